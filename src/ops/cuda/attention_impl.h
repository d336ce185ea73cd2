// Internal: the CUDA implementations of the attention family, selectable by name so the GPU
// parity test can run each on one shape. Plain C++ (no CUDA headers) so tests can include it.
// cuda::attention_forward/backward (cuda_ops.h) run what the support table chose
// (ops/attention_support.h; AttentionArgs::backend: Auto takes cuDNN where it runs the arguments,
// else AttentionKernel::Flash for head_dim 64 and 128 and AttentionKernel::Simple otherwise).
// See docs/kernels/attention.md.
#pragma once
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"
#include "megadlm/ops/attention.h"

namespace megadlm::ops::cuda {

enum class AttentionKernel : uint8_t {
  Flash,   ///< tensor-core flash attention (bf16 mma.sync, fp32 softmax); head_dim 64 or 128
  Simple,  ///< one warp per query (forward, dq) or key row (dk, dv), fp32 on CUDA cores; D <= 256
  Cudnn,   ///< cuDNN's fused attention (attention_cudnn.h); an error where cuDNN refuses
};

/// The own kernel (Flash or Simple) for these arguments: the fallback of the cuDNN path (the
/// support table's choice under AttentionBackend::Flash).
AttentionKernel default_attention_kernel(const AttentionArgs& args);

/// Same contract as ops::attention_forward (bf16 q, k, v, out; f32 lse) with a chosen kernel.
void attention_forward_with(AttentionKernel kernel, const Tensor& q, const Tensor& k,
                            const Tensor& v, Tensor& out, Tensor& lse, const AttentionArgs& args,
                            const Stream& stream);

/// Same contract as ops::attention_backward (bf16 tensors, f32 lse) with a chosen kernel.
void attention_backward_with(AttentionKernel kernel, const Tensor& dout, const Tensor& q,
                             const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                             Tensor& dq, Tensor& dk, Tensor& dv, const AttentionArgs& args,
                             const Stream& stream);

/// The own kernel that runs a context-parallel call (ops::needs_context_parallel_kernel; the
/// support table's FlashKeyBlock / SimpleKeyBlock): Flash for head_dim 64/128 when the keys are
/// only a separate block (kv_seq != seq and/or key_document_ids) without causal mask and dropout
/// (the cases with chunk maps in the mask or the dropout coordinates stay Simple); Simple
/// otherwise. `backward`: the same for the backward pass.
AttentionKernel context_parallel_attention_kernel(const AttentionArgs& args, bool backward);

/// The simple kernels on any call of the context-parallel entries (attention_simple.cu): a
/// separate key length, key documents, chunk maps in the causal mask and in dropout.
void simple_attention_forward_key_block(const Tensor& q, const Tensor& k, const Tensor& v,
                                        Tensor& out, Tensor& lse, const AttentionArgs& args,
                                        const Stream& stream);
void simple_attention_backward_key_block(const Tensor& dout, const Tensor& q, const Tensor& k,
                                         const Tensor& v, const Tensor& out, const Tensor& lse,
                                         Tensor& dq, Tensor& dk, Tensor& dv,
                                         const AttentionArgs& args, const Stream& stream);

}  // namespace megadlm::ops::cuda
