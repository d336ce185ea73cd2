// Tokenizers with Megatron's --tokenizer-type names: text -> token ids for the preprocessor, and
// the EOD id and decoding for training. Byte-level BPE (Hugging Face tokenizer.json of GPT-2,
// GPT-NeoX, Llama-3 or Qwen2 style; GPT-2 vocab.json + merges.txt) is built in; SentencePiece
// models go through libsentencepiece in a plugin library loaded on first use, so libmegadlm
// itself never depends on it. docs/data.md lists what each type reads and supports.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace megadlm::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  /// Token ids of `text`, as Megatron's tokenizer.tokenize(text) gives them (for Hugging Face
  /// tokenizers: with the post-processor's special tokens, e.g. Llama-3's BOS). Thread-safe.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  /// Text of `ids` (special tokens included as their text), always well-formed UTF-8: byte-level
  /// tokens that end inside a character, or bytes that form none, become U+FFFD, as in Hugging
  /// Face's decoder and Megatron's GPT-2 tokenizer (errors="replace"). Thread-safe.
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  /// Number of ids (Megatron's tokenizer.vocab_size: base vocabulary plus added tokens).
  virtual int64_t vocab_size() const = 0;
  /// End-of-document id appended by --append-eod and used by --eod-mask-loss; -1 if none.
  virtual int32_t eod() const = 0;
  /// One line for logs: type and source.
  virtual std::string describe() const = 0;
};

/// What the tokenizer flags say (Megatron's spellings in comments).
struct TokenizerConfig {
  std::string type;         ///< --tokenizer-type
  std::string model;        ///< --tokenizer-model: tokenizer.json (or its directory), .model file
  std::string vocab_file;   ///< --vocab-file (GPT2BPETokenizer: vocab.json / encoder.json)
  std::string merge_file;   ///< --merge-file (GPT2BPETokenizer: merges.txt / vocab.bpe)
  int64_t vocab_size = 0;   ///< --vocab-size (NullTokenizer)
};

/// Loads the tokenizer the flags describe; throws megadlm::Error naming the flag, the file and
/// what is wrong. Supported types: HuggingFaceTokenizer, GPT2BPETokenizer,
/// SentencePieceTokenizer, GPTSentencePieceTokenizer, Llama2Tokenizer (the three via
/// libsentencepiece when this build has it), NullTokenizer.
std::unique_ptr<Tokenizer> load_tokenizer(const TokenizerConfig& config);

/// The types load_tokenizer knows, space separated (the programs' --tokenizer-type choices).
inline constexpr std::string_view kTokenizerTypes =
    "HuggingFaceTokenizer GPT2BPETokenizer SentencePieceTokenizer GPTSentencePieceTokenizer Llama2Tokenizer "
    "NullTokenizer";

/// Whether this build can load SentencePiece models (the plugin was built and loads), and if
/// not, why.
bool sentencepiece_available(std::string* why_not = nullptr);

/// Hugging Face tokenizer.json (a file, or a directory holding tokenizer.json and optionally
/// tokenizer_config.json / special_tokens_map.json naming the EOS token).
std::unique_ptr<Tokenizer> load_huggingface_tokenizer(const std::string& path);
/// GPT-2's vocab.json (encoder.json) and merges.txt (vocab.bpe); EOD is <|endoftext|>.
std::unique_ptr<Tokenizer> load_gpt2_bpe_tokenizer(const std::string& vocab_file,
                                                   const std::string& merge_file);

}  // namespace megadlm::data
