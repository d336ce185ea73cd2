// convert_checkpoint: megadlm checkpoints <-> Hugging Face folders, and checks of both.
// Thin by design: the mapping, the formats and the forward pass are library calls
// (training/checkpoint/huggingface.h); docs/checkpoints.md documents the mapping.
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
// 2 bad arguments or a reported error.
#include <sys/wait.h>
#include <unistd.h>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>
#include "megadlm/core/device.h"
#include "megadlm/core/error.h"
#include "megadlm/core/logging.h"
#include "megadlm/core/stream.h"
#include "megadlm/training/checkpoint/checkpoint.h"
#include "megadlm/training/checkpoint/config_json.h"
#include "megadlm/training/checkpoint/huggingface.h"
#include "megadlm/training/checkpoint/safetensors.h"

using namespace megadlm;
using namespace megadlm::checkpoint;
namespace fs = std::filesystem;

namespace {

const char* kUsage =
    "usage:\n"
    "  convert_checkpoint --to-hf --load DIR [--ckpt-step N] --out HF_DIR [--dtype fp32|bf16]\n"
    "                     [--tokenizer-dir DIR] [--max-shard-size-gb G] [--hf-format F] [--verify [VERIFY OPTIONS]]\n"
    "  convert_checkpoint --from-hf HF_DIR --save DIR [--dtype fp32|bf16] [--mask-token N]\n"
    "                     [--seq-length S] [--hf-format F] [--verify [VERIFY OPTIONS]]\n"
    "  --hf-format qwen (default) | sdar | fast_dllm_v2 | llada: the public format's names and config keys\n"
    "  convert_checkpoint --compare A B [--tolerance T] [--all]   (--all: optimizer state too)\n"
    "  convert_checkpoint --check DIR [--ckpt-step N]\n"
    "verify options: --verify-device cpu|cuda (default: cuda when a GPU is visible; cuda compares in bf16)\n"
    "  --hf-device cpu|cuda (where transformers runs; default: --verify-device)\n"
    "  --verify-batch B (2) --verify-seq S (64) --verify-seed N (1234) --python PATH (python3)\n"
    "  --hf-verify-script PATH (default: scripts/hf_verify.py next to the build)\n"
    "  --verify-max-abs X --verify-mean-abs X --verify-loss-diff X (thresholds; defaults by dtype)\n";

struct Args {
  std::map<std::string, std::string> values;
  std::vector<std::string> positional;
  bool help = false;
  bool has(const std::string& k) const { return values.count(k) != 0; }
  std::string get(const std::string& k, const std::string& def = "") const {
    auto it = values.find(k);
    return it == values.end() ? def : it->second;
  }
  double num(const std::string& k, double def) const {
    if (!has(k)) return def;
    const std::string& text = values.at(k);
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v))
      throw Error("`" + k + " " + text + "`: expected a finite number");
    return v;
  }
  /// The whole value as an integer in [low, high] (std::stoll would take "12abc" and say only
  /// "stoll" for "abc").
  int64_t integer(const std::string& k, int64_t low, int64_t high) const {
    const std::string& text = values.at(k);
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE)
      throw Error("`" + k + " " + text + "`: expected an integer");
    if (v < low || v > high)
      throw Error("`" + k + " " + text + "`: must be between " + std::to_string(low) + " and " +
                  std::to_string(high));
    return v;
  }
};

Args parse(int argc, char** argv) {
  static const char* kFlags[] = {"--to-hf", "--verify", "--check", "--compare", "--all"};
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string t = argv[i];
    if (t == "-h" || t == "--help") {
      a.help = true;
      continue;
    }
    if (t.rfind("--", 0) != 0) {
      a.positional.push_back(t);
      continue;
    }
    bool flag = false;
    for (const char* f : kFlags) flag = flag || t == f;
    if (flag) {
      a.values[t] = std::string(1, '1');  // (not = "1": GCC 12 warns falsely)
      continue;
    }
    if (i + 1 >= argc) MDLM_FAIL("`", t, "` expects a value");
    a.values[t] = argv[++i];
  }
  static const char* kKnown[] = {"--to-hf", "--verify", "--check", "--compare", "--all", "--load", "--ckpt-step", "--out",
                                 "--dtype", "--tokenizer-dir", "--max-shard-size-gb", "--from-hf", "--save", "--hf-format",
                                 "--mask-token", "--seq-length", "--tolerance", "--verify-device", "--verify-batch",
                                 "--verify-seq", "--verify-seed", "--hf-device", "--python", "--hf-verify-script",
                                 "--verify-max-abs", "--verify-mean-abs", "--verify-loss-diff"};
  for (const auto& [k, v] : a.values) {
    bool known = false;
    for (const char* f : kKnown) known = known || k == f;
    if (!known) MDLM_FAIL("unknown flag `", k, "`\n", kUsage);
  }
  return a;
}

std::optional<DType> dtype_flag(const Args& a) {
  if (!a.has("--dtype")) return std::nullopt;
  const std::string d = a.get("--dtype");
  if (d == "fp32") return DType::F32;
  if (d == "bf16") return DType::BF16;
  MDLM_FAIL("`--dtype ", d, "`: valid: fp32, bf16");
}

std::string locate_checkpoint(const std::string& dir, const Args& a) {
  std::optional<int64_t> step;
  if (a.has("--ckpt-step")) step = a.integer("--ckpt-step", 0, INT64_MAX);
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

std::string find_verify_script(const Args& a, const char* argv0) {
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

VerifyResult verify(const CheckpointReader& reader, const std::string& hf_dir, const Args& a, const char* argv0) {
  VerifyResult res;
  const std::string python = a.get("--python", "python3");
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
  if (dev != "cpu" && dev != "cuda") MDLM_FAIL("`--verify-device ", dev, "`: valid: cpu, cuda");
  const bool bf16 = dev == "cuda";  // megadlm's CUDA backend computes in bf16, its CPU one in fp32
  // transformers may run elsewhere: an fp32 check of a big model is quick on the GPU (TF32 off).
  const std::string hf_dev = a.get("--hf-device", dev);
  if (hf_dev != "cpu" && hf_dev != "cuda") MDLM_FAIL("`--hf-device ", hf_dev, "`: valid: cpu, cuda");
  const int64_t batch = static_cast<int64_t>(a.num("--verify-batch", 2));
  const int64_t seq = static_cast<int64_t>(a.num("--verify-seq", 64));
  std::mt19937_64 rng(static_cast<uint64_t>(a.num("--verify-seed", 1234)));
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
  const double max_abs_tol = a.num("--verify-max-abs", bf16 ? INFINITY : 1e-4);
  const double mean_abs_tol = a.num("--verify-mean-abs", bf16 ? 1e-2 : INFINITY);
  const double loss_tol = a.num("--verify-loss-diff", bf16 ? 5e-3 : 1e-5);
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

HfFormat hf_format_flag(const Args& a) {
  const std::optional<HfFormat> f = hf_format_from_name(a.get("--hf-format"));
  if (!f) MDLM_FAIL("`--hf-format ", a.get("--hf-format"), "`: valid: qwen, sdar, fast_dllm_v2, llada");
  return *f;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse(argc, argv);
    if (a.help) {
      std::cout << kUsage;
      return 0;
    }
    const int modes = a.has("--to-hf") + a.has("--from-hf") + a.has("--compare") + a.has("--check");
    if (modes != 1) {
      logging::error("give exactly one of --to-hf, --from-hf, --compare, --check\n", kUsage);
      return 2;
    }
    if (a.has("--check")) {
      if (a.positional.size() != 1) MDLM_FAIL("--check takes one directory\n", kUsage);
      const CheckpointReader reader(locate_checkpoint(a.positional[0], a));
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
      if (a.positional.size() != 2) MDLM_FAIL("--compare takes two paths\n", kUsage);
      return compare(a.positional[0], a.positional[1], a.num("--tolerance", 0.0), a.has("--all"));
    }
    if (!a.positional.empty()) MDLM_FAIL("unexpected argument `", a.positional[0], "`\n", kUsage);
    if (a.has("--to-hf")) {
      if (!a.has("--load") || !a.has("--out")) MDLM_FAIL("--to-hf needs --load DIR and --out HF_DIR\n", kUsage);
      const CheckpointReader reader(locate_checkpoint(a.get("--load"), a));
      reader.verify_files(reader.files_with({kModelPrefix}), nullptr, Stream::cpu());
      HfExportOptions o;
      o.dtype = dtype_flag(a);
      o.tokenizer_dir = a.get("--tokenizer-dir");
      o.max_shard_bytes = static_cast<uint64_t>(a.num("--max-shard-size-gb", 5.0) * 1e9);
      if (a.has("--hf-format")) o.format = hf_format_flag(a);
      export_hf(reader, a.get("--out"), o);
      std::cout << "wrote the Hugging Face folder " << a.get("--out") << " from " << reader.dir() << "\n";
      if (a.has("--verify")) {
        const VerifyResult v = verify(reader, a.get("--out"), a, argv[0]);
        if (!v.skipped && !v.passed) return 1;
      }
      return 0;
    }
    // --from-hf
    if (!a.has("--save")) MDLM_FAIL("--from-hf needs --save DIR\n", kUsage);
    HfImportOptions o;
    o.dtype = dtype_flag(a);
    if (a.has("--mask-token")) o.mask_token = a.integer("--mask-token", 0, INT32_MAX);
    if (a.has("--seq-length")) o.seq_length = static_cast<int>(a.integer("--seq-length", 1, INT32_MAX));
    if (a.has("--hf-format")) o.format = hf_format_flag(a);
    import_hf(a.get("--from-hf"), a.get("--save"), o);
    const CheckpointReader reader(checkpoint_dir(a.get("--save"), kReleaseDirName));
    std::cout << "wrote the megadlm checkpoint " << reader.dir() << " (start training from it with --load "
              << a.get("--save") << " or --finetune; --use-checkpoint-args takes the model flags from it)\n";
    if (a.has("--verify")) {
      const VerifyResult v = verify(reader, a.get("--from-hf"), a, argv[0]);
      if (!v.skipped && !v.passed) return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    logging::error(e.what());
    return 2;
  }
}
