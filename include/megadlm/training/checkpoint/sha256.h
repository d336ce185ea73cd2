// SHA-256 (FIPS 180-4) for checkpoint file checksums: written while a file is written, checked
// when it is loaded. Our own implementation (no crypto library in the dependency set); the unit
// test pins it to the FIPS test vectors. Not constant-time: integrity, not secrecy, is its job.
// Checkpoints are gigabytes, so x86 CPUs with the SHA extensions (Intel since Ice Lake / Goldmont,
// AMD since Zen) use them (several times faster than the portable code); the two engines give
// the same digests by definition and the unit test compares them.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace megadlm::checkpoint {

class Sha256 {
 public:
  enum class Engine {
    Best,      ///< the SHA instructions when this CPU has them, else portable code
    Portable,  ///< plain C++ everywhere
  };
  explicit Sha256(Engine engine = Engine::Best);
  /// Whether Engine::Best uses the CPU's SHA instructions here.
  static bool hardware_available();
  /// Feeds `bytes` bytes; may be called any number of times.
  void update(const void* data, size_t bytes);
  /// Lower-case hex of the digest; the object must not be updated afterwards.
  std::string hex_digest();

 private:
  void compress(const uint8_t* blocks, size_t count);
  std::array<uint32_t, 8> h_;
  bool hardware_ = false;
  std::array<uint8_t, 64> buf_{};
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
  bool finished_ = false;
};

/// SHA-256 of a whole file; throws naming the file when it cannot be read.
std::string sha256_file(const std::string& path);

}  // namespace megadlm::checkpoint
