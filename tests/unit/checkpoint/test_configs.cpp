// What a checkpoint says about its model: the RunConfig's JSON form round-trips, differences
// are reported by flag name, --use-checkpoint-args flags rebuild the same model through the
// real parser, and the Hugging Face name and config mapping (both directions, and the models
// it must refuse, naming the flag or config field).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include "megadlm/training/arguments/arguments.h"
#include "megadlm/training/checkpoint/config_json.h"
#include "megadlm/training/checkpoint/huggingface.h"
#include "megadlm/training/arguments/checkpoint_args.h"
#include "support/scratch.h"

using namespace megadlm;
using test::error_of;
using namespace megadlm::checkpoint;

namespace {

RunConfig qwen3_like() {
  RunConfig r;
  TransformerConfig& m = r.model;
  m.num_layers = 3;
  m.hidden_size = 64;
  m.ffn_hidden_size = 96;
  m.num_attention_heads = 4;
  m.num_query_groups = 2;
  m.kv_channels = 32;  // not hidden / heads: Qwen3 has head_dim
  m.seq_length = 48;
  m.max_position_embeddings = 128;
  m.position_embedding_type = PositionEmbeddingType::Rope;
  m.rotary_base = 1000000.0f;
  m.normalization = NormType::RMSNorm;
  m.norm_epsilon = 1e-6f;
  m.activation = MlpActivation::SwiGLU;
  m.qk_layernorm = true;
  m.add_bias_linear = m.add_qkv_bias = false;
  m.untie_embeddings_and_output_weights = true;
  m.vocab_size = 1000;
  m.padded_vocab_size = 1024;
  m.attention_mask = AttentionMaskType::NoMask;
  r.diffusion.mask_token = 999;
  r.optimizer.lr = 2e-4f;
  r.optimizer.decay_style = LrDecayStyle::WSD;
  r.training.seed = 77;
  return r;
}

}  // namespace

TEST(RunConfigJson, RoundTripsEveryRecordedField) {
  const RunConfig a = qwen3_like();
  const RunConfig b = run_config_from_json(run_config_to_json(a), "test");
  EXPECT_EQ(run_config_to_json(a), run_config_to_json(b));
  EXPECT_EQ(b.model.kv_channels, 32);
  EXPECT_EQ(b.model.rotary_base, 1000000.0f);
  EXPECT_EQ(b.model.norm_epsilon, 1e-6f);
  EXPECT_EQ(b.optimizer.decay_style, LrDecayStyle::WSD);
  EXPECT_EQ(b.training.seed, 77u);
  EXPECT_NE(error_of([] { run_config_from_json("{\"x\": 1}", "ck/metadata.json"); }).find("ck/metadata.json: no run configuration"),
            std::string::npos);
}

TEST(RunConfigJson, RecordsTheBlockSizeScheduleAndTheAdaptation) {
  RunConfig a = qwen3_like();
  a.model.attention_mask = AttentionMaskType::BlockCausal;
  a.diffusion.block_size = 16;
  a.diffusion.block_size_schedule = {{1, 100}, {4, 300}};
  a.diffusion.adapted_from = "vanilla (autoregressive, causal) (ck, iteration 40)";
  const std::string text = run_config_to_json(a);
  // The JSON spells the schedule as [size, until] pairs, as docs/finetuning.md shows it.
  EXPECT_NE(text.find("\"block_size_schedule\": [\n      [\n        1,\n        100\n      ],"), std::string::npos) << text;
  const RunConfig b = run_config_from_json(text, "test");
  EXPECT_EQ(b.diffusion.block_size_schedule, a.diffusion.block_size_schedule);
  EXPECT_EQ(b.diffusion.adapted_from, a.diffusion.adapted_from);
  EXPECT_EQ(b.diffusion.block_size_at(99), 1);
  EXPECT_EQ(b.diffusion.block_size_at(100), 4);
  EXPECT_EQ(b.diffusion.block_size_at(300), 16);
  // A checkpoint written before the schedule existed reads as "no schedule".
  const RunConfig old = run_config_from_json(run_config_to_json(qwen3_like()), "test");
  EXPECT_TRUE(old.diffusion.block_size_schedule.empty());
  EXPECT_TRUE(old.diffusion.adapted_from.empty());
}

TEST(HuggingFace, BlockModelsCarryTheirBlockSizeBothWays) {
  RunConfig a = qwen3_like();
  a.model.attention_mask = AttentionMaskType::BlockCausal;
  a.model.block_diffusion_causal_clean = true;
  a.diffusion.block_size = 16;
  const std::string text = hf_config_json(a, DType::BF16);
  const nlohmann::json j = nlohmann::json::parse(text);
  EXPECT_EQ(j.at("block_size").get<int64_t>(), 16);
  EXPECT_EQ(j.at("mask_token_id").get<int64_t>(), 999);
  const RunConfig b = run_config_from_hf(text, "config.json");
  EXPECT_EQ(b.model.attention_mask, AttentionMaskType::BlockCausal);
  EXPECT_TRUE(b.model.block_diffusion_causal_clean);
  EXPECT_EQ(b.diffusion.block_size, 16);
  EXPECT_EQ(b.diffusion.mask_token, 999);
  // A block model's own config (Qwen3 architecture, block_size and mask_token_id at the top, no
  // megadlm section): block diffusion with a block-causal clean half.
  const RunConfig s = run_config_from_hf(R"({"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 96,
      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
      "vocab_size": 1024, "block_size": 4, "mask_token_id": 1000})", "config.json");
  EXPECT_EQ(s.model.attention_mask, AttentionMaskType::BlockCausal);
  EXPECT_FALSE(s.model.block_diffusion_causal_clean);
  EXPECT_EQ(s.diffusion.block_size, 4);
  EXPECT_EQ(s.diffusion.mask_token, 1000);
  // Without block_size: the full-sequence model, as before.
  EXPECT_EQ(run_config_from_hf(hf_config_json(qwen3_like(), DType::BF16), "c.json").model.attention_mask,
            AttentionMaskType::NoMask);
}

TEST(RunConfigJson, ReportsDifferencesByFlagName) {
  const RunConfig saved = qwen3_like();
  RunConfig now = saved;
  now.model.hidden_size = 128;
  now.model.padded_vocab_size = 1152;
  now.model.seq_length = 96;
  now.diffusion.mask_token = 5;
  auto diffs = compare_run_configs(saved, now, false);
  std::map<std::string, ConfigMismatch> by;
  for (const auto& d : diffs) by[d.field.substr(0, d.field.find(' '))] = d;
  ASSERT_TRUE(by.count("--hidden-size"));
  EXPECT_EQ(by["--hidden-size"].saved, "64");
  EXPECT_EQ(by["--hidden-size"].current, "128");
  EXPECT_TRUE(by["--hidden-size"].fatal);
  EXPECT_TRUE(by["padded"].fatal);
  EXPECT_TRUE(by["--seq-length"].fatal);
  EXPECT_FALSE(by["--mask-token"].fatal);
  for (const auto& d : compare_run_configs(saved, now, true))
    if (d.field == "--seq-length") {
      EXPECT_FALSE(d.fatal) << "fine-tuning may change the sequence length";
    }
}

TEST(CheckpointArgs, RebuildTheSameModelThroughTheParser) {
  for (const bool qwen2 : {false, true}) {
    RunConfig a = qwen3_like();
    if (qwen2) {
      a.model.qk_layernorm = false;
      a.model.add_qkv_bias = true;
      a.model.untie_embeddings_and_output_weights = false;
      a.model.num_query_groups = a.model.num_attention_heads;
      a.model.kv_channels = 16;
    }
    std::vector<std::string> argv = training::checkpoint_model_args(a);
    for (const char* x : {"--micro-batch-size", "1", "--lr", "1e-3", "--train-iters", "5", "--mock-data"}) argv.push_back(x);
    const RunConfig b = training::parse_arguments(argv, {}).config;
    const auto diffs = compare_run_configs(a, b, false);
    for (const auto& d : diffs) ADD_FAILURE() << (qwen2 ? "qwen2: " : "qwen3: ") << d.field << " " << d.saved << " vs " << d.current;
    EXPECT_EQ(b.model.init_method_std, a.model.init_method_std);
  }
}

TEST(CheckpointArgs, PickThePaddingMultipleThatRebuildsThePaddedVocabulary) {
  EXPECT_EQ(training::vocab_padding_multiple(50289, 50304), 128);  // Megatron's default fits
  EXPECT_EQ(training::vocab_padding_multiples(50289, 50304), (std::vector<int64_t>{16, 32, 64, 128}));
  EXPECT_EQ(training::vocab_padding_multiple(128, 256), 256);      // saved at TP 2 with 128
  EXPECT_EQ(training::vocab_padding_multiple(100, 104), 8);
  EXPECT_EQ(training::vocab_padding_multiple(151936, 151936), 128);
  EXPECT_EQ(training::vocab_padding_multiple(100, 97), 1);          // nothing fits
}

TEST(CheckpointArgs, CommandLineFlagsWinOverTheCheckpoints) {
  std::vector<std::string> errors;
  // No --use-checkpoint-args: unchanged.
  const std::vector<std::string> plain = {"--load", "/nonexistent", "--seq-length", "7"};
  EXPECT_EQ(training::with_checkpoint_args(plain, errors), plain);
  EXPECT_TRUE(errors.empty());
  // A --load without a checkpoint: an error naming the flag.
  training::with_checkpoint_args({"--use-checkpoint-args", "--load", "/nonexistent"}, errors);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("`--use-checkpoint-args`: `--load /nonexistent` holds no checkpoint"), std::string::npos) << errors[0];
}

TEST(HuggingFace, MapsEveryParameterNameBothWays) {
  for (const auto& [ours, hf] : std::vector<std::pair<std::string, std::string>>{
           {"embedding.word_embeddings.weight", "model.embed_tokens.weight"},
           {"decoder.final_layernorm.weight", "model.norm.weight"},
           {"output_layer.weight", "lm_head.weight"},
           {"decoder.layers.0.input_layernorm.weight", "model.layers.0.input_layernorm.weight"},
           {"decoder.layers.11.self_attention.linear_q.weight", "model.layers.11.self_attn.q_proj.weight"},
           {"decoder.layers.11.self_attention.linear_k.bias", "model.layers.11.self_attn.k_proj.bias"},
           {"decoder.layers.2.self_attention.linear_v.weight", "model.layers.2.self_attn.v_proj.weight"},
           {"decoder.layers.2.self_attention.q_layernorm.weight", "model.layers.2.self_attn.q_norm.weight"},
           {"decoder.layers.2.self_attention.k_layernorm.weight", "model.layers.2.self_attn.k_norm.weight"},
           {"decoder.layers.2.self_attention.linear_proj.weight", "model.layers.2.self_attn.o_proj.weight"},
           {"decoder.layers.2.pre_mlp_layernorm.weight", "model.layers.2.post_attention_layernorm.weight"},
           {"decoder.layers.2.mlp.linear_fc1_gate.weight", "model.layers.2.mlp.gate_proj.weight"},
           {"decoder.layers.2.mlp.linear_fc1_up.weight", "model.layers.2.mlp.up_proj.weight"},
           {"decoder.layers.2.mlp.linear_fc2.weight", "model.layers.2.mlp.down_proj.weight"}}) {
    EXPECT_EQ(hf_tensor_name(ours), hf);
    EXPECT_EQ(megadlm_tensor_name(hf), ours);
  }
  EXPECT_FALSE(megadlm_tensor_name("model.layers.0.self_attn.rotary_emb.inv_freq").has_value());
  EXPECT_NE(error_of([] { hf_tensor_name("embedding.position_embeddings.weight"); }).find("has no Hugging Face name"),
            std::string::npos);
}

TEST(HuggingFace, ConfigRoundTripsAndRefusesWhatQwenCannotBe) {
  const RunConfig a = qwen3_like();
  const RunConfig b = run_config_from_hf(hf_config_json(a, DType::BF16), "config.json");
  for (const auto& d : compare_run_configs(a, b, false)) ADD_FAILURE() << d.field << " " << d.saved << " vs " << d.current;
  EXPECT_EQ(b.diffusion.mask_token, 999);
  EXPECT_EQ(hf_architecture_for(a.model), HfArchitecture::Qwen3);

  auto refused = [](auto change) {
    RunConfig c = qwen3_like();
    change(c.model);
    return error_of([&] { hf_architecture_for(c.model); });
  };
  EXPECT_NE(refused([](TransformerConfig& m) { m.normalization = NormType::LayerNorm; }).find("--normalization RMSNorm"), std::string::npos);
  EXPECT_NE(refused([](TransformerConfig& m) { m.activation = MlpActivation::Gelu; }).find("--swiglu"), std::string::npos);
  EXPECT_NE(refused([](TransformerConfig& m) { m.add_bias_linear = true; }).find("--disable-bias-linear"), std::string::npos);
  EXPECT_NE(refused([](TransformerConfig& m) { m.position_embedding_type = PositionEmbeddingType::LearnedAbsolute; })
                .find("--position-embedding-type rope"), std::string::npos);
  EXPECT_NE(refused([](TransformerConfig& m) { m.qk_layernorm = false; }).find("--kv-channels"), std::string::npos);

  const std::string qwen2 = R"({"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
      "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
      "max_position_embeddings": 32768, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
      "tie_word_embeddings": true, "hidden_act": "silu"})";
  const RunConfig q = run_config_from_hf(qwen2, "config.json");
  EXPECT_EQ(q.model.kv_channels, 64);
  EXPECT_TRUE(q.model.add_qkv_bias);
  EXPECT_FALSE(q.model.qk_layernorm);
  EXPECT_FALSE(q.model.untie_embeddings_and_output_weights);
  EXPECT_EQ(q.model.padded_vocab_size, 151936);
  EXPECT_EQ(q.model.attention_mask, AttentionMaskType::NoMask);
  EXPECT_NE(error_of([] { run_config_from_hf(R"({"model_type": "llama"})", "c.json"); }).find("model_type 'llama' is not supported"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              std::string s = qwen2;
              s.insert(1, R"("rope_scaling": {"type": "yarn", "factor": 4},)");
              run_config_from_hf(s, "c.json");
            }).find("rope_scaling"),
            std::string::npos);
}
