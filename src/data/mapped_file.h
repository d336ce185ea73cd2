// A read-only memory map of a whole file (internal to the data module). Errors name the file.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace megadlm::data {

class MappedFile {
 public:
  /// Maps `path`; `what` names the file's role in error messages (".idx", ".bin").
  MappedFile(const std::string& path, const char* what);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const unsigned char* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const unsigned char* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace megadlm::data
