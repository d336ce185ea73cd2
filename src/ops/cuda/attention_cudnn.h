// Internal: the cuDNN backend of the attention family (attention_cudnn.cpp), called by the
// entries in attention.cu. Plain C++ (no CUDA or cuDNN headers), so tests can include it.
//
// cuDNN's fused flash attention through the backend graph API (no frontend): the composite
// cuDNN's SDPA forward and backward graphs, built once per shape and cached. Dense rows use
// the [B, S, H, D] tensors in place; packed documents run as one ragged (THD) batch of
// documents. See docs/kernels/attention.md, "cuDNN backend".
#pragma once
#include <string>
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"
#include "megadlm/ops/attention.h"

namespace megadlm::ops::cuda {

/// Why cuDNN cannot compute these arguments exactly (dropout, head_dim, version, ...), or an
/// empty string when it may (the plan build can still refuse; see CudnnRun).
std::string cudnn_attention_unsupported(const AttentionArgs& args, bool backward);

/// "cuDNN 9.14.0" (the library loaded at run time), or why none is available.
std::string cudnn_attention_version();

/// Result of one cuDNN attention call: ran, or refused (nothing was queued) with the reason.
struct CudnnRun {
  bool ran = false;
  std::string refusal;
};

/// Same contracts as ops::attention_forward / attention_backward (bf16 q, k, v, out, dout, dq,
/// dk, dv; f32 lse [B, Hq, S]). A refusal (unsupported arguments, no engine, a plan that does not
/// build) is remembered per plan key, so a refused shape costs one failed build per process.
CudnnRun cudnn_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                                 Tensor& lse, const AttentionArgs& args, const Stream& stream);
CudnnRun cudnn_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Tensor& out, const Tensor& lse,
                                  Tensor& dq, Tensor& dk, Tensor& dv, const AttentionArgs& args,
                                  const Stream& stream);

/// The same on the packed QKV buffer (ops::attention_forward_packed / attention_backward_packed):
/// q, k, v (and dq, dk, dv) read and written in place through their strides, no copies.
/// q and k come from qk_rows, v from v_rows' value columns (the same buffer, or two of one layout).
CudnnRun cudnn_attention_forward_packed(const Tensor& qk_rows, const Tensor& v_rows, Tensor& out,
                                        Tensor& lse, const AttentionArgs& args, const Stream& stream);
CudnnRun cudnn_attention_backward_packed(const Tensor& dout, const Tensor& qk_rows,
                                         const Tensor& v_rows, const Tensor& out, const Tensor& lse,
                                         Tensor& dqkv, const AttentionArgs& args, const Stream& stream);
/// Why the packed forward or backward of these arguments would not run on cuDNN ("" if both would;
/// a plan that fails to build is still refused at its first call).
std::string cudnn_attention_packed_refusal(const AttentionArgs& args);

}  // namespace megadlm::ops::cuda
