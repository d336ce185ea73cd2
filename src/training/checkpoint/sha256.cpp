#include "megadlm/training/checkpoint/sha256.h"
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>
#include <vector>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif
#include "megadlm/core/error.h"

namespace megadlm::checkpoint {

namespace {

constexpr uint32_t kRound[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

inline uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

// One 64-byte block, FIPS 180-4 section 6.2.2 as written.
void compress_portable(uint32_t* state, const uint8_t* p) {
  uint32_t w[64];
  for (int i = 0; i < 16; ++i)
    w[i] = (uint32_t{p[4 * i]} << 24) | (uint32_t{p[4 * i + 1]} << 16) |
           (uint32_t{p[4 * i + 2]} << 8) | uint32_t{p[4 * i + 3]};
  for (int i = 16; i < 64; ++i) {
    const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
    const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = state[0], b = state[1], c = state[2], d = state[3], e = state[4], f = state[5],
           g = state[6], h = state[7];
  for (int i = 0; i < 64; ++i) {
    const uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) +
                        kRound[i] + w[i];
    const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  state[0] += a; state[1] += b; state[2] += c; state[3] += d;
  state[4] += e; state[5] += f; state[6] += g; state[7] += h;
}

#if defined(__x86_64__) && defined(__GNUC__)
#define MDLM_SHA_NI 1
// FIPS 180-4 rounds with the SHA extensions. The state lives in two registers in the order the
// instructions want: (A, B, E, F) and (C, D, G, H), highest lane first. Each group of four rounds
// adds the round constants to four message words; sha256rnds2 does two rounds on the low two
// lanes. Message words 16..63 come four at a time from the previous sixteen:
// W[t] = s1(W[t-2]) + W[t-7] + s0(W[t-15]) + W[t-16], where msg1 adds the s0 terms, alignr
// provides W[t-7] and msg2 adds the s1 terms (feeding its own results for the last two lanes).
__attribute__((target("sha,sse4.1,ssse3"))) void compress_sha_ni(uint32_t* state, const uint8_t* p,
                                                                 size_t count) {
  const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bLL, 0x0405060700010203LL);
  __m128i t = _mm_shuffle_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(state)), 0xB1);  // C D A B
  __m128i efgh = _mm_shuffle_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(state + 4)), 0x1B);
  __m128i abef = _mm_alignr_epi8(t, efgh, 8);
  __m128i cdgh = _mm_blend_epi16(efgh, t, 0xF0);
  for (; count > 0; --count, p += 64) {
    const __m128i abef0 = abef, cdgh0 = cdgh;
    __m128i w[4];
    for (int g = 0; g < 16; ++g) {
      __m128i& cur = w[g % 4];
      if (g < 4) {
        cur = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * g)), bswap);
      } else {
        const __m128i prev1 = w[(g + 3) % 4], prev2 = w[(g + 2) % 4];
        cur = _mm_sha256msg1_epu32(cur, w[(g + 1) % 4]);
        cur = _mm_add_epi32(cur, _mm_alignr_epi8(prev1, prev2, 4));
        cur = _mm_sha256msg2_epu32(cur, prev1);
      }
      __m128i msg = _mm_add_epi32(cur, _mm_loadu_si128(reinterpret_cast<const __m128i*>(kRound + 4 * g)));
      cdgh = _mm_sha256rnds2_epu32(cdgh, abef, msg);
      msg = _mm_shuffle_epi32(msg, 0x0E);
      abef = _mm_sha256rnds2_epu32(abef, cdgh, msg);
    }
    abef = _mm_add_epi32(abef, abef0);
    cdgh = _mm_add_epi32(cdgh, cdgh0);
  }
  t = _mm_shuffle_epi32(abef, 0x1B);      // F E B A
  cdgh = _mm_shuffle_epi32(cdgh, 0xB1);   // D C H G
  _mm_storeu_si128(reinterpret_cast<__m128i*>(state), _mm_blend_epi16(t, cdgh, 0xF0));      // D C B A
  _mm_storeu_si128(reinterpret_cast<__m128i*>(state + 4), _mm_alignr_epi8(cdgh, t, 8));     // H G F E
}
#endif

}  // namespace

bool Sha256::hardware_available() {
#ifdef MDLM_SHA_NI
  static const bool ok = __builtin_cpu_supports("sha") && __builtin_cpu_supports("sse4.1") &&
                         __builtin_cpu_supports("ssse3");
  return ok;
#else
  return false;
#endif
}

Sha256::Sha256(Engine engine)
    : h_{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
         0x5be0cd19},
      hardware_(engine == Engine::Best && hardware_available()) {}

void Sha256::compress(const uint8_t* blocks, size_t count) {
#ifdef MDLM_SHA_NI
  if (hardware_) {
    compress_sha_ni(h_.data(), blocks, count);
    return;
  }
#endif
  for (size_t b = 0; b < count; ++b) compress_portable(h_.data(), blocks + 64 * b);
}

void Sha256::update(const void* data, size_t bytes) {
  MDLM_CHECK(!finished_, "Sha256::update after hex_digest");
  const auto* p = static_cast<const uint8_t*>(data);
  total_ += bytes;
  if (buf_len_ > 0) {
    const size_t take = std::min(bytes, 64 - buf_len_);
    std::memcpy(buf_.data() + buf_len_, p, take);
    buf_len_ += take;
    p += take;
    bytes -= take;
    if (buf_len_ < 64) return;
    compress(buf_.data(), 1);
    buf_len_ = 0;
  }
  const size_t blocks = bytes / 64;
  compress(p, blocks);
  p += 64 * blocks;
  bytes -= 64 * blocks;
  std::memcpy(buf_.data(), p, bytes);
  buf_len_ = bytes;
}

std::string Sha256::hex_digest() {
  if (!finished_) {
    const uint64_t bits = total_ * 8;
    const uint8_t one = 0x80;
    update(&one, 1);
    const uint8_t zero[64] = {};
    update(zero, (buf_len_ <= 56 ? 56 - buf_len_ : 120 - buf_len_));
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(bits >> (56 - 8 * i));
    update(len, 8);
    finished_ = true;
  }
  static const char* kHex = "0123456789abcdef";
  std::string out;
  out.reserve(64);
  for (uint32_t v : h_)
    for (int s = 28; s >= 0; s -= 4) out += kHex[(v >> s) & 0xf];
  return out;
}

std::string sha256_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) MDLM_FAIL("cannot open ", path, " to verify its checksum: ", std::strerror(errno));
  Sha256 h;
  std::vector<uint8_t> buf(size_t{8} << 20);
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      MDLM_FAIL("cannot read ", path, " to verify its checksum: ", std::strerror(err));
    }
    if (n == 0) break;
    h.update(buf.data(), static_cast<size_t>(n));
  }
  ::close(fd);
  return h.hex_digest();
}

}  // namespace megadlm::checkpoint
