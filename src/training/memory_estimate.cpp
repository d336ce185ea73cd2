// training/memory_estimate.h: parameter counts from the flags, per pipeline stage and tensor-
// parallel rank, as the model builds them (embedding and output layer on the first and last
// stage, layers split evenly, matrices split over TP).
#include "megadlm/training/memory_estimate.h"
#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include "megadlm/core/error.h"
#include "megadlm/training/arguments/arguments.h"

namespace megadlm::training {

namespace {

std::string gib(double bytes) {
  char buf[64];
  if (bytes >= 1024.0 * 1024 * 1024 * 1024) std::snprintf(buf, sizeof buf, "%.3g TiB", bytes / (1024.0 * 1024 * 1024 * 1024));
  else std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / (1024.0 * 1024 * 1024));
  return buf;
}

std::string count(double n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, n >= 1e6 ? "%.3g" : "%.0f", n);
  return buf;
}

}  // namespace

MemoryEstimate estimate_parameter_memory(const RunConfig& c) {
  const TransformerConfig& m = c.model;
  const double tp = std::max(1, c.parallel.tensor_model_parallel_size);
  const double pp = std::max(1, c.parallel.pipeline_model_parallel_size);
  const double h = m.hidden_size, ffn = m.ffn_hidden_size, kv = m.kv_channels;
  const double heads = m.num_attention_heads, groups = m.num_query_groups;
  const double vocab = static_cast<double>(std::max(m.padded_vocab_size, m.vocab_size));
  // One layer: q, k, v, the output projection, the MLP (gate and up with SwiGLU), the norms.
  const double attention = h * kv * (heads + 2 * groups) + kv * heads * h;
  const double mlp = (m.activation == MlpActivation::SwiGLU ? 3.0 : 2.0) * h * ffn;
  const double layer = (attention + mlp) / tp + 4 * h;
  const double layers_per_stage = std::ceil(static_cast<double>(m.num_layers) / pp);
  const double embedding = vocab * h / tp +
                           (m.position_embedding_type == PositionEmbeddingType::LearnedAbsolute
                                ? static_cast<double>(m.max_position_embeddings) * h : 0.0);
  const double output = m.untie_embeddings_and_output_weights ? vocab * h / tp : 0.0;
  // The busiest stage: the only one with pp 1, else the first (embedding) or the last (output).
  const double ends = pp == 1 ? embedding + output : std::max(embedding, output);

  MemoryEstimate e;
  e.parameters_per_rank = layers_per_stage * layer + ends;
  const bool cuda = c.training.device == DeviceKind::Cuda;
  const double shard = c.parallel.use_distributed_optimizer ? std::max(1, c.parallel.data_parallel_size) : 1;
  // Model weights (bf16 on CUDA) and fp32 gradients on every rank; fp32 masters and two Adam
  // moments on the rank that owns them.
  const double per_parameter = (cuda ? 2.0 : 4.0) + 4.0 + 12.0 / shard;
  e.bytes_per_rank = e.parameters_per_rank * per_parameter;
  const std::string layers_flags = "`--num-layers " + std::to_string(m.num_layers) + "` layers of `--hidden-size " +
                                   std::to_string(m.hidden_size) + "` and `--ffn-hidden-size " +
                                   std::to_string(m.ffn_hidden_size) + "`";
  e.parts.push_back({layers_flags, layers_per_stage * layer});
  e.parts.push_back({"the embedding of the padded vocabulary " + count(vocab) + " (`--vocab-size " +
                         std::to_string(m.vocab_size) + "`) x `--hidden-size " + std::to_string(m.hidden_size) + "`",
                     pp == 1 ? embedding : std::max(embedding, output)});
  if (output > 0 && pp == 1)
    e.parts.push_back({"the untied output layer (`--untie-embeddings-and-output-weights`)", output});
  std::sort(e.parts.begin(), e.parts.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  return e;
}

void check_parameter_memory(const RunConfig& c, double available_bytes, const std::string& where) {
  if (available_bytes <= 0) return;
  const MemoryEstimate e = estimate_parameter_memory(c);
  if (e.bytes_per_rank <= available_bytes) return;
  std::string msg = "the model does not fit: " + count(e.parameters_per_rank) +
                    " parameters on the busiest rank need at least " + gib(e.bytes_per_rank) +
                    " (weights, fp32 gradients, fp32 master weights and Adam moments; activations "
                    "come on top), more than " + where + ". Most of it: ";
  for (size_t i = 0; i < e.parts.size() && i < 2; ++i)
    msg += (i ? "; " : "") + e.parts[i].first + " (" + count(e.parts[i].second) + " parameters, " +
           gib(e.parts[i].second * e.bytes_per_rank / std::max(e.parameters_per_rank, 1.0)) + ")";
  msg += ". Use smaller sizes, or spread the model with `--tensor-model-parallel-size` / "
         "`--pipeline-model-parallel-size` (and `--use-distributed-optimizer`) [M-31]";
  throw ConfigError({msg}, {});
}

double host_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0.0;
}

}  // namespace megadlm::training
