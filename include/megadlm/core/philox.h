// Counter-based random numbers (Philox-4x32-10, Salmon et al. 2011), usable on host and device.
//
// Every random number in megadlm is a pure function of (key, counter): the key holds the seed
// and a purpose tag, the counter holds *global* coordinates (sample index in dataset order,
// token position, parameter id, element index). Never rank, local index or call order, so a
// value is the same whichever rank computes it (docs/architecture.md, promise 1).
//
// Counter layout used across the library (documented here once):
//   counter = {c0, c1, c2, c3}; key = {seed_lo, seed_hi ^ purpose}
//   * weight init:   c0..c1 = element index (64-bit), c2 = param id (hash of the global name), c3 = 0
//   * diffusion t:   c0 = 0,        c1 = 0, c2..c3 = global sample index
//   * token masks:   c0 = position, c1 = 0, c2..c3 = global sample index
//   * eval noise:    purpose EvalNoise, the t / mask / fallback counters above with c1 = 1 / 2 / 3,
//                    c2..c3 = validation sample index
//   * dropout:       c0 = hidden element / 4, c1 = position, c2 = sample low bits, c3 = layer site
//   * attn dropout:  c0 = key position / 4, c1 = query position, c2 = sample low bits,
//                    c3 = (layer site << 16) | query head
//   * MoE benchmark routing (--moe-router-force-load-balancing): c0 = expert / 2, c1 = position,
//                    c2 = sample low bits, c3 = layer (ops/moe.h)
//   * fault injection: purpose ErrorInjection, c0..c1 = iteration (training/fault_detection)
//   * sampler:       Gumbel noise c0 = token / 2, c1 = generated position, c2 = request's sample
//                    index, c3 = step; random remasking c0 = generated position, c1 = 0, c2, c3 as
//                    Gumbel (ops/sampling.h)
//   * SFT order:     c0..c1 = example, c2..c3 = epoch (data/sft_dataset.h)
//   * likelihood MC: c0 = answer position (or 0 for the draw of k), c1 = 1 + row of the
//                    mini-batch (0 for k), c2 = request index, c3 = repeat (diffusion/likelihood.h)
// Each call returns 4 independent 32-bit words; callers that need fewer use word 0.
#pragma once
#include <cstdint>
#include <cmath>

#if defined(__CUDACC__)
#define MDLM_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define MDLM_HOST_DEVICE inline
#endif

namespace megadlm {

/// Purposes keep independent streams apart even when counters coincide.
enum class RngPurpose : uint32_t {
  WeightInit = 0x1001,
  DiffusionTime = 0x2001,
  DiffusionMask = 0x2002,
  DiffusionFallback = 0x2003,
  Varilen = 0x2004,
  EvalNoise = 0x2005,
  HiddenDropout = 0x3001,
  AttentionDropout = 0x3002,
  MoeRandomLogits = 0x3003,
  MockData = 0x4001,
  SftShuffle = 0x4002,
  SamplerGumbel = 0x5001,
  SamplerRemask = 0x5002,
  LikelihoodMC = 0x5003,
  ErrorInjection = 0x6001,
};

struct PhiloxWords {
  uint32_t w[4];
};

MDLM_HOST_DEVICE uint32_t philox_mulhilo(uint32_t a, uint32_t b, uint32_t* hi) {
  uint64_t p = static_cast<uint64_t>(a) * static_cast<uint64_t>(b);
  *hi = static_cast<uint32_t>(p >> 32);
  return static_cast<uint32_t>(p);
}

/// Philox-4x32 with 10 rounds.
MDLM_HOST_DEVICE PhiloxWords philox4x32(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                        uint32_t k0, uint32_t k1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, hi1;
    uint32_t lo0 = philox_mulhilo(kMul0, c0, &hi0);
    uint32_t lo1 = philox_mulhilo(kMul1, c2, &hi1);
    uint32_t n0 = hi1 ^ c1 ^ k0;
    uint32_t n1 = lo1;
    uint32_t n2 = hi0 ^ c3 ^ k1;
    uint32_t n3 = lo0;
    c0 = n0; c1 = n1; c2 = n2; c3 = n3;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return PhiloxWords{{c0, c1, c2, c3}};
}

/// Key for (seed, purpose).
struct PhiloxKey {
  uint32_t k0, k1;
  MDLM_HOST_DEVICE static PhiloxKey make(uint64_t seed, RngPurpose purpose) {
    return PhiloxKey{static_cast<uint32_t>(seed),
                     static_cast<uint32_t>(seed >> 32) ^ static_cast<uint32_t>(purpose)};
  }
};

MDLM_HOST_DEVICE PhiloxWords philox(PhiloxKey key, uint32_t c0, uint32_t c1, uint32_t c2,
                                    uint32_t c3) {
  return philox4x32(c0, c1, c2, c3, key.k0, key.k1);
}

/// Uniform float in [0, 1) with 24 random bits (exactly representable, never 1.0).
MDLM_HOST_DEVICE float uniform_from_u32(uint32_t x) {
  return static_cast<float>(x >> 8) * (1.0f / 16777216.0f);
}

/// Uniform double in [0, 1) with 53 random bits from two words.
MDLM_HOST_DEVICE double uniform53(uint32_t a, uint32_t b) {
  uint64_t v = (static_cast<uint64_t>(a >> 5) << 26) | static_cast<uint64_t>(b >> 6);
  return static_cast<double>(v) * (1.0 / 9007199254740992.0);
}

/// Standard normal from two words (Box-Muller, computed in double for host/device agreement).
MDLM_HOST_DEVICE double normal_from_words(uint32_t a, uint32_t b) {
  double u1 = (static_cast<double>(a) + 1.0) * (1.0 / 4294967296.0);  // (0, 1]
  double u2 = static_cast<double>(b) * (1.0 / 4294967296.0);          // [0, 1)
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/// Stable 32-bit id of a name (FNV-1a), used as the parameter id in weight-init counters.
inline uint32_t stable_name_id(const char* s) {
  uint32_t h = 2166136261u;
  for (; *s; ++s) {
    h ^= static_cast<uint8_t>(*s);
    h *= 16777619u;
  }
  return h;
}

}  // namespace megadlm
