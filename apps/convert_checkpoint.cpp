// convert_checkpoint: megadlm checkpoints <-> Hugging Face folders, and checks of both.
// Thin by design: the mapping, the formats and the forward pass are library calls
// (training/checkpoint/huggingface.h); docs/checkpoints.md documents the mapping. The flags are
// the table in flags() below (tool_cli.h parses them and prints --help from them).
//
//   convert_checkpoint --to-hf --load DIR [--ckpt-step N] --out HF_DIR [--dtype fp32|bf16]
//                      [--tokenizer-dir DIR] [--max-shard-size-gb G] [--verify ...]
//   convert_checkpoint --from-hf HF_DIR --save DIR [--dtype fp32|bf16] [--mask-token N]
//                      [--seq-length S] [--hf-format F] [--verify ...]
// --hf-format qwen (default), sdar, fast_dllm_v2 or llada: the public format written by --to-hf
// (names and config.json keys, docs/checkpoints.md "Block-diffusion formats"); --from-hf reads
// the format its config.json's model_type names and, given the flag, refuses another.
//   convert_checkpoint --compare A B [--tolerance T] [--all]  (checkpoints or Hugging Face folders;
//                      model weights, with --all the optimizer state too)
//   convert_checkpoint --check DIR [--ckpt-step N]      (verify every file of a checkpoint)
// --verify runs the same random tokens through megadlm's forward pass and through transformers
// (scripts/hf_verify.py, bidirectional attention patched in) and asserts the logits agree:
// fp32 on the CPU (max |diff| <= 1e-4, loss diff <= 1e-5) or bf16 on CUDA (mean |diff| <= 1e-2,
// loss diff <= 5e-3); without python3 + transformers it says why it skipped.
// Exit codes: 0 success or verification skipped; 1 a comparison or verification failed;
// 2 bad arguments or a reported error; 3 an unexpected failure.
#include <sys/wait.h>
#include <unistd.h>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>
#include "megadlm/core/device.h"
#include "megadlm/core/error.h"
#include "megadlm/core/stream.h"
#include "megadlm/training/checkpoint/checkpoint.h"
#include "megadlm/training/checkpoint/config_json.h"
#include "megadlm/training/checkpoint/huggingface.h"
#include "megadlm/training/checkpoint/safetensors.h"
#include "tool_cli.h"

using namespace megadlm;
using namespace megadlm::checkpoint;
namespace fs = std::filesystem;

namespace {

const char* kUsage =
    "usage:\n"
    "  convert_checkpoint --to-hf --load DIR [--ckpt-step N] --out HF_DIR [--dtype fp32|bf16]\n"
    "                     [--tokenizer-dir DIR] [--max-shard-size-gb G] [--hf-format F] [--verify [VERIFY FLAGS]]\n"
    "  convert_checkpoint --from-hf HF_DIR --save DIR [--dtype fp32|bf16] [--mask-token N]\n"
    "                     [--seq-length S] [--hf-format F] [--verify [VERIFY FLAGS]]\n"
    "  convert_checkpoint --compare A B [--tolerance T] [--all]\n"
    "  convert_checkpoint --check DIR [--ckpt-step N]\n"
    "Exit codes: 0 success or verification skipped; 1 a comparison or verification failed; 2 bad arguments\n"
    "or a reported error; 3 an unexpected failure. docs/checkpoints.md has the mapping and the formats.";

std::vector<apps::CliFlag> flags() {
  using training::FlagKind;
  return {
      {.name = "--to-hf", .value = nullptr, .help = "mode: write a Hugging Face folder from a megadlm checkpoint"},
      {.name = "--from-hf", .value = "HF_DIR", .help = "mode: write a megadlm checkpoint (release) from a Hugging Face folder"},
      {.name = "--compare", .value = "A B", .help = "mode: compare the model weights of two checkpoints or Hugging Face "
                                                   "folders, bitwise (or --tolerance)",
       .kind = FlagKind::StringList},
      {.name = "--check", .value = "DIR", .help = "mode: verify every file of a checkpoint (sizes and SHA-256)"},
      {.name = "--load", .value = "DIR", .help = "--to-hf: the megadlm checkpoint directory (its latest checkpoint)"},
      {.name = "--ckpt-step", .value = "N", .help = "--to-hf, --check: iteration N instead of the latest",
       .kind = FlagKind::Int, .range = "[0, inf)"},
      {.name = "--out", .value = "HF_DIR", .help = "--to-hf: the Hugging Face folder to write"},
      {.name = "--save", .value = "DIR", .help = "--from-hf: the megadlm checkpoint directory to write"},
      {.name = "--dtype", .value = "D", .help = "dtype of the written weights (default: the source's)",
       .choices = "fp32 bf16"},
      {.name = "--hf-format", .value = "F",
       .help = "the public format's names and config keys (docs/checkpoints.md): --to-hf writes it (default qwen); "
               "--from-hf reads the format config.json's model_type names and, given this flag, refuses another",
       .choices = "qwen sdar fast_dllm_v2 llada"},
      {.name = "--tokenizer-dir", .value = "DIR", .help = "--to-hf: copy the tokenizer files of DIR into the folder"},
      {.name = "--max-shard-size-gb", .value = "G", .help = "--to-hf: largest safetensors shard in GB",
       .kind = FlagKind::Float, .default_value = "5", .range = "(0, inf)"},
      {.name = "--mask-token", .value = "N", .help = "--from-hf: the mask token id of the checkpoint",
       .kind = FlagKind::Int, .range = "[0, 2147483647]"},
      {.name = "--seq-length", .value = "S", .help = "--from-hf: the checkpoint's --seq-length",
       .kind = FlagKind::Int, .range = "[1, 2147483647]"},
      {.name = "--tolerance", .value = "T", .help = "--compare: largest |difference| that counts as equal",
       .kind = FlagKind::Float, .default_value = "0", .range = "[0, inf)"},
      {.name = "--all", .value = nullptr, .help = "--compare: the optimizer state too"},
      {.name = "--verify", .value = nullptr,
       .help = "--to-hf, --from-hf: run the same random tokens through megadlm and transformers "
               "(scripts/hf_verify.py) and compare the logits; skipped, saying why, without transformers"},
      {.name = "--verify-device", .value = "D",
       .help = "--verify: where megadlm runs (default: cuda when a GPU is visible; cuda compares in bf16)",
       .choices = "cpu cuda"},
      {.name = "--hf-device", .value = "D", .help = "--verify: where transformers runs (default: --verify-device)",
       .choices = "cpu cuda"},
      {.name = "--verify-batch", .value = "B", .help = "--verify: samples", .kind = FlagKind::Int,
       .default_value = "2", .range = "[1, inf)"},
      {.name = "--verify-seq", .value = "S", .help = "--verify: tokens per sample", .kind = FlagKind::Int,
       .default_value = "64", .range = "[1, inf)"},
      {.name = "--verify-seed", .value = "N", .help = "--verify: seed of the random tokens", .kind = FlagKind::Int,
       .default_value = "1234", .range = "[0, inf)"},
      {.name = "--python", .value = "PATH", .help = "--verify: the Python that runs transformers",
       .default_value = "python3"},
      {.name = "--hf-verify-script", .value = "PATH",
       .help = "--verify: the Hugging Face side (default: scripts/hf_verify.py next to the build)"},
      {.name = "--verify-max-abs", .value = "X",
       .help = "--verify: largest |logit difference| allowed (default: 1e-4 in fp32, none in bf16)",
       .kind = FlagKind::Float, .range = "[0, inf)"},
      {.name = "--verify-mean-abs", .value = "X",
       .help = "--verify: largest mean |logit difference| allowed (default: none in fp32, 1e-2 in bf16)",
       .kind = FlagKind::Float, .range = "[0, inf)"},
      {.name = "--verify-loss-diff", .value = "X",
       .help = "--verify: largest loss difference allowed (default: 1e-5 in fp32, 5e-3 in bf16)",
       .kind = FlagKind::Float, .range = "[0, inf)"},
  };
}

std::optional<DType> dtype_flag(const apps::Cli& a) {
  if (!a.has("--dtype")) return std::nullopt;
  return a.get("--dtype") == "bf16" ? DType::BF16 : DType::F32;  // the table allows these two
}

std::string locate_checkpoint(const std::string& dir, const apps::Cli& a) {
  std::optional<int64_t> step;
  if (a.has("--ckpt-step")) step = a.integer("--ckpt-step");
  const std::optional<std::string> found = find_checkpoint(dir, step);
  if (!found) MDLM_FAIL(dir, " holds no checkpoint (no ", kLatestFileName, ")");
  return *found;
}

// ------------------------------------------------------------------------------- --verify

struct VerifyResult {
  bool skipped = false;
  bool passed = false;
};

/// Runs a shell command; true on exit status 0. With `output`, its stdout (trimmed) is kept.
bool run(const std::string& command, std::string* output = nullptr) {
  if (output == nullptr) {
    const int rc = std::system(command.c_str());
    return rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) == 0;
  }
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return false;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p) != nullptr) *output += buf;
  const int rc = ::pclose(p);
  while (!output->empty() && std::isspace(static_cast<unsigned char>(output->back()))) output->pop_back();
  return rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) == 0;
}

std::string quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string find_verify_script(const apps::Cli& a, const char* argv0) {
  if (a.has("--hf-verify-script")) return a.get("--hf-verify-script");
  std::error_code ec;
  const fs::path exe = fs::canonical(fs::path("/proc/self/exe"), ec);
  const fs::path base = ec ? fs::path(argv0).parent_path() : exe.parent_path();
  for (const fs::path& p : {base / "../../scripts/hf_verify.py", base / "../scripts/hf_verify.py",
                            base / "../share/megadlm/hf_verify.py"})
    if (fs::exists(p)) return fs::weakly_canonical(p).string();
  MDLM_FAIL("cannot find scripts/hf_verify.py next to this program; pass --hf-verify-script PATH");
}

// Mean over tokens of -log softmax(logits)[label], in double.
double mean_ce(const float* logits, const std::vector<int32_t>& labels, int64_t vocab) {
  double total = 0;
  for (size_t t = 0; t < labels.size(); ++t) {
    const float* row = logits + static_cast<int64_t>(t) * vocab;
    double mx = row[0];
    for (int64_t v = 1; v < vocab; ++v) mx = std::max(mx, static_cast<double>(row[v]));
    double sum = 0;
    for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(row[v]) - mx);
    total += std::log(sum) + mx - row[labels[t]];
  }
  return total / static_cast<double>(labels.size());
}

// Elementwise and loss differences between two logit arrays [tokens, vocab].
struct LogitDiff {
  double max_abs = 0, mean_abs = 0, max_logit = 0, loss_a = 0, loss_b = 0;
  int64_t where = 0;  // flat index of the largest difference
  double loss_diff() const { return std::fabs(loss_a - loss_b); }
};

LogitDiff logit_diff(const float* a, const float* b, int64_t n, const std::vector<int32_t>& labels, int64_t vocab) {
  LogitDiff d;
  double sum_abs = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double diff = std::fabs(static_cast<double>(a[i]) - b[i]);
    sum_abs += diff;
    d.max_logit = std::max(d.max_logit, std::fabs(static_cast<double>(b[i])));
    if (diff > d.max_abs) {
      d.max_abs = diff;
      d.where = i;
    }
  }
  d.mean_abs = sum_abs / static_cast<double>(n);
  d.loss_a = mean_ce(a, labels, vocab);
  d.loss_b = mean_ce(b, labels, vocab);
  return d;
}

VerifyResult verify(const CheckpointReader& reader, const std::string& hf_dir, const apps::Cli& a, const char* argv0) {
  VerifyResult res;
  const std::string python = a.get("--python");
  const std::string script = find_verify_script(a, argv0);
  // The script says whether its dependencies import here (exit 0) or why not.
  std::string why;
  if (!run(quoted(python) + " " + quoted(script) + " --probe", &why)) {
    std::cout << "verify: SKIPPED: " << script << " cannot run here: "
              << (why.empty() ? "`" + python + "` failed" : why)
              << " (run --verify where Python has transformers, e.g. the GPU machine)\n";
    res.skipped = true;
    return res;
  }
  const RunConfig cfg = run_config_from_json(reader.index().state.run_config_json, reader.dir());
  const std::string dev = a.get("--verify-device", cuda_device_count() > 0 ? "cuda" : "cpu");
  const bool bf16 = dev == "cuda";  // megadlm's CUDA backend computes in bf16, its CPU one in fp32
  // transformers may run elsewhere: an fp32 check of a big model is quick on the GPU (TF32 off).
  const std::string hf_dev = a.get("--hf-device", dev);
  const int64_t batch = a.integer("--verify-batch");
  const int64_t seq = a.integer("--verify-seq");
  std::mt19937_64 rng(static_cast<uint64_t>(a.integer("--verify-seed")));
  std::vector<int32_t> tokens(static_cast<size_t>(batch * seq));
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(cfg.model.vocab_size));

  char tmpl[] = "/tmp/megadlm_verify_XXXXXX";
  const std::string work = ::mkdtemp(tmpl);
  std::vector<int64_t> ids(tokens.begin(), tokens.end());
  write_safetensors(work + "/input_ids.safetensors", {{"input_ids", DType::I64, {batch, seq}, ids.data()}});
  const Tensor ours = checkpoint_logits(reader, tokens, batch, seq, dev == "cuda" ? Device::cuda(0) : Device::cpu());
  const std::string hf_out = work + "/hf_logits.safetensors", ref_out = work + "/hf_fp32_logits.safetensors";
  const std::string cmd = quoted(python) + " " + quoted(script) + " --model " + quoted(hf_dir) + " --input " +
                          quoted(work + "/input_ids.safetensors") + " --output " + quoted(hf_out) +
                          " --dtype " + (bf16 ? "bf16" : "fp32") + " --device " + hf_dev +
                          (bf16 ? " --fp32-reference " + quoted(ref_out) : "") +
                          (cfg.model.attention_mask == AttentionMaskType::Causal ? " --causal" : "");
  std::cout << "verify: running " << cmd << "\n" << std::flush;
  if (!run(cmd)) MDLM_FAIL(script, " failed (its output is above)");
  const int64_t vocab = cfg.model.padded_vocab_size;
  const auto read_logits = [&](const std::string& file) {
    const Tensor t = SafetensorsFile(file).read("logits");
    MDLM_CHECK(t.numel() == ours.numel(), "Hugging Face logits in ", file, " have ", t.numel(), " elements, ours ",
               ours.numel(), " (vocabulary ", vocab, ")");
    return t.dtype() == DType::F32 ? t : t.to(Device::cpu(), DType::F32, Stream::cpu());
  };
  const Tensor hf = read_logits(hf_out);
  const LogitDiff d = logit_diff(ours.data<float>(), hf.data<float>(), ours.numel(), tokens, vocab);
  // Thresholds (docs/checkpoints.md): fp32 differences are reassociation only; bf16 ones
  // are bf16 rounding of activations and weights on both sides.
  const auto threshold = [&](const char* flag, double fallback) { return a.has(flag) ? a.number(flag) : fallback; };
  const double max_abs_tol = threshold("--verify-max-abs", bf16 ? INFINITY : 1e-4);
  const double mean_abs_tol = threshold("--verify-mean-abs", bf16 ? 1e-2 : INFINITY);
  const double loss_tol = threshold("--verify-loss-diff", bf16 ? 5e-3 : 1e-5);
  res.passed = d.max_abs <= max_abs_tol && d.mean_abs <= mean_abs_tol && d.loss_diff() <= loss_tol;
  const int64_t tok = d.where / vocab;
  std::printf("verify: %s (%s, megadlm on %s, transformers on %s, %lld x %lld tokens, vocabulary %lld): largest |logit difference| %.3e "
              "at sample %lld position %lld token %lld (logits up to %.3g); mean |difference| %.3e; "
              "loss megadlm %.7f, transformers %.7f (difference %.3e); thresholds: max %.1e, mean %.1e, loss %.1e\n",
              res.passed ? "PASSED" : "FAILED", bf16 ? "bf16" : "fp32", dev.c_str(), hf_dev.c_str(),
              static_cast<long long>(batch),
              static_cast<long long>(seq), static_cast<long long>(vocab), d.max_abs, static_cast<long long>(tok / seq),
              static_cast<long long>(tok % seq), static_cast<long long>(d.where % vocab), d.max_logit, d.mean_abs,
              d.loss_a, d.loss_b, d.loss_diff(), max_abs_tol, mean_abs_tol, loss_tol);
  if (bf16) {
    // Both bf16 implementations measured against transformers in fp32 (same weights): how far
    // transformers' own bf16 run lands is the noise floor any bf16 implementation has.
    const Tensor ref = read_logits(ref_out);
    const LogitDiff ours_ref = logit_diff(ours.data<float>(), ref.data<float>(), ours.numel(), tokens, vocab);
    const LogitDiff hf_ref = logit_diff(hf.data<float>(), ref.data<float>(), ours.numel(), tokens, vocab);
    std::printf("verify: against transformers fp32 (same weights): megadlm bf16 max |diff| %.3e, mean %.3e, loss "
                "diff %.3e; transformers bf16 (the noise floor) max |diff| %.3e, mean %.3e, loss diff %.3e\n",
                ours_ref.max_abs, ours_ref.mean_abs, ours_ref.loss_diff(), hf_ref.max_abs, hf_ref.mean_abs,
                hf_ref.loss_diff());
  }
  fs::remove_all(work);
  return res;
}

// ------------------------------------------------------------------------------- --compare

// A checkpoint or a Hugging Face folder, as name -> tensor with Hugging Face names.
class Source {
 public:
  Source(const std::string& path, bool with_optimizer) {
    if (fs::exists(fs::path(path) / "config.json")) {
      hf_ = std::make_unique<HfWeights>(path);
      for (const std::string& n : hf_->names()) names_[n] = n;
    } else {
      std::optional<std::string> dir = find_checkpoint(path, std::nullopt);
      if (!dir) MDLM_FAIL(path, " is neither a Hugging Face folder (config.json) nor a megadlm checkpoint");
      ck_ = std::make_unique<CheckpointReader>(*dir);
      for (const auto& [name, t] : ck_->index().tensors)
        if (with_optimizer || name.rfind(kModelPrefix, 0) == 0) names_[name] = name;
    }
  }
  bool is_hf() const { return hf_ != nullptr; }
  /// Use Hugging Face names for the model tensors (to compare with a Hugging Face folder).
  void use_hf_names() {
    if (hf_) return;
    std::map<std::string, std::string> renamed;
    for (const auto& [shown, real] : names_)
      renamed[real.rfind(kModelPrefix, 0) == 0 ? hf_tensor_name(real.substr(std::string(kModelPrefix).size())) : shown] = real;
    names_ = renamed;
  }
  const std::map<std::string, std::string>& names() const { return names_; }
  Tensor read(const std::string& shown) const {
    const std::string& real = names_.at(shown);
    return hf_ ? hf_->read(real) : ck_->read_whole(real);
  }

 private:
  std::unique_ptr<HfWeights> hf_;
  std::unique_ptr<CheckpointReader> ck_;
  std::map<std::string, std::string> names_;
};

int compare(const std::string& a_path, const std::string& b_path, double tolerance, bool all) {
  Source a(a_path, all), b(b_path, all);
  if (a.is_hf() != b.is_hf()) {
    a.use_hf_names();
    b.use_hf_names();
  }
  int64_t equal = 0, differ = 0, missing = 0;
  double worst = 0;
  std::string worst_name;
  for (const auto& [name, real] : a.names()) {
    if (!b.names().count(name)) {
      // Zero biases an export adds (Qwen2 q/k/v, Qwen3 o_proj) have no megadlm counterpart.
      if (!a.is_hf() || b.is_hf() || name.find(".bias") == std::string::npos) {
        std::cout << "only in " << a_path << ": " << name << "\n";
        ++missing;
      }
      continue;
    }
    const Tensor x = a.read(name), y = b.read(name);
    if (x.shape() != y.shape()) {
      std::cout << "shape differs: " << name << " " << shape_str(x.shape()) << " vs " << shape_str(y.shape()) << "\n";
      ++differ;
      continue;
    }
    const bool same_bytes = x.dtype() == y.dtype() && std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
    double diff = 0;
    if (!same_bytes) {
      const Tensor xf = x.to(Device::cpu(), DType::F64, Stream::cpu());
      const Tensor yf = y.to(Device::cpu(), DType::F64, Stream::cpu());
      for (int64_t i = 0; i < x.numel(); ++i)
        diff = std::max(diff, std::fabs(xf.data<double>()[i] - yf.data<double>()[i]));
    }
    if (diff > worst) {
      worst = diff;
      worst_name = name;
    }
    if (same_bytes || diff <= tolerance) ++equal;
    else {
      ++differ;
      std::cout << "differs: " << name << " (largest |difference| " << diff << ")\n";
    }
  }
  for (const auto& [name, real] : b.names())
    if (!a.names().count(name) && (!b.is_hf() || a.is_hf() || name.find(".bias") == std::string::npos)) {
      std::cout << "only in " << b_path << ": " << name << "\n";
      ++missing;
    }
  std::cout << "compare: " << equal << " tensors equal" << (tolerance > 0 ? " within the tolerance" : " (bitwise)")
            << ", " << differ << " differ, " << missing << " present on one side only; largest |difference| "
            << worst << (worst_name.empty() ? "" : " in " + worst_name) << "\n";
  return differ == 0 && missing == 0 ? 0 : 1;
}

HfFormat hf_format_flag(const apps::Cli& a) {
  return *hf_format_from_name(a.get("--hf-format"));  // the table's choices are the format names
}

// The mode's own flags, checked together: every problem at once, as a ConfigError.
void check_mode(const apps::Cli& a) {
  std::vector<std::string> errors;
  const int modes = a.has("--to-hf") + a.has("--from-hf") + a.has("--compare") + a.has("--check");
  if (modes != 1)
    errors.push_back("give exactly one of `--to-hf`, `--from-hf DIR`, `--compare A B`, `--check DIR` (" +
                     std::to_string(modes) + " given)");
  if (a.has("--compare") && a.all("--compare").size() != 2)
    errors.push_back("`--compare` takes two paths (checkpoints or Hugging Face folders), got " +
                     std::to_string(a.all("--compare").size()));
  if (a.has("--to-hf") && !a.has("--load")) errors.push_back("`--to-hf` needs `--load DIR`");
  if (a.has("--to-hf") && !a.has("--out")) errors.push_back("`--to-hf` needs `--out HF_DIR`");
  if (a.has("--from-hf") && !a.has("--save")) errors.push_back("`--from-hf` needs `--save DIR`");
  if (!errors.empty()) throw ConfigError(errors, {});
}

int run_mode(const apps::Cli& a, const char* argv0) {
  check_mode(a);
  if (a.has("--check")) {
    const CheckpointReader reader(locate_checkpoint(a.get("--check"), a));
    std::vector<std::string> files;
    for (const auto& [name, f] : reader.index().files) files.push_back(name);
    reader.verify_files(files, nullptr, Stream::cpu());
    const CheckpointState& st = reader.index().state;
    std::cout << "check: " << reader.dir() << " is complete: "
              << (reader.index().checksummed ? "the index (its SHA-256) and " : "the index (written without a checksum), ")
              << files.size() << " files verified (sizes and "
              << "SHA-256), " << reader.index().tensors.size() << " tensors; iteration " << st.iteration
              << ", consumed samples " << st.consumed_samples << (st.has_optimizer ? ", with" : ", without")
              << " optimizer state; saved under " << st.saved_under << "\n";
    return 0;
  }
  if (a.has("--compare")) {
    const std::vector<std::string> paths = a.all("--compare");
    return compare(paths[0], paths[1], a.number("--tolerance"), a.has("--all"));
  }
  if (a.has("--to-hf")) {
    const CheckpointReader reader(locate_checkpoint(a.get("--load"), a));
    reader.verify_files(reader.files_with({kModelPrefix}), nullptr, Stream::cpu());
    HfExportOptions o;
    o.dtype = dtype_flag(a);
    o.tokenizer_dir = a.get("--tokenizer-dir");
    o.max_shard_bytes = static_cast<uint64_t>(a.number("--max-shard-size-gb") * 1e9);
    if (a.has("--hf-format")) o.format = hf_format_flag(a);
    export_hf(reader, a.get("--out"), o);
    std::cout << "wrote the Hugging Face folder " << a.get("--out") << " from " << reader.dir() << "\n";
    if (a.has("--verify")) {
      const VerifyResult v = verify(reader, a.get("--out"), a, argv0);
      if (!v.skipped && !v.passed) return 1;
    }
    return 0;
  }
  // --from-hf
  HfImportOptions o;
  o.dtype = dtype_flag(a);
  if (a.has("--mask-token")) o.mask_token = a.integer("--mask-token");
  if (a.has("--seq-length")) o.seq_length = static_cast<int>(a.integer("--seq-length"));
  if (a.has("--hf-format")) o.format = hf_format_flag(a);
  import_hf(a.get("--from-hf"), a.get("--save"), o);
  const CheckpointReader reader(checkpoint_dir(a.get("--save"), kReleaseDirName));
  std::cout << "wrote the megadlm checkpoint " << reader.dir() << " (start training from it with --load "
            << a.get("--save") << " or --finetune; --use-checkpoint-args takes the model flags from it)\n";
  if (a.has("--verify")) {
    const VerifyResult v = verify(reader, a.get("--from-hf"), a, argv0);
    if (!v.skipped && !v.passed) return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return apps::tool_main(argc, argv, {"convert_checkpoint", kUsage, flags()},
                         [&](const apps::Cli& cli) { return run_mode(cli, argv[0]); });
}
