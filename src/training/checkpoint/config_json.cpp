#include "megadlm/training/checkpoint/config_json.h"
#include <cmath>
#include <nlohmann/json.hpp>
#include "megadlm/core/error.h"

namespace megadlm::checkpoint {

namespace {

using nlohmann::json;

// Enum <-> the string users type on the command line.
template <typename E>
struct EnumNames {
  std::vector<std::pair<E, const char*>> names;
  const char* to_str(E v) const {
    for (const auto& [e, n] : names) if (e == v) return n;
    return "?";
  }
  E from_str(const std::string& s, const std::string& field) const {
    for (const auto& [e, n] : names) if (s == n) return e;
    MDLM_FAIL("unknown value '", s, "' for ", field);
  }
};

const EnumNames<PositionEmbeddingType> kPos{{{PositionEmbeddingType::LearnedAbsolute, "learned_absolute"},
                                             {PositionEmbeddingType::Rope, "rope"},
                                             {PositionEmbeddingType::None, "none"}}};
const EnumNames<NormType> kNorm{{{NormType::LayerNorm, "LayerNorm"}, {NormType::RMSNorm, "RMSNorm"}}};
const EnumNames<MlpActivation> kAct{{{MlpActivation::Gelu, "gelu"}, {MlpActivation::SwiGLU, "swiglu"}}};
const EnumNames<AttentionMaskType> kMask{{{AttentionMaskType::NoMask, "no_mask"},
                                          {AttentionMaskType::Causal, "causal"},
                                          {AttentionMaskType::BlockCausal, "block_causal"}}};
const EnumNames<BlockTimeGranularity> kGranularity{{{BlockTimeGranularity::Block, "block"},
                                                   {BlockTimeGranularity::Sequence, "sequence"}}};
const EnumNames<RunningMode> kMode{{{RunningMode::DiffLMNoShift, "difflm-noshift"},
                                    {RunningMode::Vanilla, "vanilla"}}};
const EnumNames<DlmLossWeight> kWeight{{{DlmLossWeight::ExactRatio, "exact_ratio"},
                                        {DlmLossWeight::InvT, "inv_t"},
                                        {DlmLossWeight::InvTEps, "inv_t_eps"}}};
const EnumNames<LrDecayStyle> kDecay{{{LrDecayStyle::Constant, "constant"},
                                      {LrDecayStyle::Linear, "linear"},
                                      {LrDecayStyle::Cosine, "cosine"},
                                      {LrDecayStyle::InverseSquareRoot, "inverse-square-root"},
                                      {LrDecayStyle::WSD, "WSD"}}};
const EnumNames<WsdDecayStyle> kWsd{{{WsdDecayStyle::Exponential, "exponential"},
                                     {WsdDecayStyle::Linear, "linear"},
                                     {WsdDecayStyle::Cosine, "cosine"}}};
const EnumNames<DeviceKind> kDevice{{{DeviceKind::Cpu, "cpu"}, {DeviceKind::Cuda, "cuda"}}};
const EnumNames<MoeScoreFunction> kScore{{{MoeScoreFunction::Softmax, "softmax"},
                                          {MoeScoreFunction::Sigmoid, "sigmoid"}}};
const EnumNames<MoeLoadBalancing> kBalancing{{{MoeLoadBalancing::AuxLoss, "aux_loss"},
                                              {MoeLoadBalancing::SeqAuxLoss, "seq_aux_loss"},
                                              {MoeLoadBalancing::Sinkhorn, "sinkhorn"},
                                              {MoeLoadBalancing::None, "none"},
                                              {MoeLoadBalancing::ExpertChoice, "softmax_expert_choice"}}};
const EnumNames<MoeDispatcher> kDispatcher{{{MoeDispatcher::AllGather, "allgather"},
                                            {MoeDispatcher::AllToAll, "alltoall"}}};

// One table per struct: field name, and how to move it to and from JSON. Keeping both
// directions on one line makes a forgotten field visible.
#define MDLM_FIELD(obj, name) {#name, [](json& j, const auto& o) { j[#name] = o.name; }, \
    [](const json& j, auto& o) { if (j.contains(#name)) j.at(#name).get_to(o.name); }}
#define MDLM_ENUM(obj, name, table) {#name, [](json& j, const auto& o) { j[#name] = table.to_str(o.name); }, \
    [](const json& j, auto& o) { if (j.contains(#name)) o.name = table.from_str(j.at(#name).get<std::string>(), #name); }}

template <typename T>
struct Field {
  const char* name;
  void (*to)(json&, const T&);
  void (*from)(const json&, T&);
};

const std::vector<Field<TransformerConfig>>& model_fields() {
  static const std::vector<Field<TransformerConfig>> f = {
      MDLM_FIELD(m, num_layers), MDLM_FIELD(m, hidden_size), MDLM_FIELD(m, ffn_hidden_size),
      MDLM_FIELD(m, num_attention_heads), MDLM_FIELD(m, num_query_groups), MDLM_FIELD(m, kv_channels),
      MDLM_FIELD(m, seq_length), MDLM_FIELD(m, max_position_embeddings),
      MDLM_ENUM(m, position_embedding_type, kPos), MDLM_FIELD(m, rotary_base),
      MDLM_FIELD(m, rotary_percent), MDLM_ENUM(m, normalization, kNorm), MDLM_FIELD(m, norm_epsilon),
      MDLM_ENUM(m, activation, kAct), MDLM_FIELD(m, qk_layernorm), MDLM_FIELD(m, add_bias_linear),
      MDLM_FIELD(m, add_qkv_bias), MDLM_FIELD(m, untie_embeddings_and_output_weights),
      MDLM_FIELD(m, vocab_size), MDLM_FIELD(m, padded_vocab_size), MDLM_FIELD(m, init_method_std),
      MDLM_FIELD(m, attention_dropout), MDLM_FIELD(m, hidden_dropout),
      MDLM_ENUM(m, attention_mask, kMask), MDLM_FIELD(m, block_diffusion_causal_clean)};
  return f;
}

const std::vector<Field<MoeConfig>>& moe_fields() {
  static const std::vector<Field<MoeConfig>> f = {
      MDLM_FIELD(m, num_experts), MDLM_FIELD(m, moe_layers), MDLM_FIELD(m, topk),
      MDLM_ENUM(m, score, kScore), MDLM_FIELD(m, pre_softmax), MDLM_FIELD(m, num_groups),
      MDLM_FIELD(m, group_topk), MDLM_FIELD(m, topk_limited_devices),
      MDLM_ENUM(m, load_balancing, kBalancing), MDLM_FIELD(m, aux_loss_coeff),
      MDLM_FIELD(m, z_loss_coeff), MDLM_FIELD(m, expert_bias), MDLM_FIELD(m, bias_update_rate),
      MDLM_FIELD(m, pad_to_capacity), MDLM_FIELD(m, batch_level_expert_choice),
      MDLM_FIELD(m, ffn_hidden_size), MDLM_FIELD(m, shared_expert_size), MDLM_FIELD(m, grouped_gemm),
      MDLM_ENUM(m, dispatcher, kDispatcher)};
  return f;
}

const std::vector<Field<DiffusionConfig>>& diffusion_fields() {
  static const std::vector<Field<DiffusionConfig>> f = {
      MDLM_ENUM(d, mode, kMode), MDLM_FIELD(d, mask_token), MDLM_FIELD(d, varilen_prob),
      MDLM_ENUM(d, loss_weight, kWeight), MDLM_FIELD(d, min_masked), MDLM_FIELD(d, block_size),
      MDLM_ENUM(d, t_granularity, kGranularity), MDLM_FIELD(d, ar_loss_weight),
      MDLM_FIELD(d, diffusion_loss_scale), MDLM_FIELD(d, block_size_schedule),
      MDLM_FIELD(d, adapted_from)};
  return f;
}

const std::vector<Field<OptimizerConfig>>& optimizer_fields() {
  static const std::vector<Field<OptimizerConfig>> f = {
      MDLM_FIELD(o, lr), MDLM_FIELD(o, min_lr), MDLM_FIELD(o, lr_warmup_init),
      MDLM_ENUM(o, decay_style, kDecay), MDLM_ENUM(o, wsd_decay_style, kWsd),
      MDLM_FIELD(o, lr_warmup_iters), MDLM_FIELD(o, lr_decay_iters), MDLM_FIELD(o, lr_wsd_decay_iters),
      MDLM_FIELD(o, weight_decay), MDLM_FIELD(o, adam_beta1), MDLM_FIELD(o, adam_beta2),
      MDLM_FIELD(o, adam_eps), MDLM_FIELD(o, clip_grad)};
  return f;
}

const std::vector<Field<TrainingConfig>>& training_fields() {
  static const std::vector<Field<TrainingConfig>> f = {
      MDLM_FIELD(t, micro_batch_size), MDLM_FIELD(t, global_batch_size), MDLM_FIELD(t, train_iters),
      MDLM_FIELD(t, seed), MDLM_FIELD(t, bf16), MDLM_ENUM(t, device, kDevice),
      MDLM_FIELD(t, check_for_nan_in_loss_and_grad)};
  return f;
}

const std::vector<Field<DataConfig>>& data_fields() {
  static const std::vector<Field<DataConfig>> f = {
      MDLM_FIELD(d, mock_data), MDLM_FIELD(d, data_path), MDLM_FIELD(d, split),
      MDLM_FIELD(d, train_data_path), MDLM_FIELD(d, valid_data_path), MDLM_FIELD(d, test_data_path),
      MDLM_FIELD(d, vocab_file), MDLM_FIELD(d, merge_file),
      MDLM_FIELD(d, reset_position_ids), MDLM_FIELD(d, reset_attention_mask),
      MDLM_FIELD(d, eod_mask_loss), MDLM_FIELD(d, tokenizer_type), MDLM_FIELD(d, tokenizer_model)};
  return f;
}

const std::vector<Field<ParallelConfig>>& parallel_fields() {
  static const std::vector<Field<ParallelConfig>> f = {
      MDLM_FIELD(p, world_size), MDLM_FIELD(p, tensor_model_parallel_size),
      MDLM_FIELD(p, pipeline_model_parallel_size), MDLM_FIELD(p, context_parallel_size),
      MDLM_FIELD(p, expert_model_parallel_size), MDLM_FIELD(p, data_parallel_size),
      MDLM_FIELD(p, virtual_pipeline_model_parallel_size), MDLM_FIELD(p, sequence_parallel),
      MDLM_FIELD(p, use_distributed_optimizer), MDLM_FIELD(p, num_distributed_optimizer_instances)};
  return f;
}

#undef MDLM_FIELD
#undef MDLM_ENUM

template <typename T>
json to_json(const T& v, const std::vector<Field<T>>& fields) {
  json j = json::object();
  for (const Field<T>& f : fields) f.to(j, v);
  return j;
}

template <typename T>
void from_json(const json& j, T& v, const std::vector<Field<T>>& fields, const char* section) {
  if (!j.contains(section)) return;
  const json& s = j.at(section);
  for (const Field<T>& f : fields) {
    try {
      f.from(s, v);
    } catch (const json::exception& e) {
      MDLM_FAIL("field ", section, ".", f.name, ": ", e.what());
    }
  }
}

std::string show(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

}  // namespace

std::string run_config_to_json(const RunConfig& c) {
  json j;
  j["model"] = to_json(c.model, model_fields());
  j["moe"] = to_json(c.model.moe, moe_fields());
  j["diffusion"] = to_json(c.diffusion, diffusion_fields());
  j["optimizer"] = to_json(c.optimizer, optimizer_fields());
  j["training"] = to_json(c.training, training_fields());
  j["data"] = to_json(c.data, data_fields());
  j["parallel"] = to_json(c.parallel, parallel_fields());
  // JSON has no NaN: it would be written as null and make the checkpoint unloadable. Validation
  // refuses non-finite flags; a configuration built in code is refused here, naming the field.
  for (const auto& [section, fields] : j.items())
    for (const auto& [name, value] : fields.items())
      if (value.is_number_float() && !std::isfinite(value.get<double>()))
        MDLM_FAIL("the run configuration holds a non-finite ", section, ".", name, " (", value.get<double>(),
                  "); a checkpoint of it could not be read back");
  return j.dump(2);
}

RunConfig run_config_from_json(const std::string& text, const std::string& where) {
  RunConfig c;
  try {
    const json j = json::parse(text);
    if (!j.is_object() || !j.contains("model"))
      MDLM_FAIL(where, ": no run configuration (expected an object with a \"model\" section)");
    from_json(j, c.model, model_fields(), "model");
    from_json(j, c.model.moe, moe_fields(), "moe");
    from_json(j, c.diffusion, diffusion_fields(), "diffusion");
    from_json(j, c.optimizer, optimizer_fields(), "optimizer");
    from_json(j, c.training, training_fields(), "training");
    from_json(j, c.data, data_fields(), "data");
    from_json(j, c.parallel, parallel_fields(), "parallel");
  } catch (const json::exception& e) {
    MDLM_FAIL(where, ": the run configuration is not valid JSON (", e.what(), ")");
  } catch (const Error& e) {
    MDLM_FAIL(where, ": bad run configuration: ", e.what());
  }
  return c;
}

std::vector<ConfigMismatch> compare_run_configs(const RunConfig& saved, const RunConfig& current,
                                                bool finetune) {
  const json a = to_json(saved.model, model_fields()), b = to_json(current.model, model_fields());
  const bool rope = current.model.position_embedding_type == PositionEmbeddingType::Rope;
  // Field -> the flag it comes from, and whether a difference is fatal.
  struct Rule {
    const char* field;
    const char* flag;
    bool fatal;
  };
  const Rule rules[] = {
      {"num_layers", "--num-layers", true},
      {"hidden_size", "--hidden-size", true},
      {"ffn_hidden_size", "--ffn-hidden-size", true},
      {"num_attention_heads", "--num-attention-heads", true},
      {"num_query_groups", "--num-query-groups", true},
      {"kv_channels", "--kv-channels", true},
      {"position_embedding_type", "--position-embedding-type", true},
      {"normalization", "--normalization", true},
      {"norm_epsilon", "--norm-epsilon", true},
      {"activation", "--swiglu", true},
      {"qk_layernorm", "--qk-layernorm", true},
      {"add_bias_linear", "--disable-bias-linear (add_bias_linear)", true},
      {"add_qkv_bias", "--add-qkv-bias", true},
      {"untie_embeddings_and_output_weights", "--untie-embeddings-and-output-weights", true},
      {"vocab_size", "--vocab-size", true},
      {"padded_vocab_size", "padded vocabulary (--vocab-size padded to --make-vocab-size-divisible-by x TP)", true},
      {"rotary_percent", "--rotary-percent", true},
      {"rotary_base", "--rotary-base", !finetune},
      {"seq_length", "--seq-length", !finetune},
      {"max_position_embeddings", "--max-position-embeddings", !rope},
      {"attention_mask", "--attention-mask-type", false},
  };
  std::vector<ConfigMismatch> out;
  for (const Rule& r : rules) {
    if (a.value(r.field, json()) == b.value(r.field, json())) continue;
    out.push_back({r.flag, show(a.value(r.field, json())), show(b.value(r.field, json())), r.fatal});
  }
  // Mixture of experts: which layers hold experts and their shapes decide the tensors; the
  // router settings change the function, not the weights.
  const json ma = to_json(saved.model.moe, moe_fields()), mb = to_json(current.model.moe, moe_fields());
  const Rule moe_rules[] = {
      {"num_experts", "--num-experts", true},
      {"moe_layers", "--moe-layer-freq", true},
      {"ffn_hidden_size", "--moe-ffn-hidden-size", true},
      {"shared_expert_size", "--moe-shared-expert-intermediate-size", true},
      {"topk", "--moe-router-topk", false},
      {"score", "--moe-router-score-function", false},
      {"load_balancing", "--moe-router-load-balancing-type", false},
      {"expert_bias", "--moe-router-enable-expert-bias", false},
  };
  for (const Rule& r : moe_rules) {
    if (ma.value(r.field, json()) == mb.value(r.field, json())) continue;
    out.push_back({r.flag, show(ma.value(r.field, json())), show(mb.value(r.field, json())), r.fatal});
  }
  if (saved.diffusion.mode != current.diffusion.mode)
    out.push_back({"--model-running-mode", kMode.to_str(saved.diffusion.mode),
                   kMode.to_str(current.diffusion.mode), false});
  if (saved.diffusion.mask_token != current.diffusion.mask_token)
    out.push_back({"--mask-token", std::to_string(saved.diffusion.mask_token),
                   std::to_string(current.diffusion.mask_token), false});
  return out;
}

}  // namespace megadlm::checkpoint
