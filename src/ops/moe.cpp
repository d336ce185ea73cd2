// Dispatch for the moe family (see include/megadlm/ops/moe.h): shared argument checks, then the
// one switch on the device.
#include "megadlm/ops/moe.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/dispatch.h"
#if MEGADLM_WITH_CUDA
#include "ops/cuda/cuda_ops.h"
#endif

namespace megadlm::ops {

namespace {

/// Logits-like tensors: f32, or f64 on the CPU (gradient checks).
void check_stat(const char* op, const Tensor& t, const char* what) {
  MDLM_CHECK(t.defined(), op, ": ", what, " is undefined");
  if (t.is_cpu()) {
    MDLM_CHECK(t.dtype() == DType::F32 || t.dtype() == DType::F64, op, ": CPU ", what,
               " must be f32 or f64, got ", t.str());
  } else {
    detail::check_dtype(op, t, DType::F32, what);
  }
}

void check_routing(const char* op, const Tensor& indices, int64_t rows, const char* what) {
  MDLM_CHECK(indices.defined() && indices.dtype() == DType::I32 && indices.dim() == 2 &&
                 indices.rows() == rows,
             op, ": ", what, " must be i32 [", rows, ", K], got ",
             indices.defined() ? indices.str() : std::string("undefined"));
}

void check_same_shape(const char* op, const Tensor& a, const Tensor& b, const char* what) {
  MDLM_CHECK(a.shape() == b.shape(), op, ": ", what, " ", b.str(), " must have the shape of ", a.str());
}

}  // namespace

void moe_router_topk_forward(const Tensor& logits, const Tensor& expert_bias, Tensor& probs,
                             Tensor& indices, const RouterTopkArgs& args, const Stream& stream) {
  const char* op = "moe_router_topk_forward";
  detail::check_device(op, stream, {&logits, &expert_bias, &probs, &indices});
  check_stat(op, logits, "logits");
  check_stat(op, probs, "probs");
  const int64_t experts = logits.cols();
  MDLM_CHECK(args.topk >= 1 && args.topk <= experts, op, ": topk ", args.topk, " must lie in [1, ",
             experts, "]");
  MDLM_CHECK(probs.rows() == logits.rows() && probs.cols() == args.topk, op, ": probs ", probs.str(),
             " must be [", logits.rows(), ", ", args.topk, "]");
  check_routing(op, indices, logits.rows(), "indices");
  MDLM_CHECK(indices.cols() == args.topk, op, ": indices must have ", args.topk, " columns");
  if (expert_bias.defined()) {
    detail::check_numel(op, expert_bias, experts, "expert_bias");
    MDLM_CHECK(expert_bias.dtype() == logits.dtype() || expert_bias.dtype() == DType::F32, op,
               ": expert_bias must be f32");
    MDLM_CHECK(args.selection == RouterSelection::TopK, op, ": the expert bias needs top-k selection");
  }
  if (args.num_groups > 0) {
    MDLM_CHECK(experts % args.num_groups == 0 && args.group_topk >= 1 &&
                   args.group_topk <= args.num_groups &&
                   args.topk <= args.group_topk * (experts / args.num_groups),
               op, ": ", args.num_groups, " groups with ", args.group_topk,
               " kept cannot hold top-", args.topk, " of ", experts, " experts");
  }
  if (stream.is_cuda()) MDLM_CUDA_BACKEND(cuda::moe_router_topk_forward(logits, expert_bias, probs, indices, args, stream));
  else cpu::moe_router_topk_forward(logits, expert_bias, probs, indices, args, stream);
}

void moe_router_topk_backward(const Tensor& dprobs, const Tensor& logits, const Tensor& indices,
                              Tensor& dlogits, const RouterTopkArgs& args, const Stream& stream) {
  const char* op = "moe_router_topk_backward";
  detail::check_device(op, stream, {&dprobs, &logits, &indices, &dlogits});
  check_stat(op, logits, "logits");
  check_stat(op, dprobs, "dprobs");
  check_routing(op, indices, logits.rows(), "indices");
  check_same_shape(op, indices, dprobs, "dprobs");
  check_same_shape(op, logits, dlogits, "dlogits");
  check_stat(op, dlogits, "dlogits");
  if (stream.is_cuda()) MDLM_CUDA_BACKEND(cuda::moe_router_topk_backward(dprobs, logits, indices, dlogits, args, stream));
  else cpu::moe_router_topk_backward(dprobs, logits, indices, dlogits, args, stream);
}

void moe_expert_choice_forward(const Tensor& logits, Tensor& probs, Tensor& indices,
                               const ExpertChoiceArgs& args, const Stream& stream) {
  const char* op = "moe_expert_choice_forward";
  detail::check_device(op, stream, {&logits, &probs, &indices});
  check_stat(op, logits, "logits");
  check_same_shape(op, logits, probs, "probs");
  check_stat(op, probs, "probs");
  check_routing(op, indices, logits.rows(), "indices");
  MDLM_CHECK(indices.cols() == logits.cols(), op, ": indices must be [T, E]");
  MDLM_CHECK(args.capacity >= 1, op, ": capacity must be >= 1, got ", args.capacity);
  MDLM_CHECK(args.seq > 0 && logits.rows() % args.seq == 0, op, ": ", logits.rows(),
             " rows are not whole sequences of ", args.seq);
  if (stream.is_cuda()) MDLM_CUDA_BACKEND(cuda::moe_expert_choice_forward(logits, probs, indices, args, stream));
  else cpu::moe_expert_choice_forward(logits, probs, indices, args, stream);
}

void moe_capacity_drop(const Tensor& probs, const Tensor& indices, Tensor& kept, int64_t capacity,
                       int num_experts, CapacityDropPolicy policy, const Stream& stream) {
  const char* op = "moe_capacity_drop";
  detail::check_device(op, stream, {&probs, &indices, &kept});
  check_stat(op, probs, "probs");
  check_routing(op, indices, probs.rows(), "indices");
  check_same_shape(op, probs, indices, "indices");
  check_same_shape(op, indices, kept, "kept");
  detail::check_dtype(op, kept, DType::I32, "kept");
  MDLM_CHECK(capacity >= 0 && num_experts >= 1, op, ": bad capacity ", capacity, " or experts ", num_experts);
  if (stream.is_cuda()) MDLM_CUDA_BACKEND(cuda::moe_capacity_drop(probs, indices, kept, capacity, num_experts, policy, stream));
  else cpu::moe_capacity_drop(probs, indices, kept, capacity, num_experts, policy, stream);
}

void moe_router_stats(const Tensor& logits, Tensor& score_sums, Tensor& lse_sq,
                      const RowGroups& groups, const Stream& stream) {
  const char* op = "moe_router_stats";
  detail::check_device(op, stream, {&logits, &score_sums, &lse_sq});
  check_stat(op, logits, "logits");
  if (score_sums.defined()) {
    check_stat(op, score_sums, "score_sums");
    MDLM_CHECK(score_sums.cols() == logits.cols(), op, ": score_sums ", score_sums.str(), " must be [G, ",
               logits.cols(), "]");
  }
  if (lse_sq.defined()) {
    check_stat(op, lse_sq, "lse_sq");
    detail::check_numel(op, lse_sq, 1, "lse_sq");
  }
  if (stream.is_cuda()) MDLM_CUDA_BACKEND(cuda::moe_router_stats(logits, score_sums, lse_sq, groups, stream));
  else cpu::moe_router_stats(logits, score_sums, lse_sq, groups, stream);
}

void moe_random_logits(Tensor& logits, const RandomLogitsArgs& args, const Stream& stream) {
  const char* op = "moe_random_logits";
  detail::check_device(op, stream, {&logits});
  check_stat(op, logits, "logits");
  MDLM_CHECK(args.seq_len >= 1 && args.row_offset >= 0 && args.sample_offset >= 0, op, ": bad seq_len ",
             args.seq_len, ", row_offset ", args.row_offset, " or sample_offset ", args.sample_offset);
  if (stream.is_cuda()) MDLM_CUDA_BACKEND(cuda::moe_random_logits(logits, args, stream));
  else cpu::moe_random_logits(logits, args, stream);
}

void moe_count_tokens(const Tensor& indices, Tensor& counts, const RowGroups& groups,
                      const Stream& stream) {
  const char* op = "moe_count_tokens";
  detail::check_device(op, stream, {&indices, &counts});
  check_routing(op, indices, indices.rows(), "indices");
  check_stat(op, counts, "counts");
  MDLM_CHECK(counts.dim() == 2, op, ": counts must be [G, E], got ", counts.str());
  if (stream.is_cuda()) MDLM_CUDA_BACKEND(cuda::moe_count_tokens(indices, counts, groups, stream));
  else cpu::moe_count_tokens(indices, counts, groups, stream);
}

void moe_router_loss_backward(const Tensor& logits, const Tensor& w, Tensor& dlogits,
                              const RouterLossArgs& args, const Stream& stream) {
  const char* op = "moe_router_loss_backward";
  detail::check_device(op, stream, {&logits, &w, &dlogits});
  check_stat(op, logits, "logits");
  check_same_shape(op, logits, dlogits, "dlogits");
  check_stat(op, dlogits, "dlogits");
  if (w.defined()) {
    check_stat(op, w, "w");
    MDLM_CHECK(w.cols() == logits.cols(), op, ": w ", w.str(), " must be [G, ", logits.cols(), "]");
  }
  if (stream.is_cuda()) MDLM_CUDA_BACKEND(cuda::moe_router_loss_backward(logits, w, dlogits, args, stream));
  else cpu::moe_router_loss_backward(logits, w, dlogits, args, stream);
}

void moe_expert_choice_aux(const Tensor& logits, const Tensor& experts_per_row, Tensor& value,
                           Tensor& dlogits, float grad_scale, const Stream& stream) {
  const char* op = "moe_expert_choice_aux";
  detail::check_device(op, stream, {&logits, &experts_per_row, &value, &dlogits});
  check_stat(op, logits, "logits");
  check_stat(op, experts_per_row, "experts_per_row");
  detail::check_numel(op, experts_per_row, logits.rows(), "experts_per_row");
  check_stat(op, value, "value");
  detail::check_numel(op, value, 1, "value");
  check_same_shape(op, logits, dlogits, "dlogits");
  if (stream.is_cuda()) MDLM_CUDA_BACKEND(cuda::moe_expert_choice_aux(logits, experts_per_row, value, dlogits, grad_scale, stream));
  else cpu::moe_expert_choice_aux(logits, experts_per_row, value, dlogits, grad_scale, stream);
}

void moe_dispatch_plan(const Tensor& indices, int first_expert, int num_experts, Tensor& dest,
                       Tensor& counts, const Stream& stream) {
  const char* op = "moe_dispatch_plan";
  detail::check_device(op, stream, {&indices, &dest, &counts});
  check_routing(op, indices, indices.rows(), "indices");
  check_same_shape(op, indices, dest, "dest");
  detail::check_dtype(op, dest, DType::I32, "dest");
  detail::check_numel(op, counts, num_experts, "counts");
  detail::check_dtype(op, counts, DType::I32, "counts");
  MDLM_CHECK(first_expert >= 0 && num_experts >= 1, op, ": bad expert range [", first_expert, ", +",
             num_experts, ")");
  if (stream.is_cuda()) MDLM_CUDA_BACKEND(cuda::moe_dispatch_plan(indices, first_expert, num_experts, dest, counts, stream));
  else cpu::moe_dispatch_plan(indices, first_expert, num_experts, dest, counts, stream);
}

void moe_permute(const Tensor& x, const Tensor& dest, Tensor& out, const Stream& stream) {
  const char* op = "moe_permute";
  detail::check_device(op, stream, {&x, &dest, &out});
  detail::check_float_activation(op, x, "x");
  check_routing(op, dest, x.rows(), "dest");
  MDLM_CHECK(out.dtype() == x.dtype() && out.cols() == x.cols(), op, ": out ", out.str(),
             " must be [N, ", x.cols(), "] of x's dtype");
  if (out.numel() == 0) return;
  if (stream.is_cuda()) MDLM_CUDA_BACKEND(cuda::moe_permute(x, dest, out, stream));
  else cpu::moe_permute(x, dest, out, stream);
}

void moe_unpermute(const Tensor& y, const Tensor& dest, const Tensor& probs, Tensor& out,
                   const Stream& stream) {
  const char* op = "moe_unpermute";
  detail::check_device(op, stream, {&y, &dest, &probs, &out});
  detail::check_float_activation(op, out, "out");
  check_routing(op, dest, out.rows(), "dest");
  MDLM_CHECK(y.dtype() == out.dtype() && y.cols() == out.cols(), op, ": y ", y.str(),
             " must be [N, ", out.cols(), "] of out's dtype");
  if (probs.defined()) {
    check_same_shape(op, dest, probs, "probs");
    check_stat(op, probs, "probs");
  }
  if (out.numel() == 0) return;
  if (stream.is_cuda()) MDLM_CUDA_BACKEND(cuda::moe_unpermute(y, dest, probs, out, stream));
  else cpu::moe_unpermute(y, dest, probs, out, stream);
}

void moe_unpermute_backward(const Tensor& dout, const Tensor& y, const Tensor& dest,
                            const Tensor& probs, Tensor& dy, Tensor& dprobs, const Stream& stream) {
  const char* op = "moe_unpermute_backward";
  detail::check_device(op, stream, {&dout, &y, &dest, &probs, &dy, &dprobs});
  detail::check_float_activation(op, dout, "dout");
  check_routing(op, dest, dout.rows(), "dest");
  check_same_shape(op, y, dy, "dy");
  MDLM_CHECK(y.dtype() == dout.dtype() && dy.dtype() == dout.dtype() && y.cols() == dout.cols(), op,
             ": y ", y.str(), " and dy ", dy.str(), " must be [N, ", dout.cols(), "] of dout's dtype");
  check_same_shape(op, dest, probs, "probs");
  check_same_shape(op, dest, dprobs, "dprobs");
  check_stat(op, probs, "probs");
  check_stat(op, dprobs, "dprobs");
  if (stream.is_cuda()) MDLM_CUDA_BACKEND(cuda::moe_unpermute_backward(dout, y, dest, probs, dy, dprobs, stream));
  else cpu::moe_unpermute_backward(dout, y, dest, probs, dy, dprobs, stream);
}

void grouped_gemm(const Tensor& a, const Tensor& b, Tensor& c, const std::vector<int64_t>& group_rows,
                  const GroupedGemmArgs& args, const Stream& stream) {
  const char* op = "grouped_gemm";
  detail::check_device(op, stream, {&a, &b, &c, args.bias});
  const int64_t groups = static_cast<int64_t>(group_rows.size());
  MDLM_CHECK(groups >= 1, op, ": no groups");
  int64_t total = 0;
  for (int64_t n : group_rows) {
    MDLM_CHECK(n >= 0, op, ": negative group size ", n);
    total += n;
  }
  MDLM_CHECK(a.dtype() == b.dtype(), op, ": A ", a.str(), " and B ", b.str(), " dtypes differ");
  MDLM_CHECK(a.rows() == total, op, ": A ", a.str(), " has ", a.rows(), " rows, the groups ", total);
  if (!args.trans_a) {
    MDLM_CHECK(b.rows() % groups == 0, op, ": B ", b.str(), " does not hold ", groups, " stacked matrices");
    const int64_t b_rows = b.rows() / groups;
    const int64_t k = a.cols(), n = args.trans_b ? b_rows : b.cols();
    MDLM_CHECK((args.trans_b ? b.cols() : b_rows) == k, op, ": inner dimensions differ: A ", a.str(),
               ", B block [", b_rows, ", ", b.cols(), "] trans_b=", args.trans_b);
    MDLM_CHECK(c.rows() == total && c.cols() == n, op, ": C ", c.str(), " must be [", total, ", ", n, "]");
  } else {
    MDLM_CHECK(b.rows() == total, op, ": B ", b.str(), " must have the ", total, " rows of the groups");
    MDLM_CHECK(c.rows() % groups == 0, op, ": C ", c.str(), " does not hold ", groups, " stacked matrices");
    const int64_t m = a.cols(), n = args.trans_b ? b.rows() : b.cols();
    MDLM_CHECK(!args.trans_b, op, ": weight-gradient groups take B untransposed");
    MDLM_CHECK(c.rows() / groups == m && c.cols() == n, op, ": C ", c.str(), " must be ", groups,
               " stacked [", m, ", ", n, "]");
  }
  MDLM_CHECK(c.dtype() == a.dtype() || c.dtype() == DType::F32, op, ": C ", c.str(),
             " must have A's dtype or f32");
  if (args.bias) {
    detail::check_numel(op, *args.bias, groups * c.cols(), "bias");
    detail::check_dtype(op, *args.bias, c.dtype(), "bias");
    MDLM_CHECK(!args.trans_a, op, ": a bias needs the row-grouped form");
  }
  if (stream.is_cuda()) MDLM_CUDA_BACKEND(cuda::grouped_gemm(a, b, c, group_rows, args, stream));
  else cpu::grouped_gemm(a, b, c, group_rows, args, stream);
}

}  // namespace megadlm::ops
