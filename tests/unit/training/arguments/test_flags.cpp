// The flag table itself: self-consistency (including defaults inside their own choices), the
// documents generated from it, the nearest-flag suggestion, and Python-style value printing.
#include <gtest/gtest.h>
#include <filesystem>
#include <fstream>
#include <sstream>
#include "megadlm/training/arguments/flags.h"
#include "training/arguments/flag_enums.h"
#include "training/arguments/flag_value.h"

// Test tables name only the fields they need; GCC 12 warns about the omitted members anyway.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

using namespace megadlm::training;

TEST(FlagTable, IsConsistent) {
  const std::vector<std::string> problems = check_flag_table();
  std::string all;
  for (const std::string& p : problems) all += p + "\n";
  EXPECT_TRUE(problems.empty()) << all;
}

// Every flag read as an enum maps each of its choices (and nothing else), so a choice added to
// the table cannot reach RunConfig unmapped.
TEST(FlagTable, EnumFlagsMapEveryChoice) {
  const std::vector<std::string> problems = detail::check_enum_flags();
  std::string all;
  for (const std::string& p : problems) all += p + "\n";
  EXPECT_TRUE(problems.empty()) << all;
  EXPECT_EQ(detail::enum_of_word<megadlm::ShardingStrategy>("optim_grads"),
            megadlm::ShardingStrategy::OptimGrads);
  EXPECT_EQ(detail::enum_of_word<megadlm::ops::AttentionBackend>("fused"),
            megadlm::ops::AttentionBackend::Cudnn);
  EXPECT_THROW(detail::enum_of_word<megadlm::MoeDispatcher>("nccl"), megadlm::Error);
}

TEST(FlagTable, CatchesADefaultOutsideItsChoices) {
  // MegaDLMs' --base-model: default Qwen_2, choices [vanilla]: a default must lie in its own
  // choices.
  const FlagSpec bad[] = {{.name = "--base-model", .kind = FlagKind::String,
                           .default_value = "Qwen_2", .choices = "vanilla", .help = "x"},
                          {.name = "--no-thing", .kind = FlagKind::StoreFalse, .help = "x"},
                          {.name = "--mode", .kind = FlagKind::String, .default_value = "a",
                           .choices = "a b", .not_yet = "c", .help = "x"}};
  const std::vector<std::string> problems = check_flag_table(bad);
  ASSERT_EQ(problems.size(), 3u);
  EXPECT_NE(problems[0].find("--base-model: default 'Qwen_2' is not a valid value"), std::string::npos)
      << problems[0];
  EXPECT_NE(problems[1].find("must name its dest"), std::string::npos) << problems[1];
  EXPECT_NE(problems[2].find("not-yet value 'c' is not among its choices"), std::string::npos);
}

TEST(FlagTable, CoversMegatronAndMegadlmFlags) {
  for (const char* name :
       {"--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
        "--expert-model-parallel-size", "--expert-tensor-parallel-size", "--sequence-parallel",
        "--num-layers-per-virtual-pipeline-stage", "--virtual-pipeline-model-parallel-size",
        "--num-virtual-stages-per-pipeline-rank", "--cp-comm-type",
        "--hierarchical-context-parallel-sizes", "--use-distributed-optimizer",
        "--num-distributed-optimizer-instances", "--data-parallel-sharding-strategy",
        "--use-custom-fsdp", "--use-megatron-fsdp", "--num-layers", "--hidden-size",
        "--ffn-hidden-size", "--num-attention-heads", "--group-query-attention",
        "--num-query-groups", "--kv-channels", "--seq-length", "--max-position-embeddings",
        "--position-embedding-type", "--rotary-base", "--normalization", "--norm-epsilon",
        "--swiglu", "--qk-layernorm", "--disable-bias-linear", "--untie-embeddings-and-output-weights",
        "--vocab-size", "--make-vocab-size-divisible-by", "--init-method-std", "--num-experts",
        "--moe-router-topk", "--micro-batch-size", "--global-batch-size", "--train-iters", "--lr",
        "--min-lr", "--lr-decay-style", "--lr-wsd-decay-style", "--lr-wsd-decay-iters",
        "--lr-warmup-iters", "--lr-warmup-fraction", "--lr-warmup-init", "--lr-decay-iters",
        "--weight-decay", "--adam-beta1", "--adam-beta2", "--adam-eps", "--clip-grad",
        "--optimizer", "--bf16", "--fp16", "--seed", "--mock-data", "--data-path", "--split",
        "--tokenizer-type", "--save", "--load", "--log-interval", "--eval-interval", "--eval-iters",
        "--exit-interval", "--model-running-mode", "--base-model", "--mask-token",
        "--attention-mask-type", "--difflm-varilen-prob", "--device", "--metrics-jsonl",
        "--dry-run", "--world-size", "--dlm-loss-weight", "--dlm-min-masked", "--dlm-t-sampling",
        "--dlm-shift", "--batch-size", "--warmup", "--model-parallel-size",
        "--checkpoint-activations", "--override-opt_param-scheduler"})
    EXPECT_NE(find_flag(name), nullptr) << name;
  EXPECT_EQ(find_flag("--tensor-model-parallel"), nullptr);  // no prefix matching
  EXPECT_EQ(flag_dest(*find_flag("--disable-bias-linear")), "add_bias_linear");
  EXPECT_EQ(flag_dest(*find_flag("--use-megatron-fsdp")), "use_custom_fsdp");
  EXPECT_EQ(flag_dest(*find_flag("--fp8-format")), "fp8");
  EXPECT_EQ(flag_dest(*find_flag("--seq-length")), "seq_length");
}

TEST(FlagTable, SuggestsTheNearestFlag) {
  EXPECT_EQ(nearest_flag("--tensor-parallel-size"), "--tensor-model-parallel-size");
  EXPECT_EQ(nearest_flag("--pipeline-parallel-size"), "--pipeline-model-parallel-size");
  EXPECT_EQ(nearest_flag("--lr-warmup-iter"), "--lr-warmup-iters");
  EXPECT_EQ(nearest_flag("--global-batch"), "--global-batch-size");
  EXPECT_EQ(nearest_flag("--use-dist-optimizer"), "--use-distributed-optimizer");
  EXPECT_EQ(nearest_flag("--zzzzzzzzzzzzzzzzzzzzzz"), "");
}

// Edit distance alone turned `--learning-rate` into `--error-injection-rate`.
// Spellings of other trainers (Hugging Face, PyTorch scripts) map to Megatron's flag first;
// underscores count as dashes.
TEST(FlagTable, SuggestsKnownAliasesBeforeTheNearestName) {
  EXPECT_EQ(nearest_flag("--learning-rate"), "--lr");
  EXPECT_EQ(nearest_flag("--learning_rate"), "--lr");
  EXPECT_EQ(nearest_flag("--min-learning-rate"), "--min-lr");
  EXPECT_EQ(nearest_flag("--max-steps"), "--train-iters");
  EXPECT_EQ(nearest_flag("--warmup-steps"), "--lr-warmup-iters");
  EXPECT_EQ(nearest_flag("--max-grad-norm"), "--clip-grad");
  EXPECT_EQ(nearest_flag("--num-hidden-layers"), "--num-layers");
  EXPECT_EQ(nearest_flag("--num-heads"), "--num-attention-heads");
  EXPECT_EQ(nearest_flag("--intermediate-size"), "--ffn-hidden-size");
  EXPECT_EQ(nearest_flag("--max-seq-length"), "--seq-length");
  EXPECT_EQ(nearest_flag("--per-device-train-batch-size"), "--micro-batch-size");
  EXPECT_EQ(nearest_flag("--output-dir"), "--save");
  EXPECT_EQ(nearest_flag("--adam-epsilon"), "--adam-eps");
  EXPECT_EQ(nearest_flag("--tp"), "--tensor-model-parallel-size");
  // Underscores alone: the flag itself.
  EXPECT_EQ(nearest_flag("--global_batch_size"), "--global-batch-size");
  // An alias is offered only when its flag is in the table searched.
  FlagSpec only;
  only.name = "--error-injection-rate";
  only.kind = FlagKind::Float;
  const std::vector<FlagSpec> small = {only};
  EXPECT_EQ(nearest_flag("--learning-rate", small), "--error-injection-rate");
  // Every alias names a flag of the table.
  for (const auto& [alias, flag] : flag_aliases()) {
    EXPECT_NE(find_flag(flag), nullptr) << alias << " -> " << flag;
    EXPECT_EQ(find_flag(alias), nullptr) << alias << " is a flag itself";
  }
}

TEST(FlagTable, HelpIsGeneratedFromTheTable) {
  const std::string help = format_help();
  EXPECT_EQ(help.rfind("usage: pretrain_difflm [FLAG ...] [@FILE ...]", 0), 0u);
  for (int g = 0; g < static_cast<int>(FlagGroup::kCount); ++g)
    EXPECT_NE(help.find(std::string("\n") + flag_group_title(static_cast<FlagGroup>(g)) + ":\n"),
              std::string::npos);
  for (const FlagSpec& f : flag_table())
    EXPECT_NE(help.find(std::string(f.name)), std::string::npos) << f.name;
  EXPECT_NE(help.find("  -h, --help\n"), std::string::npos);
  EXPECT_NE(help.find("  --tensor-model-parallel-size INT\n"), std::string::npos);
  EXPECT_NE(help.find("  --dlm-t-sampling {iid|stratified|systematic}\n"), std::string::npos);
  std::string flat;  // help text is wrapped; compare with single spaces
  for (const std::string& w : detail::split_words(help)) flat += w + " ";
  EXPECT_NE(flat.find("[not supported yet: stratified, systematic]"), std::string::npos);
}

TEST(FlagTable, DocsFlagsMdIsUpToDate) {
  const std::string md = format_flags_markdown();
  EXPECT_EQ(md.rfind("<!-- autogenerated by scripts/gen_flags_doc.sh, do not edit -->\n", 0), 0u);
  EXPECT_NE(md.find("| `--base-model` | `{vanilla}` | `vanilla` | implemented |"), std::string::npos);
  const std::filesystem::path doc =
      std::filesystem::path(__FILE__).parent_path() / ".." / ".." / ".." / ".." / "docs" / "flags.md";
  std::ifstream in(doc);
  ASSERT_TRUE(in) << "cannot read " << doc;
  std::stringstream committed;
  committed << in.rdbuf();
  EXPECT_TRUE(committed.str() == md)
      << "docs/flags.md is out of date with src/training/arguments/flag_table.cpp; regenerate it with "
         "scripts/gen_flags_doc.sh";
}

TEST(FlagValues, PrintLikePython) {
  using detail::python_float_repr;
  EXPECT_EQ(python_float_repr(1e-5), "1e-05");
  EXPECT_EQ(python_float_repr(1e-8), "1e-08");
  EXPECT_EQ(python_float_repr(0.0001), "0.0001");
  EXPECT_EQ(python_float_repr(2e-4), "0.0002");
  EXPECT_EQ(python_float_repr(0.1), "0.1");
  EXPECT_EQ(python_float_repr(1.0), "1.0");
  EXPECT_EQ(python_float_repr(0.0), "0.0");
  EXPECT_EQ(python_float_repr(-1.5), "-1.5");
  EXPECT_EQ(python_float_repr(4294967296.0), "4294967296.0");
  EXPECT_EQ(python_float_repr(1e16), "1e+16");
  EXPECT_EQ(python_float_repr(123456.789), "123456.789");
  EXPECT_EQ(detail::python_repr(std::vector<std::string>{"p2p", "a2a"}), "['p2p', 'a2a']");
  EXPECT_EQ(detail::python_repr(std::vector<int64_t>{2, 4}), "[2, 4]");
  EXPECT_EQ(detail::python_repr(detail::FlagValue{}), "None");
  EXPECT_EQ(detail::python_repr(true), "True");
}
