// Stand-ins for the transports a build lacks (backends.h): each entry says which CMake option
// brings the transport in, instead of failing at link time.
#include <cstdlib>
#include "comm/backends.h"

namespace megadlm::comm::detail {

#if !MEGADLM_WITH_MPI
namespace {
[[noreturn]] void no_mpi(const char* what) {
  MDLM_FAIL(what, ": this libmegadlm was built without MPI (configure with -DMEGADLM_WITH_MPI=ON "
                  "and an MPI library such as libopenmpi-dev); a single process needs no MPI");
}
}  // namespace
bool mpi_compiled_impl() { return false; }
bool mpi_start() { no_mpi("starting MPI"); }
bool mpi_is_up() { return false; }
void mpi_stop() {}
int mpi_world_rank() { no_mpi("asking MPI for the world rank"); }
int mpi_world_size() { no_mpi("asking MPI for the world size"); }
std::shared_ptr<Communicator> mpi_world_communicator(const std::string&, std::chrono::milliseconds,
                                                     std::shared_ptr<CommRegistry>) {
  no_mpi("creating the MPI world communicator");
}
void mpi_broadcast_bytes(void*, size_t, int, std::chrono::milliseconds, const char* what) {
  no_mpi(what);
}
std::vector<std::pair<int, std::string>> mpi_gather_strings(const std::string&, std::chrono::milliseconds,
                                                            int*) {
  no_mpi("gathering the ranks' start-up errors");
}
void mpi_abort(int code) noexcept { std::_Exit(code); }
#endif

#if !MEGADLM_WITH_NCCL
namespace {
[[noreturn]] void no_nccl(const char* what) {
  MDLM_FAIL(what, ": this libmegadlm was built without NCCL (configure with -DMEGADLM_WITH_CUDA=ON "
                  "-DMEGADLM_WITH_NCCL=ON and libnccl next to the CUDA toolkit, or NCCL_ROOT); one "
                  "GPU needs no NCCL");
}
}  // namespace
bool nccl_compiled_impl() { return false; }
NcclId nccl_new_unique_id() { no_nccl("creating an NCCL unique id"); }
std::shared_ptr<Communicator> nccl_world_communicator(const NcclId&, int, int, int,
                                                      std::chrono::milliseconds,
                                                      std::shared_ptr<CommRegistry>) {
  no_nccl("creating the NCCL world communicator");
}
std::string nccl_runtime_version() { return "none"; }
#endif

}  // namespace megadlm::comm::detail
