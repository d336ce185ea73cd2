// Each tensor-parallel layer against the unsplit layer, in f64 on the CPU (SPMD under mpirun):
// every rank builds the unsplit layer and its TP slice from the same seed (weights are
// initialised by global element index, so the slice holds exactly the unsplit values), runs
// forward and backward on the same input, and compares the output, the input gradient and its
// slice of every weight gradient. Only summation order differs: 1e-12 relative.
#include <gtest/gtest.h>
#include <algorithm>
#include <cmath>
#include "megadlm/comm/bootstrap.h"
#include "megadlm/parallel/process_groups.h"
#include "megadlm/model/gpt_model.h"
#include "megadlm/parallel/tensor_parallel/mappings.h"
#include "support/op_testing.h"
#include "support/spmd.h"

using namespace megadlm;

namespace {

comm::DistributedRuntime& runtime() { return test::spmd::mpi_runtime(); }

TransformerConfig layer_config(bool gpt_style) {
  TransformerConfig c;
  c.num_layers = 1;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.num_query_groups = gpt_style ? 4 : 4;
  c.kv_channels = 8;
  c.ffn_hidden_size = 48;
  c.seq_length = 7;
  c.max_position_embeddings = 8;
  c.vocab_size = c.padded_vocab_size = 64;
  c.hidden_dropout = 0.2f;
  c.attention_dropout = 0.2f;
  c.position_embedding_type = gpt_style ? PositionEmbeddingType::LearnedAbsolute : PositionEmbeddingType::Rope;
  c.normalization = gpt_style ? NormType::LayerNorm : NormType::RMSNorm;
  c.activation = gpt_style ? MlpActivation::Gelu : MlpActivation::SwiGLU;
  c.qk_layernorm = !gpt_style;
  c.add_bias_linear = c.add_qkv_bias = gpt_style;
  c.untie_embeddings_and_output_weights = !gpt_style;
  c.attention_mask = gpt_style ? AttentionMaskType::Causal : AttentionMaskType::NoMask;
  return c;
}

MicroBatch batch(const TransformerConfig& c) {
  MicroBatch mb;
  mb.batch = 3;  // 21 rows: uneven sequence-parallel shards over 2 and 4 ranks
  mb.seq = c.seq_length;
  mb.first_sample = 5;
  const int64_t t = mb.batch * mb.seq;
  std::vector<int32_t> ids, pos;
  std::vector<float> w;
  for (int64_t i = 0; i < t; ++i) {
    ids.push_back(static_cast<int32_t>((i * 13 + 3) % c.vocab_size));
    pos.push_back(static_cast<int32_t>(i % mb.seq));
    w.push_back(0.25f + static_cast<float>(i % 3));
  }
  mb.input_ids = Tensor::from_ints(ids, {t});
  mb.labels = Tensor::from_ints(ids, {t});
  mb.positions = Tensor::from_ints(pos, {t});
  mb.loss_weights = Tensor::from_floats(w, {t}, DType::F64);
  return mb;
}

/// The slice of the full tensor `full` (global shape) that `d` describes.
std::vector<double> slice_of(const Tensor& full, const ParamDesc& d) {
  const std::vector<double> all = test::to_doubles(full);
  if (d.shape.size() < 2) {
    return std::vector<double>(all.begin() + d.row_offset, all.begin() + d.row_offset + d.numel());
  }
  const int64_t gcols = d.global_shape[1], rows = d.shape[0], cols = d.shape[1];
  std::vector<double> out;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out.push_back(all[static_cast<size_t>((d.row_offset + r) * gcols + d.col_offset + c)]);
  return out;
}

void compare_model(bool gpt_style, bool sp, bool overlap = false) {
  comm::DistributedRuntime& rt = runtime();
  const int world = rt.world().size();
  ParallelConfig pc;
  pc.world_size = world;
  pc.tensor_model_parallel_size = world;
  pc.sequence_parallel = sp;
  pc.tp_comm_overlap = overlap;
  parallel::ProcessGroups groups = parallel::ProcessGroups::build(rt.world_shared(), pc);
  const TransformerConfig cfg = layer_config(gpt_style);
  if (cfg.num_query_groups % world != 0) GTEST_SKIP() << "world does not divide the groups";
  const Stream cpu = Stream::cpu();

  ParameterStore full_store, tp_store;
  GptModel full(cfg, full_store);
  GptModel split(cfg, tp_store, ModelParallel::from(groups, pc));
  full_store.materialize(DType::F64, 11, cpu);
  tp_store.materialize(DType::F64, 11, cpu);
  for (const ParamDesc& d : tp_store.descs()) {  // the TP slice of every initial weight
    const auto i = std::find_if(full_store.descs().begin(), full_store.descs().end(),
                                [&](const ParamDesc& f) { return f.name == d.name; }) - full_store.descs().begin();
    ASSERT_EQ(test::to_doubles(tp_store.param(static_cast<int>(&d - tp_store.descs().data()))),
              slice_of(full_store.param(static_cast<int>(i)), d)) << d.name;
  }

  const MicroBatch mb = batch(cfg);
  ModelRuntime frt, trt;
  frt.dtype = trt.dtype = DType::F64;
  Tensor full_loss = Tensor::zeros({1}, DType::F64, cpu), tp_loss = Tensor::zeros({1}, DType::F64, cpu);
  ModelRecord frec, trec;
  full.forward(mb, frec, full_loss, 1.0f, frt);
  split.forward(mb, trec, tp_loss, 1.0f, trt);
  EXPECT_NEAR(tp_loss.data<double>()[0], full_loss.data<double>()[0], 1e-12 * std::fabs(full_loss.data<double>()[0]))
      << "rank " << rt.world().rank();
  full.backward(mb, frec, frt);
  split.backward(mb, trec, trt);
  for (size_t k = 0; k < tp_store.descs().size(); ++k) {
    const ParamDesc& d = tp_store.descs()[k];
    const auto i = std::find_if(full_store.descs().begin(), full_store.descs().end(),
                                [&](const ParamDesc& f) { return f.name == d.name; }) - full_store.descs().begin();
    Tensor g = tp_store.grad(static_cast<int>(k));
    std::vector<double> got = test::to_doubles(g);
    if (d.tp.partial_grad) {  // the partial sums over TP make the whole gradient
      Tensor sum = Tensor::from_floats(std::vector<float>(got.size(), 0.0f), {static_cast<int64_t>(got.size())}, DType::F64);
      std::copy(got.begin(), got.end(), sum.data<double>());
      groups.tp->all_reduce(sum, comm::ReduceOp::Sum, cpu);
      got = test::to_doubles(sum);
    }
    const std::vector<double> want = slice_of(full_store.grad(static_cast<int>(i)), d);
    // Relative, with an absolute floor: the key bias's true gradient is zero (softmax is
    // invariant to a shift of every key by the same vector), so both sides are rounding noise.
    double diff = 0, norm = 0;
    for (size_t e = 0; e < want.size(); ++e) {
      diff += (got[e] - want[e]) * (got[e] - want[e]);
      norm += want[e] * want[e];
    }
    EXPECT_LE(std::sqrt(diff), 1e-12 * std::sqrt(norm) + 1e-14) << d.name << " on rank " << rt.world().rank();
  }
}

}  // namespace

TEST(TensorParallelModel, ForwardAndEveryGradientSliceMatchTheUnsplitModel) {
  compare_model(false, false);
}

TEST(TensorParallelModel, SequenceParallelMatchesTheUnsplitModel) { compare_model(false, true); }

TEST(TensorParallelModel, GptStyleLayersWithBiasesMatchTheUnsplitModel) {
  compare_model(true, false);
  compare_model(true, true);
}

TEST(TensorParallelModel, CommOverlapMatchesTheUnsplitModel) {
  compare_model(false, true, true);
  compare_model(true, true, true);
}
