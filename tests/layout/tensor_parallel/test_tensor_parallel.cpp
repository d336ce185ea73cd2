// Layout equivalence for tensor (and sequence) parallelism, as an SPMD program under mpirun:
// every rank trains the tiny diffusion LM with TP (x DP) spread over the world and, on its own,
// the single-process reference; per-iteration losses and gradient norms must agree to 1e-5
// (relative). Differences come only from fp32 summation order (TP all-reduces, split GEMMs).
// Cases: TP = world (2 or 4) with and without SP, TP 2 x DP 2 (4 ranks), MHA and GQA,
// tied and untied embeddings, LayerNorm + GELU + learned positions + biases.
#include <gtest/gtest.h>
#include <cmath>
#include <sstream>
#include "megadlm/comm/bootstrap.h"
#include "megadlm/comm/process_groups.h"
#include "megadlm/data/mock_dataset.h"
#include "megadlm/training/trainer.h"
#include "support/spmd.h"

using namespace megadlm;

namespace {

comm::DistributedRuntime& runtime() { return test::spmd::mpi_runtime(); }

struct Variant {
  int tp = 1;
  bool sp = false;
  int query_groups = 4;
  bool untied = true;
  bool gpt_style = false;  // LayerNorm, GELU, learned positions, biases, causal AR
  bool dist_opt = false;
};

RunConfig tiny_run(const Variant& v, int world) {
  RunConfig r;
  TransformerConfig& m = r.model;
  m.num_layers = 2;
  m.hidden_size = 64;
  m.num_attention_heads = 4;
  m.num_query_groups = v.query_groups;
  m.kv_channels = 16;
  m.ffn_hidden_size = 128;
  m.seq_length = 30;  // 2 x 30 = 60 rows: not a multiple of 4 (exercises SP padding)
  m.max_position_embeddings = 32;
  m.untie_embeddings_and_output_weights = v.untied;
  m.vocab_size = m.padded_vocab_size = 128;
  m.hidden_dropout = 0.1f;
  m.attention_dropout = 0.1f;
  if (v.gpt_style) {
    m.position_embedding_type = PositionEmbeddingType::LearnedAbsolute;
    m.normalization = NormType::LayerNorm;
    m.activation = MlpActivation::Gelu;
    m.add_bias_linear = m.add_qkv_bias = true;
    m.attention_mask = AttentionMaskType::Causal;
    r.diffusion.mode = RunningMode::Vanilla;
  } else {
    m.position_embedding_type = PositionEmbeddingType::Rope;
    m.normalization = NormType::RMSNorm;
    m.activation = MlpActivation::SwiGLU;
    m.qk_layernorm = true;
    m.add_bias_linear = m.add_qkv_bias = false;
  }
  r.diffusion.mask_token = 127;
  r.diffusion.varilen_prob = 0.3f;  // truncated micro-batches: SP shards of uneven rows
  r.optimizer.lr = 3e-3f;
  r.optimizer.lr_warmup_iters = 2;
  r.optimizer.lr_decay_iters = 12;
  r.optimizer.decay_style = LrDecayStyle::Cosine;
  r.optimizer.weight_decay = 0.1f;
  r.optimizer.clip_grad = 0.5f;
  r.training.micro_batch_size = 2;
  r.training.global_batch_size = 4;
  r.training.train_iters = 12;
  r.training.log_interval = 1000;
  r.training.device = DeviceKind::Cpu;
  r.parallel.world_size = world;
  r.parallel.tensor_model_parallel_size = v.tp;
  r.parallel.sequence_parallel = v.sp && v.tp > 1;
  r.parallel.data_parallel_size = world / v.tp;
  r.parallel.use_distributed_optimizer = v.dist_opt;
  return r;
}

std::vector<IterationMetrics> train(const RunConfig& cfg, const comm::ProcessGroups* groups) {
  auto data = std::make_shared<MockGptDataset>(128, 30, 127);
  std::ostringstream log;
  Trainer t(cfg, data, log, groups);
  return t.train();
}

void expect_same_as_single_process(Variant v) {
  comm::DistributedRuntime& rt = runtime();
  const int world = rt.world().size();
  if (v.tp == 0) v.tp = world;  // "all ranks"
  if (world % v.tp != 0) GTEST_SKIP() << "TP " << v.tp << " does not divide world " << world;
  if (v.query_groups % v.tp != 0) GTEST_SKIP() << "TP " << v.tp << " does not divide the KV groups";
  const RunConfig cfg = tiny_run(v, world);
  comm::ProcessGroups groups = comm::ProcessGroups::build(rt.world_shared(), cfg.parallel);
  const auto split = train(cfg, &groups);
  Variant one = v;
  one.tp = 1;
  one.sp = false;
  one.dist_opt = false;
  const auto ref = train(tiny_run(one, 1), nullptr);
  ASSERT_EQ(split.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_NEAR(split[i].lm_loss, ref[i].lm_loss, 1e-5 * ref[i].lm_loss)
        << "rank " << rt.world().rank() << ", iteration " << i + 1 << ", tp " << v.tp << " sp " << v.sp;
    EXPECT_NEAR(split[i].grad_norm, ref[i].grad_norm, 1e-5 * ref[i].grad_norm)
        << "rank " << rt.world().rank() << ", iteration " << i + 1 << ", tp " << v.tp << " sp " << v.sp;
  }
}

}  // namespace

TEST(TensorParallel, AllRanksMatchOneProcess) { expect_same_as_single_process({.tp = 0}); }

TEST(TensorParallel, SequenceParallelMatchesOneProcess) {
  expect_same_as_single_process({.tp = 0, .sp = true});
}

TEST(TensorParallel, GroupedQueryAttentionWithTwoGroupsMatchesOneProcess) {
  expect_same_as_single_process({.tp = 2, .sp = true, .query_groups = 2});
}

TEST(TensorParallel, TiedEmbeddingsMatchOneProcess) {
  expect_same_as_single_process({.tp = 0, .sp = true, .untied = false});
}

TEST(TensorParallel, LayerNormGeluBiasesAndLearnedPositionsMatchOneProcess) {
  expect_same_as_single_process({.tp = 0, .gpt_style = true});
  expect_same_as_single_process({.tp = 0, .sp = true, .gpt_style = true});
}

TEST(TensorParallel, TwoByTwoWithDataParallelAndDistributedOptimizerMatchesOneProcess) {
  // On 4 ranks: TP 2 x DP 2; on 2 ranks: TP 2 x DP 1.
  expect_same_as_single_process({.tp = 2, .sp = true, .dist_opt = true});
  expect_same_as_single_process({.tp = 2, .sp = false});
}
