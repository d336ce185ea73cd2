// Hugging Face import and export for the Qwen2 / Qwen3 / Qwen3-MoE architecture family
// (docs/checkpoints.md has the complete name and config mapping), and the forward pass that
// --verify compares. A mixture-of-experts model is Qwen3-MoE: softmax top-k routing
// (norm_topk_prob = post-softmax, else --moe-router-pre-softmax), SwiGLU experts by global
// index, dense layers listed in mlp_only_layers, no shared experts, dropless.
//
// A megadlm model is exportable when it is a Qwen-style decoder: RMSNorm, SwiGLU, RoPE over the
// whole head, no learned positions, no biases except (optionally) on q/k/v. With
// --qk-layernorm it is Qwen3 (q_norm/k_norm), otherwise Qwen2 (which always has q/k/v biases:
// zeros are written when the model has none, an exact equivalence). Attention is
// bidirectional for masked-diffusion models; Hugging Face's classes are causal, which
// scripts/hf_verify.py switches off. The "megadlm" block of config.json records what
// config.json cannot say (bidirectional attention, mask token, unpadded vocabulary) so that an
// export imports back to the same model.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>
#include "megadlm/core/device.h"
#include "megadlm/core/tensor.h"
#include "megadlm/training/checkpoint/checkpoint.h"
#include "megadlm/training/training_config.h"

namespace megadlm::checkpoint {

enum class HfArchitecture { Qwen2, Qwen3, Qwen3Moe };

/// The public format of a Hugging Face folder (docs/checkpoints.md, "Block-diffusion formats"):
///   Qwen       model_type qwen2 / qwen3 / qwen3_moe, Qwen names (block models: block_size and
///              mask_token_id at the top of config.json)
///   Sdar       model_type "sdar" (SDARForCausalLM): Qwen3 names, block_size, mask_token_id
///   FastDllmV2 model_type "Fast_dLLM_Qwen" (Fast_dLLM_QwenForCausalLM): Qwen2 names with q/k/v
///              biases, the block size as bd_size; the mask id is not in config.json (its
///              added_tokens.json names it "|<MASK>|")
///   Llada      model_type "llada" (LLaDAModelLM): LLaDA's names (model.transformer.wte,
///              blocks.N.{attn_norm,q_proj,k_proj,v_proj,attn_out,ff_norm,ff_proj,up_proj,ff_out},
///              ln_f, ff_out) and OLMo-style keys (d_model, n_layers, ...); full attention
enum class HfFormat { Qwen, Sdar, FastDllmV2, Llada };
const char* hf_format_name(HfFormat f);  ///< qwen, sdar, fast_dllm_v2, llada (--hf-format)
std::optional<HfFormat> hf_format_from_name(const std::string& name);
/// The format a config.json describes (by its model_type); throws naming `where` and model_type.
HfFormat hf_format_of_config(const std::string& config_json, const std::string& where);
/// Every reason `config` cannot be written as `format` (empty = it can), naming the flag.
std::vector<std::string> hf_format_problems(const RunConfig& config, HfFormat format);

/// The Hugging Face architecture that represents `model`; throws naming the flag that keeps
/// the model from being one.
HfArchitecture hf_architecture_for(const TransformerConfig& model);
/// "model.layers.3.self_attn.q_proj.weight" for "decoder.layers.3.self_attention.linear_q.weight".
std::string hf_tensor_name(const std::string& megadlm_name, HfFormat format = HfFormat::Qwen);
/// The inverse; nullopt for names that are not megadlm parameters (rotary buffers, ...).
std::optional<std::string> megadlm_tensor_name(const std::string& hf_name, HfFormat format = HfFormat::Qwen);

/// config.json for `config` with weights stored as `dtype`, in `format` (throws with
/// hf_format_problems when the model cannot be that format).
std::string hf_config_json(const RunConfig& config, DType dtype, HfFormat format = HfFormat::Qwen);
/// The run configuration (model, mask token) a Hugging Face config.json describes. Throws naming
/// the config field that megadlm cannot represent (rope_scaling, sliding windows, activations).
RunConfig run_config_from_hf(const std::string& config_json, const std::string& where);

/// The weights of a Hugging Face folder: model.safetensors, or the shards that
/// model.safetensors.index.json lists; files are opened on first use.
class HfWeights {
 public:
  explicit HfWeights(std::string dir);
  ~HfWeights();
  const std::string& dir() const { return dir_; }
  /// Every tensor name, sorted.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  /// The tensor on the host in its stored dtype; throws naming the folder and the tensor.
  Tensor read(const std::string& name) const;

 private:
  std::string dir_;
  std::map<std::string, std::string> where_;  // tensor -> file
  mutable std::map<std::string, std::unique_ptr<SafetensorsFile>> files_;
};

struct HfExportOptions {
  std::optional<DType> dtype;          ///< weights' dtype in the export (default: as stored)
  std::string tokenizer_dir;           ///< tokenizer files copied from here ("" = none)
  uint64_t max_shard_bytes = 5000000000ull;  ///< larger exports are sharded with an index
  HfFormat format = HfFormat::Qwen;    ///< --hf-format
};

/// Writes config.json, model.safetensors (or model-0000i-of-0000n.safetensors and
/// model.safetensors.index.json) and the tokenizer files into `out_dir`.
void export_hf(const CheckpointReader& reader, const std::string& out_dir, const HfExportOptions& options);

struct HfImportOptions {
  std::optional<DType> dtype;          ///< weights' dtype in the checkpoint (default: as in the files)
  std::optional<int64_t> mask_token;   ///< recorded for --use-checkpoint-args
  std::optional<int> seq_length;       ///< recorded for --use-checkpoint-args
  std::optional<HfFormat> format;      ///< --hf-format: the folder must be this format (default: any)
};

/// Reads a Hugging Face folder (model.safetensors or a sharded index) and writes the megadlm
/// checkpoint `save_dir`/release with latest_checkpointed_iteration.txt = "release": weights
/// only, loadable with --load (iteration 0, fresh optimizer) or --finetune. Refuses a
/// `save_dir` that holds iteration checkpoints (a training run's folder, whose "latest" it would
/// repoint) and one a running trainer holds (its megadlm.lock).
void import_hf(const std::string& hf_dir, const std::string& save_dir, const HfImportOptions& options);

/// Logits (host f32 [batch * seq, padded vocab]) of the checkpoint's model for `tokens`
/// ([batch * seq], positions 0..seq-1 in each sample), on `device`: fp32 on the CPU, bf16 on
/// CUDA. Attention as the checkpoint's configuration says (block-diffusion models: bidirectional,
/// the same weights without the block mask).
Tensor checkpoint_logits(const CheckpointReader& reader, const std::vector<int32_t>& tokens,
                         int64_t batch, int64_t seq, Device device);

}  // namespace megadlm::checkpoint
