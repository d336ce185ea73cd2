// Model FLOPs per iteration as Megatron-LM counts them (training.py num_floating_point_operations,
// core 0.10): 12 * B * S * L * H^2 * ( (1 + G/N + S/H) * (N*D/H) + (F/H) * (3/2 if SwiGLU)
// + V / (2 L H) ). Attention is counted as full (not causal-halved), which is exact for the
// bidirectional diffusion model. MFU = achieved FLOP/s / peak.
#pragma once
#include <cstdint>
#include "megadlm/model/transformer_config.h"

namespace megadlm {

double megatron_flops_per_iteration(const TransformerConfig& m, int64_t global_batch_size);

/// bf16 dense GEMM rate measured with cuBLASLt on the H200 (docs/benchmarks.md): the MFU denominator.
inline constexpr double kH200PeakTflops = 811.0;
/// The H200's dense bf16 datasheet rate, Megatron's MFU convention (the metrics' mfu_989).
inline constexpr double kH200DatasheetTflops = 989.0;

}  // namespace megadlm
