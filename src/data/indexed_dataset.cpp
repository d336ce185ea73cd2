#include "megadlm/data/indexed_dataset.h"
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cerrno>
#include <cstring>
#include <limits>
#include "data/mapped_file.h"
#include "megadlm/core/error.h"

namespace megadlm::data {

namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr size_t kHeaderBytes = 34;  // magic 9 + version 8 + dtype 1 + counts 8 + 8

template <typename T>
T load(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // the .idx arrays are not aligned (they start at byte 34)
  return v;
}

bool valid_code(uint8_t c) { return c >= 1 && c <= 8; }

int64_t token_at(const unsigned char* p, IndexDType t) {
  switch (t) {
    case IndexDType::UInt8: return load<uint8_t>(p);
    case IndexDType::Int8: return load<int8_t>(p);
    case IndexDType::Int16: return load<int16_t>(p);
    case IndexDType::Int32: return load<int32_t>(p);
    case IndexDType::Int64: return load<int64_t>(p);
    case IndexDType::UInt16: return load<uint16_t>(p);
    default: return -1;
  }
}

int64_t dtype_max(IndexDType t) {
  switch (t) {
    case IndexDType::UInt8: return 255;
    case IndexDType::Int8: return 127;
    case IndexDType::Int16: return 32767;
    case IndexDType::UInt16: return 65535;
    case IndexDType::Int32: return std::numeric_limits<int32_t>::max();
    default: return std::numeric_limits<int64_t>::max();
  }
}

}  // namespace

size_t index_dtype_size(IndexDType t) {
  switch (t) {
    case IndexDType::UInt8:
    case IndexDType::Int8: return 1;
    case IndexDType::Int16:
    case IndexDType::UInt16: return 2;
    case IndexDType::Int32:
    case IndexDType::Float32: return 4;
    case IndexDType::Int64:
    case IndexDType::Float64: return 8;
  }
  return 0;
}

const char* index_dtype_name(IndexDType t) {
  switch (t) {
    case IndexDType::UInt8: return "uint8";
    case IndexDType::Int8: return "int8";
    case IndexDType::Int16: return "int16";
    case IndexDType::Int32: return "int32";
    case IndexDType::Int64: return "int64";
    case IndexDType::Float64: return "float64";
    case IndexDType::Float32: return "float32";
    case IndexDType::UInt16: return "uint16";
  }
  return "?";
}

IndexDType optimal_index_dtype(int64_t vocab_size) {
  return vocab_size < 65500 ? IndexDType::UInt16 : IndexDType::Int32;
}

// ---------------------------------------------------------------------------------- MappedFile

MappedFile::MappedFile(const std::string& path, const char* what) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    MDLM_FAIL("cannot open the dataset ", what, " file ", path, ": ", std::strerror(errno),
              " (a --data-path prefix P needs both P.idx and P.bin)");
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    MDLM_FAIL("cannot stat ", path, ": ", std::strerror(errno));
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      MDLM_FAIL("cannot memory-map ", path, ": ", std::strerror(errno));
    }
    data_ = static_cast<const unsigned char*>(p);
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<unsigned char*>(data_), size_);
}

// ------------------------------------------------------------------------------ IndexedDataset

IndexedDataset::IndexedDataset(const std::string& prefix) : prefix_(prefix) {
  idx_ = std::make_unique<MappedFile>(idx_path(), ".idx");
  bin_ = std::make_unique<MappedFile>(bin_path(), ".bin");
  const std::string& ip = idx_->path();
  const unsigned char* h = idx_->data();
  if (idx_->size() < kHeaderBytes)
    MDLM_FAIL(ip, ": truncated index: ", idx_->size(), " bytes, smaller than the ", kHeaderBytes,
              "-byte MMIDIDX header");
  if (std::memcmp(h, kMagic, sizeof kMagic) != 0)
    MDLM_FAIL(ip, ": not a Megatron indexed-dataset index (the file does not start with the "
                  "MMIDIDX magic); write it with preprocess_data");
  const uint64_t version = load<uint64_t>(h + 9);
  if (version != 1)
    MDLM_FAIL(ip, ": index version ", version, " is not supported (valid: 1)");
  const uint8_t code = h[17];
  if (!valid_code(code))
    MDLM_FAIL(ip, ": unknown dtype code ", static_cast<int>(code),
              " (valid: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16)");
  dtype_ = static_cast<IndexDType>(code);
  if (dtype_ == IndexDType::Float32 || dtype_ == IndexDType::Float64)
    MDLM_FAIL(ip, ": dtype ", index_dtype_name(dtype_), " holds no token ids (valid token "
                  "dtypes: uint8, int8, int16, uint16, int32, int64)");
  const uint64_t n = load<uint64_t>(h + 18);
  const uint64_t d = load<uint64_t>(h + 26);
  // Sizes in 128 bits' worth of care: a corrupted count must not overflow the expected size.
  const unsigned __int128 expected =
      static_cast<unsigned __int128>(kHeaderBytes) + static_cast<unsigned __int128>(n) * 12u +
      static_cast<unsigned __int128>(d) * 8u;
  const size_t actual = idx_->size();
  if (static_cast<unsigned __int128>(actual) < expected)
    MDLM_FAIL(ip, ": truncated index: the header announces ", n, " sequences and ", d,
              " document-index entries (", static_cast<uint64_t>(expected), " bytes) but the file has ",
              actual, " bytes");
  if (static_cast<unsigned __int128>(actual) != expected &&
      static_cast<unsigned __int128>(actual) != expected + n)
    MDLM_FAIL(ip, ": the file has ", actual, " bytes but its header announces ", n,
              " sequences and ", d, " document-index entries (", static_cast<uint64_t>(expected),
              " bytes, or ", static_cast<uint64_t>(expected + n), " with sequence modes): corrupted");
  num_sequences_ = static_cast<int64_t>(n);
  num_doc_entries_ = static_cast<int64_t>(d);
  lengths_at_ = kHeaderBytes;
  pointers_at_ = lengths_at_ + n * 4;
  documents_at_ = pointers_at_ + n * 8;
  if (n == 0) MDLM_FAIL(ip, ": empty dataset (0 sequences)");
  if (d < 2) MDLM_FAIL(ip, ": empty dataset (", d, " document-index entries, no document)");

  // Document index: 0, non-decreasing, ends at N.
  if (document_index(0) != 0)
    MDLM_FAIL(ip, ": corrupted document index: entry 0 is ", document_index(0), ", expected 0");
  for (int64_t i = 1; i < num_doc_entries_; ++i) {
    const int64_t a = document_index(i - 1), b = document_index(i);
    if (b < a || b > num_sequences_)
      MDLM_FAIL(ip, ": corrupted document index: entry ", i, " is ", b, " after ", a,
                " (entries must rise from 0 to the ", n, " sequences)");
  }
  if (document_index(num_doc_entries_ - 1) != num_sequences_)
    MDLM_FAIL(ip, ": corrupted document index: the last entry is ",
              document_index(num_doc_entries_ - 1), ", expected the sequence count ", n);

  // Sequences lie back to back in the .bin, as Megatron writes them, and fill it exactly.
  const int64_t item = static_cast<int64_t>(index_dtype_size(dtype_));
  int64_t expected_pointer = 0;
  for (int64_t i = 0; i < num_sequences_; ++i) {
    const int32_t len = sequence_length(i);
    const int64_t ptr = sequence_pointer(i);
    if (len < 0) MDLM_FAIL(ip, ": corrupted index: sequence ", i, " has length ", len);
    if (ptr != expected_pointer)
      MDLM_FAIL(ip, ": corrupted index: sequence ", i, " starts at byte ", ptr, " of the .bin, "
                "expected ", expected_pointer, " (the end of sequence ", i - 1, ")");
    expected_pointer += static_cast<int64_t>(len) * item;
    num_tokens_ += len;
  }
  if (static_cast<uint64_t>(expected_pointer) != bin_->size())
    MDLM_FAIL(bin_->path(), ": size mismatch: the file has ", bin_->size(), " bytes but ", ip,
              " describes ", num_tokens_, " ", index_dtype_name(dtype_), " tokens (",
              expected_pointer, " bytes)", bin_->size() < static_cast<uint64_t>(expected_pointer)
                                               ? ": the .bin is truncated" : "");
  if (num_tokens_ == 0) MDLM_FAIL(ip, ": empty dataset (", n, " sequences, 0 tokens)");
}

IndexedDataset::~IndexedDataset() = default;

int32_t IndexedDataset::sequence_length(int64_t i) const {
  return load<int32_t>(idx_->data() + lengths_at_ + static_cast<size_t>(i) * 4);
}

int64_t IndexedDataset::sequence_pointer(int64_t i) const {
  return load<int64_t>(idx_->data() + pointers_at_ + static_cast<size_t>(i) * 8);
}

int64_t IndexedDataset::document_index(int64_t i) const {
  return load<int64_t>(idx_->data() + documents_at_ + static_cast<size_t>(i) * 8);
}

void IndexedDataset::read(int64_t i, int64_t offset, int64_t length, std::vector<int32_t>& out) const {
  MDLM_CHECK(i >= 0 && i < num_sequences_, prefix_, ": sequence ", i, " out of range [0, ",
             num_sequences_, ")");
  const int64_t len = sequence_length(i);
  MDLM_CHECK(offset >= 0 && length >= 0 && offset + length <= len, prefix_, ": tokens [", offset,
             ", ", offset + length, ") outside sequence ", i, " of ", len, " tokens");
  const size_t item = index_dtype_size(dtype_);
  const unsigned char* p = bin_->data() + sequence_pointer(i) + static_cast<size_t>(offset) * item;
  const size_t base = out.size();
  out.resize(base + static_cast<size_t>(length));
  if (dtype_ == IndexDType::Int32) {
    std::memcpy(out.data() + base, p, static_cast<size_t>(length) * 4);
    return;
  }
  for (int64_t k = 0; k < length; ++k) {
    const int64_t v = token_at(p + static_cast<size_t>(k) * item, dtype_);
    if (v < 0 || v > std::numeric_limits<int32_t>::max())
      MDLM_FAIL(bin_path(), ": token ", offset + k, " of sequence ", i, " is ", v,
                ", not a valid token id");
    out[base + static_cast<size_t>(k)] = static_cast<int32_t>(v);
  }
}

std::vector<int32_t> IndexedDataset::sequence(int64_t i) const {
  std::vector<int32_t> out;
  read(i, 0, sequence_length(i), out);
  return out;
}

void IndexedDataset::check_token_ids(int64_t vocab_size, uint64_t max_bytes) const {
  const size_t item = index_dtype_size(dtype_);
  const uint64_t limit = max_bytes == 0 ? bin_->size() : std::min<uint64_t>(max_bytes, bin_->size());
  const unsigned char* p = bin_->data();
  int64_t seq = 0, seq_end = sequence_length(0);
  for (uint64_t b = 0, t = 0; b + item <= limit; b += item, ++t) {
    const int64_t v = token_at(p + b, dtype_);
    if (v < 0 || v >= vocab_size) {
      while (seq + 1 < num_sequences_ && static_cast<int64_t>(t) >= seq_end)
        seq_end += sequence_length(++seq);
      const int64_t within = static_cast<int64_t>(t) - (seq_end - sequence_length(seq));
      MDLM_FAIL(bin_path(), ": token id ", v, " at token ", within, " of sequence ", seq,
                " is outside the vocabulary [0, ", vocab_size, "): the data was tokenized with a "
                "different tokenizer, or --vocab-size / --tokenizer-model do not match it");
    }
  }
}

// ------------------------------------------------------------------------ IndexedDatasetWriter

IndexedDatasetWriter::IndexedDatasetWriter(const std::string& prefix, IndexDType dtype)
    : prefix_(prefix), dtype_(dtype) {
  MDLM_CHECK(dtype != IndexDType::Float32 && dtype != IndexDType::Float64,
             "token files need an integer dtype, got ", index_dtype_name(dtype));
  const std::string path = prefix + ".bin";
  bin_ = std::fopen(path.c_str(), "wb");
  if (bin_ == nullptr) MDLM_FAIL("cannot create ", path, ": ", std::strerror(errno));
}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  if (!finalized_) {
    try {
      finalize();
    } catch (...) {
      // A destructor must not throw; callers that care call finalize() themselves.
    }
  }
}

void IndexedDatasetWriter::add_sequence(std::span<const int32_t> tokens) {
  MDLM_CHECK(!finalized_, prefix_, ": add_sequence after finalize");
  const size_t item = index_dtype_size(dtype_);
  const int64_t max = dtype_max(dtype_);
  buffer_.resize(tokens.size() * item);
  for (size_t k = 0; k < tokens.size(); ++k) {
    const int64_t v = tokens[k];
    if (v < 0 || v > max)
      MDLM_FAIL(prefix_, ".bin: token id ", v, " does not fit the dtype ", index_dtype_name(dtype_));
    char* dst = buffer_.data() + k * item;
    switch (dtype_) {
      case IndexDType::UInt8: { uint8_t x = static_cast<uint8_t>(v); std::memcpy(dst, &x, 1); break; }
      case IndexDType::Int8: { int8_t x = static_cast<int8_t>(v); std::memcpy(dst, &x, 1); break; }
      case IndexDType::Int16: { int16_t x = static_cast<int16_t>(v); std::memcpy(dst, &x, 2); break; }
      case IndexDType::UInt16: { uint16_t x = static_cast<uint16_t>(v); std::memcpy(dst, &x, 2); break; }
      case IndexDType::Int32: { int32_t x = static_cast<int32_t>(v); std::memcpy(dst, &x, 4); break; }
      default: { int64_t x = v; std::memcpy(dst, &x, 8); break; }
    }
  }
  if (!buffer_.empty() && std::fwrite(buffer_.data(), 1, buffer_.size(), bin_) != buffer_.size())
    MDLM_FAIL(prefix_, ".bin: write failed: ", std::strerror(errno));
  MDLM_CHECK(tokens.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()),
             prefix_, ": a sequence of ", tokens.size(), " tokens exceeds the format's int32 lengths");
  lengths_.push_back(static_cast<int32_t>(tokens.size()));
  num_tokens_ += static_cast<int64_t>(tokens.size());
}

void IndexedDatasetWriter::end_document() {
  documents_.push_back(static_cast<int64_t>(lengths_.size()));
}

void IndexedDatasetWriter::finalize() {
  if (finalized_) return;
  finalized_ = true;
  const bool closed_ok = std::fclose(bin_) == 0;
  bin_ = nullptr;
  if (!closed_ok) MDLM_FAIL(prefix_, ".bin: write failed on close: ", std::strerror(errno));
  const std::string path = prefix_ + ".idx";
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) MDLM_FAIL("cannot create ", path, ": ", std::strerror(errno));
  bool ok = std::fwrite(kMagic, 1, sizeof kMagic, f) == sizeof kMagic;
  const uint64_t version = 1;
  const uint8_t code = static_cast<uint8_t>(dtype_);
  const uint64_t n = lengths_.size(), d = documents_.size();
  ok = ok && std::fwrite(&version, 8, 1, f) == 1 && std::fwrite(&code, 1, 1, f) == 1 &&
       std::fwrite(&n, 8, 1, f) == 1 && std::fwrite(&d, 8, 1, f) == 1;
  ok = ok && (n == 0 || std::fwrite(lengths_.data(), 4, n, f) == n);
  const int64_t item = static_cast<int64_t>(index_dtype_size(dtype_));
  std::vector<int64_t> pointers(n);
  int64_t at = 0;
  for (size_t i = 0; i < n; ++i) {
    pointers[i] = at;
    at += static_cast<int64_t>(lengths_[i]) * item;
  }
  ok = ok && (n == 0 || std::fwrite(pointers.data(), 8, n, f) == n);
  ok = ok && std::fwrite(documents_.data(), 8, d, f) == d;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) MDLM_FAIL(path, ": write failed: ", std::strerror(errno));
}

}  // namespace megadlm::data
