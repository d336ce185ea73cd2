// Internal to comm/: the seam between the transport-neutral code (bootstrap, process groups) and
// the two libraries. Implemented by mpi_communicator.cpp (MEGADLM_WITH_MPI) and
// cuda/nccl_communicator.cpp (MEGADLM_WITH_NCCL); backend_stubs.cpp stands in for a library the
// build lacks and says how to get it. Nothing outside these files tests a build flag.
#pragma once
#include <array>
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>
#include "comm/comm_common.h"

namespace megadlm::comm::detail {

// ---- MPI ---------------------------------------------------------------------------------------
bool mpi_compiled_impl();
/// Initialises MPI with MPI_THREAD_SERIALIZED or better unless it already is (then checks the
/// level). Returns true when this call initialised it (the caller then finalises it).
bool mpi_start();
/// Initialised and not yet finalised.
bool mpi_is_up();
void mpi_stop();
int mpi_world_rank();
int mpi_world_size();
/// A private duplicate of MPI_COMM_WORLD named `name`.
std::shared_ptr<Communicator> mpi_world_communicator(const std::string& name,
                                                     std::chrono::milliseconds timeout,
                                                     std::shared_ptr<CommRegistry> registry);
/// Broadcast of raw bytes over MPI_COMM_WORLD from world rank `root`, within `timeout` (used to
/// hand the NCCL unique id to every rank).
void mpi_broadcast_bytes(void* data, size_t bytes, int root, std::chrono::milliseconds timeout,
                         const char* what);
/// Collective over MPI_COMM_WORLD within `timeout`: every rank passes a string (usually empty);
/// world rank 0 gets every non-empty one with its rank, the other ranks only how many ranks
/// passed one (`count`). One small all-reduce when every string is empty.
std::vector<std::pair<int, std::string>> mpi_gather_strings(const std::string& mine,
                                                            std::chrono::milliseconds timeout,
                                                            int* count);
/// MPI_Abort(MPI_COMM_WORLD, code): ends every process of the job.
[[noreturn]] void mpi_abort(int code) noexcept;

// ---- NCCL --------------------------------------------------------------------------------------
bool nccl_compiled_impl();
inline constexpr size_t kNcclIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES, checked in the NCCL file
using NcclId = std::array<char, kNcclIdBytes>;
NcclId nccl_new_unique_id();
/// ncclCommInitRankConfig on `device` (made current), bounded by `timeout`.
std::shared_ptr<Communicator> nccl_world_communicator(const NcclId& id, int rank, int size,
                                                      int device,
                                                      std::chrono::milliseconds timeout,
                                                      std::shared_ptr<CommRegistry> registry);
/// "2.28.3" (the library loaded at run time).
std::string nccl_runtime_version();

}  // namespace megadlm::comm::detail
