#include "megadlm/parallel/tensor_parallel/vocab_parallel.h"
#include "megadlm/ops/cross_entropy.h"
#include "megadlm/ops/embedding.h"
#include "megadlm/parallel/tensor_parallel/mappings.h"

namespace megadlm::tp {

Tensor vocab_parallel_embedding(const Tensor& weight, const Tensor& ids, int64_t vocab_start,
                                const ModelParallel& mp, const Stream& s) {
  Tensor x = Tensor::empty({ids.numel(), weight.cols()}, weight.dtype(), s);
  ops::embedding_forward(weight, ids, x, vocab_start, s);
  if (mp.sequence_parallel) return scatter_rows(x, mp.tp.get(), s);
  all_reduce(x, mp.tp.get(), s);
  return x;
}

void vocab_parallel_embedding_backward(const Tensor& ids, const Tensor& dx, Tensor& dweight,
                                       int64_t vocab_start, const ModelParallel& mp,
                                       const Stream& s) {
  // The lookup's backward needs every row's gradient on every rank.
  Tensor dx_full = mp.sequence_parallel ? gather_rows(dx, ids.numel(), mp.tp.get(), s) : dx;
  ops::embedding_backward(ids, dx_full, dweight, vocab_start, s);
}

void vocab_parallel_cross_entropy(Tensor& logits, const Tensor& targets, const Tensor& weights,
                                  Tensor& losses, float grad_scale, int64_t vocab_start,
                                  const ModelParallel& mp, const Stream& s) {
  comm::Communicator* tp = mp.tp.comm.get();
  MDLM_CHECK(tp != nullptr, "vocab_parallel_cross_entropy needs the tensor-parallel group");
  const int64_t t = logits.rows();
  Tensor row_max = Tensor::empty({t}, losses.dtype(), s);
  Tensor sum_exp = Tensor::empty({t}, losses.dtype(), s);
  Tensor target_logit = Tensor::empty({t}, losses.dtype(), s);
  ops::cross_entropy_shard_max(logits, row_max, s);
  tp->all_reduce(row_max, comm::ReduceOp::Max, s);
  ops::cross_entropy_shard_stats(logits, targets, vocab_start, row_max, sum_exp, target_logit, s);
  tp->all_reduce(sum_exp, comm::ReduceOp::Sum, s);
  tp->all_reduce(target_logit, comm::ReduceOp::Sum, s);
  ops::cross_entropy_shard_finish(logits, targets, vocab_start, row_max, sum_exp, target_logit,
                                  weights, losses, grad_scale, s);
}

}  // namespace megadlm::tp
