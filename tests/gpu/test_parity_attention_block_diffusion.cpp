// GPU parity of block diffusion's attention mask (AttentionMask::BlockDiffusion and
// BlockDiffusionCausal over the doubled row [x_t | x_0], include/megadlm/ops/attention.h): the
// flash kernels (head_dim 64 and 128, L a multiple of 128) and the simple kernels (any head_dim,
// any L) against the CPU f32 reference on the same bf16-rounded inputs, forward (out, lse) and
// backward (dq, dk, dv; each backend's backward from its own forward's out and lse, as training
// runs them), with the tolerances of AttentionParity. Packed rows: documents whose
// boundaries are no multiples of the block size (blocks restart at each document, the last block
// of a document is short), one document a row, length-1 documents; blocks of 4, 32, 128, 256 and
// 48 (not dividing 128: L = 384); GQA 8/2. Both --attention-backend auto and flash must land on
// the flash kernels (the forward is deterministic, so the public op's out and lse equal those of
// the flash kernels called by name, bit for bit, and the deterministic backward likewise), and
// the deterministic backward is bitwise reproducible. Inputs come from parity.h's printed seed
// base. Every test skips without a GPU.
#include <gtest/gtest.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>
#include "megadlm/ops/attention.h"
#include "megadlm/ops/attention_merge.h"
#include "megadlm/ops/row_block.h"
#include "ops/attention_block_diffusion_bulk.h"
#include "ops/attention_support.h"
#include "parity.h"
#include "support/attention_cases.h"
#include "support/op_testing.h"
#include "support/tolerances.h"
#if MEGADLM_WITH_CUDA
#include "ops/cuda/attention_impl.h"
#endif

using namespace megadlm;
using megadlm::ops::AttentionArgs;
using megadlm::ops::AttentionMask;
namespace parity = megadlm::test::parity;

namespace {

/// block_ranges [batch, 4, L] of packed rows: documents whose lengths cycle through
/// `doc_lengths` (starting at entry b for row b; the last document cut at L), each split into
/// diffusion blocks of `block` positions from its own start (the last block of a document may be
/// shorter). doc_lengths {L}: one document a row. (The same builder as
/// tests/unit/ops/test_attention_block_diffusion.cpp.)
std::vector<int32_t> block_ranges(int64_t batch, int64_t L, const std::vector<int>& doc_lengths,
                                  int block) {
  std::vector<int32_t> r(static_cast<size_t>(batch * 4 * L));
  for (int64_t b = 0; b < batch; ++b) {
    int32_t* row = r.data() + b * 4 * L;
    size_t next = static_cast<size_t>(b);
    int64_t start = 0;
    while (start < L) {
      const int64_t end = std::min<int64_t>(L, start + doc_lengths[next++ % doc_lengths.size()]);
      for (int64_t p = start; p < end; ++p) {
        const int64_t bs = start + (p - start) / block * block;
        row[p] = static_cast<int32_t>(start);
        row[L + p] = static_cast<int32_t>(end);
        row[2 * L + p] = static_cast<int32_t>(bs);
        row[3 * L + p] = static_cast<int32_t>(std::min<int64_t>(bs + block, end));
      }
      start = end;
    }
  }
  return r;
}

struct BdCase {
  int64_t batch, L, heads, kv_heads, dim;
  int block;
  std::vector<int> docs;
  AttentionMask mask;
};

std::string name_of(const BdCase& c) {
  std::string d;
  for (int x : c.docs) d += megadlm::detail::concat(d.empty() ? "" : ",", x);
  // concat rather than a chain of operator+ (GCC 12 reports a false -Wrestrict on the chain).
  return megadlm::detail::concat("B=", c.batch, " L=", c.L, " Hq=", c.heads, " Hkv=", c.kv_heads, " D=", c.dim,
                                 " block=", c.block, " docs={", d, "}",
                                 c.mask == AttentionMask::BlockDiffusionCausal ? " causal-clean" : "");
}

/// How a CUDA call is made: the public op under --attention-backend auto or flash, or a kernel
/// family by name (attention_impl.h).
/// Bulk: the composed path (cuDNN causal bulks + flash strips, ops/attention_block_diffusion_bulk.h)
/// called by name, whatever MEGADLM_BD_ATTENTION says.
enum class Route { Auto, BackendFlash, Flash, Simple, Bulk };

const char* route_name(Route r) {
  switch (r) {
    case Route::Auto: return "auto";
    case Route::BackendFlash: return "backend-flash";
    case Route::Flash: return "flash";
    case Route::Simple: return "simple";
    case Route::Bulk: return "bulk";
  }
  return "?";
}

struct Result {
  std::vector<double> out, lse, dq, dk, dv;
};

struct Errors {
  double out = 0, lse = 0, dq = 0, dk = 0, dv = 0;
};

/// One case's inputs (bf16 values on the host as f32 and on the device), its ranges, and the CPU
/// f32 reference.
class BdRun {
 public:
  /// reference = false: no CPU reference (long rows compared on the device only; errors() unusable).
  BdRun(const BdCase& c, const Stream& cuda, bool reference = true) : c_(c), cuda_(cuda) {
    const int64_t S = 2 * c.L;
    const Shape qs{c.batch, S, c.heads, c.dim}, kvs{c.batch, S, c.kv_heads, c.dim};
    // q, k in [-2, 2): scores of std ~1.3, peaked rows, so a wrong key or a missed mask shows.
    q_ = parity::make_input(qs, DType::BF16, cuda, -2.0f, 2.0f);
    k_ = parity::make_input(kvs, DType::BF16, cuda, -2.0f, 2.0f);
    v_ = parity::make_input(kvs, DType::BF16, cuda);
    dout_ = parity::make_input(qs, DType::BF16, cuda);
    const std::vector<int32_t> r = block_ranges(c.batch, c.L, c.docs, c.block);
    ranges_cpu_ = Tensor::from_ints(r, {c.batch, 4, c.L});
    ranges_cuda_ = parity::ints_to_device(r, {c.batch, 4, c.L}, cuda);
    max_block_ = ops::block_diffusion_one_document_max_block(r.data(), c.batch, c.L);
    if (!reference) return;
    const Stream cpu = Stream::cpu();
    const AttentionArgs a = args(ranges_cpu_);
    Tensor out = parity::poisoned_host(qs), lse = parity::poisoned_host({c.batch, c.heads, S});
    ops::attention_forward(q_.host, k_.host, v_.host, out, lse, a, cpu);
    Tensor dq = parity::poisoned_host(qs), dk = parity::poisoned_host(kvs),
           dv = parity::poisoned_host(kvs);
    ops::attention_backward(dout_.host, q_.host, k_.host, v_.host, out, lse, dq, dk, dv, a, cpu);
    ref_ = {test::to_doubles(out), test::to_doubles(lse), test::to_doubles(dq),
            test::to_doubles(dk), test::to_doubles(dv)};
  }

  AttentionArgs args(const Tensor& ranges, bool deterministic = false,
                     ops::AttentionBackend backend = ops::AttentionBackend::Auto) const {
    AttentionArgs a{.batch = c_.batch, .seq = 2 * c_.L, .num_heads = c_.heads,
                    .num_kv_heads = c_.kv_heads, .head_dim = c_.dim, .mask = c_.mask,
                    .softmax_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c_.dim)))};
    a.block_ranges = &ranges;
    a.block_diffusion_max_block = max_block_;
    a.deterministic = deterministic;
    a.backend = backend;
    return a;
  }

  /// Forward, then backward from that forward's out and lse, on the device.
  Result run(Route route, bool deterministic = false) const {
    const int64_t S = 2 * c_.L;
    const Shape qs{c_.batch, S, c_.heads, c_.dim}, kvs{c_.batch, S, c_.kv_heads, c_.dim};
    const AttentionArgs a = args(ranges_cuda_, deterministic,
                                 route == Route::BackendFlash ? ops::AttentionBackend::Flash
                                                              : ops::AttentionBackend::Auto);
    Tensor out = parity::poisoned(qs, DType::BF16, cuda_);
    Tensor lse = parity::poisoned({c_.batch, c_.heads, S}, DType::F32, cuda_);
    Tensor dq = parity::poisoned(qs, DType::BF16, cuda_), dk = parity::poisoned(kvs, DType::BF16, cuda_),
           dv = parity::poisoned(kvs, DType::BF16, cuda_);
    if (route == Route::Bulk) {
      MDLM_CHECK(max_block_ > 0, "the composed path needs rows of one document");
      ops::detail::block_diffusion_bulk_forward(q_.device, k_.device, v_.device, out, lse, a, cuda_);
      ops::detail::block_diffusion_bulk_backward(dout_.device, q_.device, k_.device, v_.device, out,
                                                 lse, dq, dk, dv, a, cuda_);
    } else if (route == Route::Auto || route == Route::BackendFlash) {
      ops::attention_forward(q_.device, k_.device, v_.device, out, lse, a, cuda_);
      ops::attention_backward(dout_.device, q_.device, k_.device, v_.device, out, lse, dq, dk, dv,
                              a, cuda_);
    } else {
#if MEGADLM_WITH_CUDA
      using ops::cuda::AttentionKernel;
      const AttentionKernel k = route == Route::Flash ? AttentionKernel::Flash : AttentionKernel::Simple;
      ops::cuda::attention_forward_with(k, q_.device, k_.device, v_.device, out, lse, a, cuda_);
      ops::cuda::attention_backward_with(k, dout_.device, q_.device, k_.device, v_.device, out,
                                         lse, dq, dk, dv, a, cuda_);
#endif
    }
    return {parity::download(out, cuda_), parity::download(lse, cuda_), parity::download(dq, cuda_),
            parity::download(dk, cuda_), parity::download(dv, cuda_)};
  }

  Errors errors(const Result& got) const {
    return {test::rel_l2(got.out, ref_.out), test::lse_max_abs_error(got.lse, ref_.lse),
            test::rel_l2(got.dq, ref_.dq), test::rel_l2(got.dk, ref_.dk),
            test::rel_l2(got.dv, ref_.dv)};
  }

 private:
  BdCase c_;
  Stream cuda_;
  parity::Input q_, k_, v_, dout_;
  Tensor ranges_cpu_, ranges_cuda_;
  int64_t max_block_ = 0;  // one document a row: the longest block (the composed path's N)
  Result ref_;
};

/// out, lse, dq, dk, dv of `got` bit for bit those of `want` (`what` prefixes each name).
void expect_identical_results(const std::string& what, const Result& got, const Result& want) {
  parity::expect_identical(what + "out", got.out, want.out);
  parity::expect_identical(what + "lse", got.lse, want.lse);
  parity::expect_identical(what + "dq", got.dq, want.dq);
  parity::expect_identical(what + "dk", got.dk, want.dk);
  parity::expect_identical(what + "dv", got.dv, want.dv);
}

void expect_within_tolerances(const Errors& e) {
  // bf16 outputs: the relative L2 bound of tolerances.h, as AttentionParity.
  EXPECT_LT(e.out, test::kBf16ParityRelL2);
  EXPECT_LT(e.lse, test::kLseMaxAbs);
  EXPECT_LT(e.dq, test::kBf16ParityRelL2);
  EXPECT_LT(e.dk, test::kBf16ParityRelL2);
  EXPECT_LT(e.dv, test::kBf16ParityRelL2);
}

/// Runs each case on each route against the CPU; returns nothing, prints one line per run.
void check_cases(const std::vector<BdCase>& cases, const std::vector<Route>& routes) {
  const Stream cuda = parity::gpu_stream();
  Errors worst;
  for (const BdCase& c : cases) {
    SCOPED_TRACE(name_of(c));
    const BdRun run(c, cuda);
    for (Route r : routes) {
      SCOPED_TRACE(route_name(r));
      const Errors e = run.errors(run.run(r));
      std::printf("[block diffusion parity] %-66s %-13s out %.2e lse %.2e dq %.2e dk %.2e dv %.2e\n",
                  name_of(c).c_str(), route_name(r), e.out, e.lse, e.dq, e.dk, e.dv);
      expect_within_tolerances(e);
      worst = {std::max(worst.out, e.out), std::max(worst.lse, e.lse), std::max(worst.dq, e.dq),
               std::max(worst.dk, e.dk), std::max(worst.dv, e.dv)};
    }
  }
  std::printf("[block diffusion parity] worst over %zu cases: out %.2e lse %.2e dq %.2e dk %.2e "
              "dv %.2e\n",
              cases.size(), worst.out, worst.lse, worst.dq, worst.dk, worst.dv);
}

/// The composed path against the CPU and against the flash kernels on the whole mask (each
/// route's own forward and backward; bulk vs flash as relative L2 like the CPU errors).
void check_bulk_cases(const std::vector<BdCase>& cases) {
  const Stream cuda = parity::gpu_stream();
  Errors worst, worst_vs_flash;
  for (const BdCase& c : cases) {
    SCOPED_TRACE(name_of(c));
    const BdRun run(c, cuda);
    const Result bulk = run.run(Route::Bulk), flash = run.run(Route::Flash);
    const Errors e = run.errors(bulk), f = run.errors(flash);
    const Errors d{test::rel_l2(bulk.out, flash.out), test::lse_max_abs_error(bulk.lse, flash.lse),
                   test::rel_l2(bulk.dq, flash.dq), test::rel_l2(bulk.dk, flash.dk),
                   test::rel_l2(bulk.dv, flash.dv)};
    std::printf("[block diffusion parity] %-66s bulk vs cpu  out %.2e lse %.2e dq %.2e dk %.2e dv %.2e\n"
                "[block diffusion parity] %-66s flash vs cpu out %.2e lse %.2e dq %.2e dk %.2e dv %.2e\n"
                "[block diffusion parity] %-66s bulk vs flash out %.2e lse %.2e dq %.2e dk %.2e dv %.2e\n",
                name_of(c).c_str(), e.out, e.lse, e.dq, e.dk, e.dv, name_of(c).c_str(), f.out, f.lse,
                f.dq, f.dk, f.dv, name_of(c).c_str(), d.out, d.lse, d.dq, d.dk, d.dv);
    expect_within_tolerances(e);
    expect_within_tolerances(f);
    expect_within_tolerances(d);
    for (auto [w, x] : {std::pair{&worst, &e}, std::pair{&worst_vs_flash, &d}})
      *w = {std::max(w->out, x->out), std::max(w->lse, x->lse), std::max(w->dq, x->dq),
            std::max(w->dk, x->dk), std::max(w->dv, x->dv)};
  }
  std::printf("[block diffusion parity] bulk, worst over %zu cases: vs cpu out %.2e lse %.2e dq %.2e "
              "dk %.2e dv %.2e; vs flash out %.2e lse %.2e dq %.2e dk %.2e dv %.2e\n",
              cases.size(), worst.out, worst.lse, worst.dq, worst.dk, worst.dv, worst_vs_flash.out,
              worst_vs_flash.lse, worst_vs_flash.dq, worst_vs_flash.dk, worst_vs_flash.dv);
}

// Packings: irregular documents (boundaries off every block and tile size, a length-1
// document), and one document a row.
const std::vector<int> kIrregular = {100, 37, 1, 90, 29, 200, 7};
const std::vector<int> kOneDocument = {1 << 20};

/// One document a row (the composed path's precondition): blocks 4 / 32 / 128 at L = 1024,
/// block 32 at L = 2048, GQA 4/2, both variants.
std::vector<BdCase> bulk_cases(int64_t dim) {
  std::vector<BdCase> cases;
  for (AttentionMask mask : {AttentionMask::BlockDiffusion, AttentionMask::BlockDiffusionCausal}) {
    for (int block : {4, 32, 128}) cases.push_back({2, 1024, 4, 2, dim, block, {1 << 20}, mask});
    cases.push_back({1, 2048, 4, 2, dim, 32, {1 << 20}, mask});
  }
  return cases;
}

std::vector<BdCase> flash_cases(int64_t dim) {
  std::vector<BdCase> cases;
  for (AttentionMask mask : {AttentionMask::BlockDiffusion, AttentionMask::BlockDiffusionCausal}) {
    for (int block : {4, 32, 128}) cases.push_back({2, 256, 8, 2, dim, block, kIrregular, mask});
    cases.push_back({2, 256, 8, 2, dim, 32, kOneDocument, mask});
    cases.push_back({1, 512, 8, 2, dim, 256, {300, 111, 101}, mask});
    cases.push_back({1, 512, 8, 2, dim, 256, kOneDocument, mask});
    cases.push_back({2, 384, 8, 2, dim, 48, {130, 47, 1, 96, 110}, mask});  // 48 does not divide 128
  }
  return cases;
}

}  // namespace

TEST(AttentionBlockDiffusionParity, TheSupportTableSendsFlashShapesToTheFlashKernels) {
  MDLM_REQUIRE_GPU();
#if MEGADLM_WITH_CUDA
  // Under auto and flash, both directions, head_dim 64/128 with L % 128 == 0: the flash kernels;
  // head_dim 32 or L = 96: the simple ones. (The bitwise checks below show the calls run there.)
  const Tensor r = Tensor::from_ints(block_ranges(1, 384, kIrregular, 32), {1, 4, 384});
  for (int64_t dim : {64, 128, 32})
    for (int64_t L : {384, 96})
      for (AttentionMask mask : {AttentionMask::BlockDiffusion, AttentionMask::BlockDiffusionCausal})
        for (auto backend : {ops::AttentionBackend::Auto, ops::AttentionBackend::Flash})
          for (bool backward : {false, true}) {
            AttentionArgs a{.batch = 1, .seq = 2 * L, .num_heads = 8, .num_kv_heads = 2,
                            .head_dim = dim, .mask = mask, .softmax_scale = 0.1f};
            a.block_ranges = &r;
            a.backend = backend;
            const bool flash = dim != 32 && L % 128 == 0;
            // cuDNN's version does not matter: it has no such mask.
            const ops::AttentionChoice c =
                ops::choose_attention(a, backward, {.cuda = true, .cudnn_version = 91400});
            EXPECT_EQ(c.impl, flash ? ops::AttentionImpl::Flash : ops::AttentionImpl::Simple);
            EXPECT_TRUE(c.error.empty());
            EXPECT_EQ(ops::cuda::default_attention_kernel(a),
                      flash ? ops::cuda::AttentionKernel::Flash : ops::cuda::AttentionKernel::Simple);
          }
#endif
}

TEST(AttentionBlockDiffusionParity, FlashHeadDim128MatchesCpu) {
  MDLM_REQUIRE_GPU();
  check_cases(flash_cases(128), {Route::Flash, Route::Auto});
}

TEST(AttentionBlockDiffusionParity, FlashHeadDim64MatchesCpu) {
  MDLM_REQUIRE_GPU();
  check_cases(flash_cases(64), {Route::Flash, Route::BackendFlash});
}

TEST(AttentionBlockDiffusionParity, SimpleKernelsMatchCpu) {
  MDLM_REQUIRE_GPU();
  // The public op on what the flash kernels do not take (head_dim 32; L = 96 and L = 100, not
  // multiples of 128), and the simple kernels by name on flash shapes, as a second opinion.
  std::vector<BdCase> fallback, second;
  for (AttentionMask mask : {AttentionMask::BlockDiffusion, AttentionMask::BlockDiffusionCausal}) {
    fallback.push_back({2, 256, 8, 2, 32, 32, kIrregular, mask});
    fallback.push_back({2, 96, 4, 2, 128, 16, {40, 1, 55}, mask});
    fallback.push_back({2, 100, 4, 4, 80, 7, {33, 1, 66}, mask});
    second.push_back({2, 256, 8, 2, 128, 4, kIrregular, mask});
    second.push_back({1, 384, 8, 2, 64, 48, {130, 47, 1, 96, 110}, mask});
  }
  check_cases(fallback, {Route::Auto, Route::Simple});
  check_cases(second, {Route::Simple});
}

TEST(AttentionBlockDiffusionParity, AutoAndBackendFlashRunTheFlashKernelsBitForBit) {
  MDLM_REQUIRE_GPU();
  // The forward is deterministic and so is the backward with --deterministic-mode: the public
  // op under auto and under flash gives, bit for bit, what the flash kernels give by name.
  const Stream cuda = parity::gpu_stream();
  for (int64_t dim : {128, 64})
    for (AttentionMask mask : {AttentionMask::BlockDiffusion, AttentionMask::BlockDiffusionCausal}) {
      const BdCase c{2, 256, 8, 2, dim, 32, kIrregular, mask};
      SCOPED_TRACE(name_of(c));
      const BdRun run(c, cuda);
      const Result flash = run.run(Route::Flash, true);
      for (Route r : {Route::Auto, Route::BackendFlash}) {
        const Result got = run.run(r, true);
        const std::string what = name_of(c) + " " + route_name(r) + " vs flash ";
        expect_identical_results(what, got, flash);
      }
    }
}

TEST(AttentionBlockDiffusionParity, DeterministicBackwardIsBitwiseReproducible) {
  MDLM_REQUIRE_GPU();
  // --deterministic-mode on the flash kernels: one dQ slab per key tile, summed in order; two
  // runs give the same bits and stay within the tolerances.
  const Stream cuda = parity::gpu_stream();
  for (int64_t dim : {128, 64})
    for (AttentionMask mask : {AttentionMask::BlockDiffusion, AttentionMask::BlockDiffusionCausal}) {
      const BdCase c{2, 384, 8, 2, dim, 48, {130, 47, 1, 96, 110}, mask};
      SCOPED_TRACE(name_of(c));
      const BdRun run(c, cuda);
      const Result first = run.run(Route::Flash, true), second = run.run(Route::Flash, true);
      const Errors e = run.errors(first);
      std::printf("[block diffusion parity] %-66s deterministic dq %.2e dk %.2e dv %.2e\n",
                  name_of(c).c_str(), e.dq, e.dk, e.dv);
      expect_within_tolerances(e);
      parity::expect_identical(name_of(c) + " dq", first.dq, second.dq);
      parity::expect_identical(name_of(c) + " dk", first.dk, second.dk);
      parity::expect_identical(name_of(c) + " dv", first.dv, second.dv);
    }
}

TEST(AttentionBlockDiffusionParity, FlashRefusesHalfLengthsThatAreNotMultiplesOf128) {
  MDLM_REQUIRE_GPU();
#if MEGADLM_WITH_CUDA
  // Calling the flash kernels by name on L = 96 is an error, not a wrong result.
  const Stream cuda = parity::gpu_stream();
  const BdCase c{1, 96, 2, 2, 128, 16, kIrregular, AttentionMask::BlockDiffusion};
  const Shape qs{1, 192, 2, 128};
  const Tensor q = parity::to_device(std::vector<float>(static_cast<size_t>(shape_numel(qs)), 0.5f),
                                     qs, DType::BF16, cuda);
  const Tensor r = parity::ints_to_device(block_ranges(1, 96, kIrregular, 16), {1, 4, 96}, cuda);
  AttentionArgs a{.batch = 1, .seq = 192, .num_heads = 2, .num_kv_heads = 2, .head_dim = 128,
                  .mask = c.mask, .softmax_scale = 0.1f};
  a.block_ranges = &r;
  Tensor out = parity::poisoned(qs, DType::BF16, cuda), lse = parity::poisoned({1, 2, 192}, DType::F32, cuda);
  EXPECT_THROW(ops::cuda::attention_forward_with(ops::cuda::AttentionKernel::Flash, q, q, q, out,
                                                 lse, a, cuda),
               Error);
#endif
}

TEST(AttentionBlockDiffusionParity, BulkHeadDim128MatchesCpuAndFlash) {
  MDLM_REQUIRE_GPU();
  check_bulk_cases(bulk_cases(128));
}

TEST(AttentionBlockDiffusionParity, BulkHeadDim64MatchesCpuAndFlash) {
  MDLM_REQUIRE_GPU();
  check_bulk_cases(bulk_cases(64));
}

const char* policy_name(ops::BlockDiffusionAttention p) {
  return p == ops::BlockDiffusionAttention::Bulk ? "bulk" : p == ops::BlockDiffusionAttention::Flash ? "flash" : "auto";
}

TEST(AttentionBlockDiffusionParity, BulkIsWhatAutoRunsUnderTheSwitch) {
  MDLM_REQUIRE_GPU();
  // With MEGADLM_BD_ATTENTION=bulk the public op under auto runs the composed path for
  // one-document rows (deterministic backward: bit for bit the same as by name) and the whole
  // mask on the flash kernels for packed documents; under auto at L = 1024, below
  // kBlockDiffusionBulkMinHalf, and under flash: the flash kernels.
  const ops::BlockDiffusionAttention policy = ops::detail::block_diffusion_attention();
  const bool on = policy == ops::BlockDiffusionAttention::Bulk;
  std::printf("[block diffusion parity] MEGADLM_BD_ATTENTION=%s\n", policy_name(policy));
  const Stream cuda = parity::gpu_stream();
  for (AttentionMask mask : {AttentionMask::BlockDiffusion, AttentionMask::BlockDiffusionCausal}) {
    const BdCase c{2, 1024, 4, 2, 128, 32, {1 << 20}, mask};
    SCOPED_TRACE(name_of(c));
    const BdRun run(c, cuda);
    const Result want = run.run(on ? Route::Bulk : Route::Flash, true), got = run.run(Route::Auto, true);
    const std::string what = name_of(c) + " auto vs " + (on ? "bulk " : "flash ");
    expect_identical_results(what, got, want);
  }
}

TEST(AttentionBlockDiffusionParity, BulkIsWhatAutoRunsFromItsThreshold) {
  MDLM_REQUIRE_GPU();
  // Under MEGADLM_BD_ATTENTION=auto or bulk, one-document rows of half length
  // kBlockDiffusionBulkMinHalf run the composed path through the public op: bit for bit the same
  // as the composition by name (deterministic backward); under flash, the flash kernels. The
  // composition against the flash kernels on the whole mask within the bf16 tolerances (no CPU
  // reference at this length: the Bulk*MatchesCpuAndFlash cases hold it against the CPU).
  const ops::BlockDiffusionAttention policy = ops::detail::block_diffusion_attention();
  const bool bulk = policy != ops::BlockDiffusionAttention::Flash;
  std::printf("[block diffusion parity] MEGADLM_BD_ATTENTION=%s, L %lld\n", policy_name(policy),
              static_cast<long long>(ops::kBlockDiffusionBulkMinHalf));
  const Stream cuda = parity::gpu_stream();
  for (AttentionMask mask : {AttentionMask::BlockDiffusion, AttentionMask::BlockDiffusionCausal}) {
    const BdCase c{1, ops::kBlockDiffusionBulkMinHalf, 4, 2, 128, 32, {1 << 20}, mask};
    SCOPED_TRACE(name_of(c));
    const BdRun run(c, cuda, /*reference=*/false);
    const Result by_name = run.run(bulk ? Route::Bulk : Route::Flash, true), got = run.run(Route::Auto, true);
    const std::string what = name_of(c) + " auto vs " + (bulk ? "bulk " : "flash ");
    expect_identical_results(what, got, by_name);
    const Result b = run.run(Route::Bulk), f = run.run(Route::Flash);
    const Errors d{test::rel_l2(b.out, f.out), test::lse_max_abs_error(b.lse, f.lse), test::rel_l2(b.dq, f.dq),
                   test::rel_l2(b.dk, f.dk), test::rel_l2(b.dv, f.dv)};
    std::printf("[block diffusion parity] %-66s bulk vs flash out %.2e lse %.2e dq %.2e dk %.2e dv %.2e\n",
                name_of(c).c_str(), d.out, d.lse, d.dq, d.dk, d.dv);
    expect_within_tolerances(d);
  }
}

namespace {

/// A host tensor of `dtype` (bf16 or f32) holding `values` (bf16-representable).
Tensor host_tensor(const std::vector<float>& values, const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype, Stream::cpu());
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::BF16) t.data<bf16_t>()[i] = bf16_t::from_float(values[i]);
    else t.data<float>()[i] = values[i];
  }
  return t;
}

}  // namespace

TEST(AttentionBlockDiffusionParity, BulkAddRowBlockEqualsTheCpuBitForBit) {
  MDLM_REQUIRE_GPU();
  // The composed backward's gradient sum (ops::add_row_block): CUDA and CPU both sum in f32 and
  // round once, so they agree bit for bit; rows outside the block keep their values. Widths with
  // the 16-byte path (2048, 128) and without it (13, 7), blocks at offsets 1 and 31.
  const Stream cuda = parity::gpu_stream();
  struct Case {
    DType dtype;
    int64_t batch, dst_rows, rows, row0, width;
  };
  for (const Case c : {Case{DType::BF16, 2, 96, 63, 33, 2048}, Case{DType::BF16, 3, 40, 8, 31, 13},
                       Case{DType::F32, 2, 64, 31, 1, 128}, Case{DType::F32, 1, 9, 5, 4, 7}}) {
    const std::string what = megadlm::detail::concat("add_row_block ", c.dtype == DType::BF16 ? "bf16" : "f32",
                                                     " batch ", c.batch, " rows ", c.row0, "+", c.rows, " of ",
                                                     c.dst_rows, " width ", c.width);
    SCOPED_TRACE(what);
    const Shape ds{c.batch * c.dst_rows, c.width}, ss{c.batch * c.rows, c.width};
    // dst of larger magnitude than src, so that most sums round.
    const std::vector<float> dv = parity::bf16_values(shape_numel(ds), -4.0f, 4.0f),
                             sv = parity::bf16_values(shape_numel(ss), -0.05f, 0.05f);
    Tensor dst_host = host_tensor(dv, ds, c.dtype);
    const Tensor src_host = host_tensor(sv, ss, c.dtype);
    Tensor dst_dev = parity::to_device(dv, ds, c.dtype, cuda);
    const Tensor src_dev = parity::to_device(sv, ss, c.dtype, cuda);
    ops::add_row_block(src_host, dst_host, c.batch, c.row0, Stream::cpu());
    ops::add_row_block(src_dev, dst_dev, c.batch, c.row0, cuda);
    const std::vector<double> got = parity::download(dst_dev, cuda);
    std::vector<double> want(got.size());
    for (size_t i = 0; i < want.size(); ++i)
      want[i] = c.dtype == DType::BF16 ? dst_host.data<bf16_t>()[i].to_float() : dst_host.data<float>()[i];
    parity::expect_identical(what, got, want);
    // And the CPU did add (the block's rows moved, the others did not).
    size_t moved = 0, outside_moved = 0;
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t r = 0; r < c.dst_rows; ++r)
        for (int64_t x = 0; x < c.width; ++x) {
          const size_t k = static_cast<size_t>((b * c.dst_rows + r) * c.width + x);
          const bool inside = r >= c.row0 && r < c.row0 + c.rows;
          (inside ? moved : outside_moved) += want[k] != dv[k];
        }
    EXPECT_GT(moved, 0u);
    EXPECT_EQ(outside_moved, 0u);
  }
}

TEST(AttentionBlockDiffusionParity, BulkMergeIntoBf16RowWindowMatchesTheCpu) {
  MDLM_REQUIRE_GPU();
  // The composed forward's merge (attention_merge with out_seq / out_row0, bf16 out on CUDA):
  // a bulk of n rows merged into rows [row0, row0 + n) of the doubled rows, against the CPU's
  // f32 merge of the same values; rows outside the window bit for bit unchanged.
  const Stream cuda = parity::gpu_stream();
  const int64_t B = 2, So = 512, n = 255, row0 = 257, H = 4, D = 128;
  const Shape os{B, So, H, D}, bs{B, n, H, D}, ls{B, H, So}, bls{B, H, n};
  const std::vector<float> ov = parity::bf16_values(shape_numel(os)), bv = parity::bf16_values(shape_numel(bs)),
                           lv = parity::bf16_values(shape_numel(ls), 1.0f, 6.0f),
                           blv = parity::bf16_values(shape_numel(bls), 1.0f, 6.0f);
  Tensor out_host = Tensor::from_floats(ov, os, DType::F32), lse_host = Tensor::from_floats(lv, ls, DType::F32);
  Tensor out_dev = parity::to_device(ov, os, DType::BF16, cuda), lse_dev = parity::to_device(lv, ls, DType::F32, cuda);
  const ops::AttentionMergeArgs a{.batch = B, .seq = n, .num_heads = H, .head_dim = D, .out_seq = So, .out_row0 = row0};
  ops::attention_merge(out_host, lse_host, Tensor::from_floats(bv, bs, DType::F32),
                       Tensor::from_floats(blv, bls, DType::F32), a, Stream::cpu());
  ops::attention_merge(out_dev, lse_dev, parity::to_device(bv, bs, DType::BF16, cuda),
                       parity::to_device(blv, bls, DType::F32, cuda), a, cuda);
  const std::vector<double> got_o = parity::download(out_dev, cuda), got_l = parity::download(lse_dev, cuda);
  parity::expect_close("merge out (bf16, row window)", got_o, test::to_doubles(out_host), test::kBf16ParityRelL2);
  EXPECT_LT(test::lse_max_abs_error(got_l, test::to_doubles(lse_host)), test::kLseMaxAbs);
  size_t outside_changed = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t r = 0; r < So; ++r) {
      if (r >= row0 && r < row0 + n) continue;
      for (int64_t h = 0; h < H; ++h) {
        outside_changed += got_l[static_cast<size_t>((b * H + h) * So + r)] != lv[static_cast<size_t>((b * H + h) * So + r)];
        for (int64_t d = 0; d < D; ++d) {
          const size_t k = static_cast<size_t>(((b * So + r) * H + h) * D + d);
          outside_changed += got_o[k] != ov[k];
        }
      }
    }
  EXPECT_EQ(outside_changed, 0u);
}
