// The MoE block on one rank in f64: its backward (input, router and expert gradients, with the
// aux and z losses in the objective) against central finite differences, for each router
// variant; grouped and per-expert GEMMs computing the same function; experts without tokens.
#include <gtest/gtest.h>
#include <cmath>
#include <functional>
#include "megadlm/model/moe.h"
#include "megadlm/ops/elementwise.h"
#include "support/op_testing.h"
#include "support/tiny_model.h"

using namespace megadlm;

namespace {

struct Variant {
  const char* name;
  std::function<void(TransformerConfig&)> edit;
};

TransformerConfig tiny_moe_config() {
  RunConfig r = test::tiny_run({.layers = 1, .hidden = 8, .heads = 2, .query_groups = 2,
                                .kv_channels = 4, .ffn = 12, .seq = 5, .vocab = 16});
  test::make_moe(r, 4, 2);
  r.model.moe.aux_loss_coeff = 0.3f;  // large enough to matter in the gradient
  r.model.moe.z_loss_coeff = 0.05f;
  return r.model;
}

MicroBatch micro_batch(int64_t batch, int64_t seq) {
  MicroBatch mb;
  mb.batch = batch;
  mb.seq = seq;
  return mb;
}

/// One MoE layer with its own store (f64) and runtime.
struct Harness {
  TransformerConfig cfg;
  ParameterStore store;
  MoeLayer layer;
  ModelRuntime rt;
  std::unique_ptr<MoeStepState> state;

  explicit Harness(const TransformerConfig& c) : cfg(c) {
    layer = MoeLayer(cfg, 0, "decoder.layers.0.", store, ModelParallel::single());
    rt.stream = Stream::cpu();
    rt.dtype = DType::F64;
    store.materialize(DType::F64, 7, rt.stream);
    state = std::make_unique<MoeStepState>(cfg, DType::F64, rt.stream);
    state->aux_grad_scale = 1.0f;
    rt.moe = state.get();
  }

  /// <dy, y> + aux_coeff * aux + z_coeff * z: the objective the backward differentiates.
  double objective(const Tensor& x, const Tensor& dy, const MicroBatch& mb) {
    state->begin_step(rt.stream);
    MoeLayer::Saved saved;
    Tensor y = layer.forward(x, mb, saved, rt);
    const std::vector<double> st = test::to_doubles(state->stats);
    const int64_t e = cfg.moe.num_experts;
    const double aux = cfg.moe.load_balancing == MoeLoadBalancing::None ? 0.0 : st[static_cast<size_t>(2 * e)];
    return test::inner(dy, y) + cfg.moe.aux_loss_coeff * aux + cfg.moe.z_loss_coeff * st[static_cast<size_t>(2 * e + 1)];
  }
};

void expect_gradients_match(const TransformerConfig& cfg, const char* name) {
  const int64_t batch = 2, seq = 5, h = cfg.hidden_size;
  Harness hx(cfg);
  const MicroBatch mb = micro_batch(batch, seq);
  Tensor x = test::random_tensor({batch * seq, h}, 101, DType::F64);
  Tensor dy = test::random_tensor({batch * seq, h}, 102, DType::F64);
  // Analytic gradients.
  hx.state->begin_step(hx.rt.stream);
  hx.store.zero_grads(hx.rt.stream);
  MoeLayer::Saved saved;
  hx.layer.forward(x, mb, saved, hx.rt);
  Tensor dx = hx.layer.backward(dy, mb, saved, hx.rt);
  auto f = [&] { return hx.objective(x, dy, mb); };
  EXPECT_LT(test::rel_l2(test::to_doubles(dx), test::finite_difference(x, f)), 1e-6) << name << ": dx";
  for (int p = 0; p < static_cast<int>(hx.store.descs().size()); ++p) {
    Tensor param = hx.store.param(p);
    const std::vector<double> grad = test::to_doubles(hx.store.grad(p));
    EXPECT_LT(test::rel_l2(grad, test::finite_difference(param, f)), 1e-6)
        << name << ": " << hx.store.desc(p).name;
  }
}

}  // namespace

TEST(MoeLayer, GradientsMatchFiniteDifferencesForEveryRouter) {
  const Variant variants[] = {
      {"aux_loss softmax", [](TransformerConfig&) {}},
      {"pre-softmax scaled", [](TransformerConfig& c) {
         c.moe.pre_softmax = true;
         c.moe.topk_scaling_factor = 2.0f;
       }},
      {"sigmoid", [](TransformerConfig& c) { c.moe.score = MoeScoreFunction::Sigmoid; }},
      {"seq_aux_loss", [](TransformerConfig& c) { c.moe.load_balancing = MoeLoadBalancing::SeqAuxLoss; }},
      {"no balancing, top-1 pre-softmax", [](TransformerConfig& c) {
         c.moe.load_balancing = MoeLoadBalancing::None;
         c.moe.topk = 1;
         c.moe.pre_softmax = true;
       }},
      {"sinkhorn", [](TransformerConfig& c) {
         c.moe.load_balancing = MoeLoadBalancing::Sinkhorn;
         c.moe.aux_loss_coeff = 0.0f;
       }},
      {"expert choice", [](TransformerConfig& c) { c.moe.load_balancing = MoeLoadBalancing::ExpertChoice; }},
      {"capacity 0.5 (drops)", [](TransformerConfig& c) { c.moe.capacity_factor = 0.5f; }},
      {"group-limited", [](TransformerConfig& c) {
         c.moe.num_groups = 2;
         c.moe.group_topk = 1;
       }},
      {"shared experts", [](TransformerConfig& c) { c.moe.shared_expert_size = 6; }},
      {"GELU experts with biases", [](TransformerConfig& c) {
         c.activation = MlpActivation::Gelu;
         c.add_bias_linear = true;
       }},
      {"grouped GEMM", [](TransformerConfig& c) { c.moe.grouped_gemm = true; }},
  };
  for (const Variant& v : variants) {
    TransformerConfig cfg = tiny_moe_config();
    v.edit(cfg);
    expect_gradients_match(cfg, v.name);
  }
}

TEST(MoeLayer, GroupedAndPerExpertGemmsComputeTheSameFunction) {
  TransformerConfig cfg = tiny_moe_config();
  const MicroBatch mb = micro_batch(2, 5);
  Tensor x = test::random_tensor({10, cfg.hidden_size}, 201, DType::F64);
  Tensor dy = test::random_tensor({10, cfg.hidden_size}, 202, DType::F64);
  std::vector<double> outs[2], grads[2];
  for (int grouped = 0; grouped < 2; ++grouped) {
    cfg.moe.grouped_gemm = grouped == 1;
    Harness hx(cfg);
    MoeLayer::Saved saved;
    outs[grouped] = test::to_doubles(hx.layer.forward(x, mb, saved, hx.rt));
    hx.layer.backward(dy, mb, saved, hx.rt);
    grads[grouped] = test::to_doubles(hx.store.flat_grads());
  }
  EXPECT_EQ(outs[0], outs[1]);
  EXPECT_EQ(grads[0], grads[1]);
}

TEST(MoeLayer, ExpertsWithoutTokensGetZeroGradients) {
  // A bias of +100 on experts 0 and 1 sends every token to them (top-2): experts 2 and 3 get
  // nothing, their weight gradients stay zero and the statistics say so.
  TransformerConfig cfg = tiny_moe_config();
  cfg.moe.expert_bias = true;
  cfg.moe.score = MoeScoreFunction::Sigmoid;
  Harness hx(cfg);
  Tensor& bias = hx.state->expert_bias[0];
  copy_tensor(Tensor::from_floats({100, 100, 0, 0}, {4}), bias, hx.rt.stream);
  const MicroBatch mb = micro_batch(2, 5);
  Tensor x = test::random_tensor({10, cfg.hidden_size}, 301, DType::F64);
  Tensor dy = test::random_tensor({10, cfg.hidden_size}, 302, DType::F64);
  MoeLayer::Saved saved;
  hx.layer.forward(x, mb, saved, hx.rt);
  hx.layer.backward(dy, mb, saved, hx.rt);
  const std::vector<double> st = test::to_doubles(hx.state->stats);
  EXPECT_EQ(st[0], 10.0);
  EXPECT_EQ(st[1], 10.0);
  EXPECT_EQ(st[2], 0.0);
  EXPECT_EQ(st[3], 0.0);
  for (int p = 0; p < static_cast<int>(hx.store.descs().size()); ++p) {
    const ParamDesc& d = hx.store.desc(p);
    const std::vector<double> g = test::to_doubles(hx.store.grad(p));
    double norm = 0;
    for (double v : g) norm += v * v;
    const bool idle = d.name.find("experts.2.") != std::string::npos || d.name.find("experts.3.") != std::string::npos;
    if (idle) EXPECT_EQ(norm, 0.0) << d.name;
    else EXPECT_GT(norm, 0.0) << d.name;
  }
}
