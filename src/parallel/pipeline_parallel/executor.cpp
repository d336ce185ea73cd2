#include "megadlm/parallel/pipeline_parallel/executor.h"
#include <map>
#include <utility>
#include "megadlm/core/error.h"

namespace megadlm::pp {

void run_schedule(const std::vector<Action>& actions, const ScheduleConfig& config,
                  const StageFunctions& stage, comm::Communicator* pp, const Stream& stream) {
  const int rank = config.pp_rank, size = config.pp_size, vpp = config.virtual_stages;
  MDLM_CHECK(size == 1 || (pp != nullptr && pp->size() == size && pp->rank() == rank),
             "pipeline schedule for rank ", rank, " of ", size, " needs the pipeline group");
  using Key = std::pair<int, int>;  // (micro-batch, chunk)
  // Tensors in flight: received and waiting for their compute, or computed and waiting to be sent.
  std::map<Key, Tensor> received_input, received_grad, output, input_grad;
  auto take = [](std::map<Key, Tensor>& from, Key k, const char* what) {
    auto it = from.find(k);
    MDLM_CHECK(it != from.end(), "pipeline schedule: no ", what, " for micro-batch ", k.first,
               ", chunk ", k.second);
    Tensor t = it->second;
    from.erase(it);
    return t;
  };
  auto first_stage = [&](int chunk) { return rank == 0 && chunk == 0; };
  auto last_stage = [&](int chunk) { return rank == size - 1 && chunk == vpp - 1; };
  const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  for (const Action& a : actions) {
    const Key key{a.micro_batch, a.chunk};
    switch (a.type) {
      case ActionType::Forward: {
        Tensor in = first_stage(a.chunk) ? Tensor() : take(received_input, key, "input");
        Tensor out = stage.forward(a.micro_batch, a.chunk, in);
        if (!last_stage(a.chunk)) output[key] = out;
        break;
      }
      case ActionType::Backward: {
        Tensor dout = last_stage(a.chunk) ? Tensor() : take(received_grad, key, "output gradient");
        Tensor din = stage.backward(a.micro_batch, a.chunk, dout);
        if (!first_stage(a.chunk)) input_grad[key] = din;
        break;
      }
      case ActionType::Communicate: {
        std::vector<comm::P2POp> ops;
        for (const Transfer& t : a.transfers) {
          const Key k{t.micro_batch, t.chunk};
          switch (t.kind) {
            case Transfer::Kind::SendNext:
              ops.push_back({comm::P2POp::Kind::Send, take(output, k, "output to send"), next});
              break;
            case Transfer::Kind::SendPrev:
              ops.push_back({comm::P2POp::Kind::Send, take(input_grad, k, "input gradient to send"), prev});
              break;
            case Transfer::Kind::RecvPrev:
              received_input[k] = stage.receive_buffer(t.micro_batch, t.chunk);
              ops.push_back({comm::P2POp::Kind::Recv, received_input[k], prev});
              break;
            case Transfer::Kind::RecvNext:
              received_grad[k] = stage.receive_buffer(t.micro_batch, t.chunk);
              ops.push_back({comm::P2POp::Kind::Recv, received_grad[k], next});
              break;
          }
        }
        // Sent tensors die with `ops` after the call; their memory returns to the pool in
        // stream order, after the transfer.
        if (!ops.empty()) pp->batch_p2p(ops, stream);
        break;
      }
    }
  }
  MDLM_CHECK(output.empty() && input_grad.empty() && received_input.empty() && received_grad.empty(),
             "pipeline schedule left work behind on pipeline rank ", rank);
}

}  // namespace megadlm::pp
