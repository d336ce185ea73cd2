// Internal: the cuda backend's entry points, one per op, same names and contracts as the public
// headers in include/megadlm/ops/ (see them for shapes and the accumulation contract). Called only
// from the dispatch files in src/ops/, after the shared argument checks.
#pragma once
#include <vector>
#include "megadlm/ops/activation.h"
#include "megadlm/ops/attention.h"
#include "megadlm/ops/cross_entropy.h"
#include "megadlm/ops/dropout.h"
#include "megadlm/ops/elementwise.h"
#include "megadlm/ops/embedding.h"
#include "megadlm/ops/gemm.h"
#include "megadlm/ops/norm.h"
#include "megadlm/ops/optimizer.h"
#include "megadlm/ops/random.h"
#include "megadlm/ops/reduce.h"
#include "megadlm/ops/rope.h"

namespace megadlm::ops::cuda {

void gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmArgs& args, const Stream& stream);

void rms_norm_forward(const Tensor& x, const Tensor& weight, Tensor& y, Tensor& rstd, float eps,
                      const Stream& stream);
void rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                       Tensor& dx, Tensor& dweight, const Stream& stream);
void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y,
                        Tensor& mean, Tensor& rstd, float eps, const Stream& stream);
void layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                         const Tensor& mean, const Tensor& rstd, Tensor& dx, Tensor& dweight,
                         Tensor& dbias, const Stream& stream);

void rope_forward(Tensor& x, const Tensor& positions, const RopeArgs& args, const Stream& stream);
void rope_backward(Tensor& dx, const Tensor& positions, const RopeArgs& args, const Stream& stream);

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                       const AttentionArgs& args, const Stream& stream);
void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, Tensor& dq, Tensor& dk, Tensor& dv,
                        const AttentionArgs& args, const Stream& stream);

void swiglu_forward(const Tensor& x, Tensor& y, const Stream& stream);
void swiglu_backward(const Tensor& dy, const Tensor& x, Tensor& dx, const Stream& stream);
void gelu_forward(const Tensor& x, Tensor& y, const Stream& stream);
void gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx, const Stream& stream);

void embedding_forward(const Tensor& weight, const Tensor& ids, Tensor& out, int64_t vocab_start,
                       const Stream& stream);
void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dweight,
                        int64_t vocab_start, const Stream& stream);

void cross_entropy_forward(const Tensor& logits, const Tensor& targets, Tensor& losses,
                           const Stream& stream);
void cross_entropy_forward_backward(Tensor& logits, const Tensor& targets, const Tensor& weights,
                                    Tensor& losses, float grad_scale, const Stream& stream);
void cross_entropy_shard_max(const Tensor& logits, Tensor& row_max, const Stream& stream);
void cross_entropy_shard_stats(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                               const Tensor& row_max, Tensor& sum_exp, Tensor& target_logit,
                               const Stream& stream);
void cross_entropy_shard_finish(Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                const Tensor& row_max, const Tensor& sum_exp,
                                const Tensor& target_logit, const Tensor& weights, Tensor& losses,
                                float grad_scale, const Stream& stream);

void adamw_step(Tensor& master, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                Tensor& model_param, const AdamWArgs& args, const Stream& stream);

void add(const Tensor& a, const Tensor& b, Tensor& out, const Stream& stream);
void scale_inplace(Tensor& x, float s, const Stream& stream);
void fill(Tensor& x, float value, const Stream& stream);
void copy(const Tensor& src, Tensor& dst, const Stream& stream);
void split_columns(const Tensor& x, const std::vector<Tensor*>& outs, const Stream& stream);
void concat_columns(const std::vector<const Tensor*>& parts, Tensor& out, const Stream& stream);

void sum_squares(const Tensor& x, Tensor& out, const Stream& stream);
void sum_rows(const Tensor& x, Tensor& out, const Stream& stream);
void dot(const Tensor& a, const Tensor& b, Tensor& out, const Stream& stream);

void dropout_add_forward(const Tensor& x, const Tensor& residual, Tensor& out,
                         const DropoutArgs& args, const Stream& stream);
void dropout_backward(const Tensor& dout, Tensor& dx, const DropoutArgs& args, const Stream& stream);

void fill_normal(Tensor& x, const NormalInitArgs& args, const Stream& stream);

}  // namespace megadlm::ops::cuda
