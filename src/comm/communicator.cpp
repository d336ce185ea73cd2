// Shared by every communicator: the abort registry, argument checks and error wording
// (comm_common.h). The transports themselves are in mpi_communicator.cpp,
// cuda/nccl_communicator.cpp and self_communicator.cpp.
#include <unistd.h>
#include <algorithm>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include "comm/comm_common.h"

namespace megadlm::comm {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "?";
}

namespace detail {

void CommRegistry::add(Communicator* c) {
  std::lock_guard<std::mutex> lock(mu_);
  live_.push_back(c);
}

void CommRegistry::remove(Communicator* c) {
  // Called from the communicator's destructor body: its virtual functions are still its own.
  std::string block;
  try {
    const CollectiveRecord* r = c->collective_record();
    if (r != nullptr && r->issued() > 0)
      block = r->format(concat("group '", c->name(), "' (rank ", c->rank(), " of ", c->size(),
                               "; destroyed at ", wall_clock_text(std::chrono::system_clock::now()),
                               ", waits measured then)"),
                        std::chrono::system_clock::now());
  } catch (...) {
    block.clear();  // a record that cannot be formatted is not worth failing a destructor for
  }
  std::lock_guard<std::mutex> lock(mu_);
  live_.erase(std::remove(live_.begin(), live_.end(), c), live_.end());
  if (!block.empty()) {
    retired_.push_back(std::move(block));
    if (retired_.size() > kMaxRetired) retired_.erase(retired_.begin());
  }
}

void CommRegistry::abort_all() noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = live_.rbegin(); it != live_.rend(); ++it) (*it)->abort();
}

void CommRegistry::set_log_dir(std::string dir) {
  std::lock_guard<std::mutex> lock(mu_);
  log_dir_ = std::move(dir);
}

std::string CommRegistry::write_collective_log(const std::string& reason) noexcept {
  try {
    std::lock_guard<std::mutex> lock(mu_);
    if (live_.empty()) return "";
    const Communicator* world = live_.front();  // the world is created first
    const int rank = world->global_rank(world->rank());
    char name[96];
    std::filesystem::path dir = log_dir_;
    if (dir.empty()) {
      dir = std::filesystem::temp_directory_path();
      std::snprintf(name, sizeof name, "megadlm_collectives_rank%05d_pid%ld.txt", rank, static_cast<long>(::getpid()));
    } else {
      std::snprintf(name, sizeof name, "collectives_rank%05d.txt", rank);
    }
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    const std::string path = (dir / name).string();
    const auto now = std::chrono::system_clock::now();
    std::ostringstream os;
    os << "# megadlm: the last collectives of world rank " << rank << " (host " << host_name() << ", pid "
       << ::getpid() << "), written because: " << reason << "\n"
       << "# One block per group of this rank; oldest first; compare with the other ranks' files: the\n"
       << "# rank that stopped earlier, or waits in another operation, is where the hang started.\n";
    for (const Communicator* c : live_) {
      const CollectiveRecord* r = c->collective_record();
      if (r == nullptr) continue;
      os << "\n" << r->format(concat("group '", c->name(), "' (rank ", c->rank(), " of ", c->size(), ")"), now);
    }
    // Groups destroyed before this write (an error unwinding the trainer destroys its groups
    // before the program calls abort_job): the one that hung is usually among them.
    for (const std::string& block : retired_) os << "\n" << block;
    std::ofstream f(path, std::ios::trunc);
    f << os.str();
    f.close();
    return f ? path : std::string();
  } catch (...) {
    return "";
  }
}

std::string host_name() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown-host";
  return buf;
}

std::string describe(const Communicator& c) {
  return concat("group '", c.name(), "' (rank ", c.rank(), " of ", c.size(), ", global rank ",
                c.global_rank(c.rank()), ", host ", host_name(), ", device ", c.device().str(), ")");
}

std::string describe_op(const char* op, uint64_t seq, const std::string& detail) {
  return detail.empty() ? concat(op, " #", seq) : concat(op, " #", seq, " (", detail, ")");
}

std::string tensor_text(const Tensor& t) {
  if (!t.defined()) return "an undefined tensor";
  return concat(dtype_name(t.dtype()), shape_str(t.shape()));
}

void throw_timeout(const Communicator& c, const std::string& op_text,
                   std::chrono::milliseconds waited, const std::string& extra, CommRegistry* registry) {
  std::string msg = concat(
      "CommTimeoutError: ", op_text, " on ", describe(c), " did not complete within ",
      waited.count(), " ms (timeout ", c.timeout().count(), " ms",
      c.timeout().count() >= 60000 ? concat(" = ", c.timeout().count() / 60000.0, " min") : "",
      "). Every rank of group '", c.name(),
      "' must call the same operations in the same order; a rank that skipped this one, waits in "
      "another one, or died causes this.");
  if (!extra.empty()) msg += " " + extra;
  if (registry != nullptr) {
    const std::string file = registry->write_collective_log(concat("timeout: ", op_text, " on ", describe(c)));
    if (!file.empty()) msg += " This rank's last collectives are in " + file + " (compare with the other ranks').";
  }
  msg += " The group is unusable now: end the job (DistributedRuntime::abort_job).";
  throw CommTimeoutError(msg);
}

void throw_backend_error(const char* backend, const char* call, int code, const std::string& text,
                         const std::string& who, const char* file, int line) {
  throw_error(file, line, concat(backend, " call failed: ", call, " returned ", code, " (", text,
                                 ") on ", who));
}

namespace {
[[noreturn]] void fail(const Communicator& c, const char* op, const std::string& what) {
  MDLM_FAIL(op, " on ", describe(c), ": ", what);
}

const char* dtype_list_16bit(bool reduces_16bit) {
  return reduces_16bit ? "bf16, f16, f32, f64, i32, i64" : "f32, f64, i32, i64";
}

struct ByteRange {
  uintptr_t begin, end;
};
ByteRange bytes_of(const Tensor& t) {
  auto b = reinterpret_cast<uintptr_t>(t.data_ptr());
  return {b, b + t.nbytes()};
}
bool overlap(const ByteRange& a, const ByteRange& b) { return a.begin < b.end && b.begin < a.end; }

/// `part` (n elements) against `whole` (size * n): disjoint, exactly slot `rank`, or an error.
Aliasing slot_aliasing(const Communicator& c, const char* op, const Tensor& part, const char* part_name,
                       const Tensor& whole, const char* whole_name) {
  const ByteRange p = bytes_of(part), w = bytes_of(whole);
  if (p.begin == p.end || !overlap(p, w)) return Aliasing::Disjoint;
  const uintptr_t slot = w.begin + static_cast<uintptr_t>(c.rank()) * part.nbytes();
  if (p.begin == slot) return Aliasing::InPlace;
  fail(c, op, concat("`", part_name, "` overlaps `", whole_name, "` but is not this rank's slot ",
                     whole_name, "[", c.rank(), "*n, (", c.rank(), "+1)*n); use separate buffers "
                     "or exactly that slot"));
}
}  // namespace

void check_timeout(const Communicator& c, std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0)
    fail(c, "set_timeout", concat("the timeout must be positive, got ", timeout.count(), " ms"));
}

void check_usable(const Communicator& c, bool aborted, bool failed, const char* op) {
  if (aborted)
    fail(c, op, "the group was aborted (Communicator::abort); create the job's groups anew");
  if (failed)
    fail(c, op, "an earlier operation of this group timed out or failed, so the ranks no longer "
                "agree on what comes next; end the job (DistributedRuntime::abort_job)");
}

void check_stream(const Communicator& c, const char* op, const Stream& stream) {
  if (c.device().is_cuda() &&
      (!stream.is_cuda() || stream.device().index != c.device().index))
    fail(c, op, concat("given a stream of ", stream.device().str(), "; this group's operations "
                       "run on streams of ", c.device().str()));
}

void check_tensor(const Communicator& c, const char* op, const char* role, const Tensor& t) {
  if (!t.defined()) fail(c, op, concat("`", role, "` is an undefined tensor"));
  if (t.device() != c.device())
    fail(c, op, concat("`", role, "` (", tensor_text(t), ") is on ", t.device().str(),
                       "; this group moves tensors on ", c.device().str(),
                       c.device().is_cpu() ? " (MPI carries CPU tensors, NCCL CUDA tensors)" : ""));
}

void check_reduction(const Communicator& c, const char* op, const Tensor& t, ReduceOp rop,
                     bool reduces_16bit) {
  const DType d = t.dtype();
  const bool is16 = d == DType::BF16 || d == DType::F16;
  if (is16 && !reduces_16bit)
    fail(c, op, concat("cannot reduce ", dtype_name(d), " tensors on the CPU: MPI has no ",
                       dtype_name(d), " arithmetic and the CPU backend computes in f32; reduce an "
                       "f32 tensor (valid dtypes: ", dtype_list_16bit(false), ")"));
  if (rop == ReduceOp::Avg && !is_floating(d))
    fail(c, op, concat("ReduceOp::Avg of ", dtype_name(d), " tensors is not defined here (it "
                       "would round); use Sum and divide, or a floating dtype"));
}

void check_all_reduce(const Communicator& c, const Tensor& t, ReduceOp rop, bool reduces_16bit) {
  check_tensor(c, "all_reduce", "t", t);
  check_reduction(c, "all_reduce", t, rop, reduces_16bit);
}

Aliasing check_reduce_scatter(const Communicator& c, const Tensor& in, const Tensor& out,
                              ReduceOp rop, bool reduces_16bit) {
  const char* op = "reduce_scatter";
  check_tensor(c, op, "in", in);
  check_tensor(c, op, "out", out);
  if (in.dtype() != out.dtype())
    fail(c, op, concat("`in` is ", tensor_text(in), " but `out` is ", tensor_text(out),
                       "; both need the same dtype"));
  if (in.numel() != out.numel() * c.size())
    fail(c, op, concat("`in` has ", in.numel(), " elements and `out` ", out.numel(),
                       "; `in` must hold size * out.numel() = ", c.size(), " * ", out.numel(), " = ",
                       c.size() * out.numel()));
  check_reduction(c, op, in, rop, reduces_16bit);
  return slot_aliasing(c, op, out, "out", in, "in");
}

Aliasing check_all_gather(const Communicator& c, const Tensor& in, const Tensor& out) {
  const char* op = "all_gather";
  check_tensor(c, op, "in", in);
  check_tensor(c, op, "out", out);
  if (in.dtype() != out.dtype())
    fail(c, op, concat("`in` is ", tensor_text(in), " but `out` is ", tensor_text(out),
                       "; both need the same dtype"));
  if (out.numel() != in.numel() * c.size())
    fail(c, op, concat("`out` has ", out.numel(), " elements and `in` ", in.numel(),
                       "; `out` must hold size * in.numel() = ", c.size(), " * ", in.numel(), " = ",
                       c.size() * in.numel()));
  return slot_aliasing(c, op, in, "in", out, "out");
}

void check_broadcast(const Communicator& c, const Tensor& t, int root) {
  check_tensor(c, "broadcast", "t", t);
  if (root < 0 || root >= c.size())
    fail(c, "broadcast", concat("root ", root, " is not a rank of the group; valid: 0..",
                                c.size() - 1, " (ranks in this group, not global ranks)"));
}

AllToAllPlan check_all_to_all(const Communicator& c, const Tensor& in,
                              const std::vector<int64_t>& send_counts, const Tensor& out,
                              const std::vector<int64_t>& recv_counts) {
  const char* op = "all_to_all";
  check_tensor(c, op, "in", in);
  check_tensor(c, op, "out", out);
  if (in.dtype() != out.dtype())
    fail(c, op, concat("`in` is ", tensor_text(in), " but `out` is ", tensor_text(out),
                       "; both need the same dtype"));
  const size_t n = static_cast<size_t>(c.size());
  if (send_counts.size() != n || recv_counts.size() != n)
    fail(c, op, concat("send_counts has ", send_counts.size(), " entries and recv_counts ",
                       recv_counts.size(), "; both need one per rank of the group (", n, ")"));
  AllToAllPlan plan;
  plan.send_offsets.resize(n);
  plan.recv_offsets.resize(n);
  int64_t s = 0, r = 0;
  for (size_t p = 0; p < n; ++p) {
    if (send_counts[p] < 0 || recv_counts[p] < 0)
      fail(c, op, concat("negative count for peer ", p, " (send ", send_counts[p], ", recv ",
                         recv_counts[p], ")"));
    plan.send_offsets[p] = s;
    plan.recv_offsets[p] = r;
    s += send_counts[p];
    r += recv_counts[p];
  }
  if (s != in.numel())
    fail(c, op, concat("send_counts sum to ", s, " but `in` has ", in.numel(),
                       " elements; they must be equal"));
  if (r != out.numel())
    fail(c, op, concat("recv_counts sum to ", r, " but `out` has ", out.numel(),
                       " elements; they must be equal"));
  if (in.nbytes() > 0 && out.nbytes() > 0 && overlap(bytes_of(in), bytes_of(out)))
    fail(c, op, "`in` and `out` overlap; all_to_all needs separate buffers");
  return plan;
}

void check_p2p(const Communicator& c, const char* op, const Tensor& t, int peer) {
  check_tensor(c, op, "t", t);
  if (peer < 0 || peer >= c.size())
    fail(c, op, concat("peer ", peer, " is not a rank of the group; valid: 0..", c.size() - 1,
                       " (ranks in this group, not global ranks)"));
  if (peer == c.rank())
    fail(c, op, concat("peer ", peer, " is this rank; a transfer to itself deadlocks outside "
                       "batch_p2p (put the send and the recv in one batch_p2p call)"));
}

void check_batch_p2p(const Communicator& c, const std::vector<P2POp>& ops) {
  for (size_t i = 0; i < ops.size(); ++i) {
    const P2POp& o = ops[i];
    const char* role = o.kind == P2POp::Kind::Send ? "send" : "recv";
    check_tensor(c, "batch_p2p", concat("ops[", i, "] (", role, ")").c_str(), o.tensor);
    if (o.peer < 0 || o.peer >= c.size())
      fail(c, "batch_p2p", concat("ops[", i, "] (", role, ") names peer ", o.peer,
                                  ", not a rank of the group; valid: 0..", c.size() - 1));
  }
}

void poll_pause(int spins, std::chrono::steady_clock::duration waited) {
  using namespace std::chrono;
  if (spins < 64) return;
  if (waited < milliseconds(2)) {
    std::this_thread::yield();
  } else if (waited < milliseconds(100)) {
    std::this_thread::sleep_for(microseconds(20));
  } else {
    std::this_thread::sleep_for(microseconds(200));
  }
}

}  // namespace detail
}  // namespace megadlm::comm
