#include "megadlm/training/arguments/checkpoint_args.h"
#include <filesystem>
#include "megadlm/core/error.h"
#include "megadlm/training/checkpoint/checkpoint.h"
#include "megadlm/training/checkpoint/file_io.h"

namespace megadlm::training {

namespace {

std::string number(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// The value of the last `--flag value` / `--flag=value` in tokens, or "".
std::string last_value(const std::vector<std::string>& tokens, const std::string& flag) {
  std::string v;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] == flag && i + 1 < tokens.size()) v = tokens[i + 1];
    else if (tokens[i].rfind(flag + "=", 0) == 0) v = tokens[i].substr(flag.size() + 1);
  }
  return v;
}

}  // namespace

std::vector<int64_t> vocab_padding_multiples(int64_t vocab_size, int64_t padded_vocab_size) {
  std::vector<int64_t> out;
  for (int64_t m = 1; m <= padded_vocab_size && vocab_size > 0; m *= 2)
    if ((vocab_size + m - 1) / m * m == padded_vocab_size) out.push_back(m);
  return out;
}

int64_t vocab_padding_multiple(int64_t vocab_size, int64_t padded_vocab_size) {
  // Megatron's default 128 when it fits (the likeliest original), else the largest fit below
  // it, else the smallest above it.
  const std::vector<int64_t> fits = vocab_padding_multiples(vocab_size, padded_vocab_size);
  int64_t best = 0;
  for (int64_t m : fits)
    if (m <= 128) best = m;
  if (best == 0 && !fits.empty()) best = fits.front();
  return best == 0 ? 1 : best;
}

std::vector<std::string> checkpoint_model_args(const RunConfig& config) {
  const TransformerConfig& m = config.model;
  std::vector<std::string> a = {
      "--num-layers", std::to_string(m.num_layers),
      "--hidden-size", std::to_string(m.hidden_size),
      "--ffn-hidden-size", std::to_string(m.ffn_hidden_size),
      "--num-attention-heads", std::to_string(m.num_attention_heads),
      "--kv-channels", std::to_string(m.kv_channels),
      "--seq-length", std::to_string(m.seq_length),
      "--max-position-embeddings", std::to_string(m.max_position_embeddings),
      "--position-embedding-type", position_embedding_type_name(m.position_embedding_type),
      "--rotary-base", number(m.rotary_base),
      "--rotary-percent", number(m.rotary_percent),
      "--normalization", norm_type_name(m.normalization),
      "--norm-epsilon", number(m.norm_epsilon),
      "--vocab-size", std::to_string(m.vocab_size)};
  if (m.num_query_groups != m.num_attention_heads)
    a.insert(a.end(), {"--group-query-attention", "--num-query-groups", std::to_string(m.num_query_groups)});
  if (m.activation == MlpActivation::SwiGLU) a.push_back("--swiglu");
  if (m.qk_layernorm) a.push_back("--qk-layernorm");
  if (!m.add_bias_linear) a.push_back("--disable-bias-linear");
  if (m.add_qkv_bias && !m.add_bias_linear) a.push_back("--add-qkv-bias");
  if (m.untie_embeddings_and_output_weights) a.push_back("--untie-embeddings-and-output-weights");
  // The padding multiple that reproduces the stored padded size at tensor-parallel size 1; a run
  // at another TP size pads to that multiple times TP (Megatron's rule), and the load then
  // names the padded vocabulary as the mismatch.
  a.insert(a.end(), {"--make-vocab-size-divisible-by",
                     std::to_string(vocab_padding_multiple(m.vocab_size, m.padded_vocab_size))});
  if (config.diffusion.mask_token >= 0)
    a.insert(a.end(), {"--mask-token", std::to_string(config.diffusion.mask_token)});
  return a;
}

std::vector<std::string> with_checkpoint_args(const std::vector<std::string>& tokens,
                                              std::vector<std::string>& errors) {
  bool use = false;
  for (const std::string& t : tokens) use = use || t == "--use-checkpoint-args";
  const std::string load = last_value(tokens, "--load");
  if (!use || load.empty()) return tokens;  // V-58 reports a missing --load
  try {
    std::optional<int64_t> step;
    const std::string s = last_value(tokens, "--ckpt-step");
    if (!s.empty()) step = std::stoll(s);
    const std::optional<std::string> dir = checkpoint::find_checkpoint(load, step);
    if (!dir) {
      errors.push_back("`--use-checkpoint-args`: `--load " + load + "` holds no checkpoint (no " +
                       checkpoint::kLatestFileName + ")");
      return tokens;
    }
    const checkpoint::CheckpointReader reader(*dir);
    std::vector<std::string> out = reader.index().state.model_args;
    if (out.empty()) {
      errors.push_back("`--use-checkpoint-args`: checkpoint " + *dir + " records no model flags");
      return tokens;
    }
    out.insert(out.end(), tokens.begin(), tokens.end());
    return out;
  } catch (const std::exception& e) {
    errors.push_back(std::string("`--use-checkpoint-args`: ") + e.what());
    return tokens;
  }
}

}  // namespace megadlm::training
