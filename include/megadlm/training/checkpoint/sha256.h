// SHA-256 (FIPS 180-4) for checkpoint file checksums: written while a file is written, checked
// when it is loaded. Our own implementation (no crypto library in the dependency set); the unit
// test pins it to the FIPS test vectors. Not constant-time: integrity, not secrecy, is its job.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace megadlm::checkpoint {

class Sha256 {
 public:
  Sha256();
  /// Feeds `bytes` bytes; may be called any number of times.
  void update(const void* data, size_t bytes);
  /// Lower-case hex of the digest; the object must not be updated afterwards.
  std::string hex_digest();

 private:
  void compress(const uint8_t* block);
  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buf_{};
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
  bool finished_ = false;
};

/// SHA-256 of a whole file; throws naming the file when it cannot be read.
std::string sha256_file(const std::string& path);

}  // namespace megadlm::checkpoint
