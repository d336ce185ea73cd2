// Hugging Face Qwen3-MoE mapping on the CPU: parameter names both ways, config.json both ways
// (top-k routing, dense layers, expert width), the refusals, and a tiny MoE checkpoint exported
// and imported back: the same tensors under the Hugging Face names, and the same logits.
// (The comparison against transformers is `convert_checkpoint --verify` on the device.)
#include <gtest/gtest.h>
#include <cmath>
#include <cstring>
#include "megadlm/model/gpt_model.h"
#include "megadlm/training/checkpoint/checkpoint.h"
#include "megadlm/training/checkpoint/config_json.h"
#include "megadlm/training/checkpoint/huggingface.h"
#include "megadlm/training/checkpoint/safetensors.h"
#include "support/scratch.h"

using namespace megadlm;
using namespace megadlm::checkpoint;
using test::error_of;

namespace {

RunConfig qwen3_moe_like() {
  RunConfig r;
  TransformerConfig& m = r.model;
  m.num_layers = 3;
  m.hidden_size = 32;
  m.ffn_hidden_size = 48;  // the dense layer's MLP
  m.num_attention_heads = 4;
  m.num_query_groups = 2;
  m.kv_channels = 16;
  m.seq_length = 12;
  m.max_position_embeddings = 64;
  m.position_embedding_type = PositionEmbeddingType::Rope;
  m.rotary_base = 1000000.0f;
  m.normalization = NormType::RMSNorm;
  m.norm_epsilon = 1e-6f;
  m.activation = MlpActivation::SwiGLU;
  m.qk_layernorm = true;
  m.add_bias_linear = m.add_qkv_bias = false;
  m.untie_embeddings_and_output_weights = true;
  m.vocab_size = m.padded_vocab_size = 64;
  m.attention_mask = AttentionMaskType::NoMask;
  m.moe.num_experts = 4;
  m.moe.topk = 2;
  m.moe.ffn_hidden_size = 24;
  m.moe.moe_layers = {true, false, true};
  m.moe.aux_loss_coeff = 0.001f;
  r.diffusion.mask_token = 63;
  return r;
}

}  // namespace

TEST(HuggingFaceMoe, MapsRouterAndExpertNamesBothWays) {
  for (const auto& [ours, hf] : std::vector<std::pair<std::string, std::string>>{
           {"decoder.layers.4.mlp.router.weight", "model.layers.4.mlp.gate.weight"},
           {"decoder.layers.4.mlp.experts.17.linear_fc1_gate.weight", "model.layers.4.mlp.experts.17.gate_proj.weight"},
           {"decoder.layers.4.mlp.experts.17.linear_fc1_up.weight", "model.layers.4.mlp.experts.17.up_proj.weight"},
           {"decoder.layers.0.mlp.experts.0.linear_fc2.weight", "model.layers.0.mlp.experts.0.down_proj.weight"}}) {
    EXPECT_EQ(hf_tensor_name(ours), hf);
    EXPECT_EQ(megadlm_tensor_name(hf), ours);
  }
  EXPECT_NE(error_of([] { hf_tensor_name("decoder.layers.0.mlp.shared_experts.linear_fc2.weight"); })
                .find("has no Hugging Face name"),
            std::string::npos);
}

TEST(HuggingFaceMoe, ConfigRoundTripsAsQwen3Moe) {
  for (const bool pre_softmax : {false, true}) {
    RunConfig a = qwen3_moe_like();
    a.model.moe.pre_softmax = pre_softmax;
    ASSERT_EQ(hf_architecture_for(a.model), HfArchitecture::Qwen3Moe);
    const std::string text = hf_config_json(a, DType::BF16);
    EXPECT_NE(text.find("\"model_type\": \"qwen3_moe\""), std::string::npos) << text;
    EXPECT_NE(text.find("\"mlp_only_layers\": [\n    1\n  ]"), std::string::npos) << text;
    EXPECT_NE(text.find(std::string("\"norm_topk_prob\": ") + (pre_softmax ? "false" : "true")), std::string::npos);
    const RunConfig b = run_config_from_hf(text, "config.json");
    for (const auto& d : compare_run_configs(a, b, false)) ADD_FAILURE() << d.field << " " << d.saved << " vs " << d.current;
    EXPECT_EQ(b.model.moe.moe_layers, a.model.moe.moe_layers);
    EXPECT_EQ(b.model.moe.ffn_hidden_size, 24);
    EXPECT_EQ(b.model.ffn_hidden_size, 48);
    EXPECT_EQ(b.model.moe.pre_softmax, pre_softmax);
  }
  // transformers' own spelling of every-other-layer MoE: decoder_sparse_step 2 -> layers 1, 3.
  const RunConfig c = run_config_from_hf(R"({"model_type": "qwen3_moe", "hidden_size": 32,
      "intermediate_size": 48, "moe_intermediate_size": 16, "num_experts": 8, "num_experts_per_tok": 2,
      "decoder_sparse_step": 2, "mlp_only_layers": [], "norm_topk_prob": true, "num_hidden_layers": 4,
      "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 64})", "config.json");
  EXPECT_EQ(c.model.moe.moe_layers, (std::vector<bool>{false, true, false, true}));
  EXPECT_TRUE(c.model.qk_layernorm);
}

TEST(HuggingFaceMoe, RefusesWhatQwen3MoeCannotBe) {
  auto refused = [](auto change) {
    RunConfig c = qwen3_moe_like();
    change(c.model.moe);
    return error_of([&] { hf_architecture_for(c.model); });
  };
  EXPECT_NE(refused([](MoeConfig& m) { m.score = MoeScoreFunction::Sigmoid; }).find("sigmoids"), std::string::npos);
  EXPECT_NE(refused([](MoeConfig& m) { m.capacity_factor = 1.0f; }).find("--moe-expert-capacity-factor"), std::string::npos);
  EXPECT_NE(refused([](MoeConfig& m) { m.shared_expert_size = 8; }).find("shared experts"), std::string::npos);
  EXPECT_NE(refused([](MoeConfig& m) { m.load_balancing = MoeLoadBalancing::ExpertChoice; }).find("top-k"), std::string::npos);
  EXPECT_NE(refused([](MoeConfig& m) { m.expert_bias = true; }).find("expert bias"), std::string::npos);
}

TEST(HuggingFaceMoe, ExportAndImportKeepEveryTensorAndTheLogits) {
  test::TempDir dir;
  const RunConfig cfg = qwen3_moe_like();
  // A checkpoint of the model's initial weights.
  ParameterStore store;
  GptModel model(cfg.model, store);
  store.materialize(DType::F32, 5, Stream::cpu());
  std::vector<OutgoingPiece> pieces;
  for (size_t h = 0; h < store.descs().size(); ++h) {
    const ParamDesc& d = store.descs()[h];
    pieces.push_back({kModelPrefix + d.name, d.shape, Region::whole(d.shape), DType::F32,
                      store.param(static_cast<int>(h)).data_ptr(), false});
  }
  CheckpointState st;
  st.run_config_json = run_config_to_json(cfg);
  CheckpointWriter(nullptr, Stream::cpu()).save(dir / "ckpt", kReleaseDirName, st, pieces, nullptr, false);
  const CheckpointReader original(*find_checkpoint(dir / "ckpt", std::nullopt));

  export_hf(original, dir / "hf", {});
  const HfWeights hf(dir / "hf");
  EXPECT_TRUE(hf.contains("model.layers.0.mlp.gate.weight"));
  EXPECT_TRUE(hf.contains("model.layers.2.mlp.experts.3.down_proj.weight"));
  EXPECT_TRUE(hf.contains("model.layers.1.mlp.gate_proj.weight"));  // the dense layer
  EXPECT_FALSE(hf.contains("model.layers.1.mlp.gate.weight"));
  EXPECT_EQ(hf.read("model.layers.2.mlp.experts.3.gate_proj.weight").shape(), (Shape{24, 32}));

  import_hf(dir / "hf", dir / "back", {});
  const CheckpointReader back(*find_checkpoint(dir / "back", std::nullopt));
  ASSERT_EQ(back.index().tensors.size(), original.index().tensors.size());
  for (const auto& [name, info] : original.index().tensors) {
    ASSERT_TRUE(back.has_tensor(name)) << name;
    const Tensor x = original.read_whole(name), y = back.read_whole(name);
    ASSERT_EQ(x.nbytes(), y.nbytes()) << name;
    EXPECT_EQ(std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()), 0) << name;
  }
  std::vector<int32_t> tokens;
  for (int i = 0; i < 24; ++i) tokens.push_back((i * 7) % 64);
  const std::vector<float> a = checkpoint_logits(original, tokens, 2, 12, Device::cpu()).to_floats(Stream::cpu());
  const std::vector<float> b = checkpoint_logits(back, tokens, 2, 12, Device::cpu()).to_floats(Stream::cpu());
  EXPECT_EQ(a, b);
  float spread = 0;
  for (float v : a) spread = std::max(spread, std::fabs(v));
  EXPECT_GT(spread, 0.0f);
}
