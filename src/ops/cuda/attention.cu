// CUDA entries of the attention family (cuda_ops.h, attention_impl.h): argument checks, scratch
// buffers from the stream-ordered pool, and the dispatch of each call to what the support table
// (ops/attention_support.h) chose: cuDNN (attention_cudnn.cpp), the flash kernels
// (attention_forward.cu, attention_backward.cu) or the simple ones (attention_simple.cu), with
// the own kernel as the fallback of a cuDNN call refused at run time. Which path runs is printed
// once per kind of call (stderr).
#include <climits>
#include <cstdio>
#include <mutex>
#include <set>
#include "core/cuda/cuda_utils.h"
#include "megadlm/ops/gemm.h"
#include "ops/attention_block_diffusion_bulk.h"
#include "ops/attention_support.h"
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
  if (is_block_diffusion(a.mask)) {
    s.bd_ranges = static_cast<const int32_t*>(a.block_ranges->data_ptr());
    s.bd_causal_clean = a.mask == AttentionMask::BlockDiffusionCausal;
    s.bd_strip = a.block_diffusion_strip ? static_cast<int>(a.block_diffusion_max_block) : 0;
  }
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
                        a.mask == AttentionMask::BlockDiffusion ? ", block diffusion" : "",
                        a.mask == AttentionMask::BlockDiffusionCausal ? ", block diffusion (causal clean half)" : "",
                        a.block_diffusion_strip ? ", strip" : "",
                        a.document_ids != nullptr ? ", packed documents" : "",
                        a.keys() != a.seq ? ", separate key length" : "",
                        a.key_document_ids != nullptr ? ", key documents" : "",
                        a.query_chunks.identity() && a.key_chunks.identity() ? "" : ", chunk maps",
                        a.dropout_p > 0 ? ", dropout" : "",
                        a.deterministic && direction[0] == 'b' ? ", deterministic" : "", ")");
}

ops::AttentionDeviceFacts device_facts() {
  return {.cuda = true, .cudnn_version = cudnn_runtime_version(), .batch_invariant = ops::batch_invariant(),
          .block_diffusion = ops::detail::block_diffusion_attention()};
}

ops::AttentionChoice choose(const AttentionArgs& a, bool backward,
                            ops::AttentionEntry entry = ops::AttentionEntry::Separate) {
  return ops::choose_attention(a, backward, device_facts(), entry);
}

AttentionKernel kernel_of(ops::AttentionImpl impl) {
  if (ops::is_cudnn(impl)) return AttentionKernel::Cudnn;
  return impl == ops::AttentionImpl::Flash || impl == ops::AttentionImpl::FlashKeyBlock
             ? AttentionKernel::Flash
             : AttentionKernel::Simple;
}

/// Runs the call the way the support table chose: `cudnn()` queues cuDNN's call (a CudnnRun),
/// `own(impl)` one of the own kernels. A cuDNN call refused at run time (an unaligned tensor, a
/// plan that does not build) runs the choice's fallback, or fails under --attention-backend cudnn.
template <typename Cudnn, typename Own>
void dispatch(const char* direction, const AttentionArgs& a, const ops::AttentionChoice& c,
              Cudnn&& cudnn, Own&& own) {
  MDLM_CHECK(c.error.empty(), "attention ", direction, ": ", c.error);
  const std::string kind = call_kind(direction, a);
  if (ops::is_cudnn(c.impl)) {
    const CudnnRun run = cudnn();
    if (run.ran) {
      note_once(kind + ": " + ops::attention_impl_name(c.impl) + " (" + c.reason + ")");
      return;
    }
    MDLM_CHECK(a.backend != AttentionBackend::Cudnn, "attention ", direction,
               ": --attention-backend cudnn (fused), but cuDNN cannot run this call: ", run.refusal,
               "; use --attention-backend auto or flash");
    note_once(kind + ": " + ops::attention_impl_name(c.fallback) + " (cuDNN: " + run.refusal + ")");
    own(c.fallback);
    return;
  }
  note_once(kind + ": " + ops::attention_impl_name(c.impl) + " (" + c.reason + ")");
  own(c.impl);
}

/// The own kernel that runs a call given a chosen AttentionKernel (the tests' hook): the
/// key-block variants for the context-parallel cases.
ops::AttentionImpl own_impl(const char* op, AttentionKernel kernel, const AttentionArgs& a,
                            bool backward) {
  if (!ops::needs_context_parallel_kernel(a))
    return kernel == AttentionKernel::Flash ? ops::AttentionImpl::Flash : ops::AttentionImpl::Simple;
  if (kernel == AttentionKernel::Simple) return ops::AttentionImpl::SimpleKeyBlock;
  MDLM_CHECK(choose(a, backward).impl == ops::AttentionImpl::FlashKeyBlock, op,
             ": the flash kernels run a separate key block (kv_seq, key_document_ids) only "
             "bidirectionally without dropout, for head_dim 64/128; this call needs the simple "
             "kernels");
  return ops::AttentionImpl::FlashKeyBlock;
}

void run_own_forward(ops::AttentionImpl impl, const Tensor& q, const Tensor& k, const Tensor& v,
                     Tensor& out, Tensor& lse, const AttentionArgs& args, const Stream& stream) {
  const char* op = "cuda::attention_forward";
  if (impl == ops::AttentionImpl::BlockDiffusionBulk) {  // pieces through the public ops
    ops::detail::block_diffusion_bulk_forward(q, k, v, out, lse, args, stream);
    return;
  }
  if (impl == ops::AttentionImpl::SimpleKeyBlock) {
    simple_attention_forward_key_block(q, k, v, out, lse, args, stream);
    return;
  }
  const AttentionKernel kernel = kernel_of(impl);
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

void run_own_backward(ops::AttentionImpl impl, const Tensor& dout, const Tensor& q,
                      const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                      Tensor& dq, Tensor& dk, Tensor& dv, const AttentionArgs& args,
                      const Stream& stream) {
  const char* op = "cuda::attention_backward";
  if (impl == ops::AttentionImpl::BlockDiffusionBulk) {
    ops::detail::block_diffusion_bulk_backward(dout, q, k, v, out, lse, dq, dk, dv, args, stream);
    return;
  }
  if (impl == ops::AttentionImpl::SimpleKeyBlock) {
    simple_attention_backward_key_block(dout, q, k, v, out, lse, dq, dk, dv, args, stream);
    return;
  }
  const AttentionKernel kernel = kernel_of(impl);
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

}  // namespace

AttentionKernel context_parallel_attention_kernel(const AttentionArgs& a, bool backward) {
  return kernel_of(choose(a, backward).impl);
}

AttentionKernel default_attention_kernel(const AttentionArgs& args) {
  AttentionArgs own = args;
  own.backend = AttentionBackend::Flash;
  return kernel_of(choose(own, false).impl);
}

void attention_forward_with(AttentionKernel kernel, const Tensor& q, const Tensor& k,
                            const Tensor& v, Tensor& out, Tensor& lse, const AttentionArgs& args,
                            const Stream& stream) {
  if (kernel == AttentionKernel::Cudnn) {
    AttentionArgs forced = args;
    forced.backend = AttentionBackend::Cudnn;
    cuda::attention_forward(q, k, v, out, lse, forced, stream);
    return;
  }
  run_own_forward(own_impl("cuda::attention_forward", kernel, args, false), q, k, v, out, lse,
                  args, stream);
}

void attention_backward_with(AttentionKernel kernel, const Tensor& dout, const Tensor& q,
                             const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                             Tensor& dq, Tensor& dk, Tensor& dv, const AttentionArgs& args,
                             const Stream& stream) {
  if (kernel == AttentionKernel::Cudnn) {
    AttentionArgs forced = args;
    forced.backend = AttentionBackend::Cudnn;
    cuda::attention_backward(dout, q, k, v, out, lse, dq, dk, dv, forced, stream);
    return;
  }
  run_own_backward(own_impl("cuda::attention_backward", kernel, args, true), dout, q, k, v, out,
                   lse, dq, dk, dv, args, stream);
}

bool attention_forward_packed(const Tensor& qk_rows, const Tensor& v_rows, Tensor& out, Tensor& lse,
                              const AttentionArgs& args, const Stream& stream) {
  const ops::AttentionChoice c = choose(args, false, ops::AttentionEntry::Packed);
  const std::string kind = call_kind("forward", args) + ", packed QKV: ";
  if (!c.packed_in_place) {
    note_once(kind + c.reason);
    return false;
  }
  const CudnnRun run = cudnn_attention_forward_packed(qk_rows, v_rows, out, lse, args, stream);
  note_once(kind + (run.ran ? std::string("cuDNN in place") : "split copies (cuDNN: " + run.refusal + ")"));
  return run.ran;
}

bool attention_backward_packed(const Tensor& dout, const Tensor& qk_rows, const Tensor& v_rows,
                               const Tensor& out, const Tensor& lse, Tensor& dqkv,
                               const AttentionArgs& args, const Stream& stream) {
  const ops::AttentionChoice c = choose(args, true, ops::AttentionEntry::Packed);
  const std::string kind = call_kind("backward", args) + ", packed QKV: ";
  if (!c.packed_in_place) {
    note_once(kind + c.reason);
    return false;
  }
  const CudnnRun run = cudnn_attention_backward_packed(dout, qk_rows, v_rows, out, lse, dqkv, args, stream);
  note_once(kind + (run.ran ? std::string("cuDNN in place")
                            : "split and concat copies (cuDNN: " + run.refusal + ")"));
  return run.ran;
}

bool attention_packed_reads_in_place(const AttentionArgs& args) {
  return choose(args, false, ops::AttentionEntry::Packed).packed_in_place &&
         choose(args, true, ops::AttentionEntry::Packed).packed_in_place;
}

namespace {

/// The window's tensors have the sizes ops/attention_rows.h promises; a window cuDNN may run.
bool check_window(const char* op, const AttentionArgs& a, const AttentionRowWindow& w,
                  std::initializer_list<std::pair<const Tensor*, bool>> whole_q_kv) {
  MDLM_CHECK(a.seq > 0 && w.rows >= a.seq && w.q_row0 >= 0 && w.kv_row0 >= 0 && w.q_row0 + a.seq <= w.rows &&
                 w.kv_row0 + a.seq <= w.rows && a.keys() == a.seq,
             op, ": rows [", w.q_row0, ", +", a.seq, ") and [", w.kv_row0, ", +", a.seq, ") outside ", w.rows,
             " rows");
  for (const auto& [t, is_q] : whole_q_kv)
    check_tensor(op, *t, DType::BF16, a.batch * w.rows * (is_q ? a.num_heads : a.num_kv_heads) * a.head_dim,
                 is_q ? "a query-side tensor" : "a key-side tensor");
  return true;
}

}  // namespace

bool attention_forward_rows(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                            const AttentionArgs& args, const AttentionRowWindow& w,
                            const Stream& stream) {
  const char* op = "cuda::attention_forward_rows";
  check_window(op, args, w, {{&q, true}, {&k, false}, {&v, false}});
  check_tensor(op, out, DType::BF16, args.batch * args.seq * args.num_heads * args.head_dim, "out");
  check_tensor(op, lse, DType::F32, args.batch * args.num_heads * args.seq, "lse");
  const ops::AttentionChoice c = choose(args, false);
  const std::string kind = call_kind("forward", args) + ", row window: ";
  if (c.impl != ops::AttentionImpl::CudnnDense) {
    note_once(kind + "copies (" + c.reason + ")");
    return false;
  }
  const CudnnRun run = cudnn_attention_forward_rows(q, k, v, out, lse, args,
                                                    {.rows = w.rows, .q_row0 = w.q_row0, .kv_row0 = w.kv_row0},
                                                    stream);
  note_once(run.ran ? megadlm::detail::concat(kind, "cuDNN in place (", c.reason, ")")
                     : megadlm::detail::concat(kind, "copies (cuDNN: ", run.refusal, ")"));
  return run.ran;
}

bool attention_backward_rows(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& out, const Tensor& lse, Tensor& dq, Tensor& dk, Tensor& dv,
                             const AttentionArgs& args, const AttentionRowWindow& w,
                             const Stream& stream) {
  const char* op = "cuda::attention_backward_rows";
  check_window(op, args, w, {{&dout, true}, {&q, true}, {&out, true}, {&k, false}, {&v, false}});
  check_tensor(op, lse, DType::F32, args.batch * args.num_heads * w.rows, "lse");
  check_tensor(op, dq, DType::BF16, args.batch * args.seq * args.num_heads * args.head_dim, "dq");
  check_tensor(op, dk, DType::BF16, args.batch * args.seq * args.num_kv_heads * args.head_dim, "dk");
  check_tensor(op, dv, DType::BF16, args.batch * args.seq * args.num_kv_heads * args.head_dim, "dv");
  const ops::AttentionChoice c = choose(args, true);
  const std::string kind = call_kind("backward", args) + ", row window: ";
  if (c.impl != ops::AttentionImpl::CudnnDense) {
    note_once(kind + "copies (" + c.reason + ")");
    return false;
  }
  // The statistics are read in place as the window [q_row0, q_row0 + seq) of lse's rows when
  // that is 16-byte aligned (cuDNN's tensors are declared so) and cuDNN builds a plan for the
  // window's head stride; otherwise (the clean bulk's column L + 1; a refused plan) that window
  // alone is copied: B * Hq * seq floats, 2 / D of q's window in bytes. The other tensors
  // stay in place either way.
  const CudnnRowWindow cw{.rows = w.rows, .q_row0 = w.q_row0, .kv_row0 = w.kv_row0, .lse_rows = w.rows,
                          .lse_row0 = w.q_row0};
  CudnnRun run;
  if (reinterpret_cast<uintptr_t>(static_cast<const float*>(lse.data_ptr()) + w.q_row0) % 16 == 0) {
    run = cudnn_attention_backward_rows(dout, q, k, v, out, lse, dq, dk, dv, args, cw, stream);
    if (run.ran) {
      note_once(megadlm::detail::concat(kind, "cuDNN in place (", c.reason, ")"));
      return true;
    }
  }
  const int64_t bh = args.batch * args.num_heads;
  Tensor lse_copy = Tensor::empty({bh * args.seq, 1}, DType::F32, stream);
  copy_rows_between_batch_rows(lse.view({bh * w.rows, 1}), w.q_row0, lse_copy, 0, bh, args.seq, stream);
  CudnnRowWindow copied = cw;
  copied.lse_rows = args.seq;
  copied.lse_row0 = 0;
  const std::string why_copied =
      run.refusal.empty() ? std::string("not 16-byte aligned") : megadlm::detail::concat("cuDNN: ", run.refusal);
  run = cudnn_attention_backward_rows(dout, q, k, v, out, lse_copy, dq, dk, dv, args, copied, stream);
  note_once(run.ran ? megadlm::detail::concat(kind, "cuDNN in place, lse window copied (", why_copied, ") (",
                                              c.reason, ")")
                    : megadlm::detail::concat(kind, "copies (cuDNN: ", run.refusal, ")"));
  return run.ran;
}

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                       const AttentionArgs& args, const Stream& stream) {
  dispatch("forward", args, choose(args, false),
           [&] { return cudnn_attention_forward(q, k, v, out, lse, args, stream); },
           [&](ops::AttentionImpl impl) { run_own_forward(impl, q, k, v, out, lse, args, stream); });
}

void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, Tensor& dq, Tensor& dk, Tensor& dv,
                        const AttentionArgs& args, const Stream& stream) {
  dispatch("backward", args, choose(args, true),
           [&] { return cudnn_attention_backward(dout, q, k, v, out, lse, dq, dk, dv, args, stream); },
           [&](ops::AttentionImpl impl) {
             run_own_backward(impl, dout, q, k, v, out, lse, dq, dk, dv, args, stream);
           });
}

}  // namespace megadlm::ops::cuda
