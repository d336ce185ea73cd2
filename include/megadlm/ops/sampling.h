// Token proposals of one masked-diffusion sampler step (LLaDA's generate; docs/generation.md),
// reduced where the logits are: for each queried position only the proposed token and its
// confidence leave the device, never a [rows, vocab] block of logits.
//
// Per row r (keys[r] = (g, j): g the request's sample index, j the position counted from the
// first generated token) with logits row c (and, with classifier-free guidance, the row u of the
// same position in the prompt-masked canvas):
//   l_v  = c_v                                   without guidance
//        = u_v + f32(w + 1) * (c_v - u_v)        with it (w = cfg_scale; each op rounded to f32)
//   l_s  = -inf for s = suppress_token           (LLaDA's logits_eos_inf; -1 = none)
//   x    = argmax_v l_v                          temperature 0 (first index on ties)
//        = argmax_v exp(l_v) / (-log U_v)^tau    temperature tau > 0, in float64 (Gumbel-max
//                                                 sampling from softmax(l / tau))
//   U_v  = uniform53 of words (2(v%2), 2(v%2)+1) of
//          philox(key(seed, SamplerGumbel), {v / 2, j, g mod 2^32, step})
//   confidence = softmax(l)_x in float64         (remasking low_confidence)
//              = uniform53 of words (0, 1) of philox(key(seed, SamplerRemask), {j, 0, g, step})
//                                                 (remasking random)
// Every random number is a function of (seed, sample index, generated position, step, token):
// a request draws the same numbers alone or in any batch, on CPU and CUDA.
//
// Shapes: logits, uncond_logits [R, V] (CPU f32/f64, CUDA bf16/f32; uncond undefined without
// guidance); keys i32 [R, 2]; tokens i32 [R] and confidence f64 [R], both written.
#pragma once
#include <cstdint>
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"

namespace megadlm::ops {

enum class ProposalConfidence : uint8_t {
  Softmax,  ///< probability of the proposed token (low_confidence remasking)
  Random,   ///< a uniform number (random remasking)
};

struct ProposalArgs {
  double temperature = 0.0;  ///< tau >= 0
  float cfg_scale = 0.0f;    ///< w; used only when uncond_logits is defined
  uint64_t seed = 0;
  uint32_t step = 0;         ///< global step of the generation (Philox c3)
  int32_t suppress_token = -1;
  ProposalConfidence confidence = ProposalConfidence::Softmax;
};

void sample_proposals(const Tensor& logits, const Tensor& uncond_logits, const Tensor& keys,
                      const ProposalArgs& args, Tensor& tokens, Tensor& confidence,
                      const Stream& stream);

}  // namespace megadlm::ops
