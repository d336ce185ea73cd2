// GPU parity of the attention family: the CUDA kernels (flash for head_dim 64/128, and the simple
// warp-per-row path as a second opinion) against the CPU f32 reference on the same bf16-rounded
// inputs, for out, lse, dq, dk, dv; plus a throughput report. Every test skips without a GPU.
// The largest errors per case are printed for the project notes (docs/kernels/attention.md).
// Attention dropout: the same comparison with p = 0.1 and nonzero global offsets, and an exact
// check of which elements each kernel drops (one-hot V and dO expose P * Z element by element).
#include <gtest/gtest.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <vector>
#include "megadlm/ops/attention.h"
#include "megadlm/ops/elementwise.h"
#include "ops/attention_dropout_mask.h"
#include "parity.h"
#include "support/attention_cases.h"
#include "support/op_testing.h"
#include "support/tolerances.h"
// The one place this suite touches the CUDA backend directly: selecting the simple kernel by
// name and timing with CUDA events. Every test using it starts with MDLM_REQUIRE_GPU().
#if MEGADLM_WITH_CUDA
#include <cuda_runtime.h>
#include "ops/cuda/attention_cudnn.h"
#include "ops/cuda/attention_impl.h"
#endif

using namespace megadlm;
using megadlm::ops::AttentionArgs;
using megadlm::ops::AttentionMask;

namespace {

// dq and dk are identically zero when S = 1 (one key: dS = dP - delta = 0 exactly); the CPU
// reference is then exactly 0 while the GPU computes dP and delta in different orders (~1e-7).
// Relative errors are taken against max(||ref||, kAbsFloor * sqrt(n)): unchanged for every
// nonzero reference here (gradients are O(1e-2..1) per element), an absolute per-element bound
// of kAbsFloor * kBf16ParityRelL2 for a zero one.
constexpr double kAbsFloor = 1e-3;

double rel_l2_floored(const std::vector<double>& a, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < ref.size(); ++i) {
    if (std::isnan(a[i]) != std::isnan(ref[i])) return INFINITY;
    num += (a[i] - ref[i]) * (a[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  EXPECT_EQ(a.size(), ref.size());
  const double floor = kAbsFloor * std::sqrt(static_cast<double>(ref.size()));
  return std::sqrt(num) / std::max(std::sqrt(den), floor);
}

using Case = test::AttentionCase;
using Dropout = test::AttentionDropout;
using test::kv_shape;
using test::lse_shape;
using test::name_of;
using test::q_shape;

/// Document ids of packed rows, non-decreasing along each row as the op requires.
/// Dropout::document_pattern picks the packing:
///  0: documents of 1, 5, 13, 2, ... tokens (a fixed irregular pattern, shifted per batch row);
///  1: edge cases by batch row b % 3: every document of length 1; the whole row one document;
///     long and length-1 documents that straddle the flash tiles (ids from 100, gaps in the ids);
///  2: many short documents (5..70 tokens), for long rows.
std::vector<int32_t> packed_documents(int64_t batch, int64_t seq, int pattern = 0) {
  const std::vector<int> irregular = {1, 5, 13, 2, 31, 7, 64, 3, 40};
  const std::vector<int> straddling = {1, 127, 1, 1, 129, 64, 33, 1, 200};
  const std::vector<int> short_docs = {16, 48, 9, 32, 70, 5, 24, 61, 11};
  std::vector<int32_t> ids;
  for (int64_t b = 0; b < batch; ++b) {
    if (pattern == 1 && b % 3 != 2) {
      for (int64_t i = 0; i < seq; ++i) ids.push_back(b % 3 == 0 ? static_cast<int32_t>(i) : 7);
      continue;
    }
    const std::vector<int>& lengths =
        pattern == 0 ? irregular : pattern == 1 ? straddling : short_docs;
    const int32_t step = pattern == 1 ? 3 : 1;  // ids need not be consecutive
    int32_t doc = 0, id = pattern == 1 ? 100 : 0;
    int64_t left = lengths[b % lengths.size()];
    for (int64_t i = 0; i < seq; ++i) {
      if (left == 0) {
        left = lengths[(b + ++doc) % lengths.size()];
        id += step;
      }
      ids.push_back(id);
      --left;
    }
  }
  return ids;
}

AttentionArgs args_of(const Case& c, const Dropout& d = {}) {
  return test::attention_args(c, d, 0x0123456789abcdefull, 5);
}

/// A device buffer full of NaN: any element a kernel does not write fails the comparison.
Tensor poisoned(const Shape& shape, DType dtype, const Stream& cuda) {
  return Tensor::from_floats(std::vector<float>(static_cast<size_t>(shape_numel(shape)),
                                                std::numeric_limits<float>::quiet_NaN()),
                             shape, dtype)
      .to(Device::cuda(0), cuda);
}

/// Default: the public op with --attention-backend auto (cuDNN where it runs the call, else
/// flash for head_dim 64/128 and simple otherwise). Cudnn: cuDNN forced (a refusal fails the
/// test), packed rows with document_starts; CudnnHostStarts: the same without document_starts
/// (cuDNN derives them from document_ids on the host).
enum class Kernel { Default, Simple, Flash, Cudnn, CudnnHostStarts };

const char* kernel_name(Kernel k, const Case&) {
  switch (k) {
    case Kernel::Simple: return "simple";
    case Kernel::Flash: return "flash";
    case Kernel::Cudnn: return "cudnn";
    case Kernel::CudnnHostStarts: return "cudnn-h";
    default: return "auto";
  }
}

bool is_cudnn(Kernel k) { return k == Kernel::Cudnn || k == Kernel::CudnnHostStarts; }

/// The flat token index where each document of packed rows starts, then B * S (the
/// document_starts contract of include/megadlm/ops/attention.h).
std::vector<int32_t> document_starts_of(const std::vector<int32_t>& ids, int64_t batch, int64_t seq) {
  std::vector<int32_t> starts;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < seq; ++i) {
      const size_t t = static_cast<size_t>(b * seq + i);
      if (i == 0 || ids[t] != ids[t - 1]) starts.push_back(static_cast<int32_t>(t));
    }
  starts.push_back(static_cast<int32_t>(batch * seq));
  return starts;
}

/// Why this build or machine cannot run the cuDNN cases (empty: it can).
std::string cudnn_unavailable() {
#if MEGADLM_WITH_CUDA
  const Case c{1, 64, 2, 2, 64, AttentionMask::None};
  return ops::cuda::cudnn_attention_unsupported(test::attention_args(c, {}, 1, 0), true);
#else
  return "built without CUDA";
#endif
}

#define MDLM_REQUIRE_CUDNN()                                                    \
  do {                                                                          \
    MDLM_REQUIRE_GPU();                                                         \
    if (const std::string why = cudnn_unavailable(); !why.empty())              \
      GTEST_SKIP() << "cuDNN attention not available: " << why;                 \
  } while (0)

struct Errors {
  double out = 0, lse = 0, dq = 0, dk = 0, dv = 0;
  void keep_max(const Errors& e) {
    out = std::max(out, e.out);
    lse = std::max(lse, e.lse);
    dq = std::max(dq, e.dq);
    dk = std::max(dk, e.dk);
    dv = std::max(dv, e.dv);
  }
};

// Inputs fresh per case (seeded by the case), bf16-rounded once on the host so the CPU f32
// reference and the CUDA kernels see identical numbers. q, k in [-2, 2): scores of std ~1.3, so
// softmax rows are peaked enough that a wrong key or a missed mask shows.
class AttentionCase {
 public:
  AttentionCase(const Case& c, uint64_t seed, const Stream& cuda, const Dropout& drop = {})
      : c_(c), drop_(drop), cuda_(cuda) {
    const Tensor q = test::random_tensor(q_shape(c), seed, DType::BF16, -2.0f, 2.0f);
    const Tensor k = test::random_tensor(kv_shape(c), seed + 1, DType::BF16, -2.0f, 2.0f);
    const Tensor v = test::random_tensor(kv_shape(c), seed + 2, DType::BF16);
    const Tensor dout = test::random_tensor(q_shape(c), seed + 3, DType::BF16);
    const Stream cpu = Stream::cpu();
    q32_ = q.to(Device::cpu(), DType::F32, cpu);
    k32_ = k.to(Device::cpu(), DType::F32, cpu);
    v32_ = v.to(Device::cpu(), DType::F32, cpu);
    dout32_ = dout.to(Device::cpu(), DType::F32, cpu);
    qd_ = q.to(Device::cuda(0), cuda);
    kd_ = k.to(Device::cuda(0), cuda);
    vd_ = v.to(Device::cuda(0), cuda);
    doutd_ = dout.to(Device::cuda(0), cuda);
    if (drop.documents) {
      const std::vector<int32_t> ids = packed_documents(c.batch, c.seq, drop.document_pattern);
      docs_cpu_ = Tensor::from_ints(ids, {c.batch, c.seq});
      docs_cuda_ = docs_cpu_.to(Device::cuda(0), cuda);
      const std::vector<int32_t> starts = document_starts_of(ids, c.batch, c.seq);
      starts_cuda_ = Tensor::from_ints(starts, {static_cast<int64_t>(starts.size())})
                         .to(Device::cuda(0), cuda);
    }
    // CPU f32 reference.
    AttentionArgs a = args_of(c, drop);
    if (drop.documents) a.document_ids = &docs_cpu_;
    Tensor out = Tensor::empty(q_shape(c), DType::F32, cpu);
    Tensor lse = Tensor::empty(lse_shape(c), DType::F32, cpu);
    ops::attention_forward(q32_, k32_, v32_, out, lse, a, cpu);
    Tensor dq = Tensor::empty(q_shape(c), DType::F32, cpu);
    Tensor dk = Tensor::empty(kv_shape(c), DType::F32, cpu);
    Tensor dv = Tensor::empty(kv_shape(c), DType::F32, cpu);
    ops::attention_backward(dout32_, q32_, k32_, v32_, out, lse, dq, dk, dv, a, cpu);
    ref_out_ = test::to_doubles(out);
    ref_lse_ = test::to_doubles(lse);
    ref_dq_ = test::to_doubles(dq);
    ref_dk_ = test::to_doubles(dk);
    ref_dv_ = test::to_doubles(dv);
  }

  /// Runs one kernel family; with `grads`, also returns the downloaded dq, dk, dv (in that
  /// order) for determinism checks.
  Errors run(Kernel kernel, bool deterministic = false,
             std::vector<std::vector<double>>* grads = nullptr) const {
    AttentionArgs a = args_of(c_, drop_);
    a.deterministic = deterministic;
    if (drop_.documents) a.document_ids = &docs_cuda_;
    if (drop_.documents && kernel == Kernel::Cudnn) a.document_starts = &starts_cuda_;
    Tensor out = poisoned(q_shape(c_), DType::BF16, cuda_);
    Tensor lse = poisoned(lse_shape(c_), DType::F32, cuda_);
    Tensor dq = poisoned(q_shape(c_), DType::BF16, cuda_);
    Tensor dk = poisoned(kv_shape(c_), DType::BF16, cuda_);
    Tensor dv = poisoned(kv_shape(c_), DType::BF16, cuda_);
    if (kernel == Kernel::Default) {
      ops::attention_forward(qd_, kd_, vd_, out, lse, a, cuda_);
      ops::attention_backward(doutd_, qd_, kd_, vd_, out, lse, dq, dk, dv, a, cuda_);
    } else {
#if MEGADLM_WITH_CUDA
      using ops::cuda::AttentionKernel;
      const AttentionKernel which = is_cudnn(kernel)         ? AttentionKernel::Cudnn
                                    : kernel == Kernel::Flash ? AttentionKernel::Flash
                                                              : AttentionKernel::Simple;
      ops::cuda::attention_forward_with(which, qd_, kd_, vd_, out, lse, a, cuda_);
      ops::cuda::attention_backward_with(which, doutd_, qd_, kd_, vd_, out, lse, dq, dk, dv, a,
                                         cuda_);
#endif
    }
    Errors e;
    e.out = test::rel_l2(test::to_doubles(out, cuda_), ref_out_);
    const std::vector<double> l = test::to_doubles(lse, cuda_);
    for (size_t i = 0; i < l.size(); ++i) {
      e.lse = std::max(e.lse, std::isnan(l[i]) ? INFINITY : std::fabs(l[i] - ref_lse_[i]));
    }
    std::vector<double> gq = test::to_doubles(dq, cuda_), gk = test::to_doubles(dk, cuda_),
                        gv = test::to_doubles(dv, cuda_);
    e.dq = rel_l2_floored(gq, ref_dq_);
    e.dk = rel_l2_floored(gk, ref_dk_);
    e.dv = rel_l2_floored(gv, ref_dv_);
    if (grads != nullptr) *grads = {std::move(gq), std::move(gk), std::move(gv)};
    return e;
  }

 private:
  Case c_;
  Dropout drop_;
  Stream cuda_;
  Tensor q32_, k32_, v32_, dout32_, qd_, kd_, vd_, doutd_, docs_cpu_, docs_cuda_, starts_cuda_;
  std::vector<double> ref_out_, ref_lse_, ref_dq_, ref_dk_, ref_dv_;
};

void check_cases(const std::vector<Case>& cases, const std::vector<Kernel>& kernels,
                 uint64_t seed, const Dropout& drop = {}) {
  const Stream cuda = Stream::create(Device::cuda(0));
  Errors worst;
  int ran = 0, skipped = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(name_of(c) + (drop.p > 0 ? " dropout " + std::to_string(drop.p) : ""));
    const AttentionCase ac(c, seed += 10, cuda, drop);
    for (Kernel k : kernels) {
      // cuDNN has no backward with one key (s = 1): auto falls back.
      if (is_cudnn(k) && c.seq == 1) {
        std::printf("[attention parity] %-36s %-6s skipped: cuDNN has no backward with one key\n",
                    name_of(c).c_str(), kernel_name(k, c));
        ++skipped;
        continue;
      }
      ++ran;
      SCOPED_TRACE(kernel_name(k, c));
      const Errors e = ac.run(k);
      std::printf("[attention parity] %-36s %-6s%s out %.2e lse %.2e dq %.2e dk %.2e dv %.2e\n",
                  name_of(c).c_str(), kernel_name(k, c), drop.p > 0 ? " drop" : "", e.out, e.lse,
                  e.dq, e.dk, e.dv);
      worst.keep_max(e);
      // bf16 outputs: relative L2 bound of tolerances.h (bf16 rounding of each output plus of
      // P and dS before the tensor-core products; fp32 accumulation in another order).
      EXPECT_LT(e.out, test::kBf16ParityRelL2);
      EXPECT_LT(e.lse, test::kLseMaxAbs);
      EXPECT_LT(e.dq, test::kBf16ParityRelL2);
      EXPECT_LT(e.dk, test::kBf16ParityRelL2);
      EXPECT_LT(e.dv, test::kBf16ParityRelL2);
    }
  }
  std::printf("[attention parity] worst over %zu cases (%d case x kernel runs, %d skipped): out "
              "%.2e lse %.2e dq %.2e dk %.2e dv %.2e\n",
              cases.size(), ran, skipped, worst.out, worst.lse, worst.dq, worst.dk, worst.dv);
}

}  // namespace

TEST(AttentionParity, FlashAndSimpleMatchCpuOnShortSequences) {
  MDLM_REQUIRE_GPU();
  // S = 1, 17, 64, 141: a single row, partial tiles, exactly one forward K tile pair, and more
  // than one query/key tile with a ragged end (141 = 128 + 13).
  std::vector<Case> cases;
  for (int64_t dim : {64, 128})
    for (int64_t seq : {1, 17, 64, 141})
      for (int64_t batch : {1, 2})
        for (auto [heads, kv_heads] : {std::pair<int64_t, int64_t>{2, 2}, {6, 2}})
          for (AttentionMask mask : {AttentionMask::None, AttentionMask::Causal})
            cases.push_back({batch, seq, heads, kv_heads, dim, mask});
  check_cases(cases, {Kernel::Default, Kernel::Flash, Kernel::Simple}, 1000);
}

TEST(AttentionParity, FlashAndSimpleMatchCpuOnLongSequences) {
  MDLM_REQUIRE_GPU();
  // Many tiles: exact multiples (2048), ragged ends (300, 2047), GQA and MHA. Few heads so the
  // CPU reference stays within seconds.
  const std::vector<Case> cases = {
      {1, 2048, 1, 1, 64, AttentionMask::None},  {1, 2048, 1, 1, 64, AttentionMask::Causal},
      {1, 2048, 2, 1, 128, AttentionMask::None}, {1, 2048, 2, 1, 128, AttentionMask::Causal},
      {1, 2047, 2, 2, 128, AttentionMask::Causal}, {1, 2047, 2, 1, 64, AttentionMask::None},
      {2, 300, 4, 2, 128, AttentionMask::None},  {2, 300, 4, 2, 128, AttentionMask::Causal},
  };
  check_cases(cases, {Kernel::Default, Kernel::Flash, Kernel::Simple}, 2000);
}

TEST(AttentionParity, SimplePathMatchesCpuForOtherHeadDims) {
  MDLM_REQUIRE_GPU();
  // Head dims the flash kernels do not take go through the simple path (public op); 256 is the
  // largest it supports, 8 and 80 leave lanes idle, 33 is odd.
  std::vector<Case> cases;
  for (int64_t dim : {8, 33, 80, 96, 256})
    for (int64_t seq : {17, 141})
      for (AttentionMask mask : {AttentionMask::None, AttentionMask::Causal})
        cases.push_back({2, seq, 4, 2, dim, mask});
  check_cases(cases, {Kernel::Default, Kernel::Simple}, 3000);
}

TEST(AttentionParity, FlashAndSimpleMatchCpuWithDropout) {
  MDLM_REQUIRE_GPU();
  // p = 0.1 with every offset nonzero (the kernels must use global coordinates), GQA and MHA,
  // both masks, S = 17 (one partial tile), 141 (ragged multi-tile) and 2048 (many tiles).
  const Dropout drop{.p = 0.1f, .sample_offset = 5, .head_offset = 2, .query_offset = 3,
                     .key_offset = 8};
  std::vector<Case> cases;
  for (int64_t dim : {64, 128}) {
    for (AttentionMask mask : {AttentionMask::None, AttentionMask::Causal}) {
      for (int64_t seq : {17, 141}) {
        cases.push_back({2, seq, 6, 2, dim, mask});
        cases.push_back({1, seq, 2, 2, dim, mask});
      }
      cases.push_back({1, 2048, 2, 1, dim, mask});
    }
  }
  check_cases(cases, {Kernel::Default, Kernel::Simple}, 4000, drop);
}

TEST(AttentionParity, SimplePathMatchesCpuWithDropoutForOtherHeadDims) {
  MDLM_REQUIRE_GPU();
  const Dropout drop{.p = 0.1f, .sample_offset = 1, .head_offset = 1, .query_offset = 2,
                     .key_offset = 3};  // any key offset on the simple path
  std::vector<Case> cases;
  for (int64_t dim : {33, 96})
    for (AttentionMask mask : {AttentionMask::None, AttentionMask::Causal})
      cases.push_back({2, 141, 4, 2, dim, mask});
  check_cases(cases, {Kernel::Default}, 5000, drop);
}

TEST(AttentionParity, DropoutDropsExactlyTheElementsOfTheSharedMapping) {
  MDLM_REQUIRE_GPU();
  // With v_j = e_j (S <= D) the output is out[i, d = j] = P_ij Z_ij / (1-p), and with dO_i = e_i
  // and one query head per KV head, dv[j, d = i] = P_ij Z_ij / (1-p). P > 0 for every visible key,
  // so an element of out / dv is zero exactly when it is dropped or masked: the zero patterns of
  // both kernels must equal the CPU mapping (forward and backward masks, bit for bit).
  const Stream cuda = Stream::create(Device::cuda(0));
  const Dropout drop{.p = 0.5f, .sample_offset = 11, .head_offset = 3, .query_offset = 6,
                     .key_offset = 12};
  const std::vector<Case> cases = {
      {2, 64, 2, 2, 64, AttentionMask::None},    {2, 64, 2, 2, 64, AttentionMask::Causal},
      {2, 61, 2, 2, 64, AttentionMask::None},    {2, 128, 2, 2, 128, AttentionMask::None},
      {2, 128, 2, 2, 128, AttentionMask::Causal}, {1, 100, 3, 3, 128, AttentionMask::None},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(name_of(c));
    const AttentionArgs a = args_of(c, drop);
    const auto mask = ops::detail::AttentionDropoutMask::from_args(a);
    const int64_t S = c.seq, H = c.heads, D = c.dim;
    std::vector<float> onehot(static_cast<size_t>(c.batch * S * H * D), 0.0f);
    for (int64_t bs = 0; bs < c.batch * S; ++bs)
      for (int64_t h = 0; h < H; ++h) onehot[static_cast<size_t>((bs * H + h) * D + bs % S)] = 1.0f;
    const Tensor q = test::random_tensor(q_shape(c), 6000, DType::BF16, -1.0f, 1.0f)
                         .to(Device::cuda(0), cuda);
    const Tensor k = test::random_tensor(kv_shape(c), 6001, DType::BF16, -1.0f, 1.0f)
                         .to(Device::cuda(0), cuda);
    const Tensor v =
        Tensor::from_floats(onehot, kv_shape(c), DType::BF16).to(Device::cuda(0), cuda);
    const Tensor dout =
        Tensor::from_floats(onehot, q_shape(c), DType::BF16).to(Device::cuda(0), cuda);
    for (Kernel kernel : {Kernel::Default, Kernel::Simple}) {
      SCOPED_TRACE(kernel_name(kernel, c));
      Tensor out = poisoned(q_shape(c), DType::BF16, cuda);
      Tensor lse = poisoned(lse_shape(c), DType::F32, cuda);
      Tensor dq = poisoned(q_shape(c), DType::BF16, cuda);
      Tensor dk = poisoned(kv_shape(c), DType::BF16, cuda);
      Tensor dv = poisoned(kv_shape(c), DType::BF16, cuda);
#if MEGADLM_WITH_CUDA
      const auto which = kernel == Kernel::Simple ? ops::cuda::AttentionKernel::Simple
                                                  : ops::cuda::default_attention_kernel(a);
      ops::cuda::attention_forward_with(which, q, k, v, out, lse, a, cuda);
      ops::cuda::attention_backward_with(which, dout, q, k, v, out, lse, dq, dk, dv, a, cuda);
#endif
      const std::vector<double> o = test::to_doubles(out, cuda), g = test::to_doubles(dv, cuda);
      int64_t wrong_fwd = 0, wrong_bwd = 0, dropped = 0, visible = 0;
      for (int64_t b = 0; b < c.batch; ++b)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t i = 0; i < S; ++i)
            for (int64_t j = 0; j < S; ++j) {
              const bool seen = c.mask == AttentionMask::None || j <= i;
              const bool kept = seen && mask.keep(b, h, i, j);
              visible += seen;
              dropped += seen && !kept;
              const double fo = o[static_cast<size_t>(((b * S + i) * H + h) * D + j)];
              const double bo = g[static_cast<size_t>(((b * S + j) * H + h) * D + i)];
              wrong_fwd += std::isnan(fo) || (fo != 0.0) != kept;
              wrong_bwd += std::isnan(bo) || (bo != 0.0) != kept;
            }
      std::printf("[attention dropout mask] %-36s %-6s dropped %lld of %lld, wrong fwd %lld "
                  "bwd %lld\n",
                  name_of(c).c_str(), kernel_name(kernel, c), static_cast<long long>(dropped),
                  static_cast<long long>(visible), static_cast<long long>(wrong_fwd),
                  static_cast<long long>(wrong_bwd));
      EXPECT_EQ(wrong_fwd, 0);
      EXPECT_EQ(wrong_bwd, 0);
      EXPECT_NEAR(static_cast<double>(dropped) / static_cast<double>(visible), drop.p, 0.05);
    }
  }
}

TEST(AttentionParity, PackedDocumentsOnFlashAndSimpleMatchCpu) {
  MDLM_REQUIRE_GPU();
  // Per-document attention (--reset-attention-mask packing): documents of irregular lengths,
  // with and without dropout, both masks, GQA, head dims 64 and 128, on both kernel families
  // (and the public op, which takes flash for these head dims).
  std::vector<Case> cases;
  for (int64_t dim : {64, 128})
    for (int64_t seq : {17, 141, 300})
      for (AttentionMask mask : {AttentionMask::None, AttentionMask::Causal})
        cases.push_back({2, seq, 4, 2, dim, mask});
  Dropout docs;
  docs.documents = true;
  check_cases(cases, {Kernel::Default, Kernel::Flash, Kernel::Simple}, 5000, docs);
  docs.p = 0.1f;
  docs.sample_offset = 3;
  docs.key_offset = 8;  // the flash kernels need key_offset % 4 == 0
  check_cases(cases, {Kernel::Flash, Kernel::Simple}, 6000, docs);
}

TEST(AttentionParity, PackedDocumentEdgeCasesOnFlashAndSimpleMatchCpu) {
  MDLM_REQUIRE_GPU();
  // Edge cases of the flash document ranges: rows of length-1 documents only (every query tile
  // spans many documents, most keys masked), a row that is one document (no document mask
  // inside it), documents straddling the 32/64/128-row tiles; S = 1, S not a multiple of any
  // tile size (333), and S = 1024 with many short documents. Both masks, with and without
  // dropout (global offsets nonzero), GQA and MHA, D = 64 and 128.
  // S = 1 runs without dropout only: its dq and dk are exactly zero, and with dropout both
  // kernels compute delta = rowsum(dO * O) from the bf16-rounded O = V / (1 - p), so dS is that
  // rounding (~2^-9 |dO . O|), not zero; a relative check against the zero reference cannot
  // judge it (measured on the H200: flash and simple agree with each other, 0.73 vs 0.73).
  std::vector<Case> edge, edge_dropout, long_rows;
  for (int64_t dim : {64, 128})
    for (AttentionMask mask : {AttentionMask::None, AttentionMask::Causal}) {
      for (int64_t seq : {1, 64, 129, 333}) {
        edge.push_back({3, seq, 4, 2, dim, mask});
        if (seq > 1) edge_dropout.push_back(edge.back());
      }
      edge.push_back({3, 200, 2, 2, dim, mask});
      edge_dropout.push_back(edge.back());
      long_rows.push_back({1, 1024, 2, 1, dim, mask});
    }
  Dropout docs;
  docs.documents = true;
  for (float p : {0.0f, 0.1f}) {
    docs.p = p;
    docs.sample_offset = p > 0 ? 5 : 0;
    docs.head_offset = p > 0 ? 2 : 0;
    docs.query_offset = p > 0 ? 3 : 0;
    docs.key_offset = p > 0 ? 12 : 0;
    docs.document_pattern = 1;
    check_cases(p > 0 ? edge_dropout : edge, {Kernel::Flash, Kernel::Simple}, p > 0 ? 7100 : 7000, docs);
    docs.document_pattern = 2;
    check_cases(long_rows, {Kernel::Flash, Kernel::Simple}, p > 0 ? 8100 : 8000, docs);
  }
}

// ---- cuDNN backend --------------------------------------------------------------------------
// The same CPU comparison and tolerances as the own kernels (cuDNN also rounds P and dS to bf16
// before its tensor-core products and accumulates in fp32), with cuDNN forced: a refused plan
// fails the test instead of falling back.

TEST(AttentionParity, CudnnMatchesCpuOnShortAndLongSequences) {
  MDLM_REQUIRE_CUDNN();
  // S = 17 and 141: a partial tile and a ragged multi-tile end; MHA and GQA; both masks. (Few
  // shapes: every distinct shape builds two cuDNN plans.)
  std::vector<Case> cases;
  for (int64_t dim : {64, 128})
    for (AttentionMask mask : {AttentionMask::None, AttentionMask::Causal}) {
      cases.push_back({2, 17, 6, 2, dim, mask});
      cases.push_back({2, 141, 6, 2, dim, mask});
      cases.push_back({1, 141, 2, 2, dim, mask});
    }
  // Long rows: an exact multiple of 128 and ragged ends (the backward adds cuDNN's padding mask
  // when S % 128 != 0 on cuDNN <= 9.15), GQA groups of 2 and 4.
  cases.insert(cases.end(), {{1, 2048, 4, 1, 128, AttentionMask::None},
                             {1, 2047, 2, 2, 128, AttentionMask::Causal},
                             {2, 300, 8, 2, 128, AttentionMask::Causal}});
  check_cases(cases, {Kernel::Cudnn}, 9000);
}

TEST(AttentionParity, CudnnMatchesCpuForOtherHeadDims) {
  MDLM_REQUIRE_CUDNN();
  std::vector<Case> cases;
  for (int64_t dim : {32, 96})
    cases.push_back({2, 141, 4, 2, dim, dim == 32 ? AttentionMask::None : AttentionMask::Causal});
  check_cases(cases, {Kernel::Cudnn}, 9100);
}

TEST(AttentionParity, CudnnPackedDocumentsMatchCpu) {
  MDLM_REQUIRE_CUDNN();
  // The ragged (THD) route: irregular documents (pattern 0), the edge cases of pattern 1
  // (length-1 documents only, one document a row, documents straddling tiles) and many short
  // documents in long rows (pattern 2); with document_starts and derived on the host.
  Dropout docs;
  docs.documents = true;
  std::vector<Case> irregular, edge, long_rows;
  for (AttentionMask mask : {AttentionMask::None, AttentionMask::Causal}) {
    irregular.push_back({2, 17, 4, 2, 128, mask});
    irregular.push_back({2, 300, 4, 2, 64, mask});
    edge.push_back({3, 64, 4, 2, 128, mask});
    edge.push_back({3, 333, 4, 4, 128, mask});
    long_rows.push_back({2, 2048, 4, 4, 128, mask});
  }
  docs.document_pattern = 0;
  check_cases(irregular, {Kernel::Cudnn, Kernel::CudnnHostStarts}, 9200, docs);
  docs.document_pattern = 1;
  check_cases(edge, {Kernel::Cudnn}, 9300, docs);
  docs.document_pattern = 2;
  check_cases(long_rows, {Kernel::Cudnn}, 9400, docs);
}

// AttentionArgs::row_lengths (InferenceModel's compacted canvases): cuDNN's padding mask on the
// packed QKV rows gives at every live position what the CPU gives with the padding as a document
// of its own. The GQA cases prove the hint's path ran: packed documents with GQA are refused on
// cuDNN's ragged path, so a call that ignored the hint would not run.
TEST(AttentionParity, CudnnRowLengthsMatchCpuDocumentsAtLivePositions) {
  MDLM_REQUIRE_CUDNN();
#if MEGADLM_WITH_CUDA
  const Stream cuda = Stream::create(Device::cuda(0)), cpu = Stream::cpu();
  struct Rows {
    int64_t batch, seq, heads, kv_heads;
  };
  const int64_t d = 128;
  for (const Rows c : {Rows{4, 141, 4, 4}, Rows{4, 288, 16, 8}, Rows{4, 300, 8, 2}}) {
    SCOPED_TRACE("B " + std::to_string(c.batch) + " S " + std::to_string(c.seq) + " H " +
                 std::to_string(c.heads) + "/" + std::to_string(c.kv_heads));
    const int64_t t = c.batch * c.seq, width = (c.heads + 2 * c.kv_heads) * d;
    std::vector<int32_t> lengths, ids;
    for (int64_t b = 0; b < c.batch; ++b) {
      // Unpadded, 1 and 3 pads (the sampler's), padding longer than one 128-key tile.
      const int64_t len = c.seq - std::vector<int64_t>{0, 1, 3, 130}[static_cast<size_t>(b)];
      lengths.push_back(static_cast<int32_t>(len));
      for (int64_t i = 0; i < c.seq; ++i) ids.push_back(i < len ? 0 : 1);
    }
    const Tensor qkv = test::random_tensor({t, width}, 9500 + static_cast<uint64_t>(c.seq), DType::BF16, -2.0f, 2.0f);
    AttentionArgs a;
    a.batch = c.batch;
    a.seq = c.seq;
    a.num_heads = c.heads;
    a.num_kv_heads = c.kv_heads;
    a.head_dim = d;
    a.softmax_scale = 1.0f / std::sqrt(static_cast<float>(d));
    // CPU reference: f32 copies of the bf16 rows, the padding as its own document.
    const Tensor ids_cpu = Tensor::from_ints(ids, {c.batch, c.seq});
    Tensor q = Tensor::empty({t, c.heads * d}, DType::F32, cpu);
    Tensor k = Tensor::empty({t, c.kv_heads * d}, DType::F32, cpu);
    Tensor v = Tensor::empty({t, c.kv_heads * d}, DType::F32, cpu);
    ops::split_columns(qkv.to(Device::cpu(), DType::F32, cpu), {&q, &k, &v}, cpu);
    Tensor ref = Tensor::empty({c.batch, c.seq, c.heads, d}, DType::F32, cpu);
    Tensor ref_lse = Tensor::empty({c.batch, c.heads, c.seq}, DType::F32, cpu);
    AttentionArgs a_cpu = a;
    a_cpu.document_ids = &ids_cpu;
    ops::attention_forward(q.view({c.batch, c.seq, c.heads, d}), k.view({c.batch, c.seq, c.kv_heads, d}),
                           v.view({c.batch, c.seq, c.kv_heads, d}), ref, ref_lse, a_cpu, cpu);
    // cuDNN with the hint.
    const Tensor qkv_d = qkv.to(Device::cuda(0), cuda);
    const Tensor ids_d = ids_cpu.to(Device::cuda(0), cuda);
    const Tensor lengths_d = Tensor::from_ints(lengths, {c.batch}).to(Device::cuda(0), cuda);
    a.document_ids = &ids_d;
    a.row_lengths = &lengths_d;
    a.backend = ops::AttentionBackend::Cudnn;
    Tensor out = poisoned({c.batch, c.seq, c.heads, d}, DType::BF16, cuda);
    Tensor lse = poisoned({c.batch, c.heads, c.seq}, DType::F32, cuda);
    const ops::cuda::CudnnRun run = ops::cuda::cudnn_attention_forward_packed(qkv_d, qkv_d, out, lse, a, cuda);
    ASSERT_TRUE(run.ran) << run.refusal;
    // Compare the live positions only.
    const std::vector<double> got = test::to_doubles(out, cuda), want = test::to_doubles(ref);
    const std::vector<double> got_lse = test::to_doubles(lse, cuda), want_lse = test::to_doubles(ref_lse);
    std::vector<double> g, w;
    double lse_err = 0;
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t i = 0; i < lengths[static_cast<size_t>(b)]; ++i)
        for (int64_t h = 0; h < c.heads; ++h) {
          const size_t row = static_cast<size_t>(((b * c.seq + i) * c.heads + h) * d);
          g.insert(g.end(), got.begin() + static_cast<ptrdiff_t>(row), got.begin() + static_cast<ptrdiff_t>(row + d));
          w.insert(w.end(), want.begin() + static_cast<ptrdiff_t>(row), want.begin() + static_cast<ptrdiff_t>(row + d));
          const size_t l = static_cast<size_t>((b * c.heads + h) * c.seq + i);
          lse_err = std::max(lse_err, std::isnan(got_lse[l]) ? INFINITY : std::fabs(got_lse[l] - want_lse[l]));
        }
    const double out_err = test::rel_l2(g, w);
    std::printf("[attention parity] row_lengths B%lld S%lld H%lld/%lld cudnn out %.2e lse %.2e\n",
                static_cast<long long>(c.batch), static_cast<long long>(c.seq), static_cast<long long>(c.heads),
                static_cast<long long>(c.kv_heads), out_err, lse_err);
    EXPECT_LT(out_err, test::kBf16ParityRelL2);
    EXPECT_LT(lse_err, test::kLseMaxAbs);
  }
#endif
}

TEST(AttentionParity, AutoRunsCudnnWhereItCanAndTheOwnKernelsElsewhere) {
  MDLM_REQUIRE_CUDNN();
  // The forward is deterministic on both paths, so the auto result equals, bit for bit, the
  // result of the path it chose: cuDNN without dropout, flash with dropout.
  const Stream cuda = Stream::create(Device::cuda(0));
  const Case c{2, 141, 4, 2, 128, AttentionMask::Causal};
  for (float p : {0.0f, 0.1f}) {
    SCOPED_TRACE(p > 0 ? "dropout" : "no dropout");
    Dropout drop;
    drop.p = p;
    const AttentionArgs a = args_of(c, drop);
    const Tensor q = test::random_tensor(q_shape(c), 9500, DType::BF16).to(Device::cuda(0), cuda);
    const Tensor k = test::random_tensor(kv_shape(c), 9501, DType::BF16).to(Device::cuda(0), cuda);
    const Tensor v = test::random_tensor(kv_shape(c), 9502, DType::BF16).to(Device::cuda(0), cuda);
    auto forward = [&](ops::AttentionBackend backend, bool forced_cudnn) {
      AttentionArgs b = a;
      b.backend = backend;
      Tensor out = poisoned(q_shape(c), DType::BF16, cuda), lse = poisoned(lse_shape(c), DType::F32, cuda);
#if MEGADLM_WITH_CUDA
      if (forced_cudnn)
        ops::cuda::attention_forward_with(ops::cuda::AttentionKernel::Cudnn, q, k, v, out, lse, b, cuda);
      else
        ops::attention_forward(q, k, v, out, lse, b, cuda);
#else
      (void)forced_cudnn;
      (void)b;
#endif
      return std::make_pair(test::to_doubles(out, cuda), test::to_doubles(lse, cuda));
    };
    const auto automatic = forward(ops::AttentionBackend::Auto, false);
    const auto chosen = p > 0 ? forward(ops::AttentionBackend::Flash, false)
                              : forward(ops::AttentionBackend::Cudnn, true);
    test::parity::expect_identical("auto vs chosen path out", automatic.first, chosen.first);
    test::parity::expect_identical("auto vs chosen path lse", automatic.second, chosen.second);
    if (p > 0) {
      // --attention-backend cudnn with dropout is an error naming the reason.
      AttentionArgs forced = a;
      forced.backend = ops::AttentionBackend::Cudnn;
      Tensor out = poisoned(q_shape(c), DType::BF16, cuda), lse = poisoned(lse_shape(c), DType::F32, cuda);
      EXPECT_THROW(ops::attention_forward(q, k, v, out, lse, forced, cuda), Error);
    }
  }
}

TEST(AttentionParity, DeterministicBackwardIsBitwiseReproducible) {
  MDLM_REQUIRE_GPU();
  // --deterministic-mode: two backwards on the same inputs give identical bits, on cuDNN's
  // deterministic algorithm and on the flash kernels' per-key-tile dQ slabs (with and without
  // dropout, which only the flash kernels run), and stay within the parity tolerances.
  const Stream cuda = Stream::create(Device::cuda(0));
  const std::string no_cudnn = cudnn_unavailable();
  const bool cudnn = no_cudnn.empty();
  if (!cudnn)
    std::printf("[attention parity] deterministic: only the flash kernels run; the cuDNN cases "
                "are skipped: cuDNN attention not available: %s\n", no_cudnn.c_str());
  const std::vector<Case> cases = {{2, 300, 4, 2, 128, AttentionMask::None},
                                   {1, 2048, 4, 4, 128, AttentionMask::Causal},
                                   {2, 333, 4, 2, 64, AttentionMask::None}};
  for (float p : {0.0f, 0.1f}) {
    Dropout drop;
    drop.p = p;
    for (const Case& c : cases) {
      const AttentionCase ac(c, 9600 + static_cast<uint64_t>(c.seq), cuda, drop);
      std::vector<Kernel> kernels = {Kernel::Flash};
      if (cudnn && p == 0) kernels.push_back(Kernel::Cudnn);
      for (Kernel k : kernels) {
        SCOPED_TRACE(name_of(c) + " " + kernel_name(k, c) + (p > 0 ? " dropout" : ""));
        std::vector<std::vector<double>> first, second;
        const Errors e = ac.run(k, true, &first);
        ac.run(k, true, &second);
        std::printf("[attention parity] %-36s %-6s%s deterministic dq %.2e dk %.2e dv %.2e\n",
                    name_of(c).c_str(), kernel_name(k, c), p > 0 ? " drop" : "", e.dq, e.dk, e.dv);
        EXPECT_LT(e.dq, test::kBf16ParityRelL2);
        EXPECT_LT(e.dk, test::kBf16ParityRelL2);
        EXPECT_LT(e.dv, test::kBf16ParityRelL2);
        const char* names[] = {"dq", "dk", "dv"};
        for (int i = 0; i < 3; ++i)
          test::parity::expect_identical(name_of(c) + " " + kernel_name(k, c) + " " + names[i],
                                         first[static_cast<size_t>(i)], second[static_cast<size_t>(i)]);
      }
    }
  }
}
