// The NCCL communicator: CUDA tensors, every operation queued on the caller's stream.
//
// Timeouts without a watchdog thread: each queued operation records a CUDA event next to its
// metadata (name, sequence number, tensor); synchronize(stream) polls those events and
// ncclCommGetAsyncError until they complete, and raises CommTimeoutError naming the oldest
// unfinished operation when no operation of the stream has completed for a whole timeout (a
// long queue of healthy work never trips it).
//
// Communicators are created non-blocking (ncclConfig_t::blocking = 0): init, split, group ends
// and finalize return at once and are polled with a deadline too, so a rank that never arrives
// (connection set-up included) ends in an error instead of a hang, and ncclCommAbort is always
// reachable from the thread that waits. Compiled only with MEGADLM_WITH_NCCL; uses NCCL API of
// 2.18 or older (the devices run 2.28.3).
#include "comm/backends.h"

#if MEGADLM_WITH_NCCL
#include <nccl.h>
#include <cstring>
#include <deque>
#include <thread>
#include "core/cuda/cuda_utils.h"
#include "megadlm/core/event.h"

static_assert(NCCL_UNIQUE_ID_BYTES == megadlm::comm::detail::kNcclIdBytes,
              "NcclId must hold an ncclUniqueId");

namespace megadlm::comm::detail {

namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
using ::megadlm::detail::native_stream;

[[noreturn]] void throw_nccl(const char* call, ncclResult_t r, ncclComm_t comm,
                             const std::string& who, const char* file, int line) {
  std::string text = ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && last[0] != '\0') text += concat("; NCCL: ", last);
  throw_backend_error("NCCL", call, static_cast<int>(r), text, who, file, line);
}

/// MDLM_NCCL_CHECK(call, comm, who): ncclInProgress is not an error here (non-blocking comms);
/// the caller polls it with wait_ready.
#define MDLM_NCCL_CHECK(call, comm, who)                                               \
  do {                                                                                 \
    const ncclResult_t r_ = (call);                                                    \
    if (__builtin_expect(r_ != ncclSuccess && r_ != ncclInProgress, 0))                \
      throw_nccl(#call, r_, (comm), (who), __FILE__, __LINE__);                        \
  } while (0)

ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::F32: return ncclFloat32;
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
    case DType::F64: return ncclFloat64;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  return ncclSum;
}

/// Non-blocking config; commName shows the group name in NCCL's own logs. NCCL keeps the pointer
/// for the communicator's life, so `name` must outlive it (NcclCommunicator owns it).
ncclConfig_t make_config(const std::string& name) {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  cfg.commName = name.c_str();
  return cfg;
}

enum class Ready { Yes, TimedOut };

/// Polls a non-blocking communicator until its last call finished (throws on an NCCL error).
Ready wait_ready(ncclComm_t comm, Clock::time_point deadline, const char* call,
                 const std::string& who) {
  const auto start = Clock::now();
  for (int spins = 0;; ++spins) {
    ncclResult_t state = ncclSuccess;
    MDLM_NCCL_CHECK(ncclCommGetAsyncError(comm, &state), comm, who);
    if (state == ncclSuccess) return Ready::Yes;
    if (state != ncclInProgress) throw_nccl(call, state, comm, who, __FILE__, __LINE__);
    if (Clock::now() >= deadline) return Ready::TimedOut;
    poll_pause(spins, Clock::now() - start);
  }
}

class NcclCommunicator final : public Communicator {
 public:
  /// `name` is the string the NCCL config's commName points at.
  NcclCommunicator(ncclComm_t comm, std::unique_ptr<const std::string> name, int device,
                   milliseconds timeout, std::shared_ptr<CommRegistry> registry,
                   std::vector<int> global_ranks)
      : comm_(comm), name_(std::move(name)), device_(device), timeout_(timeout),
        registry_(std::move(registry)), global_ranks_(std::move(global_ranks)) {
    MDLM_NCCL_CHECK(ncclCommCount(comm_, &size_), comm_, *name_);
    MDLM_NCCL_CHECK(ncclCommUserRank(comm_, &rank_), comm_, *name_);
    if (registry_) registry_->add(this);
  }

  ~NcclCommunicator() override {
    if (registry_) registry_->remove(this);
    if (comm_ == nullptr) return;  // aborted
    cudaSetDevice(device_);
    if (failed_) {
      ncclCommAbort(comm_);
      return;
    }
    // Finalize flushes the queued operations; bounded like everything else, then destroy.
    const ncclResult_t r = ncclCommFinalize(comm_);
    bool clean = r == ncclSuccess || r == ncclInProgress;
    if (clean) {
      try {
        clean = wait_ready(comm_, Clock::now() + timeout_, "ncclCommFinalize", *name_) == Ready::Yes;
      } catch (const std::exception&) {
        clean = false;
      }
    }
    if (clean) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
  }

  const std::string& name() const override { return *name_; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int global_rank(int group_rank) const override {
    MDLM_CHECK(group_rank >= 0 && group_rank < size_, "group '", *name_, "' has ranks 0..",
               size_ - 1, "; asked for the global rank of member ", group_rank);
    return global_ranks_[static_cast<size_t>(group_rank)];
  }
  Device device() const override { return Device::cuda(device_); }
  milliseconds timeout() const override { return timeout_; }
  void set_timeout(milliseconds timeout) override {
    check_timeout(*this, timeout);
    timeout_ = timeout;
  }

  void all_reduce(Tensor& t, ReduceOp op, const Stream& stream) override {
    begin("all_reduce", stream);
    check_all_reduce(*this, t, op, /*reduces_16bit=*/true);
    enqueue("all_reduce", concat(tensor_text(t), ", ", reduce_op_name(op)), {t.numel(), t.dtype()}, stream, [&] {
      return ncclAllReduce(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()),
                           nccl_type(t.dtype()), nccl_op(op), comm_, native_stream(stream));
    });
  }

  void reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op, const Stream& stream) override {
    begin("reduce_scatter", stream);
    check_reduce_scatter(*this, in, out, op, /*reduces_16bit=*/true);  // NCCL's in-place = our slot rule
    enqueue("reduce_scatter",
            concat(tensor_text(in), " -> ", tensor_text(out), ", ", reduce_op_name(op)), {in.numel(), in.dtype()},
            stream, [&] {
              return ncclReduceScatter(in.data_ptr(), out.data_ptr(),
                                       static_cast<size_t>(out.numel()), nccl_type(in.dtype()),
                                       nccl_op(op), comm_, native_stream(stream));
            });
  }

  void all_gather(const Tensor& in, Tensor& out, const Stream& stream) override {
    begin("all_gather", stream);
    check_all_gather(*this, in, out);
    enqueue("all_gather", concat(tensor_text(in), " -> ", tensor_text(out)), {in.numel(), in.dtype()}, stream, [&] {
      return ncclAllGather(in.data_ptr(), out.data_ptr(), static_cast<size_t>(in.numel()),
                           nccl_type(in.dtype()), comm_, native_stream(stream));
    });
  }

  void broadcast(Tensor& t, int root, const Stream& stream) override {
    begin("broadcast", stream);
    check_broadcast(*this, t, root);
    enqueue("broadcast", concat(tensor_text(t), ", root ", root), {t.numel(), t.dtype()}, stream, [&] {
      return ncclBroadcast(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()),
                           nccl_type(t.dtype()), root, comm_, native_stream(stream));
    });
  }

  void all_to_all(const Tensor& in, const std::vector<int64_t>& send_counts, Tensor& out,
                  const std::vector<int64_t>& recv_counts, const Stream& stream) override {
    begin("all_to_all", stream);
    const AllToAllPlan plan = check_all_to_all(*this, in, send_counts, out, recv_counts);
    // Uneven all-to-all as one group of sends and receives (zero counts are skipped on both
    // sides alike, since send_counts[p] on r equals recv_counts[r] on p).
    std::vector<P2POp> ops;
    const Tensor in_flat = in.view({in.numel()});
    const Tensor out_flat = out.view({out.numel()});
    for (int p = 0; p < size_; ++p) {
      const auto q = static_cast<size_t>(p);
      if (send_counts[q] > 0)
        ops.push_back({P2POp::Kind::Send, in_flat.slice_flat(plan.send_offsets[q], {send_counts[q]}), p});
      if (recv_counts[q] > 0)
        ops.push_back({P2POp::Kind::Recv, out_flat.slice_flat(plan.recv_offsets[q], {recv_counts[q]}), p});
    }
    grouped("all_to_all", concat(tensor_text(in), " -> ", tensor_text(out)), ops, stream);
  }

  void send(const Tensor& t, int peer, const Stream& stream) override {
    begin("send", stream);
    check_p2p(*this, "send", t, peer);
    grouped("send", concat(tensor_text(t), " to ", peer), {{P2POp::Kind::Send, t, peer}}, stream);
  }

  void recv(Tensor& t, int peer, const Stream& stream) override {
    begin("recv", stream);
    check_p2p(*this, "recv", t, peer);
    grouped("recv", concat(tensor_text(t), " from ", peer), {{P2POp::Kind::Recv, t, peer}}, stream);
  }

  void batch_p2p(const std::vector<P2POp>& ops, const Stream& stream) override {
    begin("batch_p2p", stream);
    check_batch_p2p(*this, ops);
    grouped("batch_p2p", concat(ops.size(), " transfer(s)"), ops, stream);
  }

  void barrier(const Stream& stream) override {
    begin("barrier", stream);
    // A one-element all-reduce; the buffer is freed on `stream` after the operation (pool order).
    Tensor one = Tensor::zeros({1}, DType::F32, stream);
    enqueue("barrier", "", {0, std::nullopt}, stream, [&] {
      return ncclAllReduce(one.data_ptr(), one.data_ptr(), 1, ncclFloat32, ncclSum, comm_,
                           native_stream(stream));
    });
  }

  void synchronize(const Stream& stream) override {
    check_usable(*this, aborted_, failed_, "synchronize");
    check_stream(*this, "synchronize", stream);
    const cudaStream_t s = native_stream(stream);
    auto last_progress = Clock::now();
    for (int spins = 0;; ++spins) {
      // Operations of one stream finish in queue order: drop the finished head.
      const Pending* oldest = nullptr;
      size_t later = 0;
      for (auto it = pending_.begin(); it != pending_.end();) {
        if (it->stream != s) {
          ++it;
          continue;
        }
        if (oldest == nullptr && it->event.query()) {
          record_.complete(it->seq);
          recycle(std::move(it->event));
          it = pending_.erase(it);
          last_progress = Clock::now();
          continue;
        }
        if (oldest == nullptr) oldest = &*it;
        else ++later;
        ++it;
      }
      check_async_error(oldest ? oldest->what : "synchronize");
      if (oldest == nullptr) return;
      const auto now = Clock::now();
      if (now - last_progress >= timeout_) {
        failed_ = true;
        const auto queued = std::chrono::duration_cast<milliseconds>(now - oldest->queued);
        throw_timeout(*this, oldest->what,
                      std::chrono::duration_cast<milliseconds>(now - last_progress),
                      concat("It was queued ", queued.count(), " ms ago; ", later,
                             " later operation(s) of this group wait behind it on the stream."),
                      registry_.get());
      }
      poll_pause(spins, now - last_progress);
    }
  }

  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override {
    check_usable(*this, aborted_, failed_, "split");
    const std::string what = describe_op("split", ++seq_, concat("into '", name, "', color ",
                                                                 color, ", key ", key));
    record_.begin(seq_, "split", 0, std::nullopt, concat("into '", name, "'"));
    MDLM_CUDA_CHECK(cudaSetDevice(device_));
    auto child_name = std::make_unique<const std::string>(name);
    ncclConfig_t cfg = make_config(*child_name);
    // Non-blocking split: NCCL writes the new handle when its background job finishes, which
    // after a timeout may be later than this frame lives; the slot is then left to it (8 bytes).
    auto* child_slot = new ncclComm_t(nullptr);
    const ncclResult_t r =
        ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, child_slot, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
      delete child_slot;
      failed_ = true;
      throw_nccl("ncclCommSplit", r, comm_, concat(describe(*this), " in ", what), __FILE__, __LINE__);
    }
    const auto deadline = Clock::now() + timeout_;
    if (wait_ready(comm_, deadline, "ncclCommSplit", describe(*this)) == Ready::TimedOut) {
      child_name.release();  // NCCL's job may still read it
      failed_ = true;
      throw_timeout(*this, what, timeout_, "Some rank of the group did not call split.", registry_.get());
    }
    const ncclComm_t child = *child_slot;
    delete child_slot;
    if (child == nullptr) return nullptr;
    if (wait_ready(child, deadline, "ncclCommSplit", describe(*this)) == Ready::TimedOut) {
      ncclCommAbort(child);
      child_name.release();
      failed_ = true;
      throw_timeout(*this, what, timeout_, "The new group did not finish connecting.", registry_.get());
    }
    record_.complete(seq_);
    const std::vector<int> members =
        gather_global_ranks(child, name, global_rank(rank_), deadline);
    return std::make_unique<NcclCommunicator>(child, std::move(child_name), device_, timeout_,
                                              registry_, members);
  }

  const CollectiveRecord* collective_record() const override { return &record_; }

  void abort() noexcept override {
    if (aborted_) return;
    aborted_ = true;
    if (comm_ != nullptr) {
      cudaSetDevice(device_);
      ncclCommAbort(comm_);  // also stops kernels still waiting for peers
      comm_ = nullptr;
    }
  }

  /// Global ranks of a new group's members: an all-gather of each member's own global rank on a
  /// private stream, bounded by `deadline` (creation time only).
  static std::vector<int> gather_global_ranks(ncclComm_t comm, const std::string& name,
                                              int my_global, Clock::time_point deadline) {
    int n = 0;
    MDLM_NCCL_CHECK(ncclCommCount(comm, &n), comm, name);
    const std::string who = concat("creating group '", name, "' (global rank ", my_global, ")");
    cudaStream_t s = nullptr;
    MDLM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int* buf = nullptr;
    std::vector<int> out(static_cast<size_t>(n));
    std::string error;
    bool timed_out = false;
    if (cudaMalloc(&buf, sizeof(int) * static_cast<size_t>(n + 1)) != cudaSuccess) {
      error = "cudaMalloc of the rank table failed";
    } else if (cudaMemcpy(buf + n, &my_global, sizeof(int), cudaMemcpyHostToDevice) != cudaSuccess) {
      error = "cudaMemcpy of the rank table failed";
    } else {
      const ncclResult_t r = ncclAllGather(buf + n, buf, 1, ncclInt32, comm, s);
      if (r != ncclSuccess && r != ncclInProgress) {
        error = concat("ncclAllGather: ", ncclGetErrorString(r));
      } else if (r == ncclInProgress && wait_ready(comm, deadline, "ncclAllGather", who) == Ready::TimedOut) {
        timed_out = true;
      } else {
        const auto start = Clock::now();
        cudaError_t q = cudaErrorNotReady;
        for (int spins = 0; (q = cudaStreamQuery(s)) == cudaErrorNotReady; ++spins) {
          if (Clock::now() >= deadline) break;
          poll_pause(spins, Clock::now() - start);
        }
        if (q == cudaErrorNotReady) {
          timed_out = true;
        } else if (q != cudaSuccess ||
                   cudaMemcpy(out.data(), buf, sizeof(int) * static_cast<size_t>(n),
                              cudaMemcpyDeviceToHost) != cudaSuccess) {
          error = concat("the rank-table all-gather failed: ", cudaGetErrorString(q));
        }
      }
    }
    if (timed_out || !error.empty()) {
      ncclCommAbort(comm);  // stops a kernel still waiting for peers before its buffer goes
      if (buf) cudaFree(buf);
      cudaStreamDestroy(s);
      if (timed_out)
        throw CommTimeoutError(concat("CommTimeoutError: ", who, ": the members did not exchange "
                                      "their global ranks in time; every member must finish split"));
      MDLM_FAIL(who, ": ", error);
    }
    cudaFree(buf);
    cudaStreamDestroy(s);
    return out;
  }

 private:
  struct Pending {
    uint64_t seq;
    std::string what;  ///< "all_reduce #12 (bf16[1024], sum)"
    cudaStream_t stream;
    Stream keep;       ///< keeps the stream alive while its event is pending
    Event event;
    Clock::time_point queued;
  };

  void begin(const char* op, const Stream& stream) const {
    check_usable(*this, aborted_, failed_, op);
    check_stream(*this, op, stream);
  }

  void check_async_error(const std::string& what) {
    ncclResult_t state = ncclSuccess;
    MDLM_NCCL_CHECK(ncclCommGetAsyncError(comm_, &state), comm_, describe(*this));
    if (state != ncclSuccess && state != ncclInProgress) {
      failed_ = true;
      throw_nccl(what.c_str(), state, comm_, describe(*this), __FILE__, __LINE__);
    }
  }

  /// Elements and dtype an operation moves, for the collective record.
  struct Shape1 {
    int64_t count = 0;
    std::optional<DType> dtype;
  };

  /// Issues one NCCL call (or group) and records its event on `stream`.
  template <typename Call>
  void enqueue(const char* op, const std::string& detail, Shape1 size, const Stream& stream, Call&& call) {
    const uint64_t seq = ++seq_;
    const std::string what = describe_op(op, seq, detail);
    record_.begin(seq, op, size.count, size.dtype, detail);
    const ncclResult_t r = call();
    if (r != ncclSuccess && r != ncclInProgress) {
      failed_ = true;
      throw_nccl(op, r, comm_, concat(describe(*this), " in ", what), __FILE__, __LINE__);
    }
    // Non-blocking communicators may still be connecting to peers: bounded like the rest.
    if (r == ncclInProgress &&
        wait_ready(comm_, Clock::now() + timeout_, op, concat(describe(*this), " in ", what)) ==
            Ready::TimedOut) {
      failed_ = true;
      throw_timeout(*this, what, timeout_, "NCCL did not finish queueing it (peers never connected).",
                    registry_.get());
    }
    Event ev = take_event();
    ev.record(stream);
    pending_.push_back({seq, what, native_stream(stream), stream, std::move(ev), Clock::now()});
    if (pending_.size() > kPruneAt) prune();
  }

  void grouped(const char* op, const std::string& detail, const std::vector<P2POp>& ops,
               const Stream& stream) {
    Shape1 size{0, ops.empty() ? std::nullopt : std::optional<DType>(ops[0].tensor.dtype())};
    for (const P2POp& o : ops) size.count += o.tensor.numel();
    enqueue(op, detail, size, stream, [&] {
      ncclResult_t first = ncclGroupStart();
      if (first != ncclSuccess) return first;
      for (const P2POp& o : ops) {
        const ncclResult_t r =
            o.kind == P2POp::Kind::Send
                ? ncclSend(o.tensor.data_ptr(), static_cast<size_t>(o.tensor.numel()),
                           nccl_type(o.tensor.dtype()), o.peer, comm_, native_stream(stream))
                : ncclRecv(o.tensor.data_ptr(), static_cast<size_t>(o.tensor.numel()),
                           nccl_type(o.tensor.dtype()), o.peer, comm_, native_stream(stream));
        if (r != ncclSuccess && r != ncclInProgress) {
          first = r;
          break;
        }
      }
      const ncclResult_t end = ncclGroupEnd();  // always closes the group, even after an error
      return first != ncclSuccess ? first : end;
    });
  }

  Event take_event() {
    if (free_events_.empty()) return Event::create(Device::cuda(device_));
    Event e = std::move(free_events_.back());
    free_events_.pop_back();
    return e;
  }
  void recycle(Event&& e) {
    if (free_events_.size() < kPruneAt) free_events_.push_back(std::move(e));
  }

  /// Drops finished operations when nobody synchronizes for a while (bounded bookkeeping).
  void prune() {
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->event.query()) {
        record_.complete(it->seq);
        recycle(std::move(it->event));
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
  }

  static constexpr size_t kPruneAt = 256;

  ncclComm_t comm_;
  std::unique_ptr<const std::string> name_;
  int device_;
  milliseconds timeout_;
  std::shared_ptr<CommRegistry> registry_;
  std::vector<int> global_ranks_;
  int rank_ = 0;
  int size_ = 1;
  uint64_t seq_ = 0;
  bool aborted_ = false;
  bool failed_ = false;
  std::deque<Pending> pending_;
  std::vector<Event> free_events_;
  CollectiveRecord record_;
};

}  // namespace

bool nccl_compiled_impl() { return true; }

NcclId nccl_new_unique_id() {
  ncclUniqueId uid;
  MDLM_NCCL_CHECK(ncclGetUniqueId(&uid), nullptr, "rank 0 on host " + host_name());
  NcclId id;
  std::memcpy(id.data(), uid.internal, kNcclIdBytes);
  return id;
}

std::shared_ptr<Communicator> nccl_world_communicator(const NcclId& id, int rank, int size,
                                                      int device, milliseconds timeout,
                                                      std::shared_ptr<CommRegistry> registry) {
  MDLM_CUDA_CHECK(cudaSetDevice(device));
  ncclUniqueId uid;
  std::memcpy(uid.internal, id.data(), kNcclIdBytes);
  auto name = std::make_unique<const std::string>("world");
  const std::string who = concat("group 'world' (rank ", rank, " of ", size, ", host ", host_name(),
                                 ", device cuda:", device, ")");
  ncclConfig_t cfg = make_config(*name);
  ncclComm_t comm = nullptr;
  MDLM_NCCL_CHECK(ncclCommInitRankConfig(&comm, size, uid, rank, &cfg), comm, who);
  if (wait_ready(comm, Clock::now() + timeout, "ncclCommInitRankConfig", who) == Ready::TimedOut) {
    ncclCommAbort(comm);
    name.release();  // the aborted communicator may have logged with it; never freed
    throw CommTimeoutError(concat(
        "CommTimeoutError: creating the NCCL communicator on ", who, " did not finish within ",
        timeout.count(), " ms: a rank did not join. Every rank must start, bind its own GPU and "
        "reach the same point; NCCL_DEBUG=INFO shows how far each got"));
  }
  std::vector<int> identity(static_cast<size_t>(size));
  for (int i = 0; i < size; ++i) identity[static_cast<size_t>(i)] = i;
  return std::make_shared<NcclCommunicator>(comm, std::move(name), device, timeout,
                                            std::move(registry), std::move(identity));
}

std::string nccl_runtime_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unknown";
  return concat(v / 10000, ".", (v / 100) % 100, ".", v % 100);
}

}  // namespace megadlm::comm::detail

#endif  // MEGADLM_WITH_NCCL
