// CUDA entries of the attention family (cuda_ops.h, attention_impl.h): argument checks, scratch
// buffers from the stream-ordered pool, and the choice between the flash kernels
// (attention_forward.cu, attention_backward.cu) and the simple ones (attention_simple.cu).
#include <climits>
#include "core/cuda/cuda_utils.h"
#include "ops/cuda/attention_common.cuh"
#include "ops/cuda/attention_impl.h"
#include "ops/cuda/cuda_ops.h"

namespace megadlm::ops::cuda {
namespace {

constexpr int kSimpleMaxHeadDim = 256;

attn::Shape shape_of(const AttentionArgs& a) {
  return {a.batch,
          a.seq,
          a.num_heads,
          a.num_kv_heads,
          static_cast<int>(a.head_dim),
          a.mask == AttentionMask::Causal,
          a.softmax_scale,
          ops::detail::AttentionDropoutMask::from_args(a),
          a.document_ids != nullptr ? static_cast<const int32_t*>(a.document_ids->data_ptr()) : nullptr};
}

void check_tensor(const char* op, const Tensor& t, DType dtype, int64_t numel, const char* what) {
  MDLM_CHECK(t.defined() && t.is_cuda() && t.dtype() == dtype && t.numel() == numel, op, ": ",
             what, " must be a CUDA ", dtype_name(dtype), " tensor of ", numel, " elements, got ",
             t.defined() ? t.str() : std::string("undefined"));
}

void check_args(const char* op, AttentionKernel kernel, const AttentionArgs& a) {
  MDLM_CHECK(a.batch > 0 && a.seq > 0 && a.num_heads > 0 && a.num_kv_heads > 0 &&
                 a.num_heads % a.num_kv_heads == 0 && a.softmax_scale > 0,
             op, ": invalid attention arguments");
  // Positions inside a sequence and offsets inside a tile are 32-bit in the kernels.
  MDLM_CHECK(a.seq < INT_MAX / 2 && a.num_heads * a.head_dim * 128 < INT_MAX, op,
             ": seq ", a.seq, " or heads x head_dim ", a.num_heads, " x ", a.head_dim,
             " too large for the CUDA kernels");
  MDLM_CHECK(a.batch <= 65535 && a.num_heads <= 65535, op, ": batch ", a.batch, " and heads ",
             a.num_heads, " must be <= 65535 (grid dimensions)");
  MDLM_CHECK(a.dropout_p >= 0.0f && a.dropout_p < 1.0f, op, ": dropout_p ", a.dropout_p,
             " must be in [0, 1)");
  if (kernel == AttentionKernel::Flash) {
    MDLM_CHECK(a.head_dim == 64 || a.head_dim == 128, op,
               ": the flash kernels support head_dim 64 and 128, got ", a.head_dim);
    // A thread's Philox call covers four consecutive keys from a tile start (attention_common.cuh).
    MDLM_CHECK(a.dropout_p == 0.0f || a.key_offset % 4 == 0, op,
               ": attention dropout in the flash kernels needs key_offset % 4 == 0, got ",
               a.key_offset);
  } else {
    MDLM_CHECK(a.head_dim <= kSimpleMaxHeadDim, op, ": CUDA attention supports head_dim <= ",
               kSimpleMaxHeadDim, ", got ", a.head_dim, " (--kv-channels)");
  }
}

/// The flash kernels use 16-byte vector accesses (cp.async, output stores, dq atomics).
void check_aligned(const char* op, std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors) {
    MDLM_CHECK(reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0, op, ": ", t->str(),
               " is not 16-byte aligned (a view at an odd offset?)");
  }
}

template <typename T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

}  // namespace

AttentionKernel default_attention_kernel(const AttentionArgs& args) {
  // Packed documents (document_ids) run on the flash kernels too: each query tile visits only
  // the key tiles of its documents (docs/kernels/attention.md).
  return args.head_dim == 64 || args.head_dim == 128 ? AttentionKernel::Flash
                                                     : AttentionKernel::Simple;
}

void attention_forward_with(AttentionKernel kernel, const Tensor& q, const Tensor& k,
                            const Tensor& v, Tensor& out, Tensor& lse, const AttentionArgs& args,
                            const Stream& stream) {
  const char* op = "cuda::attention_forward";
  check_args(op, kernel, args);
  const int64_t q_numel = args.batch * args.seq * args.num_heads * args.head_dim;
  const int64_t kv_numel = args.batch * args.seq * args.num_kv_heads * args.head_dim;
  check_tensor(op, q, DType::BF16, q_numel, "q");
  check_tensor(op, k, DType::BF16, kv_numel, "k");
  check_tensor(op, v, DType::BF16, kv_numel, "v");
  check_tensor(op, out, DType::BF16, q_numel, "out");
  check_tensor(op, lse, DType::F32, args.batch * args.num_heads * args.seq, "lse");
  const cudaStream_t st = megadlm::detail::native_stream(stream);
  const attn::ForwardPtrs p{ptr<const attn::bf16>(q), ptr<const attn::bf16>(k),
                            ptr<const attn::bf16>(v), ptr<attn::bf16>(out), ptr<float>(lse)};
  if (kernel == AttentionKernel::Flash) {
    check_aligned(op, {&q, &k, &v, &out});
    attn::flash_forward(shape_of(args), p, st);
  } else {
    attn::simple_forward(shape_of(args), p, st);
  }
}

void attention_backward_with(AttentionKernel kernel, const Tensor& dout, const Tensor& q,
                             const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                             Tensor& dq, Tensor& dk, Tensor& dv, const AttentionArgs& args,
                             const Stream& stream) {
  const char* op = "cuda::attention_backward";
  check_args(op, kernel, args);
  const int64_t q_numel = args.batch * args.seq * args.num_heads * args.head_dim;
  const int64_t kv_numel = args.batch * args.seq * args.num_kv_heads * args.head_dim;
  check_tensor(op, dout, DType::BF16, q_numel, "dout");
  check_tensor(op, q, DType::BF16, q_numel, "q");
  check_tensor(op, k, DType::BF16, kv_numel, "k");
  check_tensor(op, v, DType::BF16, kv_numel, "v");
  check_tensor(op, out, DType::BF16, q_numel, "out");
  check_tensor(op, lse, DType::F32, args.batch * args.num_heads * args.seq, "lse");
  check_tensor(op, dq, DType::BF16, q_numel, "dq");
  check_tensor(op, dk, DType::BF16, kv_numel, "dk");
  check_tensor(op, dv, DType::BF16, kv_numel, "dv");
  const cudaStream_t st = megadlm::detail::native_stream(stream);
  // Scratch from the stream-ordered pool; freed (stream-ordered) when these go out of scope,
  // after the kernels queued below.
  Tensor delta = Tensor::empty({args.batch, args.num_heads, args.seq}, DType::F32, stream);
  Tensor dq_accum;
  if (kernel == AttentionKernel::Flash) {
    dq_accum = Tensor::empty({args.batch, args.seq, args.num_heads, args.head_dim}, DType::F32,
                             stream);
  }
  const attn::BackwardPtrs p{ptr<const attn::bf16>(dout),
                             ptr<const attn::bf16>(q),
                             ptr<const attn::bf16>(k),
                             ptr<const attn::bf16>(v),
                             ptr<const attn::bf16>(out),
                             ptr<const float>(lse),
                             ptr<attn::bf16>(dq),
                             ptr<attn::bf16>(dk),
                             ptr<attn::bf16>(dv),
                             ptr<float>(delta),
                             dq_accum.defined() ? ptr<float>(dq_accum) : nullptr};
  if (kernel == AttentionKernel::Flash) {
    check_aligned(op, {&dout, &q, &k, &v, &out, &dq, &dk, &dv});
    attn::flash_backward(shape_of(args), p, st);
  } else {
    attn::simple_backward(shape_of(args), p, st);
  }
}

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                       const AttentionArgs& args, const Stream& stream) {
  attention_forward_with(default_attention_kernel(args), q, k, v, out, lse, args, stream);
}

void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, Tensor& dq, Tensor& dk, Tensor& dv,
                        const AttentionArgs& args, const Stream& stream) {
  attention_backward_with(default_attention_kernel(args), dout, q, k, v, out, lse, dq, dk, dv,
                          args, stream);
}

}  // namespace megadlm::ops::cuda
