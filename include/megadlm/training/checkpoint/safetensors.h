// The safetensors file format, our own reader and writer: 8 bytes of little-endian header
// length N, N bytes of JSON {"__metadata__": {str: str}, key: {"dtype", "shape", "data_offsets":
// [begin, end)}} padded with spaces so the data starts 8-byte aligned, then the raw row-major
// little-endian data (offsets relative to its start, no holes, no overlaps). Hugging Face
// folders and megadlm checkpoints both use it (docs/checkpoints.md).
// The reader treats the file as untrusted: every number in the header is checked against the
// file before it is used, and every error names the file (and the key).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>
#include "megadlm/core/dtype.h"
#include "megadlm/core/tensor.h"

namespace megadlm::checkpoint {

class InputFile;

/// safetensors' name of a dtype ("F32", "BF16", ...).
const char* safetensors_dtype_name(DType t);
/// The DType of a safetensors dtype name, or nullopt for names megadlm does not hold (U8, BOOL, ...).
std::optional<DType> dtype_from_safetensors(const std::string& name);

/// One tensor to write: `numel(shape)` elements of `dtype` at `data` (host memory).
struct SafetensorsEntry {
  std::string key;
  DType dtype = DType::F32;
  Shape shape;
  const void* data = nullptr;
};

struct WrittenFile {
  std::string path;
  uint64_t bytes = 0;
  std::string sha256;  ///< of the whole file, computed from the bytes as they were written
};

/// Writes (and fsyncs) one safetensors file; entries are laid out in the order given.
WrittenFile write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                              const std::map<std::string, std::string>& metadata = {});

/// A parsed, validated safetensors file, read lazily.
class SafetensorsFile {
 public:
  struct Entry {
    std::string dtype_name;         ///< as written in the header
    std::optional<DType> dtype;     ///< nullopt when megadlm has no such dtype
    Shape shape;
    uint64_t begin = 0, end = 0;    ///< byte range relative to the start of the data
    int64_t numel() const { return shape_numel(shape); }
  };

  /// Opens and validates `path`: throws naming the file for a bad or truncated header, a key
  /// whose byte range does not match its dtype and shape, overlapping ranges or holes, or data
  /// shorter than the header promises ("truncated").
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();

  const std::string& path() const;
  const std::map<std::string, Entry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& key) const { return entries_.count(key) != 0; }
  const Entry& entry(const std::string& key) const;

  /// Raw bytes of elements [first, first + count) of `key` into `dst`.
  void read_elements(const std::string& key, int64_t first, int64_t count, void* dst) const;
  /// The whole tensor as a host tensor of its own dtype.
  Tensor read(const std::string& key) const;

 private:
  std::unique_ptr<InputFile> file_;
  uint64_t data_start_ = 0;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace megadlm::checkpoint
