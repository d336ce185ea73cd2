// Random fills keyed by global coordinates (core/philox.h): weight initialisation.
//
// Element (r, c) of a local [R, C] shard of a global [*, global_cols] tensor has global index
// g = (row_offset + r) * global_cols + col_offset + c and value
//   std * normal(philox(key(seed, WeightInit), {g lo, g hi, param_id, 0}))
// (Box-Muller on words 0 and 1, computed in double), so every tensor-parallel slice of a weight
// holds exactly the values of the unsplit weight (docs/architecture.md promise 1).
#pragma once
#include <cstdint>
#include "megadlm/core/philox.h"
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"

namespace megadlm::ops {

struct NormalInitArgs {
  uint64_t seed = 0;
  uint32_t param_id = 0;     ///< stable_name_id(global parameter name)
  float std = 0.02f;
  int64_t global_cols = 0;   ///< columns of the unsplit tensor (0: same as x.cols())
  int64_t row_offset = 0;
  int64_t col_offset = 0;
};

/// The value of global element g (host and device share this one definition).
MDLM_HOST_DEVICE float init_normal_value(const NormalInitArgs& a, int64_t g) {
  PhiloxWords w = philox(PhiloxKey::make(a.seed, RngPurpose::WeightInit), static_cast<uint32_t>(g),
                         static_cast<uint32_t>(static_cast<uint64_t>(g) >> 32), a.param_id, 0u);
  return static_cast<float>(static_cast<double>(a.std) * normal_from_words(w.w[0], w.w[1]));
}

/// x [R, C] (f32 or f64 on CPU; f32 or bf16 on CUDA) written with the values above.
void fill_normal(Tensor& x, const NormalInitArgs& args, const Stream& stream);

}  // namespace megadlm::ops
