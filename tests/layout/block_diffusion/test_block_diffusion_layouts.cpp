// Layout equivalence for block diffusion (--attention-mask-type block_causal): every rank trains
// the tiny model on the doubled rows [x_t | x_0] under a parallel layout and, on its own, the
// single-process run; per-iteration losses and gradient norms must agree to 1e-5 (relative), as
// for the full-sequence objective. Cases: DP with the distributed optimizer, TP + SP, PP with
// virtual stages, TP x PP, Megatron-FSDP (each sharding strategy), EP with an MoE model, full
// activation recomputation; each with whole rows and with packed documents (blocks restart at
// every document), and with both clean-half rules (block-causal; causal with its next-token loss).
// Context parallelism (docs/parallelism/context_parallel.md, "Block diffusion"): every
// --cp-comm-type over the whole world (CP 2 and CP 4), with the dense and the MoE model, and
// CP 2 x TP 2 and CP 2 x DP 2 at 4 ranks. Supervised fine-tuning rows (prompt, response, EOS
// padding; masks on the response only) under DP, TP + SP, PP with virtual stages and CP, with both
// clean halves and both t granularities. Run at 2 and 4 ranks.
#include <gtest/gtest.h>
#include <map>
#include <sstream>
#include <string>
#include "megadlm/comm/bootstrap.h"
#include "megadlm/data/mock_dataset.h"
#include "megadlm/parallel/context_parallel/comm_type.h"
#include "megadlm/parallel/process_groups.h"
#include "megadlm/training/trainer.h"
#include "support/spmd.h"
#include "support/tiny_model.h"

using namespace megadlm;

namespace {

comm::DistributedRuntime& runtime() { return test::spmd::mpi_runtime(); }

struct Layout {
  int tp = 1, pp = 1, vpp = 1, ep = 0;
  int cp = 1;                    ///< context-parallel size (0: the whole world)
  std::string comm = "p2p";      ///< --cp-comm-type; a2a+p2p runs {2, cp / 2}
  bool moe = false;              ///< the MoE model without expert parallelism
  int kv_groups = 2;             ///< query groups (a2a splits them over up to 4 ranks: 4)
  bool sp = false, dist_opt = false, fsdp = false;
  ShardingStrategy strategy = ShardingStrategy::OptimGradsParams;
  RecomputeGranularity recompute = RecomputeGranularity::None;
};

struct Objective {
  bool documents = false;     ///< packed documents: --reset-position-ids --reset-attention-mask
  bool causal_clean = false;  ///< the causal clean half (BlockDiffusionCausal)
  int64_t block = 4;
  bool sft = false;           ///< prompt/response rows (SftRows) through build_sft_micro_batch
  bool row_t = false;         ///< --dlm-t-granularity sequence (with sft: and --dlm-sft-loss-norm token)
  std::string key() const {
    std::ostringstream k;
    k << documents << causal_clean << "/" << block << "/" << sft << row_t;
    return k.str();
  }
};

// SFT samples as data::SftDataset serves them: a filler, a prompt of 1..9 tokens, a response of
// 2..6 tokens ending with EOS 62 (the mask token is 63), EOS padding to 16 tokens; a pure
// function of the index.
class SftRows final : public SampleSource {
 public:
  std::vector<int32_t> sample(int64_t index) const override {
    std::vector<int32_t> w{0};
    const int64_t prompt = prompt_length(index), response = 2 + (index * 3) % 5;
    for (int64_t i = 0; i < prompt + response; ++i) w.push_back(static_cast<int32_t>(1 + (index * 13 + i * 7) % 61));
    w.push_back(62);
    while (w.size() < 17) w.push_back(62);
    return w;
  }
  int32_t eod_token() const override { return 62; }
  int64_t prompt_length(int64_t index) const override { return 1 + (index * 5) % 9; }
};

RunConfig tiny_run(const Layout& l, const Objective& o, int world) {
  RunConfig r = test::tiny_run(test::TinyShape::small(4), 6);
  r.model.attention_mask = AttentionMaskType::BlockCausal;
  r.model.num_query_groups = l.kv_groups;
  r.model.block_diffusion_causal_clean = o.causal_clean;
  if (o.causal_clean) {  // Megatron-Bridge's sbd weights: the clean half's next-token loss too
    r.diffusion.ar_loss_weight = 1.0f;
    r.diffusion.diffusion_loss_scale = 0.3f;
  }
  r.diffusion.block_size = o.block;
  r.diffusion.loss_weight = DlmLossWeight::InvTEps;  // the peer's 1/p weighting
  r.diffusion.sft = o.sft;
  if (o.row_t) r.diffusion.t_granularity = BlockTimeGranularity::Sequence;
  if (o.sft && o.row_t) r.diffusion.sft_loss_norm = SftLossNorm::Token;
  if (o.documents) {
    r.data.reset_position_ids = r.data.reset_attention_mask = true;
    r.data.per_document_attention = true;
  }
  r.model.recompute_granularity = l.recompute;
  r.model.recompute_num_layers = 1;
  if (l.ep > 0 || l.moe) test::make_moe(r, 4, 2);
  const int cp = l.cp > 0 ? l.cp : world;
  const int dp = world / (l.tp * l.pp * cp);
  r.training.micro_batch_size = 1;
  r.training.global_batch_size = 4 * dp;  // 4 micro-batches a rank: enough for PP x VPP
  ParallelConfig& p = r.parallel;
  p.world_size = world;
  p.data_parallel_size = dp;
  p.tensor_model_parallel_size = l.tp;
  p.sequence_parallel = l.sp && l.tp > 1;
  p.pipeline_model_parallel_size = l.pp;
  p.context_parallel_size = cp;
  p.cp_comm_type = {cp::comm_type_from_name(l.comm)};
  if (l.comm == "a2a+p2p") p.hierarchical_context_parallel_sizes = {2, cp / 2};
  p.virtual_pipeline_model_parallel_size = l.vpp > 1 ? l.vpp : 0;
  if (l.ep > 0) {
    p.expert_model_parallel_size = l.ep;
    p.expert_tensor_parallel_size = 1;
    p.expert_data_parallel_size = world / (l.ep * l.pp);
  }
  p.use_custom_fsdp = l.fsdp;
  if (l.fsdp) p.data_parallel_sharding_strategy = l.strategy;
  p.use_distributed_optimizer = l.dist_opt || (l.fsdp && l.strategy != ShardingStrategy::NoShard);
  return r;
}

std::vector<IterationMetrics> train(const RunConfig& cfg, const parallel::ProcessGroups* groups) {
  std::shared_ptr<const SampleSource> data;
  if (cfg.diffusion.sft)
    data = std::make_shared<SftRows>();
  else
    data = std::make_shared<MockGptDataset>(64, 16, 63);  // documents of a few tokens: EODs inside rows
  std::ostringstream log;
  Trainer t(cfg, data, log, groups);
  return t.train();
}

const std::vector<IterationMetrics>& reference(const Layout& l, const Objective& o, int64_t global_batch) {
  static std::map<std::string, std::vector<IterationMetrics>> cache;
  Layout one;
  one.ep = l.ep > 0 || l.moe ? 1 : 0;
  one.kv_groups = l.kv_groups;
  RunConfig cfg = tiny_run(one, o, 1);
  cfg.training.global_batch_size = global_batch;
  const std::string key = o.key() + "/" + std::to_string(one.ep) + "/" + std::to_string(one.kv_groups) + "/" +
                          std::to_string(global_batch);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, train(cfg, nullptr)).first;
  return it->second;
}

void expect_same_as_single_process(const Layout& l, const Objective& o) {
  comm::DistributedRuntime& rt = runtime();
  const int world = rt.world().size();
  const int cp = l.cp > 0 ? l.cp : world;
  if (world % (l.tp * l.pp * cp) != 0 || (l.ep > 0 && world % (l.ep * l.pp) != 0))
    GTEST_SKIP() << "needs a world size multiple of tp " << l.tp << " x pp " << l.pp << " x cp " << cp
                 << " (and ep " << l.ep << ")";
  if (l.comm == "a2a+p2p" && cp < 4) GTEST_SKIP() << "a2a+p2p needs CP 4 (2 x 2)";
  const RunConfig cfg = tiny_run(l, o, world);
  parallel::ProcessGroups groups = parallel::ProcessGroups::build(rt.world_shared(), cfg.parallel);
  const auto got = train(cfg, &groups);
  const auto& ref = reference(l, o, cfg.training.global_batch_size);
  ASSERT_EQ(got.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_NEAR(got[i].lm_loss, ref[i].lm_loss, 1e-5 * ref[i].lm_loss)
        << "objective " << o.key() << ", cp " << cp << " " << l.comm << ": rank " << rt.world().rank()
        << ", iteration " << i + 1;
    EXPECT_NEAR(got[i].grad_norm, ref[i].grad_norm, 1e-5 * ref[i].grad_norm)
        << "objective " << o.key() << ", cp " << cp << " " << l.comm << ": rank " << rt.world().rank()
        << ", iteration " << i + 1;
  }
}

// Each layout under the three objectives that change what the attention sees.
void expect_all_objectives(const Layout& l) {
  expect_same_as_single_process(l, {});
  expect_same_as_single_process(l, {.documents = true});
  expect_same_as_single_process(l, {.documents = true, .causal_clean = true});
}

// Block-diffusion fine-tuning: per-block t with the block-causal clean half, and one t per row
// with the causal clean half's next-token loss and the token normalisation.
void expect_sft_objectives(const Layout& l) {
  expect_same_as_single_process(l, {.sft = true});
  expect_same_as_single_process(l, {.causal_clean = true, .sft = true, .row_t = true});
}

}  // namespace

TEST(BlockDiffusionLayouts, DistributedOptimizerMatchesOneProcess) {
  expect_all_objectives({.dist_opt = true});
}

TEST(BlockDiffusionLayouts, TensorParallelWithSequenceParallelMatchesOneProcess) {
  expect_all_objectives({.tp = 2, .sp = true});
}

TEST(BlockDiffusionLayouts, PipelineWithVirtualStagesMatchesOneProcess) {
  expect_all_objectives({.pp = 2, .vpp = 2});
}

TEST(BlockDiffusionLayouts, TensorTimesPipelineMatchesOneProcess) {
  expect_same_as_single_process({.tp = 2, .pp = 2, .sp = true}, {.documents = true});
}

TEST(BlockDiffusionLayouts, EveryFsdpStrategyMatchesOneProcess) {
  for (ShardingStrategy s : {ShardingStrategy::NoShard, ShardingStrategy::Optim, ShardingStrategy::OptimGrads,
                             ShardingStrategy::OptimGradsParams}) {
    SCOPED_TRACE(sharding_strategy_name(s));
    expect_same_as_single_process({.fsdp = true, .strategy = s}, {.documents = true});
  }
}

TEST(BlockDiffusionLayouts, ExpertParallelMoeMatchesOneProcess) {
  expect_all_objectives({.ep = 2});
}

TEST(BlockDiffusionLayouts, FullRecomputationMatchesOneProcess) {
  expect_all_objectives({.tp = 2, .sp = true, .recompute = RecomputeGranularity::Full});
}

TEST(BlockDiffusionLayouts, BlockSizeOneAndWholeSequenceMatchOneProcess) {
  // The extremes: B = 1 (every noisy token alone with the clean prefix) and B = L.
  expect_same_as_single_process({.tp = 2, .sp = true}, {.block = 1});
  expect_same_as_single_process({.tp = 2, .sp = true}, {.documents = true, .block = 16});
}

TEST(BlockDiffusionSftLayouts, DataParallelMatchesOneProcess) {
  expect_sft_objectives({.dist_opt = true});
}

TEST(BlockDiffusionSftLayouts, TensorParallelWithSequenceParallelMatchesOneProcess) {
  expect_sft_objectives({.tp = 2, .sp = true});
}

TEST(BlockDiffusionSftLayouts, PipelineWithVirtualStagesMatchesOneProcess) {
  expect_sft_objectives({.pp = 2, .vpp = 2});
}

// Context parallelism: the positions split into 2 x CP chunks of whole blocks (16 positions: at
// CP 4 chunks of 2, blocks of 2; at CP 2 chunks of 4, blocks of 2 and 4).
void expect_cp_objectives(const Layout& l) {
  const int cp = l.cp > 0 ? l.cp : runtime().world().size();
  std::vector<int64_t> blocks = {2};
  if (16 / (2 * cp) != 2) blocks.push_back(16 / (2 * cp));
  for (int64_t block : blocks) {
    SCOPED_TRACE("block " + std::to_string(block));
    expect_same_as_single_process(l, {.block = block});
    expect_same_as_single_process(l, {.documents = true, .block = block});
    expect_same_as_single_process(l, {.documents = true, .causal_clean = true, .block = block});
  }
}

TEST(BlockDiffusionLayouts, ContextParallelRingMatchesOneProcess) {
  expect_cp_objectives({.cp = 0, .comm = "p2p"});
}

TEST(BlockDiffusionLayouts, ContextParallelAllToAllMatchesOneProcess) {
  expect_cp_objectives({.cp = 0, .comm = "a2a", .kv_groups = 4});
}

TEST(BlockDiffusionLayouts, ContextParallelAllGatherMatchesOneProcess) {
  expect_cp_objectives({.cp = 0, .comm = "all_gather"});
}

TEST(BlockDiffusionLayouts, HierarchicalContextParallelMatchesOneProcess) {
  expect_cp_objectives({.cp = 0, .comm = "a2a+p2p"});
}

TEST(BlockDiffusionLayouts, ContextParallelMoeMatchesOneProcess) {
  expect_same_as_single_process({.cp = 0, .comm = "p2p", .moe = true, .kv_groups = 4}, {.documents = true, .block = 2});
  expect_same_as_single_process({.cp = 0, .comm = "a2a", .moe = true, .kv_groups = 4}, {.causal_clean = true, .block = 2});
}

TEST(BlockDiffusionLayouts, ContextParallelTimesTensorParallelMatchesOneProcess) {
  expect_same_as_single_process({.tp = 2, .cp = 2, .comm = "p2p", .sp = true}, {.documents = true, .block = 2});
  expect_same_as_single_process({.tp = 2, .cp = 2, .comm = "a2a", .kv_groups = 4, .sp = true}, {.causal_clean = true, .block = 4});
}

TEST(BlockDiffusionLayouts, ContextParallelTimesDataParallelMatchesOneProcess) {
  if (runtime().world().size() < 4) GTEST_SKIP() << "CP 2 x DP 2 needs 4 ranks";
  expect_same_as_single_process({.cp = 2, .comm = "p2p", .dist_opt = true}, {.documents = true, .block = 4});
  expect_same_as_single_process({.cp = 2, .comm = "all_gather", .dist_opt = true}, {.documents = true, .causal_clean = true, .block = 2});
}

TEST(BlockDiffusionSftLayouts, ContextParallelMatchesOneProcess) {
  // 16-token SFT rows: chunks of whole blocks of 2 at CP 2 and CP 4.
  expect_same_as_single_process({.cp = 0, .comm = "p2p"}, {.block = 2, .sft = true});
  expect_same_as_single_process({.cp = 0, .comm = "a2a", .kv_groups = 4},
                                {.causal_clean = true, .block = 2, .sft = true, .row_t = true});
}
