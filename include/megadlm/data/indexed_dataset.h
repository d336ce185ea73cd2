// Megatron's indexed dataset (the "MMIDIDX" format that tools/preprocess_data.py writes): a
// PREFIX.bin of raw token ids and a PREFIX.idx describing them. Read memory-mapped, written by
// megadlm's preprocessor byte for byte as Megatron writes it. Sample construction over these
// sequences lives in data/gpt_dataset.h; the format is described in docs/data.md.
//
// PREFIX.idx, little endian, no padding:
//   offset 0   9 bytes   magic "MMIDIDX\0\0"
//   offset 9   u64       version (1)
//   offset 17  u8        dtype code of the .bin tokens (IndexDType)
//   offset 18  u64       N = number of sequences
//   offset 26  u64       D = number of document-index entries (documents + 1)
//   offset 34  i32[N]    sequence lengths (tokens)
//              i64[N]    sequence pointers (byte offset of each sequence in the .bin)
//              i64[D]    document indices: 0, then the sequence index one past each document
//              (i8[N]    sequence modes, multimodal datasets only; ignored here)
// PREFIX.bin: the sequences' tokens, back to back, in the dtype of the header.
#pragma once
#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace megadlm::data {

/// Megatron's dtype codes (indexed_dataset.DType).
enum class IndexDType : uint8_t {
  UInt8 = 1,
  Int8 = 2,
  Int16 = 3,
  Int32 = 4,
  Int64 = 5,
  Float64 = 6,
  Float32 = 7,
  UInt16 = 8,
};

/// Bytes per element of a dtype.
size_t index_dtype_size(IndexDType t);
/// numpy's name of a dtype ("uint16").
const char* index_dtype_name(IndexDType t);
/// The token dtype Megatron's preprocessor picks for a vocabulary: uint16 below 65500 ids,
/// else int32 (DType.optimal_dtype).
IndexDType optimal_index_dtype(int64_t vocab_size);

class MappedFile;

/// A read-only, memory-mapped PREFIX.idx + PREFIX.bin pair. Opening validates the whole index
/// (magic, version, dtype, sizes, pointers, document indices, .bin size) and throws
/// megadlm::Error naming the file and what is wrong.
class IndexedDataset {
 public:
  explicit IndexedDataset(const std::string& prefix);
  ~IndexedDataset();
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  const std::string& prefix() const { return prefix_; }
  std::string idx_path() const { return prefix_ + ".idx"; }
  std::string bin_path() const { return prefix_ + ".bin"; }
  IndexDType dtype() const { return dtype_; }
  int64_t num_sequences() const { return num_sequences_; }
  /// Documents (document-index entries minus one).
  int64_t num_documents() const { return num_doc_entries_ - 1; }
  int64_t num_tokens() const { return num_tokens_; }

  int32_t sequence_length(int64_t i) const;
  int64_t sequence_pointer(int64_t i) const;
  /// Entry i of the document index, i in [0, num_documents()].
  int64_t document_index(int64_t i) const;

  /// Appends tokens [offset, offset + length) of sequence `i` to `out`.
  void read(int64_t i, int64_t offset, int64_t length, std::vector<int32_t>& out) const;
  /// Token ids of the whole sequence `i`.
  std::vector<int32_t> sequence(int64_t i) const;

  /// Scans the .bin and throws on the first token id outside [0, vocab_size), naming the file,
  /// the sequence and the token. Scans at most `max_bytes` from the start (0: everything).
  void check_token_ids(int64_t vocab_size, uint64_t max_bytes = 0) const;

 private:
  std::string prefix_;
  std::unique_ptr<MappedFile> idx_, bin_;
  IndexDType dtype_ = IndexDType::Int32;
  int64_t num_sequences_ = 0, num_doc_entries_ = 0, num_tokens_ = 0;
  size_t lengths_at_ = 0, pointers_at_ = 0, documents_at_ = 0;  // byte offsets in the .idx
};

/// Writes PREFIX.bin as sequences arrive and PREFIX.idx at finalize(), as Megatron's
/// IndexedDatasetBuilder does (one sequence per document unless add_sequence is used).
class IndexedDatasetWriter {
 public:
  IndexedDatasetWriter(const std::string& prefix, IndexDType dtype);
  ~IndexedDatasetWriter();

  /// One sequence of a document still open (Megatron's add_item).
  void add_sequence(std::span<const int32_t> tokens);
  /// Closes the current document (Megatron's end_document).
  void end_document();
  /// add_sequence + end_document.
  void add_document(std::span<const int32_t> tokens) {
    add_sequence(tokens);
    end_document();
  }
  /// Writes PREFIX.idx and closes both files. Called by the destructor if not called.
  void finalize();

  int64_t num_sequences() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t num_tokens() const { return num_tokens_; }

 private:
  std::string prefix_;
  IndexDType dtype_;
  std::FILE* bin_ = nullptr;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> documents_{0};
  std::vector<char> buffer_;
  int64_t num_tokens_ = 0;
  bool finalized_ = false;
};

}  // namespace megadlm::data
