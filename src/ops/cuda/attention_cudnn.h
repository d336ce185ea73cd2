// Internal: the cuDNN backend of the attention family (attention_cudnn.cpp), called by the
// entries in attention.cu. Plain C++ (no CUDA or cuDNN headers), so tests can include it.
//
// cuDNN's fused flash attention through the backend graph API (no frontend; the generic layer is
// cudnn_graph.h): the composite SDPA graphs cuDNN's frontend emits, built once per shape
// and cached. Dense rows use the [B, S, H, D] tensors in place; packed documents run as one
// ragged (THD) batch of documents. Whether cuDNN may run a call is decided by the support table
// (ops/attention_support.h). See docs/kernels/attention.md, "cuDNN backend".
#pragma once
#include <cstdint>
#include <string>
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"
#include "megadlm/ops/attention.h"

namespace megadlm::ops::cuda {

/// Why cuDNN cannot compute these arguments exactly (dropout, head_dim, version, ...), or an
/// empty string when it may (the plan build can still refuse; see CudnnRun): the support
/// table's attention_cudnn_refusal with the loaded library's version.
std::string cudnn_attention_unsupported(const AttentionArgs& args, bool backward);

/// "cuDNN 9.14.0" (the library loaded at run time), or why none is available.
std::string cudnn_attention_version();
/// cudnnGetVersion() of the loaded library (91400 = 9.14.0); 0 when built without cuDNN.
int64_t cudnn_runtime_version();

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

/// A call on row windows of larger tensors (block diffusion's causal bulks,
/// ops/attention_block_diffusion_bulk.h): q, dout, out hold `rows` rows per batch row, of which
/// the call's args.seq query rows start at q_row0; k, v likewise from kv_row0. cuDNN reads them
/// in place through a batch stride of `rows` tokens (no copies). Backward: lse [B, Hq, lse_rows],
/// the call's statistics from column lse_row0 (its pointer must be 16-byte aligned, as every
/// cuDNN tensor is declared; the caller copies a window that is not). The outputs are the
/// call's own contiguous tensors: out [B, seq, Hq, D] and lse [B, Hq, seq] forward; dq, dk, dv
/// [B, seq, H, D] backward.
struct CudnnRowWindow {
  int64_t rows = 0, q_row0 = 0, kv_row0 = 0;
  int64_t lse_rows = 0, lse_row0 = 0;  ///< backward only
};
CudnnRun cudnn_attention_forward_rows(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                                      Tensor& lse, const AttentionArgs& args, const CudnnRowWindow& window,
                                      const Stream& stream);
CudnnRun cudnn_attention_backward_rows(const Tensor& dout, const Tensor& q, const Tensor& k,
                                       const Tensor& v, const Tensor& out, const Tensor& lse,
                                       Tensor& dq, Tensor& dk, Tensor& dv, const AttentionArgs& args,
                                       const CudnnRowWindow& window, const Stream& stream);
}  // namespace megadlm::ops::cuda
