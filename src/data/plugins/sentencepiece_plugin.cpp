// libmegadlm_sentencepiece.so: SentencePiece models behind megadlm's Tokenizer interface. A
// separate library so that libmegadlm never links libsentencepiece (machines without it still
// load libmegadlm; data/tokenizer.cpp dlopens this plugin when a SentencePiece type is asked for).
// Flavours follow Megatron: GPTSentencePieceTokenizer and SentencePieceTokenizer encode plainly
// (EOD = the model's eos id), Llama2Tokenizer prepends the model's BOS.
#include <sentencepiece_processor.h>
#include <cstring>
#include <memory>
#include "megadlm/data/tokenizer.h"

namespace {

class SentencePieceTokenizer final : public megadlm::data::Tokenizer {
 public:
  SentencePieceTokenizer(std::string path, std::string flavour)
      : path_(std::move(path)), flavour_(std::move(flavour)) {}
  bool load(std::string& error) {
    const auto status = sp_.Load(path_);
    if (!status.ok()) {
      error = "cannot load the SentencePiece model: " + status.ToString();
      return false;
    }
    return true;
  }
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int> ids;
    sp_.Encode(text, &ids).IgnoreError();
    std::vector<int32_t> out;
    if (flavour_ == "Llama2Tokenizer" && sp_.bos_id() >= 0) out.push_back(sp_.bos_id());
    out.insert(out.end(), ids.begin(), ids.end());
    return out;
  }
  std::string decode(std::span<const int32_t> ids) const override {
    std::vector<int> v(ids.begin(), ids.end());
    std::string out;
    sp_.Decode(v, &out).IgnoreError();
    return out;
  }
  int64_t vocab_size() const override { return sp_.GetPieceSize(); }
  int32_t eod() const override { return sp_.eos_id(); }
  std::string describe() const override {
    return flavour_ + " (" + path_ + ", " + std::to_string(vocab_size()) + " ids, EOD " +
           std::to_string(eod()) + ")";
  }

 private:
  std::string path_, flavour_;
  sentencepiece::SentencePieceProcessor sp_;
};

}  // namespace

extern "C" __attribute__((visibility("default"))) megadlm::data::Tokenizer*
megadlm_sentencepiece_load(const char* path, const char* flavour, char* error, size_t error_len) {
  auto t = std::make_unique<SentencePieceTokenizer>(path, flavour);
  std::string why;
  if (!t->load(why)) {
    std::strncpy(error, why.c_str(), error_len - 1);
    return nullptr;
  }
  return t.release();
}
