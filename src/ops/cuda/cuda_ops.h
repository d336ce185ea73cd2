// Internal: the cuda backend's entry points (the list in ops/backend_ops.inc, shared with the
// cpu backend). Called only from the dispatch files in src/ops/.
#pragma once
#include <vector>
#include "megadlm/ops/activation.h"
#include "megadlm/ops/attention.h"
#include "megadlm/ops/attention_merge.h"
#include "megadlm/ops/cross_entropy.h"
#include "megadlm/ops/dropout.h"
#include "megadlm/ops/elementwise.h"
#include "megadlm/ops/embedding.h"
#include "megadlm/ops/gemm.h"
#include "megadlm/ops/linear_cross_entropy.h"
#include "megadlm/ops/moe.h"
#include "megadlm/ops/norm.h"
#include "megadlm/ops/optimizer.h"
#include "megadlm/ops/qk_norm_rope.h"
#include "megadlm/ops/random.h"
#include "megadlm/ops/reduce.h"
#include "megadlm/ops/rope.h"
#include "megadlm/ops/sampling.h"
#include "ops/attention_rows.h"

namespace megadlm::ops::cuda {
// attention_forward / attention_backward (backend_ops.inc) run every CUDA attention call, the
// context-parallel ones (a separate key block, chunk maps) included: the support table
// (ops/attention_support.h) picks cuDNN, the flash or the simple kernels.
#include "ops/backend_ops.inc"

// CUDA-only fast paths whose dispatch has a generic fallback (split q, k, v and the ordinary
// entries): true when they ran (cuDNN on the packed rows), false when nothing was queued.
bool attention_forward_packed(const Tensor& qk_rows, const Tensor& v_rows, Tensor& out, Tensor& lse,
                              const AttentionArgs& args, const Stream& stream);
bool attention_backward_packed(const Tensor& dout, const Tensor& qk_rows, const Tensor& v_rows,
                               const Tensor& out, const Tensor& lse, Tensor& dqkv,
                               const AttentionArgs& args, const Stream& stream);
/// Whether those two would run (the support table reads both directions' rows in place).
bool attention_packed_reads_in_place(const AttentionArgs& args);
/// A call on row windows of the whole tensors (ops/attention_rows.h): true when cuDNN ran it on
/// the windows in place (the table's choice for the piece is cuDNN dense rows), false when
/// nothing was queued (the caller copies the rows and calls attention_forward / _backward).
bool attention_forward_rows(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                            const AttentionArgs& args, const AttentionRowWindow& window,
                            const Stream& stream);
bool attention_backward_rows(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& out, const Tensor& lse, Tensor& dq, Tensor& dk, Tensor& dv,
                             const AttentionArgs& args, const AttentionRowWindow& window,
                             const Stream& stream);
}  // namespace megadlm::ops::cuda
