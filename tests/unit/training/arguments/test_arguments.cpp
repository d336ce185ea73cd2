// Flag parsing and validation, table-driven: each row is a command line and its outcome —
// accepted (with the resolved values it must produce), rejected (with the substrings the message
// must contain: flag names, values, what is valid, the rule id), or valid-but-not-supported-yet.
// At least one row per rule of docs/rules.md that megadlm implements (the row's id).
#include <gtest/gtest.h>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <unistd.h>
#include "megadlm/data/indexed_dataset.h"
#include "megadlm/training/arguments/arguments.h"
#include "megadlm/training/data_setup.h"
#include "megadlm/training/arguments/flags.h"

using namespace megadlm;
using namespace megadlm::training;

namespace {

using Argv = std::vector<std::string>;

// A small valid command line: everything the rules require, nothing else.
const std::vector<std::pair<std::string, std::string>> kBase = {
    {"--num-layers", "2"},        {"--hidden-size", "64"},   {"--num-attention-heads", "4"},
    {"--seq-length", "32"},       {"--max-position-embeddings", "32"},
    {"--micro-batch-size", "2"},  {"--vocab-size", "100"},   {"--mask-token", "99"},
    {"--lr", "1e-3"},             {"--train-iters", "10"},   {"--mock-data", ""},
};

/// kBase without the flags in `drop`, followed by `extra`.
Argv cmd(const Argv& extra = {}, const Argv& drop = {}) {
  Argv out;
  for (const auto& [flag, value] : kBase) {
    if (std::find(drop.begin(), drop.end(), flag) != drop.end()) continue;
    out.push_back(flag);
    if (!value.empty()) out.push_back(value);
  }
  out.insert(out.end(), extra.begin(), extra.end());
  return out;
}

/// cmd(extra) validated with --dry-run for `world` ranks.
Argv dry(int world, Argv extra = {}, const Argv& drop = {}) {
  extra.insert(extra.end(), {"--dry-run", "--world-size", std::to_string(world)});
  return cmd(extra, drop);
}

// The MegaDLMs 1.7B example (examples/dlm_training/dlm_pretrain_1.7b.sh, DP only).
const Argv k1p7b = {
    "--num-layers", "28", "--hidden-size", "2048", "--num-attention-heads", "16",
    "--ffn-hidden-size", "6144", "--swiglu", "--normalization", "RMSNorm", "--norm-epsilon",
    "1e-6", "--qk-layernorm", "--disable-bias-linear", "--untie-embeddings-and-output-weights",
    "--position-embedding-type", "rope", "--rotary-base", "10000", "--vocab-size", "50289",
    "--mask-token", "50277", "--seq-length", "2048", "--max-position-embeddings", "2048",
    "--micro-batch-size", "4", "--global-batch-size", "256", "--bf16", "--lr", "2e-4",
    "--min-lr", "2e-5", "--lr-decay-style", "WSD", "--lr-wsd-decay-style", "exponential",
    "--lr-wsd-decay-iters", "1000", "--lr-warmup-iters", "2000", "--weight-decay", "0.1",
    "--adam-beta1", "0.9", "--adam-beta2", "0.95", "--clip-grad", "1.0", "--init-method-std",
    "0.02", "--attention-dropout", "0", "--hidden-dropout", "0", "--train-iters", "10000",
    "--mock-data", "--model-running-mode", "difflm-noshift", "--attention-mask-type", "no_mask",
    "--base-model", "vanilla"};

enum class Outcome {
  Accepted,      ///< parse_arguments returns; `expect` must appear in warnings or not_supported
  Rejected,      ///< ConfigError with rule errors; `expect` must appear in its message
  NotSupported,  ///< ConfigError with only not-supported-yet items containing `expect`
};

struct Row {
  std::string id;  ///< the rule (or parser feature) the row exercises
  Argv argv;
  Outcome outcome;
  std::vector<std::string> expect;
  std::function<void(const ParsedArguments&)> check = nullptr;
  LaunchInfo launch = {};
};

// gtest prints a failing parameter with this (instead of its bytes).
void PrintTo(const Row& r, std::ostream* os) { *os << "row " << r.id; }

std::string joined(const std::vector<std::string>& v) {
  std::string out;
  for (const std::string& s : v) out += s + "\n";
  return out;
}

std::vector<Row> rows() {
  using O = Outcome;
  return {
      // ------------------------------------------------------------------ parsing
      {"parse-base-is-valid", cmd(), O::Accepted, {}, [](const ParsedArguments& p) {
         EXPECT_EQ(p.config.model.num_layers, 2);
         EXPECT_EQ(p.config.model.ffn_hidden_size, 256);  // 4H
         EXPECT_EQ(p.config.model.kv_channels, 16);       // H / heads
         EXPECT_EQ(p.config.model.num_query_groups, 4);   // = heads without GQA
         EXPECT_EQ(p.config.model.padded_vocab_size, 128);
         EXPECT_EQ(p.config.training.global_batch_size, 2);  // mbs · dp
         EXPECT_EQ(p.config.optimizer.lr_decay_iters, 10);   // = train iters
         EXPECT_EQ(p.config.model.attention_mask, AttentionMaskType::NoMask);
         EXPECT_EQ(p.config.diffusion.mode, RunningMode::DiffLMNoShift);
         EXPECT_EQ(p.config.training.device, DeviceKind::Cpu);
         EXPECT_TRUE(p.config.model.add_bias_linear);
         EXPECT_TRUE(p.config.model.add_qkv_bias);  // V-47: forced on with linear biases
         EXPECT_TRUE(p.warnings.empty()) << joined(p.warnings);
         EXPECT_FALSE(p.dry_run);
       }},
      {"parse-unknown-flag-suggests-nearest", cmd({"--tensor-parallel-size", "2"}), O::Rejected,
       {"unknown flag `--tensor-parallel-size`; did you mean `--tensor-model-parallel-size`?"}},
      {"parse-unknown-flag-suggests-nearest", cmd({"--seq-len", "32"}), O::Rejected,
       {"unknown flag `--seq-len`; did you mean `--seq-length`?"}},
      {"parse-no-prefix-abbreviation", cmd({"--micro-batch", "2"}), O::Rejected,
       {"unknown flag `--micro-batch`; did you mean `--micro-batch-size`?"}},
      {"parse-bad-int", cmd({"--num-layers", "two"}), O::Rejected,
       {"`--num-layers two`: invalid value; valid: an integer"}},
      {"parse-bad-float", cmd({"--lr", "fast"}), O::Rejected, {"`--lr fast`", "a number"}},
      {"parse-bad-choice", cmd({"--normalization", "BatchNorm"}), O::Rejected,
       {"`--normalization BatchNorm`: invalid value; valid: LayerNorm, RMSNorm"}},
      {"parse-missing-value", cmd({"--seed"}), O::Rejected, {"`--seed` expects a value"}},
      {"parse-flag-takes-no-value", cmd({"--swiglu=yes"}), O::Rejected,
       {"`--swiglu` takes no value"}},
      {"parse-stray-value", cmd({"stray"}), O::Rejected, {"unexpected argument `stray`"}},
      {"parse-equals-form", cmd({"--num-layers=4", "--lr=0.5"}), O::Accepted, {},
       [](const ParsedArguments& p) {
         EXPECT_EQ(p.config.model.num_layers, 4);
         EXPECT_FLOAT_EQ(p.config.optimizer.lr, 0.5f);
       }},
      {"parse-duplicate-last-wins", cmd({"--num-layers", "3", "--num-layers", "6"}), O::Accepted,
       {}, [](const ParsedArguments& p) { EXPECT_EQ(p.config.model.num_layers, 6); }},
      {"parse-negative-number-is-a-value",
       cmd({"--inference-batch-times-seqlen-threshold", "-1"}), O::Accepted,
       {"`--inference-batch-times-seqlen-threshold` has no effect in megadlm"}},
      {"V-47/parse-no-X-flag", cmd({"--disable-bias-linear", "--no-check-for-nan-in-loss-and-grad"}),
       O::Accepted, {}, [](const ParsedArguments& p) {
         EXPECT_FALSE(p.config.model.add_bias_linear);
         EXPECT_FALSE(p.config.model.add_qkv_bias);
         EXPECT_FALSE(p.config.training.check_for_nan_in_loss_and_grad);
         EXPECT_EQ(p.values.at("add_bias_linear"), "False");
       }},
      {"parse-int-list", dry(16, {"--context-parallel-size", "8", "--hierarchical-context-parallel-sizes", "2", "4", "--cp-comm-type", "a2a+p2p"}),
       O::Accepted, {}, [](const ParsedArguments& p) {
         EXPECT_EQ(p.config.parallel.hierarchical_context_parallel_sizes, (std::vector<int>{2, 4}));
         EXPECT_EQ(p.config.parallel.cp_comm_type, (std::vector<cp::CommType>{cp::CommType::A2AP2P}));
         EXPECT_EQ(p.values.at("hierarchical_context_parallel_sizes"), "[2, 4]");
       }},
      {"parse-string-list-choices", cmd({"--cp-comm-type", "p2p", "ring"}), O::Rejected,
       {"`--cp-comm-type ring`: invalid value; valid: p2p, all_gather, allgather, a2a, a2a+p2p"}},
      {"parse-empty-star-list", dry(1, {"--spec"}), O::Accepted, {"`--spec` is not supported yet"},
       [](const ParsedArguments& p) { EXPECT_EQ(p.values.at("spec"), "[]"); }},
      {"D-1", cmd({"--base-model", "Qwen_2"}), O::Rejected,
       {"`--base-model Qwen_2`: invalid value; valid: vanilla"}},

      // ------------------------------------------------------------------ logging (M-20)
      {"logging-defaults", cmd(), O::Accepted, {}, [](const ParsedArguments& p) {
         EXPECT_EQ(p.config.logging.level, logging::Level::Info);
         EXPECT_FALSE(p.config.logging.all_ranks);
         EXPECT_EQ(p.config.logging.dir, "");
         EXPECT_EQ(p.values.at("log_level"), "info");
         EXPECT_EQ(p.values.at("logging_level"), "None");
       }},
      {"logging-flags", cmd({"--log-level", "debug", "--log-all-ranks", "--log-dir", "logs"}), O::Accepted, {},
       [](const ParsedArguments& p) {
         EXPECT_EQ(p.config.logging.level, logging::Level::Debug);
         EXPECT_TRUE(p.config.logging.all_ranks);
         EXPECT_EQ(p.config.logging.dir, "logs");
         EXPECT_TRUE(p.warnings.empty()) << joined(p.warnings);
       }},
      {"logging-level-choices", cmd({"--log-level", "verbose"}), O::Rejected,
       {"`--log-level verbose`: invalid value; valid: trace, debug, info, warning, error"}},
      // Megatron's --logging-level is a Python threshold: a message shows when its level
      // (DEBUG 10, INFO 20, WARNING 30, ERROR 40) is at least the threshold.
      {"logging-python-10", cmd({"--logging-level", "10"}), O::Accepted, {},
       [](const ParsedArguments& p) { EXPECT_EQ(p.config.logging.level, logging::Level::Debug); }},
      {"logging-python-20", cmd({"--logging-level", "20"}), O::Accepted, {},
       [](const ParsedArguments& p) {
         EXPECT_EQ(p.config.logging.level, logging::Level::Info);
         EXPECT_TRUE(p.warnings.empty()) << joined(p.warnings);  // no longer "has no effect"
       }},
      {"logging-python-25", cmd({"--logging-level", "25"}), O::Accepted, {},
       [](const ParsedArguments& p) { EXPECT_EQ(p.config.logging.level, logging::Level::Warning); }},
      {"logging-python-40", cmd({"--logging-level", "40"}), O::Accepted, {},
       [](const ParsedArguments& p) { EXPECT_EQ(p.config.logging.level, logging::Level::Error); }},
      {"M-20-levels-agree", cmd({"--log-level", "warning", "--logging-level", "30"}), O::Accepted, {},
       [](const ParsedArguments& p) { EXPECT_EQ(p.config.logging.level, logging::Level::Warning); }},
      {"M-20", cmd({"--log-level", "debug", "--logging-level", "30"}), O::Rejected,
       {"give one of `--log-level debug` and `--logging-level 30` (that Python level means "
        "`--log-level warning`) [M-20]"}},
      {"M-20-log-dir-is-a-file", cmd({"--log-dir", "/dev/null"}), O::Rejected,
       {"`--log-dir /dev/null` is a file; give a directory (it is created when missing) [M-20]"}},
      // ------------------------------------------------------------------ attention backend (M-21)
      {"M-21", cmd({"--attention-backend", "fused", "--attention-dropout", "0.1"}), O::Rejected,
       {"`--attention-backend fused` cannot run `--attention-dropout 0.1`"}},
      {"M-21-auto-keeps-dropout", cmd({"--attention-backend", "auto", "--attention-dropout", "0.1"}),
       O::Accepted, {}},

      // ------------------------------------------------------------------ flag status
      {"V-12", cmd({"--batch-size", "8"}), O::Rejected,
       {"`--batch-size` is no longer a valid flag: use `--micro-batch-size` instead [V-12]"}},
      {"V-12", cmd({"--checkpoint-activations"}), O::Rejected,
       {"`--checkpoint-activations`", "`--recompute-activations`", "[V-12]"}},
      {"V-12", cmd({"--warmup", "10"}), O::Rejected, {"`--lr-warmup-fraction`", "[V-12]"}},
      {"V-12", cmd({"--model-parallel-size", "2"}), O::Rejected,
       {"`--tensor-model-parallel-size`", "[V-12]"}},
      {"V-8", cmd({"--pipeline-model-parallel-split-rank", "1"}), O::Rejected, {"[V-8]"}},
      {"not-yet-flag", cmd({"--decoder-num-layers", "5"}), O::NotSupported,
       {"`--decoder-num-layers 5` is not supported yet by megadlm (see docs/flags.md)"}},
      {"not-yet-flag-at-default", cmd({"--encoder-tensor-model-parallel-size", "0"}), O::Accepted, {}},
      {"not-yet-value", cmd({"--dlm-t-sampling", "stratified"}), O::NotSupported,
       {"`--dlm-t-sampling stratified` is not supported yet by megadlm (see docs/flags.md); "
        "supported: iid"}},
      {"not-yet-value", cmd({"--dlm-shift", "right"}), O::NotSupported, {"supported: none"}},
      {"not-yet-in-dry-run", dry(1, {"--fp16"}), O::Accepted,
       {"`--fp16` is not supported yet by megadlm"}},
      {"ignored-flag-warns", cmd({"--wandb-project", "x"}), O::Accepted,
       {"`--wandb-project` has no effect in megadlm"}},
      // Flags that would change results or memory are refused, not ignored: megadlm lacks them.
      {"not-implemented-jitter", cmd({"--moe-input-jitter-eps", "0.01"}), O::NotSupported,
       {"`--moe-input-jitter-eps 0.01` is not supported yet by megadlm: megadlm's router does not "
        "jitter its input (see docs/flags.md)"}},
      {"not-implemented-upcycling", cmd({"--save", "/tmp/c", "--save-interval", "5", "--moe-use-upcycling"}),
       O::NotSupported,
       {"`--moe-use-upcycling` is not supported yet by megadlm: megadlm cannot turn a dense checkpoint "
        "into an MoE one"}},
      {"not-implemented-moe-recompute", cmd({"--moe-layer-recompute"}), O::NotSupported,
       {"`--moe-layer-recompute` is not supported yet by megadlm: megadlm keeps the MoE layers' "
        "activations"}},
      {"not-implemented-dataloader", cmd({"--dataloader-type", "cyclic"}), O::NotSupported,
       {"`--dataloader-type cyclic` is not supported yet by megadlm (see docs/flags.md); supported: single"}},
      {"not-implemented-dataloader", cmd({"--dataloader-type", "external"}), O::NotSupported,
       {"`--dataloader-type external` is not supported yet by megadlm"}},
      {"dataloader-single", cmd({"--dataloader-type", "single"}), O::Accepted, {},
       [](const ParsedArguments& p) {
         EXPECT_TRUE(p.warnings.empty()) << joined(p.warnings);
         EXPECT_EQ(p.values.at("dataloader_type"), "single");
       }},
      {"not-implemented-in-dry-run", dry(1, {"--moe-layer-recompute"}), O::Accepted,
       {"`--moe-layer-recompute` is not supported yet by megadlm"}},
      {"no-p2p-overlap-has-no-effect",
       dry(2, {"--pipeline-model-parallel-size", "2", "--num-layers", "4", "--no-overlap-p2p-communication",
               "--global-batch-size", "4"}),
       O::Accepted, {"`--no-overlap-p2p-communication` has no effect in megadlm (megadlm's pipeline p2p is "
                     "not overlapped"}},
      {"dlm-flags", cmd({"--dlm-loss-weight", "inv_t_eps", "--dlm-min-masked", "3"}), O::Accepted,
       {}, [](const ParsedArguments& p) {
         EXPECT_EQ(p.config.diffusion.loss_weight, DlmLossWeight::InvTEps);
         EXPECT_EQ(p.config.diffusion.min_masked, 3);
       }},

      // ------------------------------------------------------------------ world and sizes
      {"M-1", cmd({"--world-size", "4"}), O::Rejected,
       {"`--world-size 4` is only used with `--dry-run`", "[M-1]"}},
      {"M-2", dry(1, {"--tensor-model-parallel-size", "0"}), O::Rejected,
       {"`--tensor-model-parallel-size 0`: a parallel size must be between 1 and", "[M-2]"}},
      {"M-2", cmd({"--num-layers", "-1"}), O::Rejected, {"`--num-layers -1` must be between 1 and"}},
      {"V-5", dry(12, {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2", "--context-parallel-size", "2"}),
       O::Rejected,
       {"world size 12 (`--world-size 12`) is not divisible by tp·pp·cp = 8",
        "`--tensor-model-parallel-size 2`",
        "valid world sizes: multiples of 8 (e.g. `--world-size 8`); valid for world size 12: sizes "
        "whose product tp·pp·cp divides it (1, 2, 3, 4, 6, 12) [V-5]"}},
      {"G-3", dry(8, {"--expert-model-parallel-size", "16", "--expert-tensor-parallel-size", "1", "--num-experts", "16"}),
       O::Rejected, {"is not divisible by etp·ep·pp = 16", "[G-3]"}},
      {"V-11/C-2", dry(4, {"--tensor-model-parallel-size", "2"}), O::Accepted, {},
       [](const ParsedArguments& p) {
         EXPECT_EQ(p.config.parallel.expert_tensor_parallel_size, 2);  // defaults to tp
         EXPECT_EQ(p.config.parallel.expert_data_parallel_size, 2);
       }},
      {"V-53", dry(8, {"--use-tp-pp-dp-mapping", "--context-parallel-size", "2"}), O::Rejected,
       {"`--context-parallel-size 2`", "[V-53]"}},
      {"G-4", dry(8, {"--use-tp-pp-dp-mapping", "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2", "--expert-tensor-parallel-size", "1"}),
       O::Rejected, {"`--expert-tensor-parallel-size 1` must equal `--tensor-model-parallel-size 2`", "[G-4]"}},
      {"V-3", dry(4, {"--tensor-model-parallel-size", "4", "--encoder-tensor-model-parallel-size", "3", "--encoder-pipeline-model-parallel-size", "1"}),
       O::Rejected, {"`--encoder-tensor-model-parallel-size 3` does not divide `--num-attention-heads 4`; valid: 1, 2, 4 [V-3]"}},
      {"V-2", dry(4, {"--tensor-model-parallel-size", "4", "--encoder-tensor-model-parallel-size", "2"}),
       O::Rejected, {"`--encoder-tensor-model-parallel-size 2` must equal `--tensor-model-parallel-size 4`", "[V-2]"}},

      // ------------------------------------------------------------------ model shape
      {"V-31", cmd({"--encoder-num-layers", "2"}), O::Rejected, {"give only one of `--num-layers 2` and `--encoder-num-layers 2` [V-31]"}},
      {"V-31", cmd({"--encoder-num-layers", "3"}, {"--num-layers"}), O::Accepted, {},
       [](const ParsedArguments& p) { EXPECT_EQ(p.config.model.num_layers, 3); }},
      {"V-32", cmd({}, {"--hidden-size"}), O::Rejected, {"`--hidden-size` is required [V-32]"}},
      {"V-32", cmd({}, {"--max-position-embeddings"}), O::Rejected,
       {"`--max-position-embeddings` is required [V-32]"}},
      {"M-5", cmd({}, {"--seq-length"}), O::Rejected, {"`--seq-length` is required [M-5]"}},
      {"V-36", cmd({"--encoder-seq-length", "32"}), O::Rejected, {"give only one of", "[V-36]"}},
      {"V-36", cmd({"--max-position-embeddings", "16"}), O::Rejected,
       {"`--max-position-embeddings 16` is smaller than `--seq-length 32`; valid: at least 32 [V-36]"}},
      {"V-33", cmd({"--hidden-size", "2048", "--num-attention-heads", "16", "--swiglu", "--max-position-embeddings", "32"}),
       O::Accepted, {}, [](const ParsedArguments& p) {
         EXPECT_EQ(p.config.model.ffn_hidden_size, 5440);  // int((4·2048·2/3)/64)·64
         EXPECT_EQ(p.config.model.kv_channels, 128);
         EXPECT_EQ(p.config.model.activation, MlpActivation::SwiGLU);
       }},
      {"V-34", cmd({"--hidden-size", "66"}), O::Rejected,
       {"`--num-attention-heads 4` does not divide `--hidden-size 66`", "[V-34]"}},
      {"V-34", cmd({"--hidden-size", "66", "--kv-channels", "16"}), O::Accepted, {}},
      {"M-13", cmd({"--group-query-attention", "--num-query-groups", "3"}), O::Rejected,
       {"`--num-query-groups 3` must divide `--num-attention-heads 4`", "valid: 1, 2, 4 [M-13]"}},
      {"C-10-derived", cmd({"--group-query-attention", "--num-query-groups", "2"}), O::Accepted, {},
       [](const ParsedArguments& p) { EXPECT_EQ(p.config.model.num_query_groups, 2); }},

      // ------------------------------------------------------------------ tensor parallel
      {"C-9", dry(3, {"--num-attention-heads", "16", "--tensor-model-parallel-size", "3"}), O::Rejected,
       {"`--tensor-model-parallel-size 3` does not divide `--num-attention-heads 16`; valid: 1, 2, 4, 8, 16 [C-9]"}},
      {"C-10", dry(4, {"--num-attention-heads", "8", "--group-query-attention", "--num-query-groups", "2", "--tensor-model-parallel-size", "4"}),
       O::Rejected, {"`--tensor-model-parallel-size 4` does not divide `--num-query-groups 2`; valid: 1, 2 [C-10]"}},
      {"R-4", dry(4, {"--tensor-model-parallel-size", "4", "--ffn-hidden-size", "130"}), O::Rejected,
       {"`--tensor-model-parallel-size 4` does not divide the MLP width `--ffn-hidden-size 130`", "[R-4]"}},
      {"V-44", cmd({"--sequence-parallel"}), O::Accepted,
       {"`--sequence-parallel` has no effect with `--tensor-model-parallel-size 1`; turned off"},
       [](const ParsedArguments& p) { EXPECT_FALSE(p.config.parallel.sequence_parallel); }},
      {"V-45", dry(2, {"--tensor-model-parallel-size", "2", "--tp-comm-overlap"}), O::Rejected,
       {"`--tp-comm-overlap` requires `--sequence-parallel`: it overlaps the sequence-parallel", "[V-45]"}},
      {"V-45-ok", dry(2, {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--tp-comm-overlap"}),
       O::Accepted, {}, [](const ParsedArguments& p) {
         EXPECT_TRUE(p.config.parallel.tp_comm_overlap);
         EXPECT_TRUE(p.config.parallel.sequence_parallel);
         EXPECT_TRUE(p.not_supported.empty()) << joined(p.not_supported);
       }},
      // At TP 1 the message names the TP size, not the --sequence-parallel the user gave (V-44
      // turns it off); TpCommOverlap.AtTpOneIsOneError checks that V-45 does not fire on top.
      {"M-25", cmd({"--tp-comm-overlap", "--sequence-parallel"}), O::Rejected,
       {"`--tp-comm-overlap` overlaps tensor-parallel communication, and "
        "`--tensor-model-parallel-size 1` has none; drop it or use a TP size > 1 with "
        "`--sequence-parallel` [M-25]"}},
      {"M-25-without-sp", cmd({"--tp-comm-overlap"}), O::Rejected, {"[M-25]"}},
      {"M-26", cmd({"--profile", "--profile-step-start", "5", "--profile-step-end", "5"}), O::Rejected,
       {"`--profile` profiles the steps after `--profile-step-start 5` completed iterations up to "
        "`--profile-step-end 5`: give 0 <= start < end [M-26]"}},
      {"M-26-negative-rank", cmd({"--profile", "--profile-ranks", "0", "-1"}), O::Rejected,
       {"holds a negative rank", "[M-26]"}},
      {"M-26-ok", cmd({"--profile", "--profile-step-start", "2", "--profile-step-end", "4", "--profile-ranks", "0", "3"}),
       O::Accepted, {}, [](const ParsedArguments& p) {
         EXPECT_TRUE(p.config.training.profile);
         EXPECT_EQ(p.config.training.profile_step_start, 2);
         EXPECT_EQ(p.config.training.profile_step_end, 4);
         EXPECT_EQ(p.config.training.profile_ranks, (std::vector<int64_t>{0, 3}));
       }},
      {"R-5", dry(4, {"--tensor-model-parallel-size", "4", "--sequence-parallel", "--seq-length", "30"}),
       O::Rejected, {"splits the local sequence `--seq-length 30`", "[R-5]"}},
      {"R-5-ok", dry(4, {"--tensor-model-parallel-size", "4", "--sequence-parallel"}), O::Accepted,
       {}, [](const ParsedArguments& p) {
         EXPECT_TRUE(p.config.parallel.sequence_parallel);
         EXPECT_TRUE(p.not_supported.empty()) << joined(p.not_supported);
       }},

      // ------------------------------------------------------------------ context parallel
      {"V-35", dry(4, {"--context-parallel-size", "4", "--seq-length", "36", "--max-position-embeddings", "64"}),
       O::Rejected, {"`--seq-length 36` is not divisible by 2 × `--context-parallel-size 4` = 8", "valid: multiples of 8 [V-35]"}},
      {"V-9", dry(8, {"--context-parallel-size", "8", "--hierarchical-context-parallel-sizes", "2", "2"}),
       O::Rejected, {"`--hierarchical-context-parallel-sizes 2 2` multiply to 4, not to `--context-parallel-size 8`; "
                     "valid: level sizes whose product is 8, e.g. `--hierarchical-context-parallel-sizes 2 4`, "
                     "`4 2` or `1 8`; or `--context-parallel-size 4` to match these levels [V-9]"}},
      // The levels' own CP size (16) does not fit 8 ranks; three levels get three-level examples.
      {"V-9", dry(8, {"--context-parallel-size", "8", "--hierarchical-context-parallel-sizes", "2", "4", "2"}),
       O::Rejected, {"multiply to 16", "e.g. `--hierarchical-context-parallel-sizes 2 2 2`, `1 2 4` or",
                     "`--context-parallel-size 16` would match these levels but needs tp·pp·cp = 1·1·16 = 16 "
                     "to divide the world size 8 (`--world-size 8`) [V-9]"}},
      {"V-10", dry(2, {"--context-parallel-size", "2", "--cp-comm-type", "a2a+p2p"}), O::Rejected,
       {"`--cp-comm-type a2a+p2p` needs `--hierarchical-context-parallel-sizes`", "[V-10]"}},
      {"M-24", dry(8, {"--context-parallel-size", "8", "--cp-comm-type", "a2a+p2p",
                       "--hierarchical-context-parallel-sizes", "2", "2", "2"}), O::Rejected,
       {"`--cp-comm-type a2a+p2p` uses two hierarchical levels (the all-to-all size, then the ring "
        "size), but `--hierarchical-context-parallel-sizes 2 2 2` gives 3; valid: two sizes whose "
        "product is `--context-parallel-size 8`, e.g. `--hierarchical-context-parallel-sizes 2 4`",
        "[M-24]"}},
      {"a2a+p2p-two-levels", dry(8, {"--context-parallel-size", "8", "--cp-comm-type", "a2a+p2p",
                                     "--hierarchical-context-parallel-sizes", "2", "4"}),
       O::Accepted, {}, [](const ParsedArguments& p) {
         EXPECT_TRUE(p.not_supported.empty()) << joined(p.not_supported);
         EXPECT_EQ(p.config.parallel.hierarchical_context_parallel_sizes, (std::vector<int>{2, 4}));
       }},
      {"C-21", cmd({"--cp-comm-type", "p2p", "a2a", "p2p"}), O::Rejected,
       {"`--cp-comm-type p2p a2a p2p` gives 3 values; valid: one value, or one per layer (`--num-layers 2`) [C-21]"}},
      {"R-6", dry(8, {"--context-parallel-size", "8", "--cp-comm-type", "a2a"}), O::Rejected,
       {"splits the 4 heads per TP rank", "`--context-parallel-size 8`", "valid all-to-all sizes: 1, 2, 4 [R-6]"}},
      {"R-7", dry(2, {"--context-parallel-size", "2", "--model-running-mode", "vanilla", "--attention-mask-type", "causal_bottom_right"}),
       O::Rejected, {"`--attention-mask-type causal_bottom_right` cannot be used with `--context-parallel-size 2`", "[R-7]"}},
      {"V-50", dry(2, {"--context-parallel-size", "2", "--use-legacy-models"}), O::Rejected, {"[V-50]"}},
      {"cp-comm-type-allgather", dry(2, {"--context-parallel-size", "2", "--cp-comm-type", "allgather"}),
       O::Accepted, {}, [](const ParsedArguments& p) {
         EXPECT_EQ(p.config.parallel.cp_comm_type, (std::vector<cp::CommType>{cp::CommType::AllGather}));
       }},

      // ------------------------------------------------------------------ pipeline
      {"V-18", dry(4, {"--num-layers", "30", "--pipeline-model-parallel-size", "4"}), O::Rejected,
       {"`--num-layers 30` is not divisible by `--pipeline-model-parallel-size 4`; valid pipeline sizes: 1, 2, 3, 5, 6, 10, 15, 30 [V-18]"}},
      {"V-7", cmd({"--standalone-embedding-stage"}), O::Rejected, {"[V-7]"}},
      {"R-3", dry(4, {"--pipeline-model-parallel-size", "4", "--num-layers", "10", "--decoder-first-pipeline-num-layers", "3"}),
       O::Rejected, {"leaves 7 layers for the 3 middle stages", "[R-3]"}},
      {"R-3-ok", dry(4, {"--pipeline-model-parallel-size", "4", "--num-layers", "10", "--decoder-first-pipeline-num-layers", "4"}),
       O::Accepted, {}, [](const ParsedArguments& p) {
         EXPECT_EQ(p.config.parallel.decoder_first_pipeline_num_layers, 4);
       }},
      {"V-19/G-2", cmd({"--num-layers-per-virtual-pipeline-stage", "1"}), O::Rejected,
       {"`--num-layers-per-virtual-pipeline-stage 1` needs `--pipeline-model-parallel-size 1` > 1 [V-19, G-2]"}},
      {"V-19", dry(2, {"--pipeline-model-parallel-size", "2", "--num-layers", "8", "--num-layers-per-virtual-pipeline-stage", "3", "--global-batch-size", "4"}),
       O::Rejected, {"does not divide the 4 layers per pipeline stage", "valid: 1, 2, 4 [V-19]"}},
      {"V-19", dry(2, {"--pipeline-model-parallel-size", "2", "--num-layers", "8", "--num-layers-per-virtual-pipeline-stage", "2", "--no-overlap-p2p-communication", "--global-batch-size", "4"}),
       O::Rejected, {"needs `--pipeline-model-parallel-size 2` > 2 [V-19]"}},
      {"V-19-ok/C-6", dry(2, {"--pipeline-model-parallel-size", "2", "--num-layers", "8", "--num-layers-per-virtual-pipeline-stage", "2", "--global-batch-size", "4"}),
       O::Accepted, {}, [](const ParsedArguments& p) {
         EXPECT_EQ(p.config.parallel.virtual_pipeline_model_parallel_size, 2);
         EXPECT_TRUE(p.config.parallel.overlap_p2p_comm);
         EXPECT_EQ(p.config.parallel.microbatch_group_size_per_vp_stage, 2);  // C-6: = pp
       }},
      {"V-20", dry(2, {"--pipeline-model-parallel-size", "2"}), O::Accepted, {},
       [](const ParsedArguments& p) {
         EXPECT_FALSE(p.config.parallel.overlap_p2p_comm);
         EXPECT_FALSE(p.config.parallel.align_param_gather);
         EXPECT_EQ(p.values.at("virtual_pipeline_model_parallel_size"), "None");
       }},
      {"R-1", dry(2, {"--pipeline-model-parallel-size", "2", "--num-layers", "8", "--num-layers-per-virtual-pipeline-stage", "2"}),
       O::Rejected, {"runs M = 1 micro-batches", "needs pp (2) <= N <= M", "[R-1]"}},
      {"C-7", cmd({"--overlap-p2p-communication-warmup-flush"}), O::Rejected, {"[C-7]"}},
      // Virtual stages per rank, two spellings (Megatron-Core's field name and upstream's flag):
      // 16 layers over pp 4 are 4 per stage; 2 virtual stages hold 2 layers each. Global batch 8
      // gives M = 4 micro-batches, so R-1 (pp <= N = pp <= M) holds.
      {"V-19-vpp-stages", dry(4, {"--pipeline-model-parallel-size", "4", "--num-layers", "16", "--global-batch-size", "8", "--virtual-pipeline-model-parallel-size", "2"}),
       O::Accepted, {}, [](const ParsedArguments& p) {
         EXPECT_EQ(p.config.parallel.virtual_pipeline_model_parallel_size, 2);
         EXPECT_TRUE(p.config.parallel.overlap_p2p_comm);
         EXPECT_TRUE(p.not_supported.empty()) << joined(p.not_supported);
       }},
      {"V-19-vpp-upstream-spelling", dry(4, {"--pipeline-model-parallel-size", "4", "--num-layers", "16", "--global-batch-size", "8", "--num-virtual-stages-per-pipeline-rank", "4"}),
       O::Accepted, {}, [](const ParsedArguments& p) {
         EXPECT_EQ(p.config.parallel.virtual_pipeline_model_parallel_size, 4);
         EXPECT_EQ(p.values.at("virtual_pipeline_model_parallel_size"), "4");
       }},
      {"V-19-vpp-spellings-agree", dry(4, {"--pipeline-model-parallel-size", "4", "--num-layers", "16", "--global-batch-size", "8", "--virtual-pipeline-model-parallel-size", "4", "--num-virtual-stages-per-pipeline-rank", "4"}),
       O::Accepted, {}, [](const ParsedArguments& p) {
         EXPECT_EQ(p.config.parallel.virtual_pipeline_model_parallel_size, 4);
       }},
      {"V-19-vpp-agrees-with-layers", dry(4, {"--pipeline-model-parallel-size", "4", "--num-layers", "16", "--global-batch-size", "8", "--virtual-pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "2"}),
       O::Accepted, {}, [](const ParsedArguments& p) {
         EXPECT_EQ(p.config.parallel.virtual_pipeline_model_parallel_size, 2);
       }},
      {"V-19-vpp-disagrees-with-layers", dry(4, {"--pipeline-model-parallel-size", "4", "--num-layers", "16", "--global-batch-size", "8", "--virtual-pipeline-model-parallel-size", "4", "--num-layers-per-virtual-pipeline-stage", "2"}),
       O::Rejected,
       {"`--virtual-pipeline-model-parallel-size 4` disagrees with `--num-layers-per-virtual-pipeline-stage 2`: "
        "the 4 layers per pipeline stage (`--num-layers 16` / `--pipeline-model-parallel-size 4`) split into 4 "
        "virtual stages give 1 layer per virtual stage, not 2; values that agree: "
        "`--virtual-pipeline-model-parallel-size 2` with `--num-layers-per-virtual-pipeline-stage 2`, or "
        "`--virtual-pipeline-model-parallel-size 4` with `--num-layers-per-virtual-pipeline-stage 1` "
        "(or give only one of the two flags) [V-19]"}},
      {"V-19-vpp-spellings-disagree", dry(4, {"--pipeline-model-parallel-size", "4", "--num-layers", "16", "--global-batch-size", "8", "--virtual-pipeline-model-parallel-size", "2", "--num-virtual-stages-per-pipeline-rank", "4"}),
       O::Rejected,
       {"`--virtual-pipeline-model-parallel-size 2` and `--num-virtual-stages-per-pipeline-rank 4` are two "
        "spellings of the virtual pipeline stages per rank and disagree", "[V-19]"}},
      {"V-19-vpp-does-not-divide", dry(4, {"--pipeline-model-parallel-size", "4", "--num-layers", "16", "--global-batch-size", "8", "--virtual-pipeline-model-parallel-size", "3"}),
       O::Rejected,
       {"`--virtual-pipeline-model-parallel-size 3` does not divide the 4 layers per pipeline stage "
        "(`--num-layers 16` / `--pipeline-model-parallel-size 4`) into whole virtual stages; valid: 1, 2, 4 [V-19]"}},
      {"V-19-vpp-upstream-does-not-divide", dry(4, {"--pipeline-model-parallel-size", "4", "--num-layers", "16", "--global-batch-size", "8", "--num-virtual-stages-per-pipeline-rank", "8"}),
       O::Rejected, {"`--num-virtual-stages-per-pipeline-rank 8` does not divide the 4 layers per pipeline stage", "valid: 1, 2, 4 [V-19]"}},
      // 30 layers: pp p must divide 30 and leave an even number of layers per stage (p = 3, 5, 15).
      {"V-18-with-vpp", dry(4, {"--pipeline-model-parallel-size", "4", "--num-layers", "30", "--virtual-pipeline-model-parallel-size", "2"}),
       O::Rejected,
       {"`--num-layers 30` is not divisible by `--pipeline-model-parallel-size 4`; valid pipeline sizes: "
        "1, 2, 3, 5, 6, 10, 15, 30; with `--virtual-pipeline-model-parallel-size 2`: 3, 5, 15 [V-18]"}},
      {"V-19-vpp-needs-pp", cmd({"--virtual-pipeline-model-parallel-size", "2"}), O::Rejected,
       {"`--virtual-pipeline-model-parallel-size 2` needs `--pipeline-model-parallel-size 1` > 1 [V-19, G-2]"}},
      {"M-2-vpp", dry(4, {"--pipeline-model-parallel-size", "4", "--num-layers", "16", "--virtual-pipeline-model-parallel-size", "0"}),
       O::Rejected, {"`--virtual-pipeline-model-parallel-size 0` must be between 1 and", "[M-2]"}},
      {"V-19-vpp-real-run", cmd({"--pipeline-model-parallel-size", "2", "--num-layers", "8", "--global-batch-size", "8", "--virtual-pipeline-model-parallel-size", "2"}),
       O::Accepted, {}, [](const ParsedArguments& p) {
         EXPECT_EQ(p.config.parallel.virtual_pipeline_model_parallel_size, 2);
         EXPECT_TRUE(p.not_supported.empty()) << joined(p.not_supported);
       }, LaunchInfo{.world_size = 2, .rank = 0, .visible_gpus = 0}},

      // ------------------------------------------------------------------ batch sizes
      {"V-17", cmd({}, {"--micro-batch-size"}), O::Rejected, {"`--micro-batch-size` is required [V-17]"}},
      {"V-17", cmd({"--micro-batch-size", "0"}), O::Rejected, {"`--micro-batch-size 0` must be > 0 [V-17]"}},
      {"V-17-derived", dry(8), O::Accepted, {}, [](const ParsedArguments& p) {
         EXPECT_EQ(p.config.training.global_batch_size, 16);  // mbs 2 × dp 8
         EXPECT_EQ(p.config.parallel.data_parallel_size, 8);
       }},
      {"B-1", dry(8, {"--global-batch-size", "20"}), O::Rejected,
       {"`--global-batch-size 20` is not divisible by `--micro-batch-size 2` × data-parallel size 8 = 16; valid: multiples of 16", "[B-1]"}},
      {"B-1-decrease", dry(8, {"--global-batch-size", "20", "--decrease-batch-size-if-needed"}),
       O::Accepted, {"`--global-batch-size 20` rounded down to 16"},
       [](const ParsedArguments& p) { EXPECT_EQ(p.config.training.global_batch_size, 16); }},
      {"B-2", cmd({"--global-batch-size", "8", "--rampup-batch-size", "4", "3", "100"}), O::Rejected,
       {"`--rampup-batch-size 4 3 100`", "[B-2]"}},
      {"B-2", cmd({"--rampup-batch-size", "4", "3"}), O::Rejected, {"expected three integers", "[B-2]"}},
      {"B-3", cmd({"--global-batch-size", "8", "--micro-batch-size", "4", "--rampup-batch-size", "2", "2", "100"}),
       O::Rejected, {"reaches a global batch of 2, not divisible by `--micro-batch-size 4`", "[B-3]"}},

      // ------------------------------------------------------------------ recompute
      {"V-13", dry(1, {"--recompute-activations"}), O::Accepted, {}, [](const ParsedArguments& p) {
         EXPECT_EQ(p.values.at("recompute_granularity"), "selective");
         EXPECT_EQ(p.config.model.recompute_granularity, RecomputeGranularity::Selective);
       }},
      {"C-15", cmd({"--recompute-activations", "--recompute-num-layers", "2"}), O::Rejected,
       {"selective recomputation takes no `--recompute-num-layers 2` [C-15]"}},
      {"C-15", cmd({"--recompute-granularity", "full"}), O::Rejected,
       {"`--recompute-granularity full` needs `--recompute-method`", "[C-15]"}},
      {"V-43", cmd({"--recompute-granularity", "selective", "--recompute-method", "uniform"}),
       O::Rejected, {"selective recomputation takes no `--recompute-method uniform` [V-43]"}},
      {"V-42", cmd({"--distribute-saved-activations"}), O::Rejected, {"[V-42]"}},
      {"M-33", cmd({"--recompute-modules", "layernorm"}), O::Rejected,
       {"`--recompute-modules layernorm` chooses what selective recomputation re-runs: it needs "
        "`--recompute-granularity selective`", "[M-33]"}},
      {"M-33-ok", dry(1, {"--recompute-activations", "--recompute-modules", "core_attn", "layernorm"}),
       O::Accepted, {}, [](const ParsedArguments& p) {
         EXPECT_EQ(p.config.model.recompute_granularity, RecomputeGranularity::Selective);
         EXPECT_TRUE(p.config.model.recompute_norms);
       }},
      {"M-33-default", dry(1, {"--recompute-activations"}), O::Accepted, {}, [](const ParsedArguments& p) {
         EXPECT_FALSE(p.config.model.recompute_norms);  // Megatron's default: core_attn only
       }},
      {"M-33-choices", cmd({"--recompute-activations", "--recompute-modules", "mlp"}), O::Rejected,
       {"`--recompute-modules mlp`: invalid value; valid:", "layernorm"}},

      // ------------------------------------------------------------------ data parallel / optimizer
      {"V-21", cmd({"--overlap-param-gather"}), O::Rejected,
       {"`--overlap-param-gather` needs `--use-distributed-optimizer` (or a sharding `--use-megatron-fsdp` strategy) and `--overlap-grad-reduce` [V-21]"}},
      {"V-21-fsdp-ok", dry(4, {"--overlap-param-gather", "--use-megatron-fsdp", "--overlap-grad-reduce"}),
       O::Accepted, {}},
      {"V-21-ok", dry(4, {"--overlap-param-gather", "--use-distributed-optimizer", "--overlap-grad-reduce"}),
       O::Accepted, {}},
      {"V-22", cmd({"--use-torch-fsdp2"}), O::Rejected, {"`--use-torch-fsdp2` cannot be used with tied embeddings", "[V-22]"}},
      {"V-23", cmd({"--overlap-param-gather-with-optimizer-step"}), O::Rejected, {"[V-23]"}},
      {"V-25", cmd({"--fp8-param-gather"}), O::Rejected, {"`--fp8-param-gather` needs `--use-distributed-optimizer` [V-25]"}},
      // ------------------------------------------------------------------ FP8
      {"FP8-tensorwise-accepted", cmd({"--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"}), O::Accepted,
       {}, [](const ParsedArguments& p) {
         ASSERT_TRUE(p.config.fp8.enabled());
         EXPECT_EQ(p.config.fp8.recipe, Fp8Recipe::Tensorwise);
         EXPECT_TRUE(p.not_supported.empty()) << joined(p.not_supported);
       }},
      {"FP8-delayed-accepted", cmd({"--fp8-format", "e4m3"}), O::Accepted, {}, [](const ParsedArguments& p) {
         EXPECT_EQ(*p.config.fp8.format, Fp8Format::E4M3);
         EXPECT_EQ(p.config.fp8.recipe, Fp8Recipe::Delayed);
         EXPECT_TRUE(p.not_supported.empty()) << joined(p.not_supported);
       }},
      {"FP8-bf16-layers-tensorwise-accepted",
       cmd({"--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--first-last-layers-bf16",
            "--num-layers-at-start-in-bf16", "1", "--num-layers-at-end-in-bf16", "0"}),
       O::Accepted, {}},
      {"FP8-7-blockwise-accepted",
       dry(1, {"--hidden-size", "128", "--ffn-hidden-size", "256", "--seq-length", "128", "--max-position-embeddings",
               "128", "--fp8-format", "hybrid", "--fp8-recipe", "blockwise"},
           {"--hidden-size", "--seq-length", "--max-position-embeddings"}),
       O::Accepted, {}, [](const ParsedArguments& p) {
         ASSERT_TRUE(p.config.fp8.enabled());
         EXPECT_EQ(p.config.fp8.recipe, Fp8Recipe::Blockwise);
         EXPECT_TRUE(p.not_supported.empty()) << joined(p.not_supported);
         EXPECT_TRUE(p.warnings.empty()) << joined(p.warnings);
       }},
      {"FP8-7-blockwise-tp2-sp-cp2-accepted",
       dry(4, {"--hidden-size", "256", "--num-attention-heads", "8", "--ffn-hidden-size", "512", "--seq-length", "512",
               "--max-position-embeddings", "512", "--tensor-model-parallel-size", "2", "--sequence-parallel",
               "--context-parallel-size", "2", "--fp8-format", "hybrid", "--fp8-recipe", "blockwise"},
           {"--hidden-size", "--num-attention-heads", "--seq-length", "--max-position-embeddings"}),
       O::Accepted, {}},
      {"FP8-7-hidden", cmd({"--fp8-format", "hybrid", "--fp8-recipe", "blockwise"}), O::Rejected,
       {"`--fp8-recipe blockwise`: `--hidden-size 64` = 64 must be a multiple of 128", "[FP8-7]"}},
      {"FP8-7-tp-split",
       dry(2, {"--hidden-size", "256", "--ffn-hidden-size", "384", "--seq-length", "128", "--max-position-embeddings",
               "128", "--tensor-model-parallel-size", "2", "--fp8-format", "hybrid", "--fp8-recipe", "blockwise"},
           {"--hidden-size", "--seq-length", "--max-position-embeddings"}),
       O::Rejected, {"`--ffn-hidden-size 384` / tensor-parallel size 2 = 192 must be a multiple of 128", "[FP8-7]"}},
      {"FP8-7-cp-chunk",
       dry(2, {"--hidden-size", "128", "--ffn-hidden-size", "256", "--seq-length", "256", "--max-position-embeddings",
               "256", "--context-parallel-size", "2", "--fp8-format", "hybrid", "--fp8-recipe", "blockwise"},
           {"--hidden-size", "--seq-length", "--max-position-embeddings"}),
       O::Rejected, {"`--seq-length 256` / (2 x context-parallel size 2)", "= 64 must be a multiple of 128", "[FP8-7]"}},
      {"FP8-7-seq",
       dry(1, {"--hidden-size", "128", "--ffn-hidden-size", "256", "--fp8-format", "hybrid", "--fp8-recipe", "blockwise"},
           {"--hidden-size"}),
       O::Rejected, {"`--seq-length 32` = 32 must be a multiple of 128", "[FP8-7]"}},
      {"FP8-7-moe",
       dry(1, {"--hidden-size", "128", "--ffn-hidden-size", "256", "--seq-length", "128", "--max-position-embeddings",
               "128", "--num-experts", "4", "--moe-ffn-hidden-size", "128", "--fp8-format", "hybrid", "--fp8-recipe",
               "blockwise"},
           {"--hidden-size", "--seq-length", "--max-position-embeddings"}),
       O::Rejected, {"`--fp8-recipe blockwise` with MoE (`--num-experts 4`) is not built", "[FP8-7]"}},
      {"FP8-7-param-gather",
       dry(2, {"--hidden-size", "128", "--ffn-hidden-size", "256", "--seq-length", "128", "--max-position-embeddings",
               "128", "--use-distributed-optimizer", "--fp8-param-gather", "--fp8-format", "hybrid", "--fp8-recipe",
               "blockwise"},
           {"--hidden-size", "--seq-length", "--max-position-embeddings"}),
       O::Rejected, {"`--fp8-recipe blockwise` with `--fp8-param-gather` is not built", "[FP8-7]"}},
      {"FP8-8", dry(1, {"--device", "cuda", "--bf16", "--fp8-format", "hybrid", "--hidden-size", "72",
                        "--num-attention-heads", "4"}),
       O::Rejected, {"`--hidden-size 72` = 72 must be a multiple of 16", "[FP8-8]"}},
      {"FP8-8-expert-width", dry(1, {"--device", "cuda", "--bf16", "--fp8-format", "hybrid", "--num-experts", "4",
                                     "--moe-ffn-hidden-size", "40"}),
       O::Rejected, {"`--moe-ffn-hidden-size 40` / expert-tensor-parallel size = 40 must be a multiple of 16",
                     "[FP8-8]"}},
      {"FP8-moe-accepted", dry(1, {"--device", "cuda", "--bf16", "--fp8-format", "hybrid", "--fp8-recipe",
                                   "tensorwise", "--num-experts", "4", "--moe-ffn-hidden-size", "48"}),
       O::Accepted, {}, [](const ParsedArguments& p) {
         EXPECT_TRUE(p.config.fp8.enabled());
         EXPECT_EQ(p.config.model.moe.num_experts, 4);
         EXPECT_TRUE(p.not_supported.empty()) << joined(p.not_supported);
       }},
      {"FP8-tp-comm-overlap-warns",
       dry(2, {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--tp-comm-overlap",
               "--fp8-format", "hybrid"}),
       O::Accepted, {"`--tp-comm-overlap` has no effect on the FP8 linears"}},
      {"FP8-dry-run-config",
       dry(1, {"--fp8-format", "e4m3", "--fp8-margin", "2", "--fp8-amax-history-len", "16",
               "--fp8-amax-compute-algo", "max", "--no-fp8-wgrad"}),
       O::Accepted, {}, [](const ParsedArguments& p) {
         const Fp8Config& f = p.config.fp8;
         ASSERT_TRUE(f.enabled());
         EXPECT_EQ(*f.format, Fp8Format::E4M3);
         EXPECT_EQ(f.recipe, Fp8Recipe::Delayed);  // Megatron's default
         EXPECT_EQ(f.margin, 2);
         EXPECT_EQ(f.amax_history_len, 16);
         EXPECT_EQ(f.amax_compute_algo, Fp8AmaxComputeAlgo::Max);
         EXPECT_FALSE(f.wgrad);
         EXPECT_FALSE(f.first_last_layers_bf16);
         EXPECT_TRUE(p.warnings.empty()) << joined(p.warnings);
       }},
      {"FP8-defaults", cmd(), O::Accepted, {}, [](const ParsedArguments& p) {
         const Fp8Config& f = p.config.fp8;
         EXPECT_FALSE(f.enabled());
         EXPECT_EQ(f.recipe, Fp8Recipe::Delayed);
         EXPECT_EQ(f.amax_history_len, 1);  // Megatron's defaults, not TE's 1024 / max
         EXPECT_EQ(f.amax_compute_algo, Fp8AmaxComputeAlgo::MostRecent);
         EXPECT_EQ(f.num_layers_at_start_in_bf16, 1);
         EXPECT_EQ(f.num_layers_at_end_in_bf16, 1);
       }},
      {"FP8-dry-run-bf16-layers",
       dry(1, {"--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--first-last-layers-bf16",
               "--num-layers-at-start-in-bf16", "0", "--num-layers-at-end-in-bf16", "2"}),
       O::Accepted, {}, [](const ParsedArguments& p) {
         EXPECT_EQ(*p.config.fp8.format, Fp8Format::Hybrid);
         EXPECT_EQ(p.config.fp8.recipe, Fp8Recipe::Tensorwise);
         EXPECT_TRUE(p.config.fp8.first_last_layers_bf16);
         EXPECT_EQ(p.config.fp8.num_layers_at_start_in_bf16, 0);
         EXPECT_EQ(p.config.fp8.num_layers_at_end_in_bf16, 2);
       }},
      {"FP8-knob-without-format-warns", cmd({"--fp8-margin", "1"}), O::Accepted,
       {"`--fp8-margin 1` has no effect without `--fp8-format`"}},
      {"FP8-delayed-knob-with-tensorwise-warns",
       dry(1, {"--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--fp8-amax-history-len", "8"}),
       O::Accepted, {"`--fp8-amax-history-len 8` has no effect with `--fp8-recipe tensorwise`"}},
      {"FP8-history-len-range", cmd({"--fp8-amax-history-len", "0"}), O::Rejected,
       {"`--fp8-amax-history-len 0`", "[M-2]"}},
      {"FP8-1", cmd({"--fp8-format", "hybrid", "--fp8-recipe", "mxfp8"}), O::Rejected,
       {"`--fp8-recipe mxfp8` is Blackwell-only", "valid recipes are delayed, tensorwise, blockwise [FP8-1]"}},
      {"FP8-1-fp4", cmd({"--fp4-format", "e2m1"}), O::Rejected,
       {"`--fp4-format e2m1` is Blackwell-only", "[FP8-1]"}},
      {"FP8-2", cmd({"--fp8-format", "e4m3", "--fp8-recipe", "custom"}), O::Rejected,
       {"`--fp8-recipe custom` needs a Python quantizer factory", "[FP8-2]"}},
      {"FP8-3", cmd({"--fp8-format", "hybrid", "--fp4-format", "e2m1"}), O::Rejected,
       {"`--fp8-format hybrid` and `--fp4-format e2m1` are mutually exclusive", "[FP8-3]"}},
      {"FP8-4", cmd({"--fp8-format", "hybrid", "--first-last-layers-bf16"}), O::Rejected,
       {"`--first-last-layers-bf16` cannot be used with `--fp8-recipe delayed`", "[FP8-4]"}},
      {"FP8-5", cmd({"--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--first-last-layers-bf16",
                     "--num-layers-at-start-in-bf16", "3"}),
       O::Rejected, {"`--num-layers-at-start-in-bf16 3` must lie in [0, 2] (`--num-layers 2` / pipeline size 1) [FP8-5]"}},
      {"FP8-5-per-stage",
       dry(2, {"--pipeline-model-parallel-size", "2", "--fp8-format", "hybrid", "--fp8-recipe",
               "tensorwise", "--first-last-layers-bf16", "--num-layers-at-end-in-bf16", "2"}),
       O::Rejected, {"`--num-layers-at-end-in-bf16 2` must lie in [0, 1] (`--num-layers 2` / pipeline size 2) [FP8-5]"}},
      {"FP8-5-negative", cmd({"--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--first-last-layers-bf16",
                              "--num-layers-at-end-in-bf16", "-1"}),
       O::Rejected, {"`--num-layers-at-end-in-bf16 -1` must lie in [0, 2]", "[FP8-5]"}},
      {"FP8-6", cmd({"--fp8-param-gather", "--use-distributed-optimizer"}), O::Rejected,
       {"`--fp8-param-gather` needs `--fp8-format` (e4m3 or hybrid) [FP8-6]"}},
      {"FP8-6-param-gather-accepted",
       cmd({"--fp8-format", "hybrid", "--fp8-param-gather", "--use-distributed-optimizer"}), O::Accepted, {},
       [](const ParsedArguments& p) {
         EXPECT_TRUE(p.config.fp8.param_gather);
         EXPECT_TRUE(p.not_supported.empty()) << joined(p.not_supported);
       }},
      {"FP8-9-fsdp", dry(2, {"--fp8-format", "hybrid", "--fp8-param-gather", "--use-custom-fsdp"}), O::Rejected,
       {"`--fp8-param-gather` with Megatron-FSDP (`--use-custom-fsdp`) is not built yet", "[FP8-9]"}},
      {"FP8-9-cuda",
       cmd({"--device", "cuda", "--bf16", "--fp8-format", "hybrid", "--fp8-param-gather",
            "--use-distributed-optimizer"}),
       O::Rejected,
       {"`--device cuda` with `--fp8-param-gather`: the FP8 parameter gather runs on the CPU backend only so far",
        "[FP8-9]"},
       nullptr, LaunchInfo{.world_size = 1, .rank = 0, .visible_gpus = 1}},
      {"G-5", dry(6, {"--use-distributed-optimizer", "--num-distributed-optimizer-instances", "4"}),
       O::Rejected, {"`--num-distributed-optimizer-instances 4` does not divide dp·cp = 6·1 = 6; valid: 1, 2, 3, 6 [G-5]"}},
      {"G-7", dry(2, {"--num-distributed-optimizer-instances", "2"}), O::Rejected,
       {"`--num-distributed-optimizer-instances 2` needs `--use-distributed-optimizer` [G-7]"}},
      {"G-8", cmd({"--use-distributed-optimizer", "--optimizer", "sgd"}), O::Rejected,
       {"`--use-distributed-optimizer` needs `--optimizer adam` (got `--optimizer sgd`) [G-8]"}},
      {"C-4", cmd({"--defer-embedding-wgrad-compute"}), O::Rejected, {"[C-4]"}},

      // ------------------------------------------------------------------ precision
      {"V-26/C-8", cmd({"--fp16", "--bf16"}), O::Rejected, {"`--fp16` and `--bf16` are mutually exclusive [V-26, C-8]"}},
      {"V-26-derived", dry(1, {"--fp16"}), O::Accepted, {"NaN checks turned off"},
       [](const ParsedArguments& p) { EXPECT_FALSE(p.config.training.check_for_nan_in_loss_and_grad); }},
      {"V-27", cmd({"--bf16", "--accumulate-allreduce-grads-in-fp32", "--main-grads-dtype", "bf16"}),
       O::Rejected, {"[V-27]"}},
      {"V-27-derived", cmd({"--bf16"}), O::Accepted, {}, [](const ParsedArguments& p) {
         EXPECT_EQ(p.values.at("accumulate_allreduce_grads_in_fp32"), "True");
         EXPECT_EQ(p.values.at("params_dtype"), "torch.bfloat16");
       }},
      {"V-39", cmd({"--fp16-lm-cross-entropy"}), O::Rejected, {"`--fp16-lm-cross-entropy` needs `--fp16` [V-39]"}},
      {"V-39", cmd({"--fp32-residual-connection"}), O::Rejected, {"needs `--fp16` or `--bf16` [V-39]"}},
      {"V-40", cmd({"--moe-grouped-gemm"}), O::Rejected, {"`--moe-grouped-gemm` needs `--bf16` [V-40]"}},

      // ------------------------------------------------------------------ schedule and LR
      {"V-29", cmd({"--train-samples", "100"}), O::Rejected, {"give only one of `--train-iters 10` and `--train-samples 100` [V-29]"}},
      {"V-29", cmd({"--lr-warmup-fraction", "0.1", "--lr-warmup-iters", "2"}), O::Rejected,
       {"give only one of `--lr-warmup-fraction 0.1` and `--lr-warmup-iters 2` [V-29]"}},
      {"V-30", cmd({"--train-samples", "100", "--lr-decay-iters", "5"}, {"--train-iters"}), O::Rejected,
       {"takes `--lr-decay-samples`, not `--lr-decay-iters 5` [V-30]"}},
      {"M-8", cmd({}, {"--train-iters"}), O::Rejected, {"`--train-iters` is required", "[M-8]"}},
      {"M-8-dry-run", dry(1, {}, {"--train-iters"}), O::Accepted, {}},
      {"M-9", cmd({}, {"--lr"}), O::Rejected, {"`--lr` is required [M-9]"}},
      {"V-37", cmd({"--min-lr", "1"}), O::Rejected, {"`--min-lr 1.0` exceeds `--lr 0.001`; valid: 0 to 0.001 [V-37]"}},
      {"V-60", cmd({"--lr-decay-style", "WSD"}), O::Rejected, {"`--lr-decay-style WSD` needs `--lr-wsd-decay-iters` [V-60]"}},
      {"V-60", cmd({"--lr-warmup-iters", "10"}), O::Rejected,
       {"warm-up (10 iterations) must be shorter than the decay horizon `--lr-decay-iters 10`", "[V-60]"}},
      {"V-60", cmd({"--lr-warmup-init", "1"}), O::Rejected, {"`--lr-warmup-init 1.0` must lie in [0, `--lr 0.001`] [V-60]"}},
      {"V-60", cmd({"--min-lr", "-1"}), O::Rejected, {"`--min-lr -1.0` must be >= 0 [V-60]"}},
      {"warmup-fraction", cmd({"--train-iters", "100", "--lr-warmup-fraction", "0.25", "--lr-decay-style", "cosine"}),
       O::Accepted, {}, [](const ParsedArguments& p) {
         EXPECT_EQ(p.config.optimizer.lr_warmup_iters, 25);
         EXPECT_EQ(p.config.optimizer.lr_decay_iters, 100);
         EXPECT_EQ(p.config.optimizer.decay_style, LrDecayStyle::Cosine);
       }},
      {"V-41", cmd({"--start-weight-decay", "0.1"}), O::Rejected, {"[V-41]"}},
      {"V-41", cmd({"--weight-decay-incr-style", "linear"}), O::Rejected,
       {"`--weight-decay-incr-style linear` needs both `--start-weight-decay` and `--end-weight-decay` [V-41]"}},
      {"M-2", cmd({"--adam-beta2", "1.0"}), O::Rejected, {"`--adam-beta2 1.0` must lie in [0, 1) [M-2]"}},

      // ------------------------------------------------------------------ checkpoints
      {"V-38", cmd({"--save", "/tmp/ckpt"}), O::Rejected, {"`--save /tmp/ckpt` needs `--save-interval` [V-38]"}},
      // Rolling checkpoints: Megatron's global type only.
      {"V-1", cmd({"--non-persistent-ckpt-type", "local"}), O::NotSupported,
       {"`--non-persistent-ckpt-type local` is not supported yet by megadlm (see docs/flags.md); supported: global"}},
      {"V-1-in-memory", cmd({"--non-persistent-ckpt-type", "in_memory"}), O::NotSupported,
       {"`--non-persistent-ckpt-type in_memory` is not supported yet by megadlm (see docs/flags.md); supported: global"}},
      {"M-19-needs-save", cmd({"--non-persistent-save-interval", "4", "--non-persistent-ckpt-type", "global"}),
       O::Rejected,
       {"`--non-persistent-save-interval 4` needs `--save` (rolling checkpoints go to <save>/non_persistent) "
        "or `--non-persistent-global-ckpt-dir` [M-19]"}},
      {"M-19-needs-type", cmd({"--save", "/tmp/c", "--save-interval", "6", "--non-persistent-save-interval", "4"}),
       O::Rejected, {"`--non-persistent-save-interval 4` needs `--non-persistent-ckpt-type global`", "[M-19]"}},
      {"M-19-not-the-save-dir", cmd({"--save", "/tmp/c", "--save-interval", "6", "--non-persistent-save-interval", "4",
                                     "--non-persistent-ckpt-type", "global", "--non-persistent-global-ckpt-dir", "/tmp/c/"}),
       O::Rejected, {"`--non-persistent-global-ckpt-dir /tmp/c/` is also `--save /tmp/c`", "[M-19]"}},
      {"M-2-non-persistent-interval", cmd({"--save", "/tmp/c", "--save-interval", "6", "--non-persistent-save-interval",
                                           "0", "--non-persistent-ckpt-type", "global"}),
       O::Rejected, {"`--non-persistent-save-interval 0` must be >= 1 [M-2]"}},
      {"rolling-default-dir", cmd({"--save", "/tmp/c", "--save-interval", "6", "--non-persistent-save-interval", "4",
                                   "--non-persistent-ckpt-type", "global", "--load", "/tmp/l"}),
       O::Accepted, {}, [](const ParsedArguments& p) {
         const CheckpointConfig& ck = p.config.checkpoint;
         EXPECT_EQ(ck.non_persistent_save_interval, 4);
         EXPECT_TRUE(ck.non_persistent_global);
         EXPECT_EQ(ck.non_persistent_save_dir(), "/tmp/c/non_persistent");
         EXPECT_EQ(ck.non_persistent_load_dir(), "/tmp/l/non_persistent");
       }},
      {"rolling-explicit-dir", cmd({"--non-persistent-save-interval", "4", "--non-persistent-ckpt-type", "global",
                                    "--non-persistent-global-ckpt-dir", "/scratch/np"}),
       O::Accepted, {}, [](const ParsedArguments& p) {
         EXPECT_EQ(p.config.checkpoint.non_persistent_save_dir(), "/scratch/np");
         EXPECT_EQ(p.config.checkpoint.non_persistent_load_dir(), "/scratch/np");
       }},
      {"V-57", cmd({"--moe-use-upcycling"}), O::Rejected, {"`--moe-use-upcycling` needs `--save` [V-57]"}},
      {"V-58", cmd({"--use-checkpoint-args"}), O::Rejected, {"`--use-checkpoint-args` needs `--load` [V-58]"}},
      {"V-58", cmd({"--ckpt-convert-format", "torch"}), O::Rejected, {"[V-58]"}},
      {"R-14", cmd({"--save", "/tmp/c", "--save-interval", "5", "--async-save", "--ckpt-format", "torch"}),
       O::Rejected, {"`--async-save` needs `--ckpt-format torch_dist` (got `--ckpt-format torch`)", "[R-14]"}},
      {"M-16", cmd({"--override-opt_param-scheduler", "--use-checkpoint-opt_param-scheduler"}), O::Rejected,
       {"mutually exclusive", "[M-16]"}},
      {"M-17", cmd({"--save", "/tmp/c", "--save-interval", "5", "--checkpoint-steps", "10,x"}), O::Rejected,
       {"`--checkpoint-steps 10,x` must be a comma-separated list of iteration numbers", "[M-17]"}},
      {"M-2-save-interval", cmd({"--save", "/tmp/c", "--save-interval", "0"}), O::Rejected,
       {"`--save-interval 0` must be >= 1 [M-2]"}},
      {"checkpoint-flags", cmd({"--save", "/tmp/c", "--persistent-save-interval", "50", "--load", "/tmp/l",
                                "--no-save-optim", "--no-load-rng", "--finetune", "--async-save",
                                "--ckpt-step", "20", "--checkpoint-steps", "7,9", "--exit-duration-in-mins", "30",
                                "--exit-signal-handler", "--exit-on-missing-checkpoint"}),
       O::Accepted, {}, [](const ParsedArguments& p) {
         const CheckpointConfig& c = p.config.checkpoint;
         EXPECT_EQ(c.save, "/tmp/c");
         EXPECT_EQ(c.save_interval, 50);
         EXPECT_EQ(c.load, "/tmp/l");
         EXPECT_FALSE(c.save_optim);
         EXPECT_TRUE(c.save_rng);
         EXPECT_TRUE(c.load_optim);
         EXPECT_FALSE(c.load_rng);
         EXPECT_TRUE(c.finetune);
         EXPECT_TRUE(c.async_save);
         EXPECT_EQ(c.ckpt_step, 20);
         EXPECT_EQ(c.extra_save_iterations, (std::vector<int64_t>{7, 9}));
         EXPECT_TRUE(c.exit_on_missing_checkpoint);
         EXPECT_EQ(p.config.training.exit_duration_in_mins, 30);
         EXPECT_TRUE(p.config.training.exit_signal_handler);
       }},
      {"checkpoint-flags-without-load", cmd({"--finetune"}), O::Accepted,
       {"`--finetune` has no effect without `--load`"}},

      // ------------------------------------------------------------------ layer options
      {"V-6", cmd({"--attention-backend", "local"}), O::Rejected, {"`--attention-backend local` needs `--spec local` [V-6]"}},
      {"V-48", cmd({"--rotary-interleaved"}), O::Rejected, {"add `--no-rope-fusion` [V-48, C-17]"}},
      {"V-48", cmd({"--no-position-embedding"}), O::Rejected,
       {"`--no-position-embedding` needs `--position-embedding-type rope` (got `--position-embedding-type learned_absolute`) [V-48]"}},
      {"V-48-derived", cmd({"--use-rotary-position-embeddings"}), O::Accepted, {},
       [](const ParsedArguments& p) {
         EXPECT_EQ(p.config.model.position_embedding_type, PositionEmbeddingType::Rope);
       }},
      {"C-16", cmd({"--squared-relu"}), O::Rejected, {"`--squared-relu` has no fused bias-activation kernel", "[C-16]"}},
      {"C-17", cmd({"--multi-latent-attention", "--rotary-interleaved", "--no-rope-fusion"}), O::Rejected, {"[C-17]"}},
      {"V-54", cmd({"--deterministic-mode", "--use-flash-attn"}), O::Rejected, {"[V-54]"}},
      {"V-55", cmd({"--apply-query-key-layer-scaling"}), O::Accepted, {}, [](const ParsedArguments& p) {
         EXPECT_EQ(p.values.at("attention_softmax_in_fp32"), "True");
       }},
      {"V-56", cmd({"--inference-batch-times-seqlen-threshold", "16"}), O::Rejected, {"[V-56]"}},
      {"M-14", cmd({"--rotary-percent", "0"}), O::Rejected, {"`--rotary-percent 0.0` must lie in (0, 1] [M-14]"}},
      {"M-15", cmd({"--hidden-dropout", "1.5"}), O::Rejected, {"`--hidden-dropout 1.5` must lie in [0, 1) [M-15]"}},
      {"M-15-attention", cmd({"--attention-dropout", "1"}), O::Rejected, {"`--attention-dropout 1.0` must lie in [0, 1) [M-15]"}},
      {"attention-dropout-default", cmd(), O::Accepted, {}, [](const ParsedArguments& p) {
         EXPECT_FLOAT_EQ(p.config.model.attention_dropout, 0.1f);  // Megatron's default, now supported
       }},

      // ------------------------------------------------------------------ MoE
      {"V-49", cmd({"--num-experts", "4", "--spec", "x"}), O::Rejected, {"[V-49]"}},
      {"V-49-derived", cmd({"--num-experts", "0"}), O::Accepted, {}, [](const ParsedArguments& p) {
         EXPECT_EQ(p.values.at("num_experts"), "None");
       }},
      {"V-51", dry(4, {"--expert-model-parallel-size", "4", "--num-experts", "6"}), O::Rejected,
       {"`--expert-model-parallel-size 4` does not divide `--num-experts 6`; valid: 1, 2, 3, 6 [V-51]"}},
      {"V-51/C-11", dry(4, {"--expert-model-parallel-size", "4"}), O::Rejected,
       {"`--expert-model-parallel-size 4` needs `--num-experts` (a multiple of 4, so that the EP "
        "ranks hold equal shares of the experts) [V-51, C-11]"}},
      {"C-11", cmd({"--num-experts", "-2"}), O::Rejected, {"`--num-experts -2` must be > 0 [C-11]"}},
      {"C-5", dry(4, {"--tensor-model-parallel-size", "2", "--expert-model-parallel-size", "2", "--num-experts", "4"}),
       O::Rejected, {"`--expert-model-parallel-size 2` with `--tensor-model-parallel-size 2` needs `--sequence-parallel` [C-5]"}},
      {"R-8", dry(2, {"--tensor-model-parallel-size", "2", "--num-experts", "4"}), O::Rejected,
       {"`--num-experts 4` with `--tensor-model-parallel-size 2` needs `--sequence-parallel` [R-8]"}},
      {"C-12", cmd({"--moe-shared-expert-intermediate-size", "0"}), O::Rejected, {"[C-12]"}},
      {"C-12", cmd({"--moe-shared-expert-overlap"}), O::Rejected,
       {"`--moe-shared-expert-overlap` needs `--moe-token-dispatcher-type alltoall` [C-12]"}},
      {"C-13", cmd({"--moe-expert-capacity-factor", "1.0"}), O::Rejected, {"[C-13]"}},
      {"C-14", cmd({"--moe-pad-expert-input-to-capacity"}), O::Rejected, {"[C-14]"}},
      {"C-18", dry(2, {"--tensor-model-parallel-size", "2", "--expert-tensor-parallel-size", "1", "--moe-token-dispatcher-type", "alltoall_seq"}),
       O::Rejected, {"[C-18]"}},
      {"C-19", cmd({"--moe-router-topk-limited-devices", "2"}), O::Rejected,
       {"`--moe-router-topk-limited-devices 2` exceeds `--expert-model-parallel-size 1`; valid: 1 to 1 [C-19]"}},
      {"R-4-experts", dry(2, {"--expert-tensor-parallel-size", "2", "--num-experts", "2", "--moe-ffn-hidden-size", "33"}),
       O::Rejected, {"`--expert-tensor-parallel-size 2` does not divide `--moe-ffn-hidden-size 33`", "[R-4]"}},
      // ---- megadlm's MoE rules (moe_rules.cpp)
      {"MOE-1", cmd({"--num-experts", "4", "--moe-router-topk", "5"}), O::Rejected,
       {"`--moe-router-topk 5` must lie in [1, 4] (`--num-experts 4`) [MOE-1]"}},
      {"R-10", cmd({"--num-experts", "4", "--moe-router-topk", "1"}), O::Rejected,
       {"`--moe-router-topk 1` needs `--moe-router-pre-softmax`", "[R-10]"}},
      {"R-10-pre-softmax", cmd({"--num-experts", "4", "--moe-router-topk", "1", "--moe-router-pre-softmax"}),
       O::Accepted, {}},
      {"R-10-sigmoid", cmd({"--num-experts", "4", "--moe-router-topk", "1", "--moe-router-score-function", "sigmoid"}),
       O::Accepted, {}, [](const ParsedArguments& p) {
         EXPECT_EQ(p.config.model.moe.score, MoeScoreFunction::Sigmoid);
       }},
      {"MOE-3-divide", cmd({"--num-experts", "6", "--moe-router-num-groups", "4", "--moe-router-group-topk", "2"}),
       O::Rejected, {"`--moe-router-num-groups 4` does not divide `--num-experts 6`; valid: 1, 2, 3, 6 [MOE-3]"}},
      {"MOE-3-both", cmd({"--num-experts", "8", "--moe-router-num-groups", "4"}), O::Rejected,
       {"group-limited routing needs both `--moe-router-num-groups` and `--moe-router-group-topk` [MOE-3]"}},
      {"MOE-3-hold", cmd({"--num-experts", "8", "--moe-router-topk", "6", "--moe-router-num-groups", "4", "--moe-router-group-topk", "2"}),
       O::Rejected, {"`--moe-router-group-topk 2` groups of 2 experts cannot hold `--moe-router-topk 6` [MOE-3]"}},
      {"MOE-3-ok", cmd({"--num-experts", "8", "--moe-router-num-groups", "4", "--moe-router-group-topk", "2"}),
       O::Accepted, {}, [](const ParsedArguments& p) {
         EXPECT_EQ(p.config.model.moe.num_groups, 4);
         EXPECT_EQ(p.config.model.moe.group_topk, 2);
       }},
      {"R-11", cmd({"--num-experts", "4", "--moe-router-load-balancing-type", "sinkhorn", "--moe-aux-loss-coeff", "0.01"}),
       O::Rejected, {"sinkhorn` balances without an aux loss; remove `--moe-aux-loss-coeff 0.01` [R-11]"}},
      {"MOE-5", cmd({"--num-experts", "4", "--moe-router-enable-expert-bias", "--moe-router-load-balancing-type", "softmax_expert_choice"}),
       O::Rejected, {"`--moe-router-enable-expert-bias` needs top-k routing, not `--moe-router-load-balancing-type softmax_expert_choice` [MOE-5]"}},
      {"MOE-5-rate", cmd({"--num-experts", "4", "--moe-router-enable-expert-bias", "--moe-router-bias-update-rate", "0"}),
       O::Rejected, {"`--moe-router-bias-update-rate 0.0` must be > 0 [MOE-5]"}},
      {"MOE-6", cmd({"--num-experts", "4", "--moe-router-load-balancing-type", "softmax_expert_choice", "--moe-router-pre-softmax"}),
       O::Rejected, {"expert choice takes post-softmax scores; remove `--moe-router-pre-softmax` [MOE-6]"}},
      {"MOE-6-ok", cmd({"--num-experts", "4", "--moe-router-load-balancing-type", "softmax_expert_choice", "--moe-batch-level-expert-choice"}),
       O::Accepted, {}, [](const ParsedArguments& p) {
         EXPECT_EQ(p.config.model.moe.load_balancing, MoeLoadBalancing::ExpertChoice);
         EXPECT_TRUE(p.config.model.moe.batch_level_expert_choice);
       }},
      {"MOE-7-length", cmd({"--num-experts", "4", "--moe-layer-freq", "[1,0,1]"}), O::Rejected,
       {"`--moe-layer-freq [1,0,1]`: the pattern has 3 entries for 2 layers", "[MOE-7]"}},
      {"MOE-7-syntax", cmd({"--num-experts", "4", "--moe-layer-freq", "[1,2]"}), O::Rejected,
       {"pattern entries must be 0 or 1, got 2", "[MOE-7]"}},
      {"MOE-7-none", cmd({"--num-experts", "4", "--moe-layer-freq", "[0]*2"}), O::Rejected,
       {"`--moe-layer-freq [0]*2` selects no MoE layer; drop `--num-experts 4` for a dense model [MOE-7]"}},
      {"MOE-7-pattern", cmd({"--num-layers", "6", "--num-experts", "4", "--moe-layer-freq", "([0]+[1]*2)*2"}),
       O::Accepted, {}, [](const ParsedArguments& p) {
         EXPECT_EQ(p.config.model.moe.moe_layers, (std::vector<bool>{false, true, true, false, true, true}));
       }},
      {"MOE-7-every-other", cmd({"--num-layers", "5", "--num-experts", "4", "--moe-layer-freq", "2"}),
       O::Accepted, {}, [](const ParsedArguments& p) {
         EXPECT_EQ(p.config.model.moe.moe_layers, (std::vector<bool>{true, false, true, false, true}));
       }},
      {"moe-config", cmd({"--num-experts", "8", "--moe-router-topk", "3", "--moe-ffn-hidden-size", "96",
                          "--moe-router-score-function", "sigmoid", "--moe-router-topk-scaling-factor", "2.5",
                          "--moe-z-loss-coeff", "0.001", "--moe-aux-loss-coeff", "0.01",
                          "--moe-token-dispatcher-type", "alltoall", "--moe-expert-capacity-factor", "1.25",
                          "--moe-token-drop-policy", "position", "--moe-shared-expert-intermediate-size", "128",
                          "--moe-router-enable-expert-bias", "--moe-router-bias-update-rate", "0.01"}),
       O::Accepted, {}, [](const ParsedArguments& p) {
         const MoeConfig& m = p.config.model.moe;
         EXPECT_EQ(m.topk, 3);
         EXPECT_EQ(m.ffn_hidden_size, 96);
         EXPECT_EQ(m.score, MoeScoreFunction::Sigmoid);
         EXPECT_FLOAT_EQ(*m.topk_scaling_factor, 2.5f);
         EXPECT_FLOAT_EQ(m.z_loss_coeff, 0.001f);
         EXPECT_FLOAT_EQ(m.aux_loss_coeff, 0.01f);
         EXPECT_EQ(m.dispatcher, MoeDispatcher::AllToAll);
         EXPECT_FLOAT_EQ(*m.capacity_factor, 1.25f);
         EXPECT_EQ(m.drop_policy, MoeDropPolicy::Position);
         EXPECT_EQ(m.shared_expert_size, 128);
         EXPECT_TRUE(m.expert_bias);
         EXPECT_FLOAT_EQ(m.bias_update_rate, 0.01f);
       }},
      {"moe-negative-capacity-is-dropless", cmd({"--num-experts", "4", "--moe-token-dispatcher-type", "alltoall", "--moe-expert-capacity-factor", "-1"}),
       O::Accepted, {}, [](const ParsedArguments& p) { EXPECT_FALSE(p.config.model.moe.capacity_factor.has_value()); }},
      {"moe-router-dtype-fp64-not-yet", cmd({"--num-experts", "4", "--moe-router-dtype", "fp64"}), O::NotSupported,
       {"`--moe-router-dtype fp64` is not supported yet by megadlm (see docs/flags.md); supported: fp32"}},
      {"moe-alltoall-seq-not-yet", cmd({"--num-experts", "4", "--moe-token-dispatcher-type", "alltoall_seq"}), O::NotSupported,
       {"`--moe-token-dispatcher-type alltoall_seq` is not supported yet", "supported: allgather, alltoall"}},

      // ------------------------------------------------------------------ data
      {"V-52", cmd({"--data-path", "corpus"}), O::Rejected, {"give one data source", "[V-52]"}},
      {"V-16", cmd({"--data-path", "a", "--data-args-path", "b"}, {"--mock-data"}), O::Rejected,
       {"give only one of `--data-path` and `--data-args-path` [V-16]"}},
      {"V-16-per-split", cmd({"--train-data-path", "a", "--per-split-data-args-path", "b.json"}, {"--mock-data"}),
       O::Rejected, {"give only one of the per-split `--*-data-path` flags and `--per-split-data-args-path` [V-16]"}},
      {"V-52-files", cmd({"--data-args-path", "a.txt", "--per-split-data-args-path", "b.json"}, {"--mock-data"}),
       O::Rejected, {"give one data source", "(or `--per-split-data-args-path`) [V-52]"}},
      {"V-52-mock", cmd({"--data-args-path", "a.txt"}), O::Rejected, {"give one data source", "[V-52]"}},
      {"V-52-sft", cmd({"--sft-data-path", "pairs.jsonl", "--tokenizer-type", "NullTokenizer"}), O::Rejected,
       {"give one data source", "`--sft-data-path`", "[V-52]"}},
      {"M-22", cmd({"--sft-data-path", "pairs.jsonl", "--tokenizer-type", "NullTokenizer", "--model-running-mode",
                    "vanilla"}, {"--mock-data"}),
       O::Rejected, {"needs `--model-running-mode difflm-noshift` [M-22]"}},
      {"M-23", cmd({"--sft-data-path", "pairs.jsonl"}, {"--mock-data"}), O::Rejected,
       {"`--sft-data-path` needs `--tokenizer-type`", "[M-23]"}},
      {"M-23-ok", cmd({"--sft-data-path", "pairs.jsonl", "--tokenizer-type", "NullTokenizer", "--dlm-sft-loss-norm",
                       "token", "--sft-chat-template", "llada", "--mask-token", "98"}, {"--mock-data", "--mask-token"}),
       O::Accepted, {}, [](const ParsedArguments& p) {
         EXPECT_TRUE(p.config.diffusion.sft);
         EXPECT_EQ(p.config.diffusion.sft_loss_norm, SftLossNorm::Token);
         EXPECT_EQ(p.config.data.sft_data_path, std::vector<std::string>{"pairs.jsonl"});
         EXPECT_EQ(p.config.data.sft_chat_template, "llada");
       }},
      // The blends parse, and the blend files are read, during validation: --dry-run sees them.
      {"M-18", dry(1, {"--data-path", "0.3", "corpus_a", "x", "corpus_b"}, {"--mock-data"}), O::Rejected,
       {"--data-path: unparsable blend weight(s) \"x\"", "[M-18]"}},
      {"M-18-odd", cmd({"--data-path", "0.3", "corpus_a", "0.7"}, {"--mock-data"}), O::Rejected,
       {"--data-path: 3 words starting with the weight 0.3", "is a weight or a prefix missing?", "[M-18]"}},
      {"M-18-file", dry(1, {"--data-args-path", "/nonexistent/blend.txt"}, {"--mock-data"}), O::Rejected,
       {"--data-args-path /nonexistent/blend.txt: cannot read the file (No such file or directory)", "[M-18]"}},
      {"M-18-json", cmd({"--per-split-data-args-path", "/nonexistent/splits.json"}, {"--mock-data"}),
       O::Rejected, {"--per-split-data-args-path /nonexistent/splits.json: cannot read the file", "[M-18]"}},
      // Weights whose sum overflows are named, not found out by the sample counts.
      {"M-18-overflow", dry(1, {"--data-path", "1e308", "corpus_a", "1e308", "corpus_b"}, {"--mock-data"}),
       O::Rejected,
       {"--data-path: the blend weights 1e308 (corpus_a), 1e308 (corpus_b) add up to more than the largest number",
        "[M-18]"}},
      // Megatron's pattern [.0-9]+ dropped the minus sign and the "nan";
      // the proportions are read whole and checked before the start (Megatron: when the
      // datasets are built).
      {"R-15", dry(1, {"--data-path", "corpus_text_document", "--split", "100,-5,5"}, {"--mock-data"}),
       O::Rejected, {"--split \"100,-5,5\": the proportion \"-5\" is negative", "[R-15]"}},
      {"R-15-nan", dry(1, {"--data-path", "corpus_text_document", "--split", "nan,5,5"}, {"--mock-data"}),
       O::Rejected, {"--split \"nan,5,5\": the proportion \"nan\" is not a finite number", "[R-15]"}},
      {"R-15-zero", dry(1, {"--data-path", "corpus_text_document", "--split", "0,0,0"}, {"--mock-data"}),
       O::Rejected, {"--split \"0,0,0\": the proportions add up to 0", "[R-15]"}},
      {"R-15-ok", dry(1, {"--data-path", "corpus_text_document", "--split", "98/2"}, {"--mock-data"}),
       O::Accepted, {}},
      {"M-10", cmd({}, {"--mock-data"}), O::Rejected, {"no training data: pass `--mock-data` or `--data-path` [M-10]"}},
      {"V-15", dry(1, {"--data-path", "corpus_text_document"}, {"--mock-data"}), O::Accepted,
       {"using Megatron's legacy default \"969, 30, 1\""},
       [](const ParsedArguments& p) {
         EXPECT_EQ(p.config.data.split, "969, 30, 1");
         EXPECT_EQ(p.config.data.data_path, (std::vector<std::string>{"corpus_text_document"}));
       }},
      {"V-28", cmd({"--num-dataset-builder-threads", "0"}), O::Rejected, {"[V-28]"}},
      {"V-59", cmd({"--tokenizer-type", "GPT2BPETokenizer"}), O::Rejected,
       {"`--tokenizer-type GPT2BPETokenizer` needs `--vocab-file` and `--merge-file` [V-59]"}},
      {"M-11", cmd({}, {"--vocab-size"}), O::Rejected, {"`--vocab-size` is required", "[M-11]"}},
      {"padded-vocab", dry(2, {"--vocab-size", "50277", "--tensor-model-parallel-size", "2", "--mask-token", "50277"}),
       O::Accepted, {}, [](const ParsedArguments& p) {
         EXPECT_EQ(p.config.model.vocab_size, 50277);
         EXPECT_EQ(p.config.model.padded_vocab_size, 50432);  // ceil(50277 / 256) · 256
       }},

      // ------------------------------------------------------------------ diffusion
      {"D-2", cmd({"--attention-mask-type", "causal"}), O::Rejected,
       {"`--model-running-mode difflm-noshift` needs `--attention-mask-type no_mask` (full-sequence diffusion) or `block_causal` (block diffusion) (got `--attention-mask-type causal`); valid: no_mask, block_causal [D-2]"}},
      {"D-10", cmd({"--model-running-mode", "vanilla", "--attention-mask-type", "block_causal"}), O::Rejected,
       {"`--attention-mask-type block_causal` trains block diffusion, which needs `--model-running-mode difflm-noshift` (got `--model-running-mode vanilla`) [D-10]",
        "`--attention-mask-type block_causal` needs `--dlm-block-size B`"}},
      {"D-10/block-size", cmd({"--attention-mask-type", "block_causal", "--dlm-block-size", "5", "--attention-dropout", "0"}), O::Rejected,
       {"`--dlm-block-size 5` must divide `--seq-length 32`; valid: a divisor of 32 (e.g. 32) [D-10]"}},
      {"D-10/block-size-alone", cmd({"--dlm-block-size", "8"}), O::Rejected,
       {"`--dlm-block-size 8` needs `--attention-mask-type block_causal` (block diffusion); got `--attention-mask-type no_mask` [D-10]"}},
      {"D-10/ar-loss", cmd({"--attention-mask-type", "block_causal", "--dlm-block-size", "8", "--attention-dropout", "0",
                            "--dlm-ar-loss-weight", "0.5"}), O::Rejected,
       {"`--dlm-ar-loss-weight 0.5` needs `--attention-mask-type block_causal --dlm-bd-clean-attention causal`", "[D-10]"}},
      {"D-10-ok", cmd({"--attention-mask-type", "block_causal", "--dlm-block-size", "8", "--attention-dropout", "0",
                       "--dlm-bd-clean-attention", "causal", "--dlm-diffusion-loss-scale", "0.3"}), O::Accepted, {},
       [](const ParsedArguments& p) {
         EXPECT_EQ(p.config.diffusion.block_size, 8);
         EXPECT_TRUE(p.config.model.block_diffusion_causal_clean);
         EXPECT_FLOAT_EQ(p.config.diffusion.diffusion_loss_scale, 0.3f);
         EXPECT_FLOAT_EQ(p.config.diffusion.ar_loss_weight, 1.0f);
         EXPECT_EQ(p.config.model.attention_mask, AttentionMaskType::BlockCausal);
       }},
      {"D-11-sft-ok", cmd({"--sft-data-path", "pairs.jsonl", "--tokenizer-type", "NullTokenizer",
                           "--attention-mask-type", "block_causal", "--dlm-block-size", "8", "--attention-dropout", "0",
                           "--dlm-t-granularity", "sequence", "--dlm-bd-clean-attention", "causal", "--mask-token", "98"},
                          {"--mock-data", "--mask-token"}),
       O::Accepted, {}, [](const ParsedArguments& p) {
         EXPECT_TRUE(p.config.diffusion.sft);
         EXPECT_EQ(p.config.diffusion.block_size, 8);
         EXPECT_EQ(p.config.diffusion.t_granularity, BlockTimeGranularity::Sequence);
         EXPECT_FLOAT_EQ(p.config.diffusion.ar_loss_weight, 1.0f);
       }},
      {"D-11", cmd({"--attention-mask-type", "block_causal", "--dlm-block-size", "8"}), O::Rejected,
       {"block diffusion's attention kernels run without attention dropout; got `--attention-dropout 0.1`; valid: `--attention-dropout 0` [D-11]"}},
      {"D-11/cp-blocks", dry(2, {"--context-parallel-size", "2", "--attention-mask-type", "block_causal", "--dlm-block-size", "16",
                                 "--attention-dropout", "0", "--hidden-dropout", "0"}), O::Rejected,
       {"block diffusion under context parallelism cuts `--seq-length 32` into 2 x `--context-parallel-size 2` chunks of "
        "whole blocks of `--dlm-block-size 16`, which does not divide; valid: `--seq-length` a multiple of 64, or a "
        "block size dividing 8, or another `--context-parallel-size` [D-11]"}},
      {"D-11/cp-hidden-dropout", dry(2, {"--context-parallel-size", "2", "--attention-mask-type", "block_causal",
                                         "--dlm-block-size", "8", "--attention-dropout", "0"}), O::Rejected,
       {"block diffusion under context parallelism runs without hidden dropout", "valid: `--hidden-dropout 0` [D-11]"}},
      {"D-11/cp-schedule", dry(2, {"--context-parallel-size", "2", "--attention-mask-type", "block_causal", "--dlm-block-size", "8",
                                   "--attention-dropout", "0", "--hidden-dropout", "0", "--dlm-block-size-schedule", "4:10"}),
       O::Rejected, {"keeps one block size", "valid: no schedule [D-11]"}},
      {"D-11-cp-ok", dry(4, {"--context-parallel-size", "4", "--cp-comm-type", "a2a+p2p", "--hierarchical-context-parallel-sizes", "2", "2",
                             "--attention-mask-type", "block_causal", "--dlm-block-size", "4", "--attention-dropout", "0",
                             "--hidden-dropout", "0"}), O::Accepted, {},
       [](const ParsedArguments& p) {
         EXPECT_EQ(p.config.parallel.context_parallel_size, 4);
         EXPECT_EQ(p.config.diffusion.block_size, 4);
         EXPECT_EQ(p.config.model.attention_mask, AttentionMaskType::BlockCausal);
       }},
      {"D-12", cmd({"--attention-mask-type", "block_causal", "--dlm-block-size", "8", "--attention-dropout", "0", "--dlm-block-size-schedule", "2:10", "1:20"}), O::Rejected,
       {"`--dlm-block-size-schedule 2:10 1:20`: entry 1:20 does not grow: sizes and iterations must both increase from one entry to the next [D-12]"}},
      {"D-12/final", cmd({"--attention-mask-type", "block_causal", "--dlm-block-size", "8", "--attention-dropout", "0", "--dlm-block-size-schedule", "8:10"}), O::Rejected,
       {"entry 8:10 is not smaller than the final `--dlm-block-size 8`; valid: sizes below it [D-12]"}},
      {"D-12/divides", cmd({"--attention-mask-type", "block_causal", "--dlm-block-size", "8", "--attention-dropout", "0", "--dlm-block-size-schedule", "3:10"}), O::Rejected,
       {"block size 3 does not divide `--seq-length 32`; valid: divisors of 32 [D-12]"}},
      {"D-12/syntax", cmd({"--attention-mask-type", "block_causal", "--dlm-block-size", "8", "--attention-dropout", "0", "--dlm-block-size-schedule", "4@10"}), O::Rejected,
       {"entry '4@10' is not SIZE:ITER", "[D-12]"}},
      {"D-12/no-block", cmd({"--dlm-block-size-schedule", "4:10"}), O::Rejected,
       {"needs `--attention-mask-type block_causal` with `--dlm-block-size` [D-12]"}},
      {"D-12-ok", cmd({"--attention-mask-type", "block_causal", "--dlm-block-size", "8", "--attention-dropout", "0", "--dlm-block-size-schedule", "1:10", "4:30"}), O::Accepted, {},
       [](const ParsedArguments& p) {
         const auto& d = p.config.diffusion;
         EXPECT_EQ(d.block_size_schedule, (std::vector<std::pair<int64_t, int64_t>>{{1, 10}, {4, 30}}));
         // Iterations are counted as completed ones: steps 1..10 use 1, 11..30 use 4, then 8.
         EXPECT_EQ(d.block_size_at(0), 1);
         EXPECT_EQ(d.block_size_at(9), 1);
         EXPECT_EQ(d.block_size_at(10), 4);
         EXPECT_EQ(d.block_size_at(29), 4);
         EXPECT_EQ(d.block_size_at(30), 8);
         EXPECT_EQ(d.block_size_at(1000), 8);
       }},
      {"D-3", cmd({"--transformer-impl", "local"}), O::Rejected, {"`--transformer-impl local`", "[D-3]"}},
      {"D-4", cmd({"--mask-token", "128"}), O::Rejected,
       {"`--mask-token 128` is outside the padded vocabulary of 128", "valid: 0 to 127 [D-4]"}},
      {"D-4", cmd({}, {"--mask-token"}), O::Rejected, {"`--mask-token 151656` is outside", "[D-4]"}},
      {"D-6", cmd({"--reset-position-ids", "--reset-attention-mask"}), O::Rejected,
       {"need `--cut-off-varlen-to-seqlen` [D-6]"}},
      {"V-59", cmd({"--data-path", "corpus", "--eod-mask-loss"}, {"--mock-data"}), O::Rejected,
       {"`--eod-mask-loss` needs the end-of-document id: give `--tokenizer-type`"}},
      {"V-59", cmd({"--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", "/nonexistent/tok.json"}),
       O::Rejected, {"cannot load the tokenizer", "/nonexistent/tok.json"}},
      {"D-7", cmd({"--difflm-varilen-prob", "1.5"}), O::Rejected, {"`--difflm-varilen-prob 1.5` must lie in [0, 1] [D-7]"}},
      {"M-12", cmd({"--dlm-min-masked", "40"}), O::Rejected, {"`--dlm-min-masked 40` must lie in [0, `--seq-length 32`] [M-12]"}},
      {"vanilla-mask-default", cmd({"--model-running-mode", "vanilla"}), O::Accepted, {},
       [](const ParsedArguments& p) {
         EXPECT_EQ(p.config.diffusion.mode, RunningMode::Vanilla);
         EXPECT_EQ(p.config.model.attention_mask, AttentionMaskType::Causal);
         EXPECT_EQ(p.values.at("attention_mask_type"), "causal");
       }},
      {"vanilla-causal-bottom-right", cmd({"--model-running-mode", "vanilla", "--attention-mask-type", "causal_bottom_right"}),
       O::Accepted, {}, [](const ParsedArguments& p) {
         EXPECT_EQ(p.config.model.attention_mask, AttentionMaskType::Causal);
       }},
      {"vanilla-no-mask-warns", cmd({"--model-running-mode", "vanilla", "--attention-mask-type", "no_mask"}),
       O::Accepted, {"always trains with causal attention"}},
      {"test-forward-not-yet", cmd({"--model-running-mode", "test-forward"}), O::NotSupported,
       {"`--model-running-mode test-forward` is not supported yet"}},

      // ------------------------------------------------------------------ device
      {"M-3", cmd({"--device", "cuda"}), O::NotSupported,
       {"`--device cuda` without `--bf16`: fp32 training on CUDA is not supported yet"},
       nullptr, LaunchInfo{.world_size = 1, .rank = 0, .visible_gpus = 1}},
      {"M-3-default-device", cmd(), O::NotSupported, {"`--device cuda` (the default when a GPU is visible) without `--bf16`"},
       nullptr, LaunchInfo{.world_size = 1, .rank = 0, .visible_gpus = 1}},
      {"M-4", cmd({"--device", "cuda", "--bf16"}), O::Rejected,
       {"`--device cuda` but no GPU is visible; use `--device cpu` [M-4]"}},
      {"M-4-dry-run", dry(1, {"--device", "cuda", "--bf16"}), O::Accepted, {}},
      {"M-7", cmd({"--bf16"}), O::Accepted, {"`--bf16` with `--device cpu`: the CPU backend computes in fp32"}},
      {"device-default-cuda", cmd({"--bf16"}), O::Accepted, {}, [](const ParsedArguments& p) {
         EXPECT_EQ(p.config.training.device, DeviceKind::Cuda);
         EXPECT_TRUE(p.warnings.empty()) << joined(p.warnings);
       }, LaunchInfo{.world_size = 1, .rank = 0, .visible_gpus = 2}},

      // ------------------------------------------------ what runs: data parallelism, nothing else yet
      {"tp-real-run", cmd({"--tensor-model-parallel-size", "2", "--sequence-parallel"}), O::Accepted, {},
       [](const ParsedArguments& p) {
         EXPECT_EQ(p.config.parallel.tensor_model_parallel_size, 2);
         EXPECT_TRUE(p.config.parallel.sequence_parallel);
         EXPECT_TRUE(p.not_supported.empty()) << joined(p.not_supported);
       }, LaunchInfo{.world_size = 2, .rank = 1, .visible_gpus = 0}},
      {"pp-real-run", cmd({"--pipeline-model-parallel-size", "2", "--recompute-granularity", "full",
                           "--recompute-method", "block", "--recompute-num-layers", "1"}),
       O::Accepted, {}, [](const ParsedArguments& p) {
         EXPECT_EQ(p.config.parallel.pipeline_model_parallel_size, 2);
         EXPECT_EQ(p.config.model.recompute_granularity, RecomputeGranularity::Full);
         EXPECT_EQ(p.config.model.recompute_method, RecomputeMethod::Block);
         EXPECT_TRUE(p.not_supported.empty()) << joined(p.not_supported);
       }, LaunchInfo{.world_size = 2, .rank = 1, .visible_gpus = 0}},
      {"cp-real-run", cmd({"--context-parallel-size", "2"}), O::Accepted, {},
       [](const ParsedArguments& p) {
         EXPECT_EQ(p.config.parallel.context_parallel_size, 2);
         EXPECT_EQ(p.config.parallel.data_parallel_size, 1);
         EXPECT_EQ(p.config.parallel.cp_comm_type, (std::vector<cp::CommType>{cp::CommType::P2P}));
         EXPECT_TRUE(p.not_supported.empty()) << joined(p.not_supported);
       }, LaunchInfo{.world_size = 2, .rank = 1, .visible_gpus = 0}},
      // Packed documents split over CP ranks (MegaDLMs refuses them; megadlm keeps documents by
      // global id), with one comm type per layer.
      {"cp-packed-per-layer-types-real-run",
       cmd({"--context-parallel-size", "2", "--reset-position-ids", "--reset-attention-mask",
            "--cut-off-varlen-to-seqlen", "--num-layers", "2", "--cp-comm-type", "a2a", "all_gather"}),
       O::Accepted, {}, [](const ParsedArguments& p) {
         EXPECT_TRUE(p.config.data.per_document_attention);
         EXPECT_EQ(p.config.parallel.cp_comm_type, (std::vector<cp::CommType>{cp::CommType::A2A, cp::CommType::AllGather}));
         EXPECT_TRUE(p.not_supported.empty()) << joined(p.not_supported);
       }, LaunchInfo{.world_size = 2, .rank = 0, .visible_gpus = 0}},
      {"dp-real-run", cmd({"--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"}),
       O::Accepted, {}, [](const ParsedArguments& p) {
         EXPECT_EQ(p.config.parallel.data_parallel_size, 4);
         EXPECT_TRUE(p.config.parallel.use_distributed_optimizer);
         EXPECT_TRUE(p.not_supported.empty()) << joined(p.not_supported);
       }, LaunchInfo{.world_size = 4, .rank = 0, .visible_gpus = 0}},
      {"fsdp-optim-grads-is-the-distributed-optimizer",
       cmd({"--use-custom-fsdp", "--data-parallel-sharding-strategy", "optim_grads"}), O::Accepted, {},
       [](const ParsedArguments& p) { EXPECT_TRUE(p.config.parallel.use_distributed_optimizer); },
       LaunchInfo{.world_size = 2, .rank = 0, .visible_gpus = 0}},
      {"fsdp-no-shard-is-ddp", cmd({"--use-megatron-fsdp", "--data-parallel-sharding-strategy", "no_shard"}),
       O::Accepted, {}, [](const ParsedArguments& p) { EXPECT_FALSE(p.config.parallel.use_distributed_optimizer); },
       LaunchInfo{.world_size = 2, .rank = 0, .visible_gpus = 0}},
      {"fsdp-param-sharding-runs", cmd({"--use-custom-fsdp"}), O::Accepted, {},
       [](const ParsedArguments& p) {
         EXPECT_TRUE(p.config.parallel.use_custom_fsdp);
         EXPECT_EQ(p.config.parallel.data_parallel_sharding_strategy, ShardingStrategy::OptimGradsParams);
         EXPECT_TRUE(p.not_supported.empty()) << joined(p.not_supported);
       }, LaunchInfo{.world_size = 2, .rank = 0, .visible_gpus = 0}},
      {"fsdp-torch-fsdp2-is-full-sharding",
       cmd({"--use-torch-fsdp2", "--untie-embeddings-and-output-weights", "--no-gradient-accumulation-fusion",
            "--data-parallel-sharding-strategy", "optim"}),
       O::Accepted, {"`--data-parallel-sharding-strategy optim` has no effect with `--use-torch-fsdp2`"},
       [](const ParsedArguments& p) {
         EXPECT_TRUE(p.config.parallel.use_custom_fsdp);
         EXPECT_TRUE(p.config.parallel.use_torch_fsdp2);
         EXPECT_EQ(p.config.parallel.data_parallel_sharding_strategy, ShardingStrategy::OptimGradsParams);
       }, LaunchInfo{.world_size = 2, .rank = 0, .visible_gpus = 0}},
      {"F-13", cmd({"--use-torch-fsdp2", "--use-megatron-fsdp", "--untie-embeddings-and-output-weights"}), O::Rejected,
       {"`--use-torch-fsdp2` and `--use-megatron-fsdp` (`--use-custom-fsdp`) choose two FSDP wrappers", "[F-13]"}},
      {"F-7", cmd({"--use-megatron-fsdp", "--check-weight-hash-across-dp-replicas-interval", "10"}), O::Rejected,
       {"`--check-weight-hash-across-dp-replicas-interval 10` needs replicated weights", "[F-7]"}},
      {"F-7-ok", cmd({"--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads",
                      "--check-weight-hash-across-dp-replicas-interval", "10"}), O::Accepted,
       {"`--check-weight-hash-across-dp-replicas-interval` has no effect"}},
      {"F-10", cmd({"--use-megatron-fsdp", "--data-parallel-sharding-strategy", "no_shard", "--init-model-with-meta-device"}),
       O::Rejected, {"`--init-model-with-meta-device` needs a sharding FSDP strategy", "[F-10]"}},
      {"F-10-ok", cmd({"--use-megatron-fsdp", "--init-model-with-meta-device"}), O::Accepted, {}},
      {"F-8", cmd({"--ckpt-format", "fsdp_dtensor"}), O::Rejected,
       {"`--ckpt-format fsdp_dtensor` is Megatron-FSDP's format: it needs `--use-megatron-fsdp`", "[F-8]"}},
      {"F-8-ok", cmd({"--use-megatron-fsdp", "--ckpt-format", "fsdp_dtensor"}), O::Accepted, {"`--ckpt-format` has no effect"}},
      {"V-22-torch-dcp-ok", cmd({"--use-torch-fsdp2", "--untie-embeddings-and-output-weights", "--no-gradient-accumulation-fusion",
            "--ckpt-format", "torch_dcp"}),
       O::Accepted, {"`--ckpt-format` has no effect in megadlm"}},
      {"V-22-pp", cmd({"--use-torch-fsdp2", "--untie-embeddings-and-output-weights", "--pipeline-model-parallel-size", "2"}),
       O::Rejected, {"`--use-torch-fsdp2` cannot be used with `--pipeline-model-parallel-size 2`", "[V-22]"},
       nullptr, LaunchInfo{.world_size = 2, .rank = 0, .visible_gpus = 0}},
      {"fsdp-outer-optim-not-yet", cmd({"--use-megatron-fsdp", "--outer-dp-sharding-strategy", "optim"}),
       O::NotSupported, {"`--outer-dp-sharding-strategy optim` is not supported yet"}},
      {"fsdp-hsdp-not-yet", cmd({"--use-megatron-fsdp", "--num-distributed-optimizer-instances", "2"}),
       O::NotSupported, {"`--num-distributed-optimizer-instances 2` with FSDP: hybrid sharding (HSDP) is not supported yet"},
       nullptr, LaunchInfo{.world_size = 4, .rank = 0, .visible_gpus = 0}},
      {"fsdp-no-shard-with-dist-opt-warns",
       cmd({"--use-megatron-fsdp", "--data-parallel-sharding-strategy", "no_shard", "--use-distributed-optimizer"}),
       O::Accepted, {"`--use-distributed-optimizer` has no effect with `--use-megatron-fsdp --data-parallel-sharding-strategy no_shard`"},
       [](const ParsedArguments& p) { EXPECT_FALSE(p.config.parallel.use_distributed_optimizer); }},
      {"sharding-strategy-without-fsdp-warns", cmd({"--data-parallel-sharding-strategy", "optim"}), O::Accepted,
       {"`--data-parallel-sharding-strategy optim` has effect only with `--use-custom-fsdp`"}},
      {"pp-cp-ep-real-run", cmd({"--pipeline-model-parallel-size", "2", "--context-parallel-size", "2", "--expert-model-parallel-size", "2", "--num-experts", "2", "--difflm-varilen-prob", "0"}),
       O::Accepted, {},
       [](const ParsedArguments& p) { EXPECT_TRUE(p.not_supported.empty()); },
       LaunchInfo{.world_size = 4, .rank = 0, .visible_gpus = 0}},
      // CP pads varilen-truncated micro-batches; the MoE layer routes only the real rows.
      {"cp-moe-varilen-real-run", cmd({"--context-parallel-size", "2", "--num-experts", "2"}), O::Accepted, {},
       [](const ParsedArguments& p) { EXPECT_TRUE(p.not_supported.empty()); },
       LaunchInfo{.world_size = 2, .rank = 0, .visible_gpus = 0}},
      {"cp-moe-sft-real-run",  // SFT micro-batches are never truncated
       cmd({"--context-parallel-size", "2", "--num-experts", "2", "--sft-data-path", "pairs.jsonl",
            "--tokenizer-type", "NullTokenizer", "--mask-token", "98"}, {"--mock-data", "--mask-token"}),
       O::Accepted, {}, [](const ParsedArguments& p) { EXPECT_TRUE(p.not_supported.empty()); },
       LaunchInfo{.world_size = 2, .rank = 0, .visible_gpus = 0}},
      {"cp-moe-vanilla-real-run", cmd({"--context-parallel-size", "2", "--num-experts", "2", "--model-running-mode", "vanilla"}),
       O::Accepted, {}, [](const ParsedArguments& p) { EXPECT_TRUE(p.not_supported.empty()); },
       LaunchInfo{.world_size = 2, .rank = 0, .visible_gpus = 0}},
      // Dry runs and real runs accept the same layouts now (CP, EP and FSDP run).
      {"ep-moe-dry-run", dry(8, {"--expert-model-parallel-size", "4", "--num-experts", "8", "--bf16", "--moe-grouped-gemm"}),
       O::Accepted, {},
       [](const ParsedArguments& p) {
         EXPECT_TRUE(p.not_supported.empty());
         EXPECT_EQ(p.config.parallel.expert_model_parallel_size, 4);
         EXPECT_EQ(p.config.parallel.expert_data_parallel_size, 2);  // 8 / (etp 1 · ep 4)
         // rank 5 = ep 1 + 4 · edp 1: its expert-ep group is 4..7, its expert-dp group {1, 5}
         const std::string report = format_dry_run_report(p, 5);
         EXPECT_NE(report.find("  expert-ep ................... [4, 5, 6, 7]"), std::string::npos) << report;
         EXPECT_NE(report.find("  expert-dp ................... [1, 5]"), std::string::npos) << report;
       }},
      {"ep-moe-real-run", cmd({"--expert-model-parallel-size", "4", "--num-experts", "8"}), O::Accepted, {},
       [](const ParsedArguments& p) {
         const MoeConfig& m = p.config.model.moe;
         EXPECT_EQ(m.num_experts, 8);
         EXPECT_EQ(m.topk, 2);
         EXPECT_EQ(m.moe_layers, std::vector<bool>(2, true));
         EXPECT_EQ(m.ffn_hidden_size, p.config.model.ffn_hidden_size);  // V-49 default
         EXPECT_EQ(m.dispatcher, MoeDispatcher::AllGather);
         EXPECT_EQ(m.load_balancing, MoeLoadBalancing::AuxLoss);
         EXPECT_FALSE(m.capacity_factor.has_value());  // dropless
       },
       LaunchInfo{.world_size = 8, .rank = 0, .visible_gpus = 0}},
      {"fsdp-dry-run", dry(4, {"--use-custom-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params"}),
       O::Accepted, {}, [](const ParsedArguments& p) {
         EXPECT_EQ(p.config.parallel.data_parallel_size, 4);
         EXPECT_TRUE(p.not_supported.empty()) << joined(p.not_supported);
       }},
      {"tp-dry-run", dry(16, {"--tensor-model-parallel-size", "2", "--context-parallel-size", "2"}), O::Accepted,
       {}, [](const ParsedArguments& p) {
         EXPECT_TRUE(p.dry_run);
         EXPECT_EQ(p.config.parallel.world_size, 16);
         EXPECT_EQ(p.config.parallel.data_parallel_size, 4);
         EXPECT_TRUE(p.not_supported.empty()) << joined(p.not_supported);
         const std::string report = format_dry_run_report(p, 3);
         EXPECT_NE(report.find("  cp .......................... [1, 3]"), std::string::npos) << report;
         EXPECT_NE(report.find("  tp .......................... [2, 3]"), std::string::npos) << report;
         // rank 3 = tp 1 + 2 * (cp 1 + 2 * dp): its dp group is {1 + 2 * (1 + 2d)} = 3, 7, 11, 15
         EXPECT_NE(report.find("  dp .......................... [3, 7, 11, 15]"), std::string::npos) << report;
       }},
      {"megadlms-1.7b-example", [] {
         Argv a = k1p7b;
         a.insert(a.end(), {"--dry-run", "--world-size", "64", "--use-distributed-optimizer"});
         return a;
       }(), O::Accepted, {},
       [](const ParsedArguments& p) {
         const RunConfig& c = p.config;
         EXPECT_EQ(c.parallel.data_parallel_size, 64);
         EXPECT_TRUE(c.parallel.use_distributed_optimizer);
         EXPECT_EQ(c.training.global_batch_size, 256);
         EXPECT_EQ(c.training.num_micro_batches(64), 1);
         EXPECT_EQ(c.model.ffn_hidden_size, 6144);
         EXPECT_EQ(c.model.kv_channels, 128);
         EXPECT_EQ(c.model.padded_vocab_size, 50304);
         EXPECT_EQ(c.model.normalization, NormType::RMSNorm);
         EXPECT_FLOAT_EQ(c.model.norm_epsilon, 1e-6f);
         EXPECT_TRUE(c.model.qk_layernorm);
         EXPECT_FALSE(c.model.add_bias_linear);
         EXPECT_TRUE(c.model.untie_embeddings_and_output_weights);
         EXPECT_EQ(c.model.position_embedding_type, PositionEmbeddingType::Rope);
         EXPECT_EQ(c.diffusion.mask_token, 50277);
         EXPECT_EQ(c.optimizer.decay_style, LrDecayStyle::WSD);
         EXPECT_EQ(c.optimizer.wsd_decay_style, WsdDecayStyle::Exponential);
         EXPECT_EQ(c.optimizer.lr_wsd_decay_iters, 1000);
         EXPECT_EQ(c.optimizer.lr_warmup_iters, 2000);
         EXPECT_EQ(c.optimizer.lr_decay_iters, 10000);
         EXPECT_FLOAT_EQ(c.optimizer.adam_beta2, 0.95f);
         EXPECT_TRUE(c.training.bf16);
         EXPECT_TRUE(p.not_supported.empty()) << joined(p.not_supported);
       }},
      {"megadlms-1.7b-example-one-process", k1p7b, O::Accepted, {}, [](const ParsedArguments& p) {
         EXPECT_EQ(p.config.training.num_micro_batches(1), 64);
       }},
  };
}

// Every rule id parse_arguments implements (derived rules included); each needs a row.
const char* const kImplementedRules[] = {
    "V-1",  "V-2",  "V-3",  "V-5",  "V-7",  "V-8",  "V-9",  "V-10", "V-11", "V-12", "V-13",
    "V-15", "V-16", "V-17", "V-18", "V-19", "V-20", "V-21", "V-22", "V-23", "V-25", "V-26",
    "V-27", "V-28", "V-29", "V-30", "V-31", "V-32", "V-33", "V-34", "V-35", "V-36", "V-37",
    "V-38", "V-39", "V-40", "V-41", "V-42", "V-43", "V-44", "V-45", "V-47", "V-48", "V-49",
    "V-50", "V-51", "V-52", "V-53", "V-54", "V-55", "V-56", "V-57", "V-58", "V-59", "V-60",
    "B-1",  "B-2",  "B-3",  "C-2",  "C-4",  "C-5",  "C-6",  "C-7",  "C-8",  "C-9",  "C-10",
    "C-11", "C-12", "C-13", "C-14", "C-15", "C-16", "C-17", "C-18", "C-19", "C-21", "G-2",
    "G-3",  "G-4",  "G-5",  "G-7",  "G-8",  "R-1",  "R-3",  "R-4",  "R-5",  "R-6",  "R-7",
    "R-8",  "D-1",  "D-2",  "D-3",  "D-4",  "D-6",  "D-7",  "D-10", "D-11",  "M-1",  "M-2",  "M-3",  "M-4",
    "M-5",  "M-7",  "M-8",  "M-9",  "M-10", "M-11", "M-12", "M-13", "M-14", "M-15", "M-16",
    "M-17", "M-18", "M-19", "M-20", "M-21", "M-22", "M-23", "M-24", "M-25", "M-26", "R-14", "R-15", "F-7", "F-8", "F-10", "F-13",
    "FP8-1", "FP8-2", "FP8-3", "FP8-4", "FP8-5", "FP8-6", "FP8-9"};

TEST(ArgumentRowsTable, HasARowForEveryImplementedRule) {
  const std::vector<Row> table = rows();
  for (const std::string rule : kImplementedRules) {
    bool covered = false;
    for (const Row& row : table) {
      // A row covers a rule when one of its '/'-separated id parts is the rule or starts with
      // "<rule>-" (e.g. "R-5-ok").
      size_t start = 0;
      while (start <= row.id.size() && !covered) {
        size_t end = row.id.find('/', start);
        if (end == std::string::npos) end = row.id.size();
        const std::string part = row.id.substr(start, end - start);
        covered = part == rule || part.rfind(rule + "-", 0) == 0;
        start = end + 1;
      }
      if (covered) break;
    }
    EXPECT_TRUE(covered) << "no row for rule " << rule;
  }
}

class ArgumentRows : public ::testing::TestWithParam<Row> {};

TEST_P(ArgumentRows, ProduceTheExpectedOutcome) {
  const Row& row = GetParam();
  std::string command;
  for (const std::string& a : row.argv) command += a + " ";
  SCOPED_TRACE("row " + row.id + ": " + command);
  try {
    const ParsedArguments p = parse_arguments(row.argv, row.launch);
    ASSERT_EQ(row.outcome, Outcome::Accepted) << "accepted, but expected a ConfigError";
    const std::string notes = joined(p.warnings) + joined(p.not_supported);
    for (const std::string& e : row.expect)
      EXPECT_NE(notes.find(e), std::string::npos) << "missing: " << e << "\nin:\n" << notes;
    if (!p.dry_run) {
      EXPECT_TRUE(p.not_supported.empty());
    }
    if (row.check) row.check(p);
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    ASSERT_NE(row.outcome, Outcome::Accepted) << "rejected:\n" << what;
    if (row.outcome == Outcome::Rejected)
      EXPECT_FALSE(e.errors().empty()) << what;
    else
      EXPECT_TRUE(e.errors().empty()) << "expected only not-supported items:\n" << what;
    const std::string where = row.outcome == Outcome::Rejected ? what : joined(e.not_supported());
    for (const std::string& x : row.expect)
      EXPECT_NE(where.find(x), std::string::npos) << "missing: " << x << "\nin:\n" << what;
  }
}

std::string row_name(const ::testing::TestParamInfo<Row>& info) {
  std::string name = std::to_string(info.index) + "_";
  for (char c : info.param.id) name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return name;
}

INSTANTIATE_TEST_SUITE_P(Table, ArgumentRows, ::testing::ValuesIn(rows()), row_name);

// ---------------------------------------------------------------------- beyond the table

TEST(TpCommOverlap, AtTpOneIsOneError) {
  try {
    parse_arguments(cmd({"--tp-comm-overlap", "--sequence-parallel"}), {});
    FAIL() << "accepted";
  } catch (const ConfigError& e) {
    ASSERT_EQ(e.errors().size(), 1u) << e.what();
    EXPECT_NE(std::string(e.what()).find("[M-25]"), std::string::npos) << e.what();
  }
}

TEST(Arguments, RealRunRefusesWhatOnlyADryRunAccepts) {
  // The same valid hybrid-FSDP layout: a dry run reports the item and returns, a real run throws it.
  const std::vector<std::string> hsdp = {"--use-custom-fsdp", "--num-distributed-optimizer-instances", "2"};
  const ParsedArguments p = parse_arguments(dry(4, hsdp), {});
  ASSERT_EQ(p.not_supported.size(), 1u) << joined(p.not_supported);
  try {
    parse_arguments(cmd(hsdp), LaunchInfo{.world_size = 4});
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(e.errors().empty()) << e.what();
    ASSERT_EQ(e.not_supported(), p.not_supported);
    EXPECT_NE(std::string(e.what()).find("not supported yet by megadlm (1 item; `--dry-run` accepts it):\n  " +
                                         p.not_supported[0]),
              std::string::npos) << e.what();
  }
}

TEST(Arguments, ReportsEveryViolationAtOnce) {
  // Three independent problems: TP vs heads (C-9), min-lr above lr (V-37), a probability > 1 (D-7).
  try {
    parse_arguments(dry(3, {"--num-attention-heads", "16", "--tensor-model-parallel-size", "3",
                            "--ffn-hidden-size", "192",
                            "--min-lr", "0.5", "--difflm-varilen-prob", "2"}),
                    {});
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("invalid command line (3 problems):"), std::string::npos) << what;
    EXPECT_NE(what.find("[C-9]"), std::string::npos) << what;
    EXPECT_NE(what.find("[V-37]"), std::string::npos) << what;
    EXPECT_NE(what.find("[D-7]"), std::string::npos) << what;
    EXPECT_EQ(e.errors().size(), 3u) << what;
  }
}

TEST(Arguments, ReportsEveryParseErrorAtOnce) {
  try {
    parse_arguments(cmd({"--tensor-parallel-size", "2", "--num-layers", "x", "--swiglu=1"}), {});
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.errors().size(), 3u) << e.what();
  }
}

TEST(Arguments, HelpSkipsValidation) {
  const ParsedArguments p = parse_arguments({"--tensor-model-parallel-size", "0", "--help"}, {});
  EXPECT_TRUE(p.help);
  EXPECT_TRUE(parse_arguments({"-h"}, {}).help);
  EXPECT_TRUE(parse_arguments({"--help-markdown"}, {}).help_markdown);
}

// "@path" (appended: GCC 12's -Wrestrict misfires on "literal" + std::string).
std::string at_file(const std::filesystem::path& p) { return std::string(1, '@').append(p.string()); }

TEST(Arguments, ExpandsFlagFiles) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("megadlm_args_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir / "sub");
  {
    std::ofstream base(dir / "base.args");
    base << "# a tiny model\n--num-layers 2 --hidden-size 64   # width\n"
            "--num-attention-heads 4\n--seq-length 32 --max-position-embeddings 32\n"
            "@sub/train.args\n";
    std::ofstream train(dir / "sub" / "train.args");
    train << "--micro-batch-size 2 --vocab-size 100 --mask-token 99\n"
             "--lr 1e-3 --train-iters 10 --mock-data --attention-dropout 0\n"
             "--metrics-jsonl 'my metrics.jsonl'\n";
    std::ofstream loop(dir / "loop.args");
    loop << "@loop.args\n";
  }
  const ParsedArguments p =
      parse_arguments({at_file(dir / "base.args"), "--num-layers", "4"}, {});
  EXPECT_EQ(p.config.model.num_layers, 4);  // the command line after @file wins
  EXPECT_EQ(p.config.model.hidden_size, 64);
  EXPECT_EQ(p.config.training.micro_batch_size, 2);
  EXPECT_TRUE(p.config.data.mock_data);
  EXPECT_EQ(p.config.training.metrics_jsonl, "my metrics.jsonl");
  try {
    parse_arguments({at_file(dir / "missing.args")}, {});
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot read flag file"), std::string::npos) << e.what();
  }
  try {
    parse_arguments({at_file(dir / "loop.args")}, {});
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("nesting deeper than"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

TEST(Arguments, FormatsMegatronsArgumentDump) {
  const ParsedArguments p = parse_arguments(cmd({"--cp-comm-type", "p2p"}), {});
  const std::string dump = format_arguments(p);
  EXPECT_EQ(dump.rfind("------------------------ arguments ------------------------\n", 0), 0u);
  EXPECT_NE(dump.find("\n-------------------- end of arguments ---------------------\n"),
            std::string::npos);
  // '.' × (48 − len(name)), as Megatron prints it.
  EXPECT_NE(dump.find("\n  num_layers " + std::string(38, '.') + " 2\n"), std::string::npos) << dump;
  EXPECT_NE(dump.find("\n  adam_eps " + std::string(40, '.') + " 1e-08\n"), std::string::npos);
  EXPECT_NE(dump.find("\n  cp_comm_type " + std::string(36, '.') + " ['p2p']\n"), std::string::npos);
  EXPECT_NE(dump.find("\n  padded_vocab_size " + std::string(31, '.') + " 128\n"), std::string::npos);
  EXPECT_NE(dump.find("\n  load " + std::string(44, '.') + " None\n"), std::string::npos);
  EXPECT_NE(dump.find("\n  swiglu " + std::string(42, '.') + " False\n"), std::string::npos);
  EXPECT_EQ(dump.find("help"), std::string::npos);
  // Sorted by name.
  EXPECT_LT(dump.find("  adam_beta1 "), dump.find("  adam_beta2 "));
  EXPECT_LT(dump.find("  world_size "), dump.find("  yaml_cfg "));
}


// ------------------------------------------------ --data-args-path, --per-split-data-args-path

// A scratch directory for the files a test writes; removed afterwards.
class DataArgsFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("megadlm_data_args_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& text) const {
    const std::filesystem::path p = dir_ / name;
    std::ofstream(p) << text;
    return p.string();
  }
  // An indexed dataset of 40 documents of 30 tokens below the test vocabulary of 100 ids;
  // `salt` makes datasets differ.
  std::string dataset(const std::string& name, int32_t salt) const {
    const std::string prefix = (dir_ / name).string();
    data::IndexedDatasetWriter w(prefix, data::IndexDType::UInt16);
    for (int32_t d = 0; d < 40; ++d) {
      std::vector<int32_t> tokens(30);
      for (int32_t k = 0; k < 30; ++k) tokens[static_cast<size_t>(k)] = (salt + 7 * d + k) % 90;
      w.add_document(tokens);
    }
    w.finalize();
    return prefix;
  }

  std::filesystem::path dir_;
};

// The ConfigError message of a command line ("" when it is accepted).
std::string rejection(const Argv& argv) {
  try {
    parse_arguments(argv, {});
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// What follows `label` in `message` up to the end of its line: the error without its source.
std::string after(const std::string& message, const std::string& label) {
  const size_t at = message.find(label);
  if (at == std::string::npos) return "<" + label + " not in: " + message + ">";
  const size_t start = at + label.size();
  return message.substr(start, message.find('\n', start) - start);
}

TEST_F(DataArgsFiles, ArgsFileGivesTheSameBlendAsDataPath) {
  const std::string a = dataset("a", 0), b = dataset("b", 50);
  // Any whitespace separates the words, newlines included, as Python's str.split().
  const std::string file = write("blend.txt", "0.3 " + a + "\n\t0.7   " + b + "\n\n");
  const ParsedArguments from_file =
      parse_arguments(cmd({"--data-args-path", file, "--split", "90,10,0"}, {"--mock-data"}), {});
  const ParsedArguments from_flag = parse_arguments(
      cmd({"--data-path", "0.3", a, "0.7", b, "--split", "90,10,0"}, {"--mock-data"}), {});
  EXPECT_EQ(from_file.config.data.data_path, from_flag.config.data.data_path);
  EXPECT_EQ(from_file.config.data.data_path, (std::vector<std::string>{"0.3", a, "0.7", b}));
  EXPECT_EQ(from_file.config.data.split, from_flag.config.data.split);
  // The datasets are built from the same config, so they draw the same samples.
  std::ostringstream log;
  const TrainingData x = build_training_data(from_file.config, 0, log);
  const TrainingData y = build_training_data(from_flag.config, 0, log);
  ASSERT_TRUE(x.train && y.train && x.valid && y.valid);
  ASSERT_EQ(x.train->num_samples(), y.train->num_samples());
  for (int64_t i = 0; i < x.train->num_samples(); ++i)
    ASSERT_EQ(x.train->sample(i), y.train->sample(i)) << "train sample " << i;
  ASSERT_EQ(x.valid->num_samples(), y.valid->num_samples());
  for (int64_t i = 0; i < x.valid->num_samples(); ++i)
    ASSERT_EQ(x.valid->sample(i), y.valid->sample(i)) << "valid sample " << i;

  // Without --split the file gets --data-path's legacy default (Megatron would stop).
  const ParsedArguments no_split = parse_arguments(cmd({"--data-args-path", file}, {"--mock-data"}), {});
  EXPECT_EQ(no_split.config.data.split, "969, 30, 1");
  EXPECT_NE(joined(no_split.warnings).find("`--split` not given with `--data-args-path`"),
            std::string::npos) << joined(no_split.warnings);
}

TEST_F(DataArgsFiles, PerSplitFileGivesTheSameBlendsAsThePerSplitFlags) {
  const std::string a = dataset("a", 0), b = dataset("b", 50);
  const ParsedArguments from_flags = parse_arguments(
      cmd({"--train-data-path", "0.3", a, "0.7", b, "--valid-data-path", b, "--test-data-path", a},
          {"--mock-data"}),
      {});
  // Lists (weights as strings or JSON numbers) and whitespace-separated strings.
  const std::string lists = write("lists.json", "{\"train\": [\"0.3\", \"" + a + "\", 0.7, \"" + b +
                                                    "\"], \"valid\": [\"" + b + "\"], \"test\": [\"" +
                                                    a + "\"], \"comment\": \"ignored\"}");
  const std::string strings = write("strings.json", "{\"train\": \"0.3 " + a + "\\n 0.7 " + b +
                                                        "\", \"valid\": \" " + b + " \", \"test\": \"" +
                                                        a + "\"}");
  for (const std::string& file : {lists, strings}) {
    SCOPED_TRACE(file);
    const ParsedArguments p =
        parse_arguments(cmd({"--per-split-data-args-path", file}, {"--mock-data"}), {});
    EXPECT_EQ(p.config.data.train_data_path, from_flags.config.data.train_data_path);
    EXPECT_EQ(p.config.data.valid_data_path, from_flags.config.data.valid_data_path);
    EXPECT_EQ(p.config.data.test_data_path, from_flags.config.data.test_data_path);
    EXPECT_TRUE(p.config.data.data_path.empty());
  }
  // null: no data for that split, as a missing --test-data-path.
  const std::string no_test =
      write("no_test.json", "{\"train\": \"" + a + "\", \"valid\": \"" + b + "\", \"test\": null}");
  const ParsedArguments p =
      parse_arguments(cmd({"--per-split-data-args-path", no_test}, {"--mock-data"}), {});
  EXPECT_EQ(p.config.data.train_data_path, (std::vector<std::string>{a}));
  EXPECT_EQ(p.config.data.valid_data_path, (std::vector<std::string>{b}));
  EXPECT_TRUE(p.config.data.test_data_path.empty());
  std::ostringstream log;
  const TrainingData d = build_training_data(p.config, 0, log);
  EXPECT_TRUE(d.train && d.valid);
  EXPECT_FALSE(d.test);
}

TEST_F(DataArgsFiles, BadArgsFilesStopValidationNamingTheFlagAndTheFile) {
  const auto args_file = [&](const std::string& path) {
    return dry(1, {"--data-args-path", path}, {"--mock-data"});
  };
  const std::string missing = (dir_ / "missing.txt").string();
  EXPECT_NE(rejection(args_file(missing)).find("--data-args-path " + missing +
                                               ": cannot read the file (No such file or directory)"),
            std::string::npos);
  EXPECT_NE(rejection(args_file(dir_.string())).find("--data-args-path " + dir_.string() +
                                                     ": is a directory, not a file"),
            std::string::npos);
  const std::string empty = write("empty.txt", " \n\t\n");
  const std::string what = rejection(args_file(empty));
  EXPECT_NE(what.find("--data-args-path " + empty + ": the file is empty; it should hold what "
                      "--data-path takes: a dataset prefix, prefixes, or `weight prefix` pairs"),
            std::string::npos) << what;
  EXPECT_NE(what.find("[M-18]"), std::string::npos) << what;
  // A bad blend reads as it does from --data-path, with the file named instead of the flag.
  for (const Argv& blend : {Argv{"0.3", "corpus_a", "0.7"}, Argv{"0.3", "corpus_a", "x", "corpus_b"},
                            Argv{"-1", "corpus_a"}}) {
    std::string words;
    for (const std::string& w : blend) words += w + " ";
    const std::string file = write("bad.txt", words);
    const std::string from_file = rejection(args_file(file));
    const std::string from_flag = rejection(dry(1, [&] {
      Argv argv = {"--data-path"};
      argv.insert(argv.end(), blend.begin(), blend.end());
      return argv;
    }(), {"--mock-data"}));
    EXPECT_FALSE(from_flag.empty()) << words;
    EXPECT_EQ(after(from_file, "--data-args-path " + file), after(from_flag, "--data-path"))
        << from_file << "\n" << from_flag;
  }
}

TEST_F(DataArgsFiles, BadPerSplitFilesStopValidationNamingTheFlagTheFileAndTheKey) {
  const std::string expected =
      "expected a JSON object with the keys \"train\", \"valid\" and \"test\"";
  const struct {
    std::string json;
    std::vector<std::string> message;  // after "--per-split-data-args-path FILE"
  } cases[] = {
      {"{\"train\": [\"a\"],", {": not valid JSON (", "parse error", expected}},
      {"[\"a\", \"b\"]", {": holds a JSON array; " + expected}},
      {"", {": not valid JSON ("}},
      // Megatron reads every key (KeyError): a split without data says so with null.
      {"{\"train\": \"a\", \"test\": null}", {": no \"valid\" key; " + expected}},
      {"{\"valid\": \"a\", \"test\": null}", {": no \"train\" key; " + expected}},
      {"{\"train\": \"a\", \"valid\": \"b\"}", {": no \"test\" key; "}},
      {"{\"train\": null, \"valid\": \"b\", \"test\": null}",
       {": \"train\" is null; the training split needs a dataset prefix or `weight prefix` pairs"}},
      {"{\"train\": \"a\", \"valid\": 3, \"test\": null}",
       {": \"valid\" is a JSON number; expected a list of prefixes and weights, one string of them, "
        "or null (no valid data)"}},
      {"{\"train\": \"a\", \"valid\": {\"x\": 1}, \"test\": null}", {": \"valid\" is a JSON object; "}},
      {"{\"train\": \"a\", \"valid\": null, \"test\": [\"a\", true]}",
       {": \"test\"[1] is a JSON boolean; the list holds dataset prefixes (strings) and weights "
        "(numbers or strings)"}},
      {"{\"train\": \"a\", \"valid\": [], \"test\": null}",
       {": \"valid\" is empty; give a dataset prefix or `weight prefix` pairs, or null for no valid data"}},
      {"{\"train\": \" \", \"valid\": null, \"test\": null}", {": \"train\" is empty; "}},
      {"{\"train\": \"a\", \"valid\": \"0.3 a x b\", \"test\": null}",
       {", key \"valid\": unparsable blend weight(s) \"x\"; a blend is `weight prefix weight prefix ...`"}},
      {"{\"train\": [0.5, \"a\", 0.5], \"valid\": null, \"test\": null}",
       {", key \"train\": 3 words starting with the weight 0.5"}},
  };
  for (const auto& c : cases) {
    const std::string file = write("splits.json", c.json);
    const std::string what =
        rejection(dry(1, {"--per-split-data-args-path", file}, {"--mock-data"}));
    SCOPED_TRACE(c.json + "\n" + what);
    EXPECT_NE(what.find("[M-18]"), std::string::npos);
    EXPECT_NE(what.find("--per-split-data-args-path " + file + c.message[0]), std::string::npos);
    for (size_t i = 1; i < c.message.size(); ++i)
      EXPECT_NE(what.find(c.message[i]), std::string::npos) << c.message[i];
  }
  const std::string missing = (dir_ / "missing.json").string();
  EXPECT_NE(rejection(dry(1, {"--per-split-data-args-path", missing}, {"--mock-data"}))
                .find("--per-split-data-args-path " + missing + ": cannot read the file"),
            std::string::npos);
}

}  // namespace
