#include "megadlm/training/checkpoint/huggingface.h"
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <nlohmann/json.hpp>
#include "megadlm/core/error.h"
#include "megadlm/core/stream.h"
#include "megadlm/model/gpt_model.h"
#include "megadlm/training/checkpoint/checkpoint.h"
#include "megadlm/training/checkpoint/config_json.h"
#include "megadlm/training/checkpoint/directory_lock.h"
#include "megadlm/training/checkpoint/file_io.h"
#include "megadlm/training/checkpoint/safetensors.h"
#include "megadlm/training/arguments/checkpoint_args.h"

namespace megadlm::checkpoint {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Layer-local names: ours <-> Hugging Face's (docs/checkpoints.md, "Hugging Face mapping").
const std::pair<const char*, const char*> kLayerNames[] = {
    {"input_layernorm.weight", "input_layernorm.weight"},
    {"self_attention.linear_q.weight", "self_attn.q_proj.weight"},
    {"self_attention.linear_q.bias", "self_attn.q_proj.bias"},
    {"self_attention.linear_k.weight", "self_attn.k_proj.weight"},
    {"self_attention.linear_k.bias", "self_attn.k_proj.bias"},
    {"self_attention.linear_v.weight", "self_attn.v_proj.weight"},
    {"self_attention.linear_v.bias", "self_attn.v_proj.bias"},
    {"self_attention.q_layernorm.weight", "self_attn.q_norm.weight"},
    {"self_attention.k_layernorm.weight", "self_attn.k_norm.weight"},
    {"self_attention.linear_proj.weight", "self_attn.o_proj.weight"},
    {"self_attention.linear_proj.bias", "self_attn.o_proj.bias"},
    {"pre_mlp_layernorm.weight", "post_attention_layernorm.weight"},
    {"mlp.linear_fc1_gate.weight", "mlp.gate_proj.weight"},
    {"mlp.linear_fc1_up.weight", "mlp.up_proj.weight"},
    {"mlp.linear_fc2.weight", "mlp.down_proj.weight"},
};
const std::pair<const char*, const char*> kGlobalNames[] = {
    {"embedding.word_embeddings.weight", "model.embed_tokens.weight"},
    {"decoder.final_layernorm.weight", "model.norm.weight"},
    {"output_layer.weight", "lm_head.weight"},
};

// LLaDA's names (its modeling file's LLaDALlamaBlock and LLaDAModel.transformer).
const std::pair<const char*, const char*> kLladaLayerNames[] = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"self_attention.linear_q.weight", "q_proj.weight"},
    {"self_attention.linear_q.bias", "q_proj.bias"},
    {"self_attention.linear_k.weight", "k_proj.weight"},
    {"self_attention.linear_k.bias", "k_proj.bias"},
    {"self_attention.linear_v.weight", "v_proj.weight"},
    {"self_attention.linear_v.bias", "v_proj.bias"},
    {"self_attention.linear_proj.weight", "attn_out.weight"},
    {"pre_mlp_layernorm.weight", "ff_norm.weight"},
    {"mlp.linear_fc1_gate.weight", "ff_proj.weight"},  // SiLU is applied to ff_proj: the gate
    {"mlp.linear_fc1_up.weight", "up_proj.weight"},
    {"mlp.linear_fc2.weight", "ff_out.weight"},
};
const std::pair<const char*, const char*> kLladaGlobalNames[] = {
    {"embedding.word_embeddings.weight", "model.transformer.wte.weight"},
    {"decoder.final_layernorm.weight", "model.transformer.ln_f.weight"},
    {"output_layer.weight", "model.transformer.ff_out.weight"},
};
constexpr int64_t kLladaMaskToken = 126336;  // LLaDA 8B's mask id (its config's mask_token_id)

const char* hf_dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "float32";
    case DType::BF16: return "bfloat16";
    case DType::F16: return "float16";
    case DType::F64: return "float64";
    default: MDLM_FAIL("dtype ", dtype_name(t), " is not a weight dtype");
  }
}

Tensor converted(const Tensor& t, std::optional<DType> dtype) {
  if (!dtype || *dtype == t.dtype()) return t;
  Tensor out = Tensor::empty(t.shape(), *dtype, Stream::cpu());
  copy_tensor(t, out, Stream::cpu());
  return out;
}

bool all_zero(const Tensor& t) {
  for (float v : t.to_floats(Stream::cpu()))
    if (v != 0.0f) return false;
  return true;
}

// The parameter list of `model` (names and global shapes), without allocating it.
std::vector<ParamDesc> parameter_list(const TransformerConfig& model) {
  ParameterStore store;
  GptModel m(model, store);
  return store.descs();
}

}  // namespace

HfArchitecture hf_architecture_for(const TransformerConfig& m) {
  auto no = [](const std::string& why) {
    MDLM_FAIL("this model has no Hugging Face Qwen2/Qwen3 equivalent: ", why);
  };
  if (m.normalization != NormType::RMSNorm) no("it uses LayerNorm (needs `--normalization RMSNorm`)");
  if (m.activation != MlpActivation::SwiGLU) no("its MLP is not SwiGLU (needs `--swiglu`)");
  if (m.position_embedding_type != PositionEmbeddingType::Rope)
    no(std::string("its positions are ") + position_embedding_type_name(m.position_embedding_type) +
       " (needs `--position-embedding-type rope`)");
  if (m.rotary_percent != 1.0f) no("it rotates part of each head (needs `--rotary-percent 1.0`)");
  if (m.add_bias_linear) no("its linear layers have biases (needs `--disable-bias-linear`)");
  if (!m.qk_layernorm && m.kv_channels * m.num_attention_heads != m.hidden_size)
    no("Qwen2 (no `--qk-layernorm`) needs `--kv-channels` = hidden size / heads");
  if (m.moe.enabled()) {
    // Qwen3-MoE: softmax top-k over the experts, optionally renormalised, dropless, no extras.
    const MoeConfig& e = m.moe;
    if (!m.qk_layernorm) no("a mixture of experts exports as Qwen3-MoE, which needs `--qk-layernorm`");
    if (e.score != MoeScoreFunction::Softmax) no("its router scores are sigmoids (Qwen3-MoE: softmax)");
    if (e.load_balancing == MoeLoadBalancing::Sinkhorn || e.load_balancing == MoeLoadBalancing::ExpertChoice)
      no("its routing is not top-k per token (Qwen3-MoE routes each token to its top-k experts)");
    if (e.topk_scaling_factor && *e.topk_scaling_factor != 1.0f) no("its routing weights are scaled (`--moe-router-topk-scaling-factor`)");
    if (e.num_groups > 0 || e.topk_limited_devices > 0) no("its routing is group-limited");
    if (e.expert_bias) no("its router has an expert bias (`--moe-router-enable-expert-bias`)");
    if (e.capacity_factor) no("it drops tokens (`--moe-expert-capacity-factor`; Qwen3-MoE is dropless)");
    if (e.shared_expert_size > 0) no("it has shared experts (Qwen3-MoE has none)");
    return HfArchitecture::Qwen3Moe;
  }
  return m.qk_layernorm ? HfArchitecture::Qwen3 : HfArchitecture::Qwen2;
}

namespace {

std::string qwen_tensor_name(const std::string& ours) {
  for (const auto& [a, b] : kGlobalNames)
    if (ours == a) return b;
  static const std::regex layer(R"(decoder\.layers\.(\d+)\.(.+))");
  static const std::regex expert(R"(mlp\.experts\.(\d+)\.(linear_fc1_gate|linear_fc1_up|linear_fc2)\.weight)");
  std::smatch m, e;
  if (std::regex_match(ours, m, layer)) {
    const std::string local = m[2].str();
    for (const auto& [a, b] : kLayerNames)
      if (local == a) return "model.layers." + m[1].str() + "." + b;
    if (local == "mlp.router.weight") return "model.layers." + m[1].str() + ".mlp.gate.weight";
    if (std::regex_match(local, e, expert)) {
      const std::string part = e[2] == "linear_fc1_gate" ? "gate_proj" : e[2] == "linear_fc1_up" ? "up_proj" : "down_proj";
      return "model.layers." + m[1].str() + ".mlp.experts." + e[1].str() + "." + part + ".weight";
    }
  }
  MDLM_FAIL("parameter ", ours, " has no Hugging Face name");
}

std::optional<std::string> qwen_megadlm_name(const std::string& hf) {
  for (const auto& [a, b] : kGlobalNames)
    if (hf == b) return std::string(a);
  static const std::regex layer(R"(model\.layers\.(\d+)\.(.+))");
  static const std::regex expert(R"(mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight)");
  std::smatch m, e;
  if (std::regex_match(hf, m, layer)) {
    const std::string local = m[2].str();
    for (const auto& [a, b] : kLayerNames)
      if (local == b) return "decoder.layers." + m[1].str() + "." + a;
    if (local == "mlp.gate.weight") return "decoder.layers." + m[1].str() + ".mlp.router.weight";
    if (std::regex_match(local, e, expert)) {
      const std::string part = e[2] == "gate_proj" ? "linear_fc1_gate" : e[2] == "up_proj" ? "linear_fc1_up" : "linear_fc2";
      return "decoder.layers." + m[1].str() + ".mlp.experts." + e[1].str() + "." + part + ".weight";
    }
  }
  return std::nullopt;
}

// What config.json cannot say, for the import back (the "megadlm" section).
json megadlm_section(const RunConfig& c) {
  const TransformerConfig& m = c.model;
  const bool block = m.attention_mask == AttentionMaskType::BlockCausal;
  return {{"attention", m.attention_mask == AttentionMaskType::NoMask ? "bidirectional" : block ? "block_causal" : "causal"},
          {"bd_clean_attention", m.block_diffusion_causal_clean ? "causal" : "block_causal"},
          {"vocab_size", m.vocab_size},
          {"mask_token_id", c.diffusion.mask_token},
          {"model_running_mode", c.diffusion.mode == RunningMode::Vanilla ? "vanilla" : "difflm-noshift"},
          {"seq_length", m.seq_length}};
}

void apply_megadlm_section(const json& j, RunConfig& c) {
  if (!j.contains("megadlm") || !j.at("megadlm").is_object()) return;
  TransformerConfig& m = c.model;
  const json& x = j.at("megadlm");
  m.vocab_size = x.value("vocab_size", m.vocab_size);
  const std::string attention = x.value("attention", std::string("bidirectional"));
  m.attention_mask = attention == "causal" ? AttentionMaskType::Causal
                     : attention == "block_causal" ? AttentionMaskType::BlockCausal
                                                   : AttentionMaskType::NoMask;
  if (m.attention_mask == AttentionMaskType::BlockCausal)
    m.block_diffusion_causal_clean = x.value("bd_clean_attention", std::string()) == "causal";
  c.diffusion.mask_token = x.value("mask_token_id", int64_t{-1});
  if (x.value("model_running_mode", std::string()) == "vanilla") c.diffusion.mode = RunningMode::Vanilla;
  m.seq_length = x.value("seq_length", m.seq_length);
}

std::string llada_config_json(const RunConfig& c, DType dtype) {
  const TransformerConfig& m = c.model;
  json j;
  j["architectures"] = {"LLaDAModelLM"};
  j["model_type"] = "llada";
  j["d_model"] = m.hidden_size;
  j["n_layers"] = m.num_layers;
  j["n_heads"] = m.num_attention_heads;
  j["n_kv_heads"] = m.num_query_groups;
  j["mlp_hidden_size"] = m.ffn_hidden_size;
  j["mlp_ratio"] = std::max(1, m.ffn_hidden_size / m.hidden_size);  // unused: mlp_hidden_size wins
  j["vocab_size"] = m.padded_vocab_size;
  j["embedding_size"] = m.padded_vocab_size;
  j["max_sequence_length"] = m.max_position_embeddings;
  j["rms_norm_eps"] = static_cast<double>(m.norm_epsilon);
  j["layer_norm_type"] = "rms";
  j["activation_type"] = "silu";
  j["block_type"] = "llama";
  j["rope"] = true;
  j["rope_theta"] = static_cast<double>(m.rotary_base);
  j["alibi"] = false;
  j["weight_tying"] = !m.untie_embeddings_and_output_weights;
  j["include_bias"] = false;
  j["include_qkv_bias"] = m.add_qkv_bias;
  j["attention_layer_norm"] = false;
  j["input_emb_norm"] = false;
  j["scale_logits"] = false;
  j["mask_token_id"] = c.diffusion.mask_token;
  j["init_std"] = static_cast<double>(m.init_method_std);
  j["use_cache"] = false;
  j["torch_dtype"] = hf_dtype_name(dtype);
  j["megadlm"] = megadlm_section(c);
  return j.dump(2);
}

RunConfig llada_run_config(const json& j, const std::string& where) {
  RunConfig c;
  TransformerConfig& m = c.model;
  auto refuse = [&](const char* key, const std::string& why) {
    MDLM_FAIL(where, ": ", key, " ", j.at(key).dump(), " is not supported (", why, ")");
  };
  if (j.value("block_type", std::string("llama")) != "llama") refuse("block_type", "valid: llama");
  if (j.value("activation_type", std::string("silu")) != "silu") refuse("activation_type", "valid: silu");
  if (j.value("layer_norm_type", std::string("rms")) != "rms") refuse("layer_norm_type", "valid: rms");
  if (!j.value("rope", true)) refuse("rope", "megadlm's LLaDA uses RoPE");
  if (j.value("alibi", false)) refuse("alibi", "RoPE only");
  if (j.value("attention_layer_norm", false)) refuse("attention_layer_norm", "LLaDA's q/k norms are not mapped");
  if (j.value("include_bias", false)) refuse("include_bias", "only q/k/v biases (include_qkv_bias)");
  if (j.value("scale_logits", false)) refuse("scale_logits", "the head is not scaled");
  if (j.value("input_emb_norm", false)) refuse("input_emb_norm", "no embedding norm");
  if (j.contains("clip_qkv") && !j.at("clip_qkv").is_null()) refuse("clip_qkv", "q/k/v are not clipped");
  if (j.contains("rope_scaling") && !j.at("rope_scaling").is_null()) refuse("rope_scaling", "plain RoPE only");
  m.num_layers = j.at("n_layers").get<int>();
  m.hidden_size = j.at("d_model").get<int>();
  m.num_attention_heads = j.at("n_heads").get<int>();
  m.num_query_groups = j.contains("n_kv_heads") && !j.at("n_kv_heads").is_null() ? j.at("n_kv_heads").get<int>()
                                                                                  : m.num_attention_heads;
  m.kv_channels = m.hidden_size / m.num_attention_heads;
  m.ffn_hidden_size = j.contains("mlp_hidden_size") && !j.at("mlp_hidden_size").is_null()
                          ? j.at("mlp_hidden_size").get<int>()
                          : j.value("mlp_ratio", 4) * m.hidden_size;
  m.vocab_size = j.at("vocab_size").get<int64_t>();
  m.padded_vocab_size = j.contains("embedding_size") && !j.at("embedding_size").is_null()
                            ? j.at("embedding_size").get<int64_t>()
                            : m.vocab_size;
  if (m.padded_vocab_size < m.vocab_size)
    MDLM_FAIL(where, ": embedding_size ", m.padded_vocab_size, " is smaller than vocab_size ", m.vocab_size);
  m.max_position_embeddings = j.value("max_sequence_length", 4096);
  m.seq_length = std::min(m.max_position_embeddings, 4096);
  m.position_embedding_type = PositionEmbeddingType::Rope;
  const double theta = j.value("rope_theta", 10000.0);
  if (theta != std::floor(theta)) MDLM_FAIL(where, ": rope_theta ", theta, " is not an integer (`--rotary-base` takes integers)");
  m.rotary_base = static_cast<float>(theta);
  m.rotary_percent = 1.0f;
  m.normalization = NormType::RMSNorm;
  m.norm_epsilon = static_cast<float>(j.value("rms_norm_eps", 1e-5));
  m.activation = MlpActivation::SwiGLU;
  m.qk_layernorm = false;
  m.add_bias_linear = false;
  m.add_qkv_bias = j.value("include_qkv_bias", false);
  m.untie_embeddings_and_output_weights = !j.value("weight_tying", false);
  m.init_method_std = static_cast<float>(j.value("init_std", 0.02));
  m.attention_dropout = 0.0f;
  m.hidden_dropout = 0.0f;
  m.attention_mask = AttentionMaskType::NoMask;  // LLaDA attends bidirectionally over the sequence
  const int64_t mask = j.contains("mask_token_id") && j.at("mask_token_id").is_number_integer()
                           ? j.at("mask_token_id").get<int64_t>()
                           : kLladaMaskToken;
  c.diffusion.mask_token = mask < m.padded_vocab_size ? mask : -1;
  apply_megadlm_section(j, c);
  return c;
}

}  // namespace

const char* hf_format_name(HfFormat f) {
  switch (f) {
    case HfFormat::Qwen: return "qwen";
    case HfFormat::Sdar: return "sdar";
    case HfFormat::FastDllmV2: return "fast_dllm_v2";
    case HfFormat::Llada: return "llada";
  }
  return "?";
}

std::optional<HfFormat> hf_format_from_name(const std::string& n) {
  for (HfFormat f : {HfFormat::Qwen, HfFormat::Sdar, HfFormat::FastDllmV2, HfFormat::Llada})
    if (n == hf_format_name(f)) return f;
  return std::nullopt;
}

HfFormat hf_format_of_config(const std::string& text, const std::string& where) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    MDLM_FAIL(where, " is not valid JSON (", e.what(), ")");
  }
  const std::string type = j.is_object() ? j.value("model_type", std::string()) : std::string();
  if (type == "qwen2" || type == "qwen3" || type == "qwen3_moe") return HfFormat::Qwen;
  if (type == "sdar") return HfFormat::Sdar;
  if (type == "Fast_dLLM_Qwen") return HfFormat::FastDllmV2;
  if (type == "llada") return HfFormat::Llada;
  MDLM_FAIL(where, ": model_type '", type, "' is not supported; megadlm imports qwen2, qwen3 and qwen3_moe, and the "
            "block-diffusion formats sdar, Fast_dLLM_Qwen and llada");
}

std::vector<std::string> hf_format_problems(const RunConfig& c, HfFormat f) {
  std::vector<std::string> out;
  const TransformerConfig& m = c.model;
  try {
    hf_architecture_for(m);
  } catch (const std::exception& e) {
    out.push_back(e.what());
  }
  const bool block = m.attention_mask == AttentionMaskType::BlockCausal && c.diffusion.block_size > 0;
  const std::string name = std::string("--hf-format ") + hf_format_name(f);
  if (f == HfFormat::Sdar || f == HfFormat::FastDllmV2) {
    if (!block)
      out.push_back("`" + name + "` is a block-diffusion format: the model needs `--attention-mask-type block_causal "
                    "--dlm-block-size B`");
    if (m.moe.enabled()) out.push_back("`" + name + "` is a dense format: this model has experts (`--num-experts`)");
    if (f == HfFormat::Sdar && !m.qk_layernorm)
      out.push_back("`--hf-format sdar` is Qwen3's architecture: the model needs `--qk-layernorm`");
    if (f == HfFormat::FastDllmV2 && m.qk_layernorm)
      out.push_back("`--hf-format fast_dllm_v2` is Qwen2.5's architecture: the model has `--qk-layernorm`, which it lacks");
  }
  if (f == HfFormat::Llada) {
    if (m.attention_mask != AttentionMaskType::NoMask)
      out.push_back("`--hf-format llada` is a full-attention (bidirectional) model: the model needs "
                    "`--attention-mask-type no_mask`");
    if (m.qk_layernorm) out.push_back("`--hf-format llada` has no q/k norms: the model has `--qk-layernorm`");
    if (m.moe.enabled()) out.push_back("`--hf-format llada` is dense: this model has experts (`--num-experts`)");
    if (m.kv_channels * m.num_attention_heads != m.hidden_size)
      out.push_back("`--hf-format llada` needs `--kv-channels` = hidden size / heads");
  }
  return out;
}

std::string hf_tensor_name(const std::string& ours, HfFormat f) {
  if (f != HfFormat::Llada) return qwen_tensor_name(ours);
  for (const auto& [a, b] : kLladaGlobalNames)
    if (ours == a) return b;
  static const std::regex layer(R"(decoder\.layers\.(\d+)\.(.+))");
  std::smatch m;
  if (std::regex_match(ours, m, layer))
    for (const auto& [a, b] : kLladaLayerNames)
      if (m[2].str() == a) return "model.transformer.blocks." + m[1].str() + "." + b;
  MDLM_FAIL("parameter ", ours, " has no name in the llada format");
}

std::optional<std::string> megadlm_tensor_name(const std::string& hf, HfFormat f) {
  if (f != HfFormat::Llada) return qwen_megadlm_name(hf);
  for (const auto& [a, b] : kLladaGlobalNames)
    if (hf == b) return std::string(a);
  static const std::regex layer(R"(model\.transformer\.blocks\.(\d+)\.(.+))");
  std::smatch m;
  if (std::regex_match(hf, m, layer))
    for (const auto& [a, b] : kLladaLayerNames)
      if (m[2].str() == b) return "decoder.layers." + m[1].str() + "." + a;
  return std::nullopt;
}

std::string hf_config_json(const RunConfig& c, DType dtype, HfFormat format) {
  const std::vector<std::string> problems = hf_format_problems(c, format);
  if (!problems.empty()) {
    std::string msg = std::string("this model cannot be written as --hf-format ") + hf_format_name(format) + ":";
    for (const std::string& p : problems) msg += "\n  " + p;
    MDLM_FAIL(msg);
  }
  if (format == HfFormat::Llada) return llada_config_json(c, dtype);
  const TransformerConfig& m = c.model;
  const HfArchitecture arch = hf_architecture_for(m);
  const bool moe = arch == HfArchitecture::Qwen3Moe;
  const bool qwen3 = arch == HfArchitecture::Qwen3 || moe;
  json j;
  j["architectures"] = {moe ? "Qwen3MoeForCausalLM" : qwen3 ? "Qwen3ForCausalLM" : "Qwen2ForCausalLM"};
  j["model_type"] = moe ? "qwen3_moe" : qwen3 ? "qwen3" : "qwen2";
  if (moe) {
    // Layer i is sparse in Qwen3-MoE iff i is not in mlp_only_layers and (i + 1) % step == 0:
    // step 1 and the dense layers listed say exactly what --moe-layer-freq said.
    const MoeConfig& e = m.moe;
    j["num_experts"] = e.num_experts;
    j["num_experts_per_tok"] = e.topk;
    j["moe_intermediate_size"] = e.ffn_hidden_size;
    j["norm_topk_prob"] = !e.pre_softmax;
    j["decoder_sparse_step"] = 1;
    json dense = json::array();
    for (int l = 0; l < m.num_layers; ++l)
      if (!e.is_moe_layer(l)) dense.push_back(l);
    j["mlp_only_layers"] = dense;
    j["router_aux_loss_coef"] = static_cast<double>(e.aux_loss_coeff);
    j["output_router_logits"] = false;
  }
  j["vocab_size"] = m.padded_vocab_size;
  j["hidden_size"] = m.hidden_size;
  j["intermediate_size"] = m.ffn_hidden_size;
  j["num_hidden_layers"] = m.num_layers;
  j["num_attention_heads"] = m.num_attention_heads;
  j["num_key_value_heads"] = m.num_query_groups;
  j["head_dim"] = m.kv_channels;
  j["max_position_embeddings"] = m.max_position_embeddings;
  j["rms_norm_eps"] = static_cast<double>(m.norm_epsilon);
  j["rope_theta"] = static_cast<double>(m.rotary_base);
  j["rope_scaling"] = nullptr;
  j["tie_word_embeddings"] = !m.untie_embeddings_and_output_weights;
  if (qwen3) j["attention_bias"] = m.add_qkv_bias;
  j["attention_dropout"] = 0.0;
  j["hidden_act"] = "silu";
  j["initializer_range"] = static_cast<double>(m.init_method_std);
  j["use_cache"] = false;
  j["use_sliding_window"] = false;
  j["sliding_window"] = nullptr;
  j["max_window_layers"] = m.num_layers;
  j["torch_dtype"] = hf_dtype_name(dtype);
  const bool block = m.attention_mask == AttentionMaskType::BlockCausal;
  if (format == HfFormat::FastDllmV2) {  // Fast-dLLM v2: bd_size; its mask id lives in added_tokens.json
    j["architectures"] = {"Fast_dLLM_QwenForCausalLM"};
    j["model_type"] = "Fast_dLLM_Qwen";
    j["bd_size"] = c.diffusion.block_size;
  } else if (block) {  // block diffusion: the block size and mask id at the top, as block models' configs carry them
    j["block_size"] = c.diffusion.block_size;
    j["mask_token_id"] = c.diffusion.mask_token;
  }
  if (format == HfFormat::Sdar) {
    j["architectures"] = {"SDARForCausalLM"};
    j["model_type"] = "sdar";
  }
  j["megadlm"] = megadlm_section(c);
  return j.dump(2);
}

RunConfig run_config_from_hf(const std::string& text, const std::string& where) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    MDLM_FAIL(where, " is not valid JSON (", e.what(), ")");
  }
  const HfFormat format = hf_format_of_config(text, where);
  if (format == HfFormat::Llada) {
    try {
      return llada_run_config(j, where);
    } catch (const json::exception& e) {
      MDLM_FAIL(where, ": missing or malformed field (", e.what(), ")");
    }
  }
  RunConfig c;
  TransformerConfig& m = c.model;
  try {
    const std::string type = j.value("model_type", std::string());
    const bool qwen3 = type == "qwen3" || type == "qwen3_moe" || type == "sdar";
    if (j.value("hidden_act", std::string("silu")) != "silu")
      MDLM_FAIL(where, ": hidden_act '", j.at("hidden_act").get<std::string>(), "' is not supported; valid: silu");
    if (j.contains("rope_scaling") && !j.at("rope_scaling").is_null())
      MDLM_FAIL(where, ": rope_scaling ", j.at("rope_scaling").dump(), " is not supported (plain RoPE only)");
    if (j.value("use_sliding_window", false))
      MDLM_FAIL(where, ": use_sliding_window is true; megadlm attends over the whole sequence");
    m.num_layers = j.at("num_hidden_layers").get<int>();
    m.hidden_size = j.at("hidden_size").get<int>();
    m.ffn_hidden_size = j.at("intermediate_size").get<int>();
    m.num_attention_heads = j.at("num_attention_heads").get<int>();
    m.num_query_groups = j.value("num_key_value_heads", m.num_attention_heads);
    m.kv_channels = j.contains("head_dim") && !j.at("head_dim").is_null() ? j.at("head_dim").get<int>()
                                                                            : m.hidden_size / m.num_attention_heads;
    m.max_position_embeddings = j.value("max_position_embeddings", 2048);
    m.position_embedding_type = PositionEmbeddingType::Rope;
    double theta = j.value("rope_theta", 10000.0);
    if (j.contains("rope_parameters") && j.at("rope_parameters").is_object())
      theta = j.at("rope_parameters").value("rope_theta", theta);
    if (theta != std::floor(theta))
      MDLM_FAIL(where, ": rope_theta ", theta, " is not an integer (`--rotary-base` takes integers)");
    m.rotary_base = static_cast<float>(theta);
    m.rotary_percent = 1.0f;
    m.normalization = NormType::RMSNorm;
    m.norm_epsilon = static_cast<float>(j.value("rms_norm_eps", 1e-6));
    m.activation = MlpActivation::SwiGLU;
    m.qk_layernorm = qwen3;
    m.add_bias_linear = false;
    m.add_qkv_bias = qwen3 ? j.value("attention_bias", false) : true;
    m.untie_embeddings_and_output_weights = !j.value("tie_word_embeddings", false);
    m.padded_vocab_size = j.at("vocab_size").get<int64_t>();
    m.vocab_size = m.padded_vocab_size;
    m.init_method_std = static_cast<float>(j.value("initializer_range", 0.02));
    m.attention_dropout = static_cast<float>(j.value("attention_dropout", 0.0));
    m.hidden_dropout = 0.0f;
    m.attention_mask = AttentionMaskType::NoMask;
    m.seq_length = std::min(m.max_position_embeddings, 2048);
    if (type == "qwen3_moe" && j.value("num_experts", 0) > 0) {
      MoeConfig& e = m.moe;
      e.num_experts = j.at("num_experts").get<int>();
      e.topk = j.value("num_experts_per_tok", 8);
      e.ffn_hidden_size = j.at("moe_intermediate_size").get<int>();
      e.pre_softmax = !j.value("norm_topk_prob", false);
      e.aux_loss_coeff = static_cast<float>(j.value("router_aux_loss_coef", 0.001));
      const int step = j.value("decoder_sparse_step", 1);
      if (step < 1) MDLM_FAIL(where, ": decoder_sparse_step ", step, " must be >= 1");
      std::set<int> dense;
      if (j.contains("mlp_only_layers") && j.at("mlp_only_layers").is_array())
        for (const auto& l : j.at("mlp_only_layers")) dense.insert(l.get<int>());
      for (int l = 0; l < m.num_layers; ++l)
        e.moe_layers.push_back(dense.count(l) == 0 && (l + 1) % step == 0);
      if (e.num_moe_layers() == 0) e.num_experts = 0;  // every layer dense: a plain Qwen3
    }
    c.diffusion.mask_token = -1;  // unknown unless recorded
    // A block model's config (block_size > 0 at the top level): block diffusion with that block.
    if (j.contains("block_size") && j.at("block_size").is_number_integer() && j.at("block_size").get<int64_t>() > 0) {
      m.attention_mask = AttentionMaskType::BlockCausal;
      c.diffusion.block_size = j.at("block_size").get<int64_t>();
      c.diffusion.mask_token = j.value("mask_token_id", int64_t{-1});
    }
    if (format == HfFormat::Sdar && c.diffusion.block_size <= 0)
      MDLM_FAIL(where, ": model_type 'sdar' needs a positive integer block_size");
    if (format == HfFormat::FastDllmV2) {  // Fast-dLLM v2: the block size is bd_size
      if (!j.contains("bd_size") || !j.at("bd_size").is_number_integer() || j.at("bd_size").get<int64_t>() <= 0)
        MDLM_FAIL(where, ": model_type 'Fast_dLLM_Qwen' needs a positive integer bd_size");
      m.attention_mask = AttentionMaskType::BlockCausal;
      c.diffusion.block_size = j.at("bd_size").get<int64_t>();
    }
    apply_megadlm_section(j, c);
  } catch (const json::exception& e) {
    MDLM_FAIL(where, ": missing or malformed field (", e.what(), ")");
  }
  return c;
}

void export_hf(const CheckpointReader& reader, const std::string& out_dir, const HfExportOptions& options) {
  const CheckpointState& st = reader.index().state;
  if (st.run_config_json.empty())
    MDLM_FAIL("checkpoint ", reader.dir(), " records no run configuration; it cannot be exported");
  const RunConfig cfg = run_config_from_json(st.run_config_json, reader.dir());
  const HfFormat format = options.format;
  hf_config_json(cfg, DType::F32, format);  // throws, naming the flags, before anything is written
  const HfArchitecture arch = hf_architecture_for(cfg.model);
  const bool llada = format == HfFormat::Llada;
  fs::create_directories(out_dir);

  // Tensors in Hugging Face order, with the zero biases Qwen needs and megadlm lacks.
  struct Out {
    std::string name;
    Tensor t;
  };
  std::vector<Out> tensors;
  DType dtype = DType::F32;
  bool dtype_known = false;
  auto add = [&](const std::string& hf, Tensor t) {
    t = converted(t, options.dtype);
    if (!dtype_known) dtype = t.dtype();
    dtype_known = true;
    tensors.push_back({hf, t});
  };
  for (const ParamDesc& d : parameter_list(cfg.model)) {
    add(hf_tensor_name(d.name, format), reader.read_whole(kModelPrefix + d.name));
    const bool q = d.name.find("linear_q.weight") != std::string::npos;
    const bool k = d.name.find("linear_k.weight") != std::string::npos;
    const bool v = d.name.find("linear_v.weight") != std::string::npos;
    if ((q || k || v) && arch == HfArchitecture::Qwen2 && !cfg.model.add_qkv_bias && !llada)
      add(hf_tensor_name(d.name.substr(0, d.name.size() - 6) + "bias"),
          Tensor::zeros({d.shape[0]}, tensors.back().t.dtype(), Stream::cpu()));
    if (d.name.find("linear_proj.weight") != std::string::npos && arch != HfArchitecture::Qwen2 &&
        cfg.model.add_qkv_bias && !llada)  // Qwen3's attention_bias covers o_proj too
      add(hf_tensor_name(d.name.substr(0, d.name.size() - 6) + "bias"),
          Tensor::zeros({d.shape[0]}, tensors.back().t.dtype(), Stream::cpu()));
  }

  // Shards of at most max_shard_bytes (a single tensor may exceed it), in order.
  std::vector<std::vector<size_t>> shards(1);
  uint64_t in_shard = 0, total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t b = tensors[i].t.nbytes();
    if (!shards.back().empty() && in_shard + b > options.max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += b;
    total += b;
  }
  json weight_map = json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    char name[64];
    if (shards.size() == 1) std::snprintf(name, sizeof name, "model.safetensors");
    else std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    std::vector<SafetensorsEntry> entries;
    for (size_t i : shards[s]) {
      entries.push_back({tensors[i].name, tensors[i].t.dtype(), tensors[i].t.shape(), tensors[i].t.data_ptr()});
      weight_map[tensors[i].name] = name;
    }
    write_safetensors((fs::path(out_dir) / name).string(), entries, {{"format", "pt"}});
  }
  if (shards.size() > 1) {
    const json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    write_file_atomic((fs::path(out_dir) / "model.safetensors.index.json").string(), index.dump(2));
  }
  write_file_atomic((fs::path(out_dir) / "config.json").string(), hf_config_json(cfg, dtype, format));
  if (!options.tokenizer_dir.empty()) {
    // Whatever tokenizer files the folder holds (tokenizer.json, vocab/merges, chat template...).
    static const std::regex tokenizer_file(
        R"((tokenizer.*|vocab\..*|merges\.txt|special_tokens_map\.json|added_tokens\.json|generation_config\.json|.*\.tiktoken|chat_template\..*))");
    int copied = 0;
    for (const auto& e : fs::directory_iterator(options.tokenizer_dir)) {
      if (!e.is_regular_file() || !std::regex_match(e.path().filename().string(), tokenizer_file)) continue;
      fs::copy_file(e.path(), fs::path(out_dir) / e.path().filename(), fs::copy_options::overwrite_existing);
      ++copied;
    }
    if (copied == 0) MDLM_FAIL("--tokenizer-dir ", options.tokenizer_dir, " holds no tokenizer files");
  }
}

HfWeights::HfWeights(std::string dir) : dir_(std::move(dir)) {
  const std::string index_path = (fs::path(dir_) / "model.safetensors.index.json").string();
  if (file_size_or_missing(index_path) >= 0) {
    try {
      const json index = json::parse(read_text_file(index_path));
      for (const auto& [name, file] : index.at("weight_map").items()) where_[name] = file.get<std::string>();
    } catch (const json::exception& e) {
      MDLM_FAIL(index_path, " is not a safetensors index (", e.what(), ")");
    }
    return;
  }
  const std::string single = (fs::path(dir_) / "model.safetensors").string();
  if (file_size_or_missing(single) < 0)
    MDLM_FAIL(dir_, " has neither model.safetensors nor model.safetensors.index.json (PyTorch .bin "
                    "weights are not read: convert them to safetensors first)");
  auto file = std::make_unique<SafetensorsFile>(single);
  for (const auto& [name, e] : file->entries()) where_[name] = "model.safetensors";
  files_["model.safetensors"] = std::move(file);
}

HfWeights::~HfWeights() = default;

std::vector<std::string> HfWeights::names() const {
  std::vector<std::string> out;
  for (const auto& [name, f] : where_) out.push_back(name);
  return out;
}

Tensor HfWeights::read(const std::string& name) const {
  const auto w = where_.find(name);
  if (w == where_.end()) MDLM_FAIL(dir_, " has no tensor ", name);
  auto it = files_.find(w->second);
  if (it == files_.end())
    it = files_.emplace(w->second, std::make_unique<SafetensorsFile>((fs::path(dir_) / w->second).string())).first;
  return it->second->read(name);
}

void import_hf(const std::string& hf_dir, const std::string& save_dir, const HfImportOptions& options) {
  // A training run's folder is not the place for an import: the save would point its "latest"
  // at release/, and the run's next --load would start over from the import instead of resuming
  // (the trainer refuses the same mix: docs/checkpoints.md, "never over another run").
  if (const std::vector<int64_t> held = list_checkpoint_iterations(save_dir); !held.empty()) {
    const std::optional<std::string> latest = read_latest(save_dir);
    MDLM_FAIL("--save ", save_dir, " holds ", held.size(), " checkpoint(s) of a training run (newest: ",
              iteration_dir_name(held.back()), latest ? "; " + std::string(kLatestFileName) + " names " + *latest : std::string(),
              "): writing the import there would point ", kLatestFileName, " at ", kReleaseDirName,
              ", and the run's next --load would start from the import instead of resuming. Import into "
              "another (empty or new) directory");
  }
  const DirectoryLock lock(save_dir, "--save");  // not while a run saves there
  const std::string config_path = (fs::path(hf_dir) / "config.json").string();
  if (file_size_or_missing(config_path) < 0) MDLM_FAIL(hf_dir, " has no config.json: not a Hugging Face model folder");
  const std::string config_text = read_text_file(config_path);
  const HfFormat format = hf_format_of_config(config_text, config_path);
  if (options.format && *options.format != format)
    MDLM_FAIL(config_path, ": model_type '", json::parse(config_text).value("model_type", std::string()),
              "' is the ", hf_format_name(format), " format, not `--hf-format ", hf_format_name(*options.format),
              "` (give --hf-format ", hf_format_name(format), ", or leave it out)");
  RunConfig cfg = run_config_from_hf(config_text, config_path);
  if (format == HfFormat::FastDllmV2 && cfg.diffusion.mask_token < 0) {
    // Fast-dLLM v2 names its mask token "|<MASK>|" in added_tokens.json, not in config.json.
    const std::string added = (fs::path(hf_dir) / "added_tokens.json").string();
    if (file_size_or_missing(added) >= 0) {
      try {
        const json a = json::parse(read_text_file(added));
        if (a.contains("|<MASK>|")) cfg.diffusion.mask_token = a.at("|<MASK>|").get<int64_t>();
      } catch (const json::exception& e) {
        MDLM_FAIL(added, ": not a JSON object of token ids (", e.what(), ")");
      }
    }
  }
  if (options.mask_token) cfg.diffusion.mask_token = *options.mask_token;
  if (options.seq_length) cfg.model.seq_length = *options.seq_length;

  const HfWeights weights(hf_dir);
  auto read = [&](const std::string& hf_name) { return weights.read(hf_name); };

  // Every megadlm parameter from its Hugging Face tensor; everything left over must be a zero
  // bias megadlm does not have (Qwen3 attention_bias on o_proj) or a tied lm_head copy.
  std::vector<OutgoingPiece> pieces;
  auto keep = std::make_shared<std::vector<Tensor>>();
  std::set<std::string> used;
  std::vector<std::string> problems;
  for (const ParamDesc& d : parameter_list(cfg.model)) {
    const std::string hf = hf_tensor_name(d.name, format);
    if (!weights.contains(hf)) {
      problems.push_back("missing tensor " + hf + " (megadlm " + d.name + ")");
      continue;
    }
    Tensor t = converted(read(hf), options.dtype);
    if (t.shape() != d.shape) {
      problems.push_back("tensor " + hf + " has shape " + shape_str(t.shape()) + ", config.json implies " +
                         shape_str(d.shape));
      continue;
    }
    used.insert(hf);
    keep->push_back(t);
    pieces.push_back({kModelPrefix + d.name, d.shape, Region::whole(d.shape), t.dtype(), t.data_ptr(), false});
  }
  for (const std::string& hf : weights.names()) {
    if (used.count(hf)) continue;
    if (hf == hf_tensor_name("output_layer.weight", format) && !cfg.model.untie_embeddings_and_output_weights) continue;
    if (hf.find("rotary_emb.inv_freq") != std::string::npos) continue;
    if (hf.find("self_attn.o_proj.bias") != std::string::npos && all_zero(read(hf))) continue;
    problems.push_back("unexpected tensor " + hf + (megadlm_tensor_name(hf, format) ? " (not in this configuration)"
                                                    : megadlm_tensor_name(hf, format == HfFormat::Llada ? HfFormat::Qwen : HfFormat::Llada)
                                                        ? " (a name of another format: config.json's model_type says " +
                                                              std::string(hf_format_name(format)) + ")"
                                                        : ""));
  }
  if (!problems.empty()) {
    std::string msg = hf_dir + " does not match its config.json (the " + hf_format_name(format) +
                      " format) as megadlm reads it:";
    for (size_t i = 0; i < std::min<size_t>(problems.size(), 20); ++i) msg += "\n  " + problems[i];
    MDLM_FAIL(msg);
  }
  CheckpointState st;
  st.run_config_json = run_config_to_json(cfg);
  st.model_args = training::checkpoint_model_args(cfg);
  st.saved_under = "Hugging Face import of " + hf_dir;
  st.created_by = "megadlm convert_checkpoint --from-hf";
  CheckpointWriter writer(nullptr, Stream::cpu());
  writer.save(save_dir, kReleaseDirName, st, std::move(pieces), keep, false);
}

Tensor checkpoint_logits(const CheckpointReader& reader, const std::vector<int32_t>& tokens, int64_t batch,
                         int64_t seq, Device device) {
  const CheckpointState& st = reader.index().state;
  if (st.run_config_json.empty()) MDLM_FAIL("checkpoint ", reader.dir(), " records no run configuration");
  RunConfig cfg = run_config_from_json(st.run_config_json, reader.dir());
  MDLM_CHECK(static_cast<int64_t>(tokens.size()) == batch * seq, "tokens must be batch x seq");
  // A block-diffusion model's weights run as the bidirectional model (its block mask belongs to
  // training's doubled row and to block decoding): what a weight-for-weight comparison needs.
  if (cfg.model.attention_mask == AttentionMaskType::BlockCausal) cfg.model.attention_mask = AttentionMaskType::NoMask;
  ModelRuntime rt;
  rt.stream = Stream::for_device(device);
  rt.dtype = device.is_cuda() ? DType::BF16 : DType::F32;
  rt.training = false;
  ParameterStore store;
  GptModel model(cfg.model, store);
  store.materialize(rt.dtype, 0, rt.stream);
  for (size_t h = 0; h < store.descs().size(); ++h) {
    const ParamDesc& d = store.descs()[h];
    Tensor host = Tensor::empty(d.shape, DType::F32, Stream::cpu());
    reader.read(kModelPrefix + d.name, d.shape, Region::whole(d.shape), host);
    Tensor p = store.param(static_cast<int>(h));
    copy_tensor(host, p, rt.stream);
  }
  HostMicroBatch h;
  h.batch = batch;
  h.seq = seq;
  h.input_ids = tokens;
  h.labels = tokens;
  h.loss_weights.assign(tokens.size(), 1.0f);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t s = 0; s < seq; ++s) h.positions.push_back(static_cast<int32_t>(s));
  h.loss_tokens = static_cast<double>(tokens.size());
  const MicroBatch mb = MicroBatch::upload(h, rt.stream);
  ModelRecord rec;
  Tensor loss = Tensor::zeros({1}, DType::F32, rt.stream);
  model.forward(mb, rec, loss, 0.0f, rt);
  Tensor out = rec.logits.to(Device::cpu(), DType::F32, rt.stream);
  rt.stream.synchronize();
  return out;
}

}  // namespace megadlm::checkpoint
