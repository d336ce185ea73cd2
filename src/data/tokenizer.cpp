// --tokenizer-type dispatch, Megatron's NullTokenizer, and the loader of the SentencePiece
// plugin (libmegadlm_sentencepiece.so, built when libsentencepiece-dev is found; loaded with
// dlopen from the directory of libmegadlm so the library runs on machines without it).
#include "megadlm/data/tokenizer.h"
#include <dlfcn.h>
#include <filesystem>
#include <sstream>
#include "megadlm/core/error.h"

namespace megadlm::data {

namespace {

// Megatron's NullTokenizer: the text is whitespace-separated token ids. megadlm takes
// --vocab-size as the whole vocabulary, so EOD is its last id (Megatron adds one id for EOD).
class NullTokenizer final : public Tokenizer {
 public:
  explicit NullTokenizer(int64_t vocab) : vocab_(vocab) {
    MDLM_CHECK(vocab >= 2, "NullTokenizer needs --vocab-size >= 2, got ", vocab);
  }
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> out;
    std::istringstream in{std::string(text)};
    std::string w;
    while (in >> w) {
      char* end = nullptr;
      const long v = std::strtol(w.c_str(), &end, 10);
      if (*end != '\0' || v < 0 || v >= vocab_)
        MDLM_FAIL("NullTokenizer: \"", w, "\" is not a token id in [0, ", vocab_, ")");
      out.push_back(static_cast<int32_t>(v));
    }
    return out;
  }
  std::string decode(std::span<const int32_t> ids) const override {
    std::string out;
    for (int32_t id : ids) {
      if (!out.empty()) out += ' ';
      out += std::to_string(id);
    }
    return out;
  }
  int64_t vocab_size() const override { return vocab_; }
  int32_t eod() const override { return static_cast<int32_t>(vocab_ - 1); }
  std::string describe() const override {
    return "NullTokenizer (" + std::to_string(vocab_) + " ids, EOD " + std::to_string(eod()) + ")";
  }

 private:
  int64_t vocab_;
};

using PluginLoad = Tokenizer* (*)(const char* path, const char* flavour, char* error, size_t error_len);

PluginLoad sentencepiece_plugin(std::string* why_not) {
  static std::string error;
  static PluginLoad load = [] () -> PluginLoad {
    Dl_info info{};
    std::filesystem::path dir;
    if (dladdr(reinterpret_cast<void*>(&sentencepiece_available), &info) != 0 && info.dli_fname != nullptr)
      dir = std::filesystem::path(info.dli_fname).parent_path();
    const std::string lib = (dir / "libmegadlm_sentencepiece.so").string();
    if (!std::filesystem::exists(lib)) {
      error = "this build of megadlm has no SentencePiece support (" + lib + " is missing: install "
              "libsentencepiece-dev and rebuild)";
      return nullptr;
    }
    void* h = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      error = std::string("cannot load the SentencePiece plugin: ") + dlerror() +
              " (is libsentencepiece installed on this machine?)";
      return nullptr;
    }
    auto f = reinterpret_cast<PluginLoad>(dlsym(h, "megadlm_sentencepiece_load"));
    if (f == nullptr) error = lib + " lacks megadlm_sentencepiece_load";
    return f;
  }();
  if (why_not != nullptr) *why_not = error;
  return load;
}

}  // namespace

bool sentencepiece_available(std::string* why_not) { return sentencepiece_plugin(why_not) != nullptr; }

std::unique_ptr<Tokenizer> load_tokenizer(const TokenizerConfig& c) {
  const std::string& t = c.type;
  if (t == "HuggingFaceTokenizer") {
    if (c.model.empty()) MDLM_FAIL("--tokenizer-type HuggingFaceTokenizer needs --tokenizer-model");
    return load_huggingface_tokenizer(c.model);
  }
  if (t == "GPT2BPETokenizer") {
    if (c.vocab_file.empty() || c.merge_file.empty())
      MDLM_FAIL("--tokenizer-type GPT2BPETokenizer needs --vocab-file and --merge-file");
    return load_gpt2_bpe_tokenizer(c.vocab_file, c.merge_file);
  }
  if (t == "SentencePieceTokenizer" || t == "GPTSentencePieceTokenizer" || t == "Llama2Tokenizer") {
    if (c.model.empty()) MDLM_FAIL("--tokenizer-type ", t, " needs --tokenizer-model (a .model file)");
    std::string why;
    PluginLoad load = sentencepiece_plugin(&why);
    if (load == nullptr) MDLM_FAIL("--tokenizer-type ", t, ": ", why);
    char error[1024] = {0};
    Tokenizer* tok = load(c.model.c_str(), t.c_str(), error, sizeof error);
    if (tok == nullptr) MDLM_FAIL("--tokenizer-model ", c.model, ": ", error);
    return std::unique_ptr<Tokenizer>(tok);
  }
  if (t == "NullTokenizer") return std::make_unique<NullTokenizer>(c.vocab_size);
  MDLM_FAIL("--tokenizer-type ", t, " is not supported; valid: ", kTokenizerTypes);
}

}  // namespace megadlm::data
