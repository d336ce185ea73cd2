// Internal: the cpu backend's entry points (the list in ops/backend_ops.inc, shared with the
// cuda backend). Called only from the dispatch files in src/ops/.
#pragma once
#include <vector>
#include "megadlm/ops/activation.h"
#include "megadlm/ops/attention.h"
#include "megadlm/ops/attention_merge.h"
#include "megadlm/ops/cross_entropy.h"
#include "megadlm/ops/dropout.h"
#include "megadlm/ops/elementwise.h"
#include "megadlm/ops/embedding.h"
#include "megadlm/ops/gemm.h"
#include "megadlm/ops/linear_cross_entropy.h"
#include "megadlm/ops/moe.h"
#include "megadlm/ops/norm.h"
#include "megadlm/ops/optimizer.h"
#include "megadlm/ops/qk_norm_rope.h"
#include "megadlm/ops/random.h"
#include "megadlm/ops/reduce.h"
#include "megadlm/ops/rope.h"
#include "megadlm/ops/sampling.h"

namespace megadlm::ops::cpu {
#include "ops/backend_ops.inc"

/// The BLAS that runs f32 GEMMs ("OpenBLAS (<its build config>)"), or "" where this build has
/// none and the naive loop runs them (src/ops/cpu/gemm.cpp).
const char* blas_library();
}  // namespace megadlm::ops::cpu
