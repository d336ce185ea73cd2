// Internal to comm/: the communicator of a one-rank group. Every collective is the identity (or a
// local copy, ordered on the caller's stream), so single-process runs and one-rank process groups
// (tp = 1, ...) need neither MPI nor NCCL. Works for CPU and CUDA tensors alike.
#pragma once
#include <memory>
#include <string>
#include "comm/comm_common.h"

namespace megadlm::comm::detail {

class SelfCommunicator final : public Communicator {
 public:
  /// `global_rank`: this process's rank in the world (0 for a single-process job).
  SelfCommunicator(std::string name, Device device, int global_rank,
                   std::chrono::milliseconds timeout, std::shared_ptr<CommRegistry> registry);
  ~SelfCommunicator() override;

  const std::string& name() const override { return name_; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int global_rank(int group_rank) const override;
  Device device() const override { return device_; }
  std::chrono::milliseconds timeout() const override { return timeout_; }
  void set_timeout(std::chrono::milliseconds timeout) override;

  void all_reduce(Tensor& t, ReduceOp op, const Stream& stream) override;
  void reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op, const Stream& stream) override;
  void all_gather(const Tensor& in, Tensor& out, const Stream& stream) override;
  void broadcast(Tensor& t, int root, const Stream& stream) override;
  void all_to_all(const Tensor& in, const std::vector<int64_t>& send_counts, Tensor& out,
                  const std::vector<int64_t>& recv_counts, const Stream& stream) override;
  void send(const Tensor& t, int peer, const Stream& stream) override;
  void recv(Tensor& t, int peer, const Stream& stream) override;
  void batch_p2p(const std::vector<P2POp>& ops, const Stream& stream) override;
  void barrier(const Stream& stream) override;
  void synchronize(const Stream& stream) override;
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override;
  void abort() noexcept override { aborted_ = true; }

 private:
  void begin(const char* op, const Stream& stream) const;
  /// As the transport of a larger world would: NCCL reduces bf16/f16, MPI (the CPU) does not,
  /// so a program that runs on one rank runs unchanged on many.
  bool reduces_16bit() const { return device_.is_cuda(); }

  std::string name_;
  Device device_;
  int global_rank_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<CommRegistry> registry_;
  bool aborted_ = false;
};

}  // namespace megadlm::comm::detail
