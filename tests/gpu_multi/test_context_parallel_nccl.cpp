// Context-parallel attention over NCCL on CUDA tensors (part of the gpu_nccl SPMD suite, 2, 4 or
// 8 ranks, one GPU each or all on one GPU through scripts/shared_gpu_rank.sh): the CPU layout
// suites prove the algorithms with blocking MPI transfers; this runs the same code where it
// differs — the p2p ring's K/V (and dK/dV) in flight on the side stream with events,
// double-buffered, the all-gather and reduce-scatter, the all-to-alls — on the GPU and compares
// every rank's out and gradients dq, dk, dv with the CPU f32 attention over the whole sequences
// (same bf16-rounded inputs on every rank). Each comm type (p2p, all_gather, a2a, a2a+p2p at
// every split of the world), bidirectional / causal (the ring's half blocks) / packed documents
// crossing the chunks, with and without attention dropout (keyed by global coordinates on both
// sides). Skips without a GPU.
#include <gtest/gtest.h>
#include <array>
#include <cmath>
#include <map>
#include <cstdio>
#include <string>
#include <vector>
#include "megadlm/comm/bootstrap.h"
#include "megadlm/ops/attention.h"
#include "megadlm/parallel/context_parallel/attention.h"
#include "megadlm/parallel/context_parallel/sequence_split.h"
#include "megadlm/parallel/model_parallel.h"
#include "megadlm/parallel/process_groups.h"
#include "support/op_testing.h"
#include "support/spmd.h"
#include "support/tolerances.h"

using namespace megadlm;

namespace {

// 16 query heads in 8 groups (GQA; a2a splits both over up to 8 ranks); D = 64 keeps the ring's
// own block on the flash / cuDNN entry. The whole sequence is 384 tokens at every world size, so
// the CPU reference costs the same: chunks of 384 / (2 cp) = 96, 48 and 24 rows at cp 2, 4 and 8,
// none a multiple of the 64/128-row tiles.
constexpr int64_t kB = 2, kHq = 16, kHkv = 8, kD = 64, kSeq = 384;

struct Case {
  std::string comm;
  std::vector<int> levels;  // a2a+p2p: {all-to-all size, ring size}
  bool causal = false, documents = false;
  float dropout = 0.0f;
  std::string name() const {
    std::string n = comm;
    for (int l : levels) n.append(" ").append(std::to_string(l));
    return n + (causal ? " causal" : "") + (documents ? " documents" : "") + (dropout > 0 ? " dropout" : "");
  }
};

/// Rows at the shard's global positions of a host [B·S, width] f32 tensor: [B·S/cp, width].
Tensor shard_rows(const Tensor& full, const cp::Split& s, int64_t width) {
  Tensor out = Tensor::zeros({kB * s.local_len(), width}, DType::F32, Stream::cpu());
  for (int64_t b = 0; b < kB; ++b)
    for (int64_t i = 0; i < s.local_len(); ++i)
      for (int64_t e = 0; e < width; ++e)
        out.data<float>()[(b * s.local_len() + i) * width + e] =
            full.data<float>()[(b * s.seq + s.global(i)) * width + e];
  return out;
}

/// Host f32 tensor of bf16-representable values (the device gets them exactly).
Tensor bf16_values(const Shape& shape, uint64_t seed, float lo, float hi) {
  return test::random_tensor(shape, seed, DType::BF16, lo, hi).to(Device::cpu(), DType::F32, Stream::cpu());
}

class ContextParallelNccl : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    runtime_ = test::spmd::runtime(comm::Transport::Nccl, &why);
    if (runtime_ == nullptr) GTEST_SKIP() << why;
    stream_ = Stream::create(runtime_->device());
  }

  void check(const Case& c) {
    SCOPED_TRACE(c.name());
    comm::Communicator& world = runtime_->world();
    const int n = world.size();
    const int64_t seq = kSeq;
    ASSERT_EQ(seq % (2 * n), 0) << "the sequence must split into 2 chunks per rank";
    const cp::Split split{n, world.rank(), seq};
    ParallelConfig pc;
    pc.world_size = n;
    pc.context_parallel_size = n;
    pc.cp_comm_type = {cp::comm_type_from_name(c.comm)};
    pc.hierarchical_context_parallel_sizes = c.levels;
    // The groups depend on the hierarchy only: built once per hierarchy (new NCCL communicators
    // over loopback sockets are slow on a shared GPU).
    if (!groups_.count(c.levels)) groups_.emplace(c.levels, parallel::ProcessGroups::build(runtime_->world_shared(), pc));
    const ModelParallel mp = ModelParallel::from(groups_.at(c.levels), pc);
    const cp::ContextParallelAttention attention(cp::comm_type_from_name(c.comm), mp);

    // Whole sequences, identical on every rank; documents of 1 to 61 tokens cross every chunk.
    const Tensor q = bf16_values({kB * seq, kHq * kD}, 31, -2, 2);
    const Tensor k = bf16_values({kB * seq, kHkv * kD}, 32, -2, 2);
    const Tensor v = bf16_values({kB * seq, kHkv * kD}, 33, -1, 1);
    const Tensor dout = bf16_values({kB * seq, kHq * kD}, 34, -1, 1);
    std::vector<int32_t> docs;
    for (int64_t b = 0; b < kB; ++b) {
      int32_t id = 0;
      int64_t left = 5 + b;
      for (int64_t i = 0; i < seq; ++i) {
        if (left-- == 0) left = 1 + (++id * 13 + b) % 61;
        docs.push_back(id);
      }
    }
    const Tensor docs_full = Tensor::from_ints(docs, {kB, seq});
    ops::AttentionArgs local{.batch = kB, .seq = split.local_len(), .num_heads = kHq,
                             .num_kv_heads = kHkv, .head_dim = kD,
                             .mask = c.causal ? ops::AttentionMask::Causal : ops::AttentionMask::None,
                             .softmax_scale = 0.125f, .dropout_p = c.dropout, .dropout_seed = 77,
                             .dropout_site = 2, .sample_offset = 3, .head_offset = 4};

    // CPU reference over the whole sequences: it depends on the mask and dropout only, not on
    // the comm type, so each of the four is computed once per process.
    const Stream cpu = Stream::cpu();
    ops::AttentionArgs whole = local;
    whole.seq = seq;
    if (c.documents) whole.document_ids = &docs_full;
    const std::string key = std::string(c.causal ? "causal" : "") + (c.documents ? " documents" : "") +
                            (c.dropout > 0 ? " dropout" : "");
    std::map<std::string, std::array<Tensor, 4>>& references = references_;
    if (!references.count(key)) {
      Tensor o = Tensor::empty(q.shape(), DType::F32, cpu), lse = Tensor::empty({kB, kHq, seq}, DType::F32, cpu);
      ops::attention_forward(q, k, v, o, lse, whole, cpu);
      Tensor gq = Tensor::empty(q.shape(), DType::F32, cpu), gk = Tensor::empty(k.shape(), DType::F32, cpu),
             gv = Tensor::empty(v.shape(), DType::F32, cpu);
      ops::attention_backward(dout, q, k, v, o, lse, gq, gk, gv, whole, cpu);
      references[key] = {o, gq, gk, gv};
    }
    const auto& [out, dq, dk, dv] = references.at(key);

    // This rank's shard on its GPU, through NCCL.
    const cp::SequenceLayout layout(kB, seq, n, split.rank, c.documents ? docs : std::vector<int32_t>{});
    auto up = [&](const Tensor& full, int64_t width) {
      return shard_rows(full, split, width).to(runtime_->device(), DType::BF16, stream_);
    };
    cp::AttentionSaved saved;
    const Tensor out_cp = attention.forward(up(q, kHq * kD), up(k, kHkv * kD), up(v, kHkv * kD), local,
                                            layout, saved, stream_);
    const cp::AttentionGrads g = attention.backward(up(dout, kHq * kD), out_cp, saved, local, layout, stream_);
    auto err = [&](const Tensor& got, const Tensor& want_full, int64_t width) {
      return test::rel_l2(test::to_doubles(got, stream_), test::to_doubles(shard_rows(want_full, split, width)));
    };
    const double e_out = err(out_cp, out, kHq * kD), e_dq = err(g.dq, dq, kHq * kD),
                 e_dk = err(g.dk, dk, kHkv * kD), e_dv = err(g.dv, dv, kHkv * kD);
    std::printf("[cp nccl] rank %d %-34s out %.2e dq %.2e dk %.2e dv %.2e\n", split.rank,
                c.name().c_str(), e_out, e_dq, e_dk, e_dv);
    EXPECT_LT(e_out, test::kBf16ParityRelL2);
    EXPECT_LT(e_dq, test::kBf16ParityRelL2);
    EXPECT_LT(e_dk, test::kBf16ParityRelL2);
    EXPECT_LT(e_dv, test::kBf16ParityRelL2);
  }

  void every_mask(const std::string& comm, std::vector<int> levels = {}) {
    check({comm, levels, false, false, 0.0f});
    check({comm, levels, true, false, 0.1f});
    check({comm, levels, false, true, 0.1f});
    check({comm, levels, true, true, 0.0f});
  }

  // Every rank frees the suite's communicators together, before main() returns.
  static void TearDownTestSuite() {
    groups_.clear();
    references_.clear();
  }

  comm::DistributedRuntime* runtime_ = nullptr;
  Stream stream_;
  static inline std::map<std::vector<int>, parallel::ProcessGroups> groups_;  // per hierarchy
  static inline std::map<std::string, std::array<Tensor, 4>> references_;     // out, dq, dk, dv per mask
};

}  // namespace

TEST_F(ContextParallelNccl, P2pRingOnTheSideStreamMatchesCpu) { every_mask("p2p"); }
TEST_F(ContextParallelNccl, AllGatherMatchesCpu) { every_mask("all_gather"); }
TEST_F(ContextParallelNccl, A2aMatchesCpu) {
  ASSERT_EQ(kHkv % runtime_->world().size(), 0) << "a2a splits " << kHkv << " groups over the world";
  every_mask("a2a");
}
TEST_F(ContextParallelNccl, A2aP2pMatchesCpu) {
  // Every split of the world into an all-to-all level and a ring level: {1, n} (degenerate: the
  // ring), {2, n / 2}, ..., {n, 1} (degenerate: the all-to-all).
  const int n = runtime_->world().size();
  for (int a = 1; a <= n; a *= 2) {
    ASSERT_EQ(kHkv % a, 0);
    every_mask("a2a+p2p", {a, n / a});
  }
}
