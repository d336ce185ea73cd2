// Tolerances used across the test suites, one reason per line.
#pragma once

namespace megadlm::test {

// Finite differences in f64 with step h = 1e-6 have truncation error O(h^2) ~ 1e-12 and rounding
// error ~ eps64 / h ~ 1e-10 relative to the function value: 1e-6 relative leaves a wide margin.
inline constexpr double kFiniteDiffRelTolF64 = 1e-6;

// The same check in f32 (h = 1e-2 on O(1) inputs): rounding error ~ eps32 / h ~ 1e-5 per term,
// accumulated over sums of up to a few hundred terms.
inline constexpr double kFiniteDiffRelTolF32 = 2e-2;

// CUDA bf16 op vs CPU f32 op on the same bf16-rounded inputs: the CUDA output is rounded to bf16
// (relative 2^-9 ~ 2e-3 per element) and fp32 accumulation order differs; relative L2 error of
// the whole output below 1e-2 is the bound a bf16 reduction order allows.
inline constexpr double kBf16ParityRelL2 = 1e-2;

// f32 outputs of CUDA kernels that read bf16 inputs but accumulate and store in fp32 (norm
// statistics, losses, weight gradients): only summation order differs. Measured on H200
// (docs/benchmarks.md, "Backend parity"): 1.3e-8 (embedding backward) to 1.9e-7 (GEMM wgrad,
// against the CPU GEMM's double accumulation; the CPU's own OpenBLAS fp32 sum adds an error of
// the same order, ~1e-7). 2e-6 is ~10x the worst.
inline constexpr double kF32AccumRelL2 = 2e-6;

// The same against an f64 sum of 4 096 products (GemmParity.Large4096Cubed): an fp32 sum's
// rounding error grows with the length of the sum. Measured on H200: 4.04e-6 (both layouts of
// B), so 4e-5.
inline constexpr double kF32AccumLongSumRelL2 = 4e-5;

// cuBLASLt FP8 GEMM (fp32 D, no fast accumulation) vs the CPU emulation on the same FP8 codes and
// scales (tests/gpu/test_parity_fp8.cpp): the products are exact in both, so only accumulation
// differs, and FP8 tensor cores keep fewer bits than fp32 between their periodic promotions to
// fp32 (a max-relative error of 2e-4 was measured for a 256x384x512 product on an H200). 1e-3
// relative L2 leaves room for that, and is still ~50x below the e4m3 rounding error of the
// operands (~5e-2), which a GEMM that ignored a scale or misread a layout would exceed.
inline constexpr double kFp8GemmF32RelL2 = 1e-3;

// f32 outputs of CUDA elementwise kernels that evaluate the CPU's fp32 formula term for term
// (AdamW): results differ only where nvcc contracts a*b+c into one FMA (one rounding instead of
// two, ~1 ulp = 6e-8 relative per element).
inline constexpr double kF32ElementwiseRelL2 = 1e-6;

}  // namespace megadlm::test
