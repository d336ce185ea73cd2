// Model FLOPs per iteration as Megatron-LM counts them (training.py num_floating_point_operations,
// core 0.10): 12 * B * S * L * H^2 * ( (1 + G/N + S/H) * (N*D/H) + (F/H) * (3/2 if SwiGLU)
// + V / (2 L H) ). Attention is counted as full (not causal-halved), which is exact for the
// bidirectional diffusion model. MFU = achieved FLOP/s / peak.
#pragma once
#include <cstdint>
#include "megadlm/model/transformer_config.h"

namespace megadlm {

/// block_size > 0: block diffusion (docs/training_objectives.md). The layers run on the doubled
/// row [x_t | x_0] (2S tokens through every projection and MLP), the output layer on the S noisy
/// tokens, and attention scores the mask's visible pairs, S·B + S² per sequence (S² + S·B/2 + S/2
/// with the causal clean half) instead of S²: the same count the PyTorch peer uses. Tokens of
/// throughput are the S useful (noisy) ones.
double megatron_flops_per_iteration(const TransformerConfig& m, int64_t global_batch_size,
                                    int64_t block_size = 0);

/// bf16 dense GEMM rate measured with cuBLASLt on the H200 (docs/benchmarks.md): the MFU denominator.
inline constexpr double kH200PeakTflops = 811.0;
/// The H200's dense bf16 datasheet rate, Megatron's MFU convention (the metrics' mfu_989).
inline constexpr double kH200DatasheetTflops = 989.0;

}  // namespace megadlm
