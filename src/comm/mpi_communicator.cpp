// The MPI communicator: CPU tensors between processes. Every operation posts a non-blocking MPI
// call and polls it with MPI_Testall until it completes or the group's timeout passes, so a rank
// whose peer skipped a collective raises CommTimeoutError instead of hanging. Calls block the
// caller; `stream` must be the CPU stream and synchronize() has nothing to wait for.
// MPI's process-wide state (initialisation, MPI_COMM_WORLD) is the one global this module uses;
// MPI imposes it. Compiled only with MEGADLM_WITH_MPI (backend_stubs.cpp otherwise).
#include "comm/backends.h"

#if MEGADLM_WITH_MPI
#include <mpi.h>
#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>

namespace megadlm::comm::detail {

namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

constexpr int kP2PTag = 7;  // one tag: transfers between a pair match in posting order

[[noreturn]] void throw_mpi(const char* call, int rc, const std::string& who, const char* file,
                            int line) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = 0;
  throw_backend_error("MPI", call, rc, len > 0 ? std::string(text, static_cast<size_t>(len)) : "unknown",
                      who, file, line);
}

/// MDLM_MPI_CHECK(call, who): `who` describes the group and rank for the message.
#define MDLM_MPI_CHECK(call, who)                                                     \
  do {                                                                                \
    const int rc_ = (call);                                                           \
    if (__builtin_expect(rc_ != MPI_SUCCESS, 0)) throw_mpi(#call, rc_, (who), __FILE__, __LINE__); \
  } while (0)

MPI_Datatype mpi_type(DType d) {
  switch (d) {
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
    case DType::I32: return MPI_INT32_T;
    case DType::I64: return MPI_INT64_T;
    case DType::BF16:
    case DType::F16: return MPI_UINT16_T;  // moved as raw 16-bit words, never reduced
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return MPI_SUM;  // Avg: divided by the group size afterwards
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::Min: return MPI_MIN;
  }
  return MPI_OP_NULL;
}

void divide_by(Tensor& t, int n) {
  if (t.dtype() == DType::F32) {
    float* p = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] /= static_cast<float>(n);
  } else if (t.dtype() == DType::F64) {
    double* p = t.data<double>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] /= n;
  }
}

bool mpi_up() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

enum class WaitResult { Done, TimedOut, Failed };

/// Polls `reqs` until all complete, an error is reported (rc set) or `timeout` passes.
WaitResult wait_all(std::vector<MPI_Request>& reqs, std::vector<MPI_Status>& statuses,
                    milliseconds timeout, milliseconds* waited, int* rc) {
  statuses.resize(reqs.size());
  const auto start = steady_clock::now();
  for (int spins = 0;; ++spins) {
    int done = 0;
    *rc = MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, statuses.data());
    const auto elapsed = steady_clock::now() - start;
    *waited = std::chrono::duration_cast<milliseconds>(elapsed);
    if (*rc != MPI_SUCCESS) return WaitResult::Failed;
    if (done) return WaitResult::Done;
    if (elapsed >= timeout) return WaitResult::TimedOut;
    poll_pause(spins, elapsed);
  }
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, std::string name, milliseconds timeout,
                  std::shared_ptr<CommRegistry> registry)
      : comm_(comm), name_(std::move(name)), timeout_(timeout), registry_(std::move(registry)) {
    // Errors come back as codes, so they become exceptions naming the group (not MPI's abort).
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Group group, world_group;
    MPI_Comm_group(comm_, &group);
    MPI_Comm_group(MPI_COMM_WORLD, &world_group);
    std::vector<int> local(static_cast<size_t>(size_));
    for (int i = 0; i < size_; ++i) local[static_cast<size_t>(i)] = i;
    global_ranks_.resize(static_cast<size_t>(size_));
    MPI_Group_translate_ranks(group, size_, local.data(), world_group, global_ranks_.data());
    MPI_Group_free(&group);
    MPI_Group_free(&world_group);
    if (registry_) registry_->add(this);
  }

  ~MpiCommunicator() override {
    if (registry_) registry_->remove(this);
    // A group with a timed-out request still posted is left to MPI_Finalize / MPI_Abort.
    if (comm_ != MPI_COMM_NULL && !failed_ && mpi_up()) MPI_Comm_free(&comm_);
  }

  const std::string& name() const override { return name_; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int global_rank(int group_rank) const override {
    MDLM_CHECK(group_rank >= 0 && group_rank < size_, "group '", name_, "' has ranks 0..",
               size_ - 1, "; asked for the global rank of member ", group_rank);
    return global_ranks_[static_cast<size_t>(group_rank)];
  }
  Device device() const override { return Device::cpu(); }
  milliseconds timeout() const override { return timeout_; }
  void set_timeout(milliseconds timeout) override {
    check_timeout(*this, timeout);
    timeout_ = timeout;
  }

  void all_reduce(Tensor& t, ReduceOp op, const Stream& stream) override {
    begin("all_reduce", stream);
    check_all_reduce(*this, t, op, /*reduces_16bit=*/false);
    const std::string what = describe_op("all_reduce", ++seq_,
                                         concat(tensor_text(t), ", ", reduce_op_name(op)));
    record_.begin(seq_, "all_reduce", t.numel(), t.dtype(), reduce_op_name(op));
    std::vector<MPI_Request> req(1);
    MDLM_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, t.data_ptr(), count("all_reduce", t.numel()),
                                  mpi_type(t.dtype()), mpi_op(op), comm_, &req[0]),
                   who());
    wait(req, what);
    if (op == ReduceOp::Avg) divide_by(t, size_);
  }

  void reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op, const Stream& stream) override {
    begin("reduce_scatter", stream);
    const Aliasing a = check_reduce_scatter(*this, in, out, op, /*reduces_16bit=*/false);
    const std::string what = describe_op("reduce_scatter", ++seq_,
                                         concat(tensor_text(in), " -> ", tensor_text(out), ", ",
                                                reduce_op_name(op)));
    record_.begin(seq_, "reduce_scatter", in.numel(), in.dtype(), reduce_op_name(op));
    // MPI forbids overlapping send and receive buffers: an in-place call reduces into a copy.
    Tensor target = a == Aliasing::InPlace ? Tensor::empty(out.shape(), out.dtype(), Stream::cpu()) : out;
    std::vector<MPI_Request> req(1);
    MDLM_MPI_CHECK(MPI_Ireduce_scatter_block(in.data_ptr(), target.data_ptr(),
                                             count("reduce_scatter", out.numel()),
                                             mpi_type(in.dtype()), mpi_op(op), comm_, &req[0]),
                   who());
    wait(req, what);
    if (a == Aliasing::InPlace && out.nbytes() > 0)
      std::memcpy(out.data_ptr(), target.data_ptr(), out.nbytes());
    if (op == ReduceOp::Avg) divide_by(out, size_);
  }

  void all_gather(const Tensor& in, Tensor& out, const Stream& stream) override {
    begin("all_gather", stream);
    const Aliasing a = check_all_gather(*this, in, out);
    const std::string what = describe_op("all_gather", ++seq_,
                                         concat(tensor_text(in), " -> ", tensor_text(out)));
    record_.begin(seq_, "all_gather", in.numel(), in.dtype(), "");
    const int n = count("all_gather", in.numel());
    const MPI_Datatype type = mpi_type(in.dtype());
    std::vector<MPI_Request> req(1);
    if (a == Aliasing::InPlace) {
      MDLM_MPI_CHECK(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out.data_ptr(), n, type,
                                    comm_, &req[0]),
                     who());
    } else {
      MDLM_MPI_CHECK(MPI_Iallgather(in.data_ptr(), n, type, out.data_ptr(), n, type, comm_, &req[0]),
                     who());
    }
    wait(req, what);
  }

  void broadcast(Tensor& t, int root, const Stream& stream) override {
    begin("broadcast", stream);
    check_broadcast(*this, t, root);
    const std::string what = describe_op("broadcast", ++seq_,
                                         concat(tensor_text(t), ", root ", root));
    record_.begin(seq_, "broadcast", t.numel(), t.dtype(), concat("root ", root));
    std::vector<MPI_Request> req(1);
    MDLM_MPI_CHECK(MPI_Ibcast(t.data_ptr(), count("broadcast", t.numel()), mpi_type(t.dtype()),
                              root, comm_, &req[0]),
                   who());
    wait(req, what);
  }

  void all_to_all(const Tensor& in, const std::vector<int64_t>& send_counts, Tensor& out,
                  const std::vector<int64_t>& recv_counts, const Stream& stream) override {
    begin("all_to_all", stream);
    const AllToAllPlan plan = check_all_to_all(*this, in, send_counts, out, recv_counts);
    const std::string what = describe_op("all_to_all", ++seq_,
                                         concat(tensor_text(in), " -> ", tensor_text(out)));
    record_.begin(seq_, "all_to_all", in.numel(), in.dtype(), "");
    // MPI-3 counts and displacements are int; the totals bound every entry.
    count("all_to_all", in.numel());
    count("all_to_all", out.numel());
    std::vector<int> sc, sd, rc, rd;
    for (size_t p = 0; p < send_counts.size(); ++p) {
      sc.push_back(static_cast<int>(send_counts[p]));
      sd.push_back(static_cast<int>(plan.send_offsets[p]));
      rc.push_back(static_cast<int>(recv_counts[p]));
      rd.push_back(static_cast<int>(plan.recv_offsets[p]));
    }
    const MPI_Datatype type = mpi_type(in.dtype());
    std::vector<MPI_Request> req(1);
    MDLM_MPI_CHECK(MPI_Ialltoallv(in.data_ptr(), sc.data(), sd.data(), type, out.data_ptr(),
                                  rc.data(), rd.data(), type, comm_, &req[0]),
                   who());
    wait(req, what);
  }

  void send(const Tensor& t, int peer, const Stream& stream) override {
    begin("send", stream);
    check_p2p(*this, "send", t, peer);
    batch({P2POp{P2POp::Kind::Send, t, peer}}, "send");
  }

  void recv(Tensor& t, int peer, const Stream& stream) override {
    begin("recv", stream);
    check_p2p(*this, "recv", t, peer);
    batch({P2POp{P2POp::Kind::Recv, t, peer}}, "recv");
  }

  void batch_p2p(const std::vector<P2POp>& ops, const Stream& stream) override {
    begin("batch_p2p", stream);
    check_batch_p2p(*this, ops);
    batch(ops, "batch_p2p");
  }

  void barrier(const Stream& stream) override {
    begin("barrier", stream);
    const std::string what = describe_op("barrier", ++seq_, "");
    record_.begin(seq_, "barrier", 0, std::nullopt, "");
    std::vector<MPI_Request> req(1);
    MDLM_MPI_CHECK(MPI_Ibarrier(comm_, &req[0]), who());
    wait(req, what);
  }

  void synchronize(const Stream& stream) override { check_stream(*this, "synchronize", stream); }

  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override {
    check_usable(*this, aborted_, failed_, "split");
    // MPI_Comm_split blocks without a deadline: meet in a barrier first, which has one, so that a
    // missing rank is reported instead of hanging inside the split.
    const std::string what = describe_op("split", ++seq_, concat("into '", name, "', color ",
                                                                 color, ", key ", key));
    record_.begin(seq_, "split", 0, std::nullopt, concat("into '", name, "'"));
    std::vector<MPI_Request> req(1);
    MDLM_MPI_CHECK(MPI_Ibarrier(comm_, &req[0]), who());
    wait(req, what);
    MPI_Comm child = MPI_COMM_NULL;
    MDLM_MPI_CHECK(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &child), who());
    if (child == MPI_COMM_NULL) return nullptr;
    return std::make_unique<MpiCommunicator>(child, name, timeout_, registry_);
  }

  void abort() noexcept override { aborted_ = true; }

  const CollectiveRecord* collective_record() const override { return &record_; }

 private:
  std::string who() const { return describe(*this); }

  void begin(const char* op, const Stream& stream) const {
    check_usable(*this, aborted_, failed_, op);
    if (stream.is_cuda())
      MDLM_FAIL(op, " on ", describe(*this), ": given a stream of ", stream.device().str(),
                "; an MPI group moves CPU tensors and runs on the CPU stream");
  }

  int count(const char* op, int64_t n) const {
    if (n > INT_MAX)
      MDLM_FAIL(op, " on ", describe(*this), ": ", n, " elements exceed MPI's int count (",
                INT_MAX, "); split the transfer");
    return static_cast<int>(n);
  }

  /// Posts every transfer, then waits for all; receives must get exactly their element count.
  void batch(const std::vector<P2POp>& ops, const char* op) {
    const std::string what = describe_op(op, ++seq_, concat(ops.size(), " transfer(s)"));
    int64_t elements = 0;
    for (const P2POp& o : ops) elements += o.tensor.numel();
    record_.begin(seq_, op, elements, ops.empty() ? std::nullopt : std::optional<DType>(ops[0].tensor.dtype()),
                  concat(ops.size(), " transfer(s)"));
    std::vector<MPI_Request> reqs(ops.size(), MPI_REQUEST_NULL);
    for (size_t i = 0; i < ops.size(); ++i) {
      const P2POp& o = ops[i];
      const int n = count(op, o.tensor.numel());
      const MPI_Datatype type = mpi_type(o.tensor.dtype());
      if (o.kind == P2POp::Kind::Send) {
        MDLM_MPI_CHECK(MPI_Isend(o.tensor.data_ptr(), n, type, o.peer, kP2PTag, comm_, &reqs[i]),
                       who());
      } else {
        MDLM_MPI_CHECK(MPI_Irecv(o.tensor.data_ptr(), n, type, o.peer, kP2PTag, comm_, &reqs[i]),
                       who());
      }
    }
    std::vector<MPI_Status> statuses;
    wait(reqs, what, &statuses, &ops);
    for (size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].kind != P2POp::Kind::Recv) continue;
      int got = 0;
      MPI_Get_count(&statuses[i], mpi_type(ops[i].tensor.dtype()), &got);
      if (got != ops[i].tensor.numel()) {
        failed_ = true;
        MDLM_FAIL(what, " on ", describe(*this), ": the receive from peer ", ops[i].peer, " into ",
                  tensor_text(ops[i].tensor), " got ", got, " elements; the sender's tensor must "
                  "have the receiver's element count and dtype");
      }
    }
  }

  void wait(std::vector<MPI_Request>& reqs, const std::string& what,
            std::vector<MPI_Status>* statuses_out = nullptr, const std::vector<P2POp>* ops = nullptr) {
    std::vector<MPI_Status> local;
    std::vector<MPI_Status>& statuses = statuses_out ? *statuses_out : local;
    milliseconds waited{0};
    int rc = MPI_SUCCESS;
    switch (wait_all(reqs, statuses, timeout_, &waited, &rc)) {
      case WaitResult::Done:
        record_.complete(seq_);  // every op waits for itself before the next one starts
        return;
      case WaitResult::TimedOut:
        failed_ = true;
        throw_timeout(*this, what, waited, "", registry_.get());
      case WaitResult::Failed:
        failed_ = true;
        if (rc == MPI_ERR_IN_STATUS) {
          for (size_t i = 0; i < statuses.size(); ++i) {
            const int e = statuses[i].MPI_ERROR;
            if (e == MPI_SUCCESS || e == MPI_ERR_PENDING) continue;
            std::string part = ops ? concat(" (", (*ops)[i].kind == P2POp::Kind::Send ? "send to" : "receive from",
                                            " peer ", (*ops)[i].peer, ", ", tensor_text((*ops)[i].tensor),
                                            e == MPI_ERR_TRUNCATE ? ": the message is larger than the receiving tensor" : "",
                                            ")")
                                   : std::string();
            throw_mpi("MPI_Testall", e, concat(who(), " in ", what, part), __FILE__, __LINE__);
          }
        }
        throw_mpi("MPI_Testall", rc, concat(who(), " in ", what), __FILE__, __LINE__);
    }
  }

  MPI_Comm comm_;
  std::string name_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<int> global_ranks_;
  milliseconds timeout_;
  std::shared_ptr<CommRegistry> registry_;
  uint64_t seq_ = 0;
  bool aborted_ = false;
  bool failed_ = false;
  CollectiveRecord record_;
};

}  // namespace

bool mpi_compiled_impl() { return true; }

bool mpi_start() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  MDLM_CHECK(!fin, "MPI was already finalised in this process; it cannot be started again");
  int provided = 0;
  bool started = false;
  if (init) {
    MPI_Query_thread(&provided);
  } else {
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
    if (rc != MPI_SUCCESS) throw_mpi("MPI_Init_thread", rc, "this process", __FILE__, __LINE__);
    started = true;
    // Whoever started MPI, a normal exit finalises it (a launcher counts a process that exits
    // without MPI_Finalize as failed); mpi_stop is a no-op once the runtime has finalised.
    std::atexit([] { mpi_stop(); });
  }
  // SERIALIZED: the library may call MPI from a communication thread, never from two at once.
  MDLM_CHECK(provided >= MPI_THREAD_SERIALIZED, "MPI provides thread level ", provided,
             " but megadlm needs MPI_THREAD_SERIALIZED (", MPI_THREAD_SERIALIZED, ") or better",
             init ? " (MPI was initialised by the program: use MPI_Init_thread)" : "");
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  return started;
}

bool mpi_is_up() { return mpi_up(); }

void mpi_stop() {
  if (mpi_up()) MPI_Finalize();
}

int mpi_world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int mpi_world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

std::shared_ptr<Communicator> mpi_world_communicator(const std::string& name,
                                                     std::chrono::milliseconds timeout,
                                                     std::shared_ptr<CommRegistry> registry) {
  // A private duplicate keeps our traffic apart from any the program itself sends on the world.
  MPI_Comm dup = MPI_COMM_NULL;
  const int rc = MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  if (rc != MPI_SUCCESS)
    throw_mpi("MPI_Comm_dup(MPI_COMM_WORLD)", rc, concat("world rank ", mpi_world_rank()), __FILE__,
              __LINE__);
  return std::make_shared<MpiCommunicator>(dup, name, timeout, std::move(registry));
}

void mpi_broadcast_bytes(void* data, size_t bytes, int root, std::chrono::milliseconds timeout,
                         const char* what) {
  std::vector<MPI_Request> req(1);
  std::vector<MPI_Status> statuses;
  const std::string who = concat("world rank ", mpi_world_rank(), " of ", mpi_world_size(),
                                 " on host ", host_name());
  int rc = MPI_Ibcast(data, static_cast<int>(bytes), MPI_BYTE, root, MPI_COMM_WORLD, &req[0]);
  if (rc != MPI_SUCCESS) throw_mpi("MPI_Ibcast", rc, who, __FILE__, __LINE__);
  milliseconds waited{0};
  switch (wait_all(req, statuses, timeout, &waited, &rc)) {
    case WaitResult::Done: return;
    case WaitResult::TimedOut:
      throw CommTimeoutError(concat("CommTimeoutError: ", what, " (an MPI broadcast from world rank ",
                                    root, ") did not complete within ", waited.count(), " ms on ",
                                    who, "; every rank must start and reach the same point"));
    case WaitResult::Failed: throw_mpi("MPI_Testall", rc, who, __FILE__, __LINE__);
  }
}

std::vector<std::pair<int, std::string>> mpi_gather_strings(const std::string& mine,
                                                            std::chrono::milliseconds timeout,
                                                            int* count) {
  const std::string who = concat("world rank ", mpi_world_rank(), " of ", mpi_world_size(),
                                 " on host ", host_name());
  const int size = mpi_world_size(), rank = mpi_world_rank();
  // Each step is a non-blocking collective polled against the deadline, as every MPI call here.
  auto finish = [&](MPI_Request req, const char* what) {
    std::vector<MPI_Request> reqs{req};
    std::vector<MPI_Status> statuses;
    milliseconds waited{0};
    int rc = MPI_SUCCESS;
    switch (wait_all(reqs, statuses, timeout, &waited, &rc)) {
      case WaitResult::Done: return;
      case WaitResult::TimedOut:
        throw CommTimeoutError(concat("CommTimeoutError: ", what, " did not complete within ",
                                      waited.count(), " ms on ", who,
                                      "; every rank must start and reach the same point"));
      case WaitResult::Failed: throw_mpi("MPI_Testall", rc, who, __FILE__, __LINE__);
    }
  };
  int64_t flag = mine.empty() ? 0 : 1, failed = 0;
  MPI_Request req = MPI_REQUEST_NULL;
  int rc = MPI_Iallreduce(&flag, &failed, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD, &req);
  if (rc != MPI_SUCCESS) throw_mpi("MPI_Iallreduce", rc, who, __FILE__, __LINE__);
  finish(req, "agreeing whether any rank's start-up failed");
  *count = static_cast<int>(failed);
  if (failed == 0) return {};
  const int len = static_cast<int>(mine.size());
  std::vector<int> lengths(static_cast<size_t>(size), 0);
  rc = MPI_Igather(&len, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, MPI_COMM_WORLD, &req);
  if (rc != MPI_SUCCESS) throw_mpi("MPI_Igather", rc, who, __FILE__, __LINE__);
  finish(req, "gathering the start-up errors' lengths");
  std::vector<int> displs(static_cast<size_t>(size), 0);
  int64_t total = 0;
  for (int r = 0; r < size; ++r) {
    displs[static_cast<size_t>(r)] = static_cast<int>(total);
    total += lengths[static_cast<size_t>(r)];
  }
  MDLM_CHECK(rank != 0 || total <= INT_MAX, "start-up errors of ", total, " bytes in all");
  std::vector<char> all(static_cast<size_t>(rank == 0 ? std::max<int64_t>(total, 1) : 1));
  rc = MPI_Igatherv(mine.data(), len, MPI_CHAR, all.data(), lengths.data(), displs.data(), MPI_CHAR, 0,
                    MPI_COMM_WORLD, &req);
  if (rc != MPI_SUCCESS) throw_mpi("MPI_Igatherv", rc, who, __FILE__, __LINE__);
  finish(req, "gathering the start-up errors");
  std::vector<std::pair<int, std::string>> out;
  if (rank != 0) return out;
  for (int r = 0; r < size; ++r)
    if (lengths[static_cast<size_t>(r)] > 0)
      out.emplace_back(r, std::string(all.data() + displs[static_cast<size_t>(r)],
                                      static_cast<size_t>(lengths[static_cast<size_t>(r)])));
  return out;
}

void mpi_abort(int code) noexcept {
  if (mpi_up()) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

}  // namespace megadlm::comm::detail

#endif  // MEGADLM_WITH_MPI
