// The public Hugging Face formats of block-diffusion model families (--hf-format; docs/
// checkpoints.md "Block-diffusion formats"): SDAR (Qwen3 names, block_size), Fast-dLLM v2 (Qwen2
// names with q/k/v biases, bd_size, the mask id from added_tokens.json) and LLaDA (its own
// module names and OLMo-style config keys). Names both ways, config.json both ways, refusals that
// name the file and key, and tiny checkpoints exported in each format and imported back: the same
// tensors bitwise and the same logits.
#include <gtest/gtest.h>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include "megadlm/model/gpt_model.h"
#include "megadlm/training/checkpoint/checkpoint.h"
#include "megadlm/training/checkpoint/config_json.h"
#include "megadlm/training/checkpoint/huggingface.h"
#include "support/scratch.h"

using namespace megadlm;
using namespace megadlm::checkpoint;
using test::error_of;
using nlohmann::json;

namespace {

RunConfig dense(bool qk_norm) {
  RunConfig r;
  TransformerConfig& m = r.model;
  m.num_layers = 2;
  m.hidden_size = 32;
  m.ffn_hidden_size = 48;
  m.num_attention_heads = 4;
  m.num_query_groups = 2;
  m.kv_channels = 8;
  m.seq_length = 16;
  m.max_position_embeddings = 64;
  m.position_embedding_type = PositionEmbeddingType::Rope;
  m.rotary_base = 10000.0f;
  m.normalization = NormType::RMSNorm;
  m.norm_epsilon = 1e-5f;
  m.activation = MlpActivation::SwiGLU;
  m.qk_layernorm = qk_norm;
  m.add_bias_linear = false;
  m.add_qkv_bias = !qk_norm;
  m.untie_embeddings_and_output_weights = true;
  m.vocab_size = 60;
  m.padded_vocab_size = 64;
  m.attention_mask = AttentionMaskType::NoMask;
  r.diffusion.mask_token = 59;
  return r;
}

RunConfig block(RunConfig r, int64_t b) {
  r.model.attention_mask = AttentionMaskType::BlockCausal;
  r.diffusion.block_size = b;
  return r;
}

RunConfig sdar_like() { return block(dense(true), 4); }
RunConfig fast_dllm_like() { return block(dense(false), 8); }
RunConfig llada_like() {
  RunConfig r = dense(false);
  r.model.add_qkv_bias = false;
  return r;
}

void save_initial_weights(const RunConfig& cfg, const std::string& dir) {
  ParameterStore store;
  GptModel model(cfg.model, store);
  store.materialize(DType::F32, 11, Stream::cpu());
  std::vector<OutgoingPiece> pieces;
  for (size_t h = 0; h < store.descs().size(); ++h) {
    const ParamDesc& d = store.descs()[h];
    Tensor p = store.param(static_cast<int>(h));
    if (d.name.find(".bias") != std::string::npos) {  // non-zero biases, so their mapping is checked
      std::vector<float> v(static_cast<size_t>(p.numel()));
      for (size_t i = 0; i < v.size(); ++i) v[i] = 0.01f * static_cast<float>(i % 7) - 0.02f;
      copy_tensor(Tensor::from_floats(v, d.shape), p, Stream::cpu());
    }
    pieces.push_back({kModelPrefix + d.name, d.shape, Region::whole(d.shape), DType::F32, p.data_ptr(), false});
  }
  CheckpointState st;
  st.run_config_json = run_config_to_json(cfg);
  CheckpointWriter(nullptr, Stream::cpu()).save(dir, kReleaseDirName, st, pieces, nullptr, false);
}

json config_of(const std::string& hf_dir) {
  std::ifstream in(hf_dir + "/config.json");
  return json::parse(in);
}

}  // namespace

TEST(HuggingFaceBlockFormats, LladaNamesBothWays) {
  const std::pair<const char*, const char*> cases[] = {
      {"embedding.word_embeddings.weight", "model.transformer.wte.weight"},
      {"decoder.final_layernorm.weight", "model.transformer.ln_f.weight"},
      {"output_layer.weight", "model.transformer.ff_out.weight"},
      {"decoder.layers.3.input_layernorm.weight", "model.transformer.blocks.3.attn_norm.weight"},
      {"decoder.layers.3.self_attention.linear_q.weight", "model.transformer.blocks.3.q_proj.weight"},
      {"decoder.layers.3.self_attention.linear_k.weight", "model.transformer.blocks.3.k_proj.weight"},
      {"decoder.layers.3.self_attention.linear_v.bias", "model.transformer.blocks.3.v_proj.bias"},
      {"decoder.layers.3.self_attention.linear_proj.weight", "model.transformer.blocks.3.attn_out.weight"},
      {"decoder.layers.3.pre_mlp_layernorm.weight", "model.transformer.blocks.3.ff_norm.weight"},
      {"decoder.layers.3.mlp.linear_fc1_gate.weight", "model.transformer.blocks.3.ff_proj.weight"},
      {"decoder.layers.3.mlp.linear_fc1_up.weight", "model.transformer.blocks.3.up_proj.weight"},
      {"decoder.layers.3.mlp.linear_fc2.weight", "model.transformer.blocks.3.ff_out.weight"},
  };
  for (const auto& [ours, hf] : cases) {
    EXPECT_EQ(hf_tensor_name(ours, HfFormat::Llada), hf);
    EXPECT_EQ(megadlm_tensor_name(hf, HfFormat::Llada), ours);
  }
  // SDAR and Fast-dLLM v2 keep Qwen's names.
  EXPECT_EQ(hf_tensor_name("decoder.layers.1.self_attention.q_layernorm.weight", HfFormat::Sdar),
            "model.layers.1.self_attn.q_norm.weight");
  EXPECT_EQ(hf_tensor_name("decoder.layers.1.self_attention.linear_k.bias", HfFormat::FastDllmV2),
            "model.layers.1.self_attn.k_proj.bias");
  EXPECT_FALSE(megadlm_tensor_name("model.layers.0.self_attn.q_proj.weight", HfFormat::Llada).has_value());
  EXPECT_NE(error_of([] { hf_tensor_name("decoder.layers.0.self_attention.q_layernorm.weight", HfFormat::Llada); })
                .find("has no name in the llada format"),
            std::string::npos);
}

TEST(HuggingFaceBlockFormats, ConfigsCarryEachFamilysKeysBothWays) {
  const json s = json::parse(hf_config_json(sdar_like(), DType::BF16, HfFormat::Sdar));
  EXPECT_EQ(s.at("model_type"), "sdar");
  EXPECT_EQ(s.at("architectures")[0], "SDARForCausalLM");
  EXPECT_EQ(s.at("block_size"), 4);
  EXPECT_EQ(s.at("mask_token_id"), 59);
  const json f = json::parse(hf_config_json(fast_dllm_like(), DType::BF16, HfFormat::FastDllmV2));
  EXPECT_EQ(f.at("model_type"), "Fast_dLLM_Qwen");
  EXPECT_EQ(f.at("architectures")[0], "Fast_dLLM_QwenForCausalLM");
  EXPECT_EQ(f.at("bd_size"), 8);
  EXPECT_FALSE(f.contains("block_size"));
  const json l = json::parse(hf_config_json(llada_like(), DType::BF16, HfFormat::Llada));
  EXPECT_EQ(l.at("model_type"), "llada");
  EXPECT_EQ(l.at("architectures")[0], "LLaDAModelLM");
  EXPECT_EQ(l.at("d_model"), 32);
  EXPECT_EQ(l.at("n_layers"), 2);
  EXPECT_EQ(l.at("n_heads"), 4);
  EXPECT_EQ(l.at("n_kv_heads"), 2);
  EXPECT_EQ(l.at("mlp_hidden_size"), 48);
  EXPECT_EQ(l.at("embedding_size"), 64);
  EXPECT_EQ(l.at("weight_tying"), false);
  EXPECT_EQ(l.at("mask_token_id"), 59);
  for (const auto& [cfg, fmt] : {std::pair{sdar_like(), HfFormat::Sdar}, std::pair{fast_dllm_like(), HfFormat::FastDllmV2},
                                 std::pair{llada_like(), HfFormat::Llada}}) {
    const std::string text = hf_config_json(cfg, DType::F32, fmt);
    EXPECT_EQ(hf_format_of_config(text, "config.json"), fmt);
    const RunConfig back = run_config_from_hf(text, "config.json");
    const auto diffs = compare_run_configs(cfg, back, false);
    for (const auto& d : diffs)
      if (d.field.rfind("--seq-length", 0) != 0 && d.field.rfind("--init-method-std", 0) != 0)
        ADD_FAILURE() << hf_format_name(fmt) << ": " << d.field << " " << d.saved << " -> " << d.current;
    EXPECT_EQ(back.diffusion.block_size, cfg.diffusion.block_size) << hf_format_name(fmt);
    EXPECT_EQ(back.diffusion.mask_token, 59) << hf_format_name(fmt);
  }
  // The families' own configs, without megadlm's section.
  const RunConfig fd = run_config_from_hf(R"({"model_type": "Fast_dLLM_Qwen", "hidden_size": 32,
      "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
      "vocab_size": 64, "bd_size": 32, "conplemenrary_mask": true})", "config.json");
  EXPECT_EQ(fd.model.attention_mask, AttentionMaskType::BlockCausal);
  EXPECT_EQ(fd.diffusion.block_size, 32);
  EXPECT_TRUE(fd.model.add_qkv_bias);
  EXPECT_FALSE(fd.model.qk_layernorm);
  const RunConfig ll = run_config_from_hf(R"({"model_type": "llada", "d_model": 4096, "n_layers": 32, "n_heads": 32,
      "n_kv_heads": 32, "mlp_hidden_size": 12288, "vocab_size": 126464, "embedding_size": 126464,
      "max_sequence_length": 4096, "rms_norm_eps": 1e-5, "weight_tying": false, "rope_theta": 500000.0,
      "mask_token_id": 126336, "block_type": "llama", "activation_type": "silu", "layer_norm_type": "rms"})",
                                          "config.json");
  EXPECT_EQ(ll.model.hidden_size, 4096);
  EXPECT_EQ(ll.model.kv_channels, 128);
  EXPECT_EQ(ll.model.ffn_hidden_size, 12288);
  EXPECT_EQ(ll.model.padded_vocab_size, 126464);
  EXPECT_EQ(ll.model.attention_mask, AttentionMaskType::NoMask);
  EXPECT_EQ(ll.diffusion.mask_token, 126336);
  EXPECT_FLOAT_EQ(ll.model.rotary_base, 500000.0f);
  EXPECT_TRUE(ll.model.untie_embeddings_and_output_weights);
}

TEST(HuggingFaceBlockFormats, MismatchesAreRefusedNamingTheFileAndKey) {
  // A model that is not the format: every reason, by flag.
  std::string e = error_of([] { hf_config_json(dense(true), DType::F32, HfFormat::Sdar); });
  EXPECT_NE(e.find("`--hf-format sdar` is a block-diffusion format"), std::string::npos) << e;
  e = error_of([] { hf_config_json(sdar_like(), DType::F32, HfFormat::FastDllmV2); });
  EXPECT_NE(e.find("Qwen2.5's architecture: the model has `--qk-layernorm`"), std::string::npos) << e;
  e = error_of([] { hf_config_json(sdar_like(), DType::F32, HfFormat::Llada); });
  EXPECT_NE(e.find("`--hf-format llada` is a full-attention"), std::string::npos) << e;
  EXPECT_NE(e.find("`--hf-format llada` has no q/k norms"), std::string::npos) << e;
  // config.json keys megadlm cannot read, named with the file.
  e = error_of([] { run_config_from_hf(R"({"model_type": "llada", "d_model": 32, "n_layers": 2, "n_heads": 4,
      "vocab_size": 64, "alibi": true})", "x/config.json"); });
  EXPECT_NE(e.find("x/config.json: alibi true is not supported"), std::string::npos) << e;
  e = error_of([] { run_config_from_hf(R"({"model_type": "sdar", "hidden_size": 32, "intermediate_size": 48,
      "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 64})", "x/config.json"); });
  EXPECT_NE(e.find("x/config.json: model_type 'sdar' needs a positive integer block_size"), std::string::npos) << e;
  e = error_of([] { run_config_from_hf(R"({"model_type": "Fast_dLLM_Qwen", "hidden_size": 32, "intermediate_size": 48,
      "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 64})", "x/config.json"); });
  EXPECT_NE(e.find("x/config.json: model_type 'Fast_dLLM_Qwen' needs a positive integer bd_size"), std::string::npos) << e;
  EXPECT_NE(error_of([] { hf_format_of_config(R"({"model_type": "dream"})", "c.json"); })
                .find("c.json: model_type 'dream' is not supported"),
            std::string::npos);

  // An import that expects another format; a folder whose tensors carry another format's names.
  test::TempDir dir;
  save_initial_weights(llada_like(), dir / "ckpt");
  const CheckpointReader r(*find_checkpoint(dir / "ckpt", std::nullopt));
  HfExportOptions o;
  o.format = HfFormat::Llada;
  export_hf(r, dir / "hf", o);
  HfImportOptions io;
  io.format = HfFormat::Sdar;
  e = error_of([&] { import_hf(dir / "hf", dir / "back", io); });
  EXPECT_NE(e.find("config.json: model_type 'llada' is the llada format, not `--hf-format sdar`"), std::string::npos) << e;
  // The same tensors under a Qwen config: the missing names, with the folder and its format.
  json c = json::parse(hf_config_json(llada_like(), DType::F32, HfFormat::Qwen));
  std::ofstream(std::string(dir / "hf") + "/config.json") << c.dump();
  e = error_of([&] { import_hf(dir / "hf", dir / "back2", {}); });
  EXPECT_NE(e.find("does not match its config.json (the qwen format)"), std::string::npos) << e;
  EXPECT_NE(e.find("missing tensor model.embed_tokens.weight"), std::string::npos) << e;
}

TEST(HuggingFaceBlockFormats, EachFormatRoundTripsWeightsAndLogits) {
  for (const auto& [cfg, fmt] : {std::pair{sdar_like(), HfFormat::Sdar}, std::pair{fast_dllm_like(), HfFormat::FastDllmV2},
                                 std::pair{llada_like(), HfFormat::Llada}}) {
    SCOPED_TRACE(hf_format_name(fmt));
    test::TempDir dir;
    save_initial_weights(cfg, dir / "ckpt");
    const CheckpointReader original(*find_checkpoint(dir / "ckpt", std::nullopt));
    HfExportOptions o;
    o.format = fmt;
    export_hf(original, dir / "hf", o);
    const HfWeights hf(dir / "hf");
    for (const auto& [name, info] : original.index().tensors) {
      const std::string ours = name.substr(std::string(kModelPrefix).size());
      EXPECT_TRUE(hf.contains(hf_tensor_name(ours, fmt))) << name;
    }
    if (fmt == HfFormat::Llada) {
      EXPECT_TRUE(hf.contains("model.transformer.blocks.1.ff_proj.weight"));
      EXPECT_EQ(hf.names().size(), original.index().tensors.size());  // no extra tensors
    }
    HfImportOptions io;
    io.format = fmt;
    import_hf(dir / "hf", dir / "back", io);
    const CheckpointReader back(*find_checkpoint(dir / "back", std::nullopt));
    ASSERT_EQ(back.index().tensors.size(), original.index().tensors.size());
    for (const auto& [name, info] : original.index().tensors) {
      ASSERT_TRUE(back.has_tensor(name)) << name;
      const Tensor x = original.read_whole(name), y = back.read_whole(name);
      ASSERT_EQ(x.nbytes(), y.nbytes()) << name;
      EXPECT_EQ(std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()), 0) << name;
    }
    const RunConfig bcfg = run_config_from_json(back.index().state.run_config_json, "back");
    EXPECT_TRUE(compare_run_configs(cfg, bcfg, false).size() <= 2);  // seq length, init std at most
    EXPECT_EQ(bcfg.diffusion.block_size, cfg.diffusion.block_size);
    EXPECT_EQ(bcfg.model.attention_mask, cfg.model.attention_mask);
    std::vector<int32_t> tokens;
    for (int i = 0; i < 32; ++i) tokens.push_back((i * 7) % 59);
    const std::vector<float> a = checkpoint_logits(original, tokens, 2, 16, Device::cpu()).to_floats(Stream::cpu());
    const std::vector<float> b = checkpoint_logits(back, tokens, 2, 16, Device::cpu()).to_floats(Stream::cpu());
    EXPECT_EQ(a, b);
    float spread = 0;
    for (float v : a) spread = std::max(spread, std::fabs(v));
    EXPECT_GT(spread, 0.0f);
  }
}
