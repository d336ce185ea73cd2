// activation_memory: how much memory a rank needs for a model and sequence length under context
// parallelism, from a CPU measurement — a self-contained account (its own program, independent
// of any --dry-run memory planner).
//
//   activation_memory [--cp 1,2,4,8] [--gpu-gib 140] [--reserve 0.1] --
//       @configs/megadlms_1.7b.args --seq-length 32768 --max-position-embeddings 32768
//       --micro-batch-size 1
//
// The Megatron flags after `--` give the model, the sequence length and the micro-batch size.
// The program builds the model with one transformer layer on the CPU, runs a training forward of
// one micro-batch at two small lengths, and counts the bytes its record keeps for backward
// (model/saved_activations.h; activations priced in bf16, statistics in f32, as a CUDA run stores
// them). Every saved tensor is linear in the tokens a rank holds, which the two lengths check, so
// the count scales exactly to the layers of the model and to S / CP tokens per sample per rank
// (tests/layout/context_parallel/test_cp_memory.cpp checks the 1/CP division on real CP runs).
// The model state per rank is counted from the parameter list: bf16 weights, fp32 main
// gradients, fp32 master weights and Adam moments sharded over the CP group (the distributed
// optimizer over dp×cp with dp = 1). The longest sequence that fits a GPU at the largest CP size
// keeps state + activations below (1 - reserve) of its memory: the reserve stands for what this
// account leaves out (transients of one layer's backward, the cuBLASLt workspace, pool
// fragmentation).
#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>
#include "megadlm/core/error.h"
#include "megadlm/model/gpt_model.h"
#include "megadlm/model/saved_activations.h"
#include "megadlm/parallel/parameter_store.h"
#include "megadlm/training/arguments/arguments.h"
#include "tool_cli.h"

using namespace megadlm;

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

const char* kUsage =
    "usage: activation_memory [--cp 1,2,4,8] [--gpu-gib 140] [--reserve 0.1] -- MEGATRON FLAGS\n"
    "  e.g. activation_memory --cp 1,2,4,8 -- @configs/megadlms_1.7b.args --seq-length 32768 \\\n"
    "         --max-position-embeddings 32768 --micro-batch-size 1\n"
    "Memory a rank needs for the model and sequence length the Megatron flags after `--` give, under\n"
    "each context-parallel size (docs/parallelism/context_parallel.md). Exit codes: 0 success, 2 a\n"
    "reported error (bad flag), 3 an unexpected failure.";

std::vector<apps::CliFlag> flags() {
  using training::FlagKind;
  return {
      {.name = "--cp", .value = "LIST", .help = "context-parallel sizes to account for, comma separated",
       .default_value = "1,2,4,8"},
      {.name = "--gpu-gib", .value = "G", .help = "GPU memory in GiB (140: an H200, 143,771 MiB as nvidia-smi reports it)",
       .kind = FlagKind::Float, .default_value = "140", .range = "(0, inf)"},
      {.name = "--reserve", .value = "F",
       .help = "fraction of the GPU kept for what this account leaves out (one layer's backward transients, "
               "the cuBLASLt workspace, pool fragmentation)",
       .kind = FlagKind::Float, .default_value = "0.1", .range = "[0, 1)"},
  };
}

struct Options {
  std::vector<int> cp;
  double gpu_gib = 0, reserve = 0;
  std::vector<std::string> megatron;
};

Options options(const apps::Cli& cli) {
  std::vector<std::string> errors;
  Options o;
  o.gpu_gib = cli.number("--gpu-gib");
  o.reserve = cli.number("--reserve");
  std::stringstream list(cli.get("--cp"));
  for (std::string x; std::getline(list, x, ',');) {
    char* end = nullptr;
    const long v = std::strtol(x.c_str(), &end, 10);
    if (x.empty() || *end != '\0' || v < 1 || v > 1 << 20) {
      errors.push_back("`--cp " + cli.get("--cp") + "`: `" + x + "` is not a context-parallel size; valid: "
                       "positive integers separated by commas (1,2,4,8)");
      break;
    }
    o.cp.push_back(static_cast<int>(v));
  }
  if (o.cp.empty() && errors.empty()) errors.push_back("`--cp` needs at least one context-parallel size");
  o.megatron = cli.rest();
  if (o.megatron.empty())
    errors.push_back("missing the model's Megatron flags after `--`, e.g. -- @configs/megadlms_1.7b.args "
                     "--seq-length 32768 --max-position-embeddings 32768");
  if (!errors.empty()) throw ConfigError(errors, {});
  return o;
}

/// Bytes per token the record keeps: per transformer layer, and for the head.
struct PerToken {
  double layer = 0, head = 0;
};

SavedActivationBytes measure(const TransformerConfig& full, int64_t seq) {
  TransformerConfig c = full;
  c.num_layers = 1;
  c.seq_length = c.max_position_embeddings = std::max<int64_t>(seq, 1);
  ParameterStore store;
  GptModel model(c, store);
  const Stream s = Stream::cpu();
  store.materialize(DType::F32, 1234, s);
  HostMicroBatch h;
  h.batch = 1;
  h.seq = seq;
  // Ids below the vocabulary (the saved bytes do not depend on which ids they are).
  const int64_t distinct = std::clamp<int64_t>(c.vocab_size - 2, 1, 1000);
  for (int64_t i = 0; i < seq; ++i) {
    h.input_ids.push_back(static_cast<int32_t>(1 + i % distinct));
    h.labels.push_back(static_cast<int32_t>(2 + i % distinct));
    h.loss_weights.push_back(1.0f);
    h.positions.push_back(static_cast<int32_t>(i));
  }
  h.loss_tokens = static_cast<double>(seq);
  const MicroBatch mb = MicroBatch::upload(h, s);
  ModelRuntime rt;
  rt.stream = s;
  ModelRecord rec;
  Tensor loss = Tensor::zeros({1}, DType::F32, s);
  model.forward(mb, rec, loss, 1.0f / static_cast<float>(seq), rt);
  return saved_activation_bytes(rec, DType::BF16);
}

int run(const apps::Cli& cli) {
  const Options o = options(cli);
  std::vector<std::string> args = o.megatron;
  for (const char* extra : {"--dry-run", "--world-size", "1", "--mock-data"}) args.emplace_back(extra);
  const training::ParsedArguments p = training::parse_arguments(args, {});
  const TransformerConfig& m = p.config.model;
  const int64_t seq = m.seq_length, mbs = p.config.training.micro_batch_size;

  // Linear in tokens: two small lengths, exact per-token rates (and no constant term).
  const int64_t s1 = 64, s2 = 128;
  const SavedActivationBytes a = measure(m, s1), b = measure(m, s2);
  MDLM_CHECK(b.layers == 2 * a.layers && b.head == 2 * a.head, "the saved bytes are not linear "
             "in the tokens (", a.layers, ", ", a.head, " at ", s1, "; ", b.layers, ", ", b.head,
             " at ", s2, "): this account does not apply");
  const PerToken per{static_cast<double>(a.layers) / s1, static_cast<double>(a.head) / s1};

  // Parameters of the whole model (registered, not allocated).
  ParameterStore all;
  GptModel whole(m, all);
  int64_t params = 0;
  for (const ParamDesc& d : all.descs()) params += d.numel();

  std::printf("model: %d layers, hidden %lld, %d heads (%d KV groups), ffn %lld, vocabulary %lld;"
              " %.3f B parameters\n", m.num_layers, static_cast<long long>(m.hidden_size),
              m.num_attention_heads, m.num_query_groups, static_cast<long long>(m.ffn_hidden_size),
              static_cast<long long>(m.padded_vocab_size), params / 1e9);
  std::printf("saved for backward, bf16 activations + f32 statistics (CPU measurement, 1 layer at"
              " %lld and %lld tokens): %.0f B/token/layer, %.0f B/token for the head\n",
              static_cast<long long>(s1), static_cast<long long>(s2), per.layer, per.head);
  auto state_bytes = [&](int cp) {
    // bf16 weights + fp32 main grads, and fp32 master weights + Adam m, v sharded over dp×cp.
    return params * (2.0 + 4.0) + params * 12.0 / cp;
  };
  auto saved_bytes = [&](int64_t s, int cp) {
    const double tokens = static_cast<double>(mbs) * static_cast<double>(s) / cp;
    return tokens * (per.layer * m.num_layers + per.head);
  };
  std::printf("\nsequence %lld, micro-batch %lld, one micro-batch in flight:\n",
              static_cast<long long>(seq), static_cast<long long>(mbs));
  std::printf("  %-4s %-16s %-18s %-20s %-18s\n", "CP", "tokens per rank", "saved (GiB/rank)",
              "model state (GiB)", "sum (GiB/rank)");
  for (int cp : o.cp) {
    const double act = saved_bytes(seq, cp), state = state_bytes(cp);
    std::printf("  %-4d %-16lld %-18.2f %-20.2f %-18.2f\n", cp,
                static_cast<long long>(mbs * seq / cp), act / kGiB, state / kGiB,
                (act + state) / kGiB);
  }
  const int cp_max = *std::max_element(o.cp.begin(), o.cp.end());
  const double budget = o.gpu_gib * kGiB * (1.0 - o.reserve) - state_bytes(cp_max);
  // Sequences are multiples of 2·cp (the split) and, for a readable answer, of 1024.
  const int64_t step = std::max<int64_t>(1024, 2 * cp_max);
  int64_t longest = 0;
  for (int64_t s = step; saved_bytes(s, cp_max) <= budget; s += step) longest = s;
  std::printf("\nlongest sequence at CP=%d that fits a %.0f GiB GPU with a %.0f%% reserve: %lld "
              "tokens (%.1f GiB saved + %.1f GiB state per rank)\n",
              cp_max, o.gpu_gib, 100 * o.reserve, static_cast<long long>(longest),
              saved_bytes(longest, cp_max) / kGiB, state_bytes(cp_max) / kGiB);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return apps::tool_main(argc, argv, {"activation_memory", kUsage, flags(), /*rest_after_dashes=*/true}, run);
}
