// CUDA entries of the attention family (cuda_ops.h, attention_impl.h): argument checks, scratch
// buffers from the stream-ordered pool, and the choice between cuDNN (attention_cudnn.cpp), the
// flash kernels (attention_forward.cu, attention_backward.cu) and the simple ones
// (attention_simple.cu), for the ordinary entries and for the context-parallel ones (a separate
// key block: context_parallel_attention_kernel). Which path runs is printed once per kind of call
// (stderr).
#include <climits>
#include <cstdio>
#include <mutex>
#include <set>
#include "core/cuda/cuda_utils.h"
#include "ops/cuda/attention_common.cuh"
#include "ops/cuda/attention_cudnn.h"
#include "ops/cuda/attention_impl.h"
#include "ops/cuda/cuda_ops.h"

namespace megadlm::ops::cuda {
namespace {

constexpr int kSimpleMaxHeadDim = 256;

attn::Shape shape_of(const AttentionArgs& a) {
  attn::Shape s{a.batch,
          a.seq,
          a.num_heads,
          a.num_kv_heads,
          static_cast<int>(a.head_dim),
          a.mask == AttentionMask::Causal,
          a.softmax_scale,
          ops::detail::AttentionDropoutMask::from_args(a),
          a.document_ids != nullptr ? static_cast<const int32_t*>(a.document_ids->data_ptr()) : nullptr};
  // The keys: the queries' own rows unless kv_seq or key_document_ids say otherwise.
  s.kv_seq = a.keys();
  if (a.key_document_ids != nullptr)
    s.key_docs = static_cast<const int32_t*>(a.key_document_ids->data_ptr());
  return s;
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
  MDLM_CHECK(a.seq < INT_MAX / 2 && a.keys() < INT_MAX / 2 &&
                 a.num_heads * a.head_dim * 128 < INT_MAX,
             op, ": seq ", a.seq, ", kv_seq ", a.keys(), " or heads x head_dim ", a.num_heads, " x ", a.head_dim,
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

const char* kernel_label(AttentionKernel k) {
  switch (k) {
    case AttentionKernel::Flash: return "megadlm flash kernels";
    case AttentionKernel::Simple: return "megadlm simple kernels";
    case AttentionKernel::Cudnn: return "cuDNN fused attention";
  }
  return "?";
}

/// Prints a line the first time it is seen in the process (which path a kind of call takes).
void note_once(const std::string& line) {
  static std::mutex mutex;
  static std::set<std::string> seen;
  std::lock_guard<std::mutex> lock(mutex);
  if (seen.insert(line).second) std::fprintf(stderr, "megadlm: %s\n", line.c_str());
}

std::string call_kind(const char* direction, const AttentionArgs& a) {
  return megadlm::detail::concat("attention ", direction, " (head_dim ", a.head_dim,
                        a.num_heads != a.num_kv_heads ? ", GQA" : "",
                        a.mask == AttentionMask::Causal ? ", causal" : "",
                        a.document_ids != nullptr ? ", packed documents" : "",
                        a.keys() != a.seq ? ", separate key length" : "",
                        a.key_document_ids != nullptr ? ", key documents" : "",
                        a.query_chunks.identity() && a.key_chunks.identity() ? "" : ", chunk maps",
                        a.dropout_p > 0 ? ", dropout" : "",
                        a.deterministic && direction[0] == 'b' ? ", deterministic" : "", ")");
}

/// Runs cuDNN unless the backend is Flash; true when it ran. A refusal is an error for the
/// Cudnn backend and a logged fallback for Auto.
template <typename Call>
bool try_cudnn(const char* direction, const AttentionArgs& a, Call&& call) {
  if (a.backend == AttentionBackend::Flash) return false;
  const CudnnRun run = call();
  if (run.ran) {
    note_once(call_kind(direction, a) + ": " + kernel_label(AttentionKernel::Cudnn) + " (" +
              cudnn_attention_version() + ")");
    return true;
  }
  MDLM_CHECK(a.backend != AttentionBackend::Cudnn, "attention ", direction,
             ": --attention-backend cudnn (fused), but cuDNN cannot run this call: ", run.refusal,
             "; use --attention-backend auto or flash");
  note_once(call_kind(direction, a) + ": " + kernel_label(default_attention_kernel(a)) +
            " (cuDNN: " + run.refusal + ")");
  return false;
}

}  // namespace

/// Whether the flash backward runs a separate key block (attention_backward.cu: kKeys).
constexpr bool kFlashBackwardKeyBlocks = true;

AttentionKernel context_parallel_attention_kernel(const AttentionArgs& a, bool backward) {
  // The flash kernels take a separate key length and the keys' own documents (kKeys), but their
  // causal mask and dropout coordinates are local positions: calls with a causal mask or dropout
  // here need the chunk maps (or keys at other positions), which only the simple kernels apply.
  // A separate key length with document_ids needs the keys' own ids.
  const bool flash = (a.head_dim == 64 || a.head_dim == 128) && a.mask == AttentionMask::None &&
                     a.dropout_p == 0.0f &&
                     (a.document_ids == nullptr || a.key_document_ids != nullptr ||
                      a.keys() == a.seq);
  if (backward && !kFlashBackwardKeyBlocks) return AttentionKernel::Simple;
  return flash ? AttentionKernel::Flash : AttentionKernel::Simple;
}

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
  if (kernel == AttentionKernel::Cudnn) {
    AttentionArgs forced = args;
    forced.backend = AttentionBackend::Cudnn;
    try_cudnn("forward", forced, [&] { return cudnn_attention_forward(q, k, v, out, lse, forced, stream); });
    return;
  }
  // A call of the context-parallel entries: the simple kernels' key-block path, or the flash
  // kernels where they run it exactly.
  const bool key_block = ops::needs_context_parallel_kernel(args);
  if (key_block && kernel == AttentionKernel::Simple) {
    simple_attention_forward_key_block(q, k, v, out, lse, args, stream);
    return;
  }
  MDLM_CHECK(!key_block || context_parallel_attention_kernel(args, false) == AttentionKernel::Flash,
             op, ": the flash kernels run a separate key block (kv_seq, key_document_ids) only "
             "bidirectionally without dropout, for head_dim 64/128; this call needs the simple "
             "kernels");
  check_args(op, kernel, args);
  const int64_t q_numel = args.batch * args.seq * args.num_heads * args.head_dim;
  const int64_t kv_numel = args.batch * args.keys() * args.num_kv_heads * args.head_dim;
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
  if (kernel == AttentionKernel::Cudnn) {
    AttentionArgs forced = args;
    forced.backend = AttentionBackend::Cudnn;
    try_cudnn("backward", forced, [&] {
      return cudnn_attention_backward(dout, q, k, v, out, lse, dq, dk, dv, forced, stream);
    });
    return;
  }
  const bool key_block = ops::needs_context_parallel_kernel(args);
  if (key_block && kernel == AttentionKernel::Simple) {
    simple_attention_backward_key_block(dout, q, k, v, out, lse, dq, dk, dv, args, stream);
    return;
  }
  MDLM_CHECK(!key_block || context_parallel_attention_kernel(args, true) == AttentionKernel::Flash,
             op, ": the flash backward runs a separate key block (kv_seq, key_document_ids) only "
             "bidirectionally without dropout, for head_dim 64/128; this call needs the simple "
             "kernels");
  check_args(op, kernel, args);
  const int64_t q_numel = args.batch * args.seq * args.num_heads * args.head_dim;
  const int64_t kv_numel = args.batch * args.keys() * args.num_kv_heads * args.head_dim;
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
  // Deterministic: one dQ slab per 128-key tile (attention_common.cuh), ceil(S / 128) times the
  // accumulator's memory; the simple kernels need none (no atomics).
  const int64_t slab = args.batch * args.seq * args.num_heads * args.head_dim;
  const int slabs = args.deterministic ? static_cast<int>((args.keys() + 127) / 128) : 1;
  if (kernel == AttentionKernel::Flash) {
    dq_accum = Tensor::empty({slabs * args.batch, args.seq, args.num_heads, args.head_dim},
                             DType::F32, stream);
  }
  attn::BackwardPtrs p{ptr<const attn::bf16>(dout),
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
  if (kernel == AttentionKernel::Flash && slabs > 1) {
    p.dq_slab_stride = slab;
    p.dq_slabs = slabs;
  }
  if (kernel == AttentionKernel::Flash) {
    check_aligned(op, {&dout, &q, &k, &v, &out, &dq, &dk, &dv});
    attn::flash_backward(shape_of(args), p, st);
  } else {
    attn::simple_backward(shape_of(args), p, st);
  }
}

void attention_forward_context_parallel(const Tensor& q, const Tensor& k, const Tensor& v,
                                        Tensor& out, Tensor& lse, const AttentionArgs& args,
                                        const Stream& stream) {
  const AttentionKernel kernel = context_parallel_attention_kernel(args, false);
  note_once(call_kind("forward", args) + ": " + kernel_label(kernel) + " (context-parallel entry)");
  attention_forward_with(kernel, q, k, v, out, lse, args, stream);
}

void attention_backward_context_parallel(const Tensor& dout, const Tensor& q, const Tensor& k,
                                         const Tensor& v, const Tensor& out, const Tensor& lse,
                                         Tensor& dq, Tensor& dk, Tensor& dv,
                                         const AttentionArgs& args, const Stream& stream) {
  const AttentionKernel kernel = context_parallel_attention_kernel(args, true);
  note_once(call_kind("backward", args) + ": " + kernel_label(kernel) + " (context-parallel entry)");
  attention_backward_with(kernel, dout, q, k, v, out, lse, dq, dk, dv, args, stream);
}

bool attention_forward_packed(const Tensor& qk_rows, const Tensor& v_rows, Tensor& out, Tensor& lse,
                              const AttentionArgs& args, const Stream& stream) {
  if (args.backend == AttentionBackend::Flash) return false;
  const CudnnRun run = cudnn_attention_forward_packed(qk_rows, v_rows, out, lse, args, stream);
  note_once(call_kind("forward", args) + ", packed QKV: " +
            (run.ran ? std::string("cuDNN in place") : "split copies (cuDNN: " + run.refusal + ")"));
  return run.ran;
}

bool attention_backward_packed(const Tensor& dout, const Tensor& qk_rows, const Tensor& v_rows,
                               const Tensor& out, const Tensor& lse, Tensor& dqkv,
                               const AttentionArgs& args, const Stream& stream) {
  if (args.backend == AttentionBackend::Flash) return false;
  const CudnnRun run = cudnn_attention_backward_packed(dout, qk_rows, v_rows, out, lse, dqkv, args, stream);
  note_once(call_kind("backward", args) + ", packed QKV: " +
            (run.ran ? std::string("cuDNN in place") : "split and concat copies (cuDNN: " + run.refusal + ")"));
  return run.ran;
}

bool attention_packed_reads_in_place(const AttentionArgs& args) {
  return args.backend != AttentionBackend::Flash && cudnn_attention_packed_refusal(args).empty();
}

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                       const AttentionArgs& args, const Stream& stream) {
  if (try_cudnn("forward", args, [&] { return cudnn_attention_forward(q, k, v, out, lse, args, stream); }))
    return;
  if (args.backend == AttentionBackend::Flash)
    note_once(call_kind("forward", args) + ": " + kernel_label(default_attention_kernel(args)) +
              " (--attention-backend flash)");
  attention_forward_with(default_attention_kernel(args), q, k, v, out, lse, args, stream);
}

void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, Tensor& dq, Tensor& dk, Tensor& dv,
                        const AttentionArgs& args, const Stream& stream) {
  if (try_cudnn("backward", args, [&] {
        return cudnn_attention_backward(dout, q, k, v, out, lse, dq, dk, dv, args, stream);
      }))
    return;
  if (args.backend == AttentionBackend::Flash)
    note_once(call_kind("backward", args) + ": " + kernel_label(default_attention_kernel(args)) +
              " (--attention-backend flash)");
  attention_backward_with(default_attention_kernel(args), dout, q, k, v, out, lse, dq, dk, dv,
                          args, stream);
}

}  // namespace megadlm::ops::cuda
