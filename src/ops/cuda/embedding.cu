// Token embedding on CUDA: forward gather and a deterministic backward into the f32 main grad.
// Entry -> launch_* -> *_kernel.
//
// Backward, sorted-ids method (no float atomics, bitwise reproducible):
//  1. key[t] = ids[t] - vocab_start when inside the shard, else V (a sentinel sorted last and
//     skipped); CUB's stable radix sort orders (key, t) pairs, so equal ids keep token order.
//  2. The sorted positions are cut into chunks of kChunk. A block per (chunk, column stripe) sums
//     the dout rows of each run of equal keys inside its chunk, in sorted order. A run wholly
//     inside the chunk is added to dweight at once (its row belongs to no other block); the
//     piece of a run that continues into the next chunk goes to tail[chunk], and a piece that
//     continues a run from an earlier chunk goes to lead[chunk].
//  3. The chunk where a multi-chunk run starts adds tail[c] + lead[c+1] + ... in chunk order
//     into dweight. Frequent ids (the diffusion mask token can be half of all tokens) thus spread
//     over many blocks instead of serialising on one.
#include <cub/device/device_radix_sort.cuh>
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/internal.h"

namespace megadlm::ops::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kChunk = 64;  // sorted positions per block in the backward
constexpr int kBatch = 8;   // dout rows loaded together before they are summed

/// out[t, j..j+kVec) = weight[ids[t] - vocab_start, ...], zeros outside the shard.
template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads)
embedding_forward_kernel(const T* __restrict__ weight, const int32_t* __restrict__ ids,
                         T* __restrict__ out, int64_t tokens, int64_t vocab, int64_t hidden,
                         int64_t vocab_start) {
  const int64_t j = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kVec;
  if (j >= hidden) return;
  for (int64_t t = blockIdx.y; t < tokens; t += gridDim.y) {
    const int64_t local = static_cast<int64_t>(ids[t]) - vocab_start;
    Vec<T, kVec> v;
    if (local >= 0 && local < vocab) {
      v = *reinterpret_cast<const Vec<T, kVec>*>(weight + local * hidden + j);
    } else {
#pragma unroll
      for (int k = 0; k < kVec; ++k) v.v[k] = from_float<T>(0.0f);
    }
    *reinterpret_cast<Vec<T, kVec>*>(out + t * hidden + j) = v;
  }
}

__global__ void embedding_keys_kernel(const int32_t* __restrict__ ids, uint32_t* __restrict__ keys,
                                      int32_t* __restrict__ positions, int64_t tokens, int64_t vocab,
                                      int64_t vocab_start) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= tokens) return;
  const int64_t local = static_cast<int64_t>(ids[t]) - vocab_start;
  keys[t] = static_cast<uint32_t>(local >= 0 && local < vocab ? local : vocab);
  positions[t] = static_cast<int32_t>(t);
}

// N consecutive floats at p, as float4 accesses when N is a multiple of 4 (the caller then
// guarantees 16-byte alignment: hidden % 4 == 0 and 16-byte-aligned bases).
template <int N>
__device__ __forceinline__ void load_floats(const float* p, float (&v)[N]) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int k = 0; k < N; k += 4) {
      const float4 q = *reinterpret_cast<const float4*>(p + k);
      v[k] = q.x, v[k + 1] = q.y, v[k + 2] = q.z, v[k + 3] = q.w;
    }
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = p[k];
  }
}

template <int N>
__device__ __forceinline__ void store_floats(float* p, const float (&v)[N]) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int k = 0; k < N; k += 4)
      *reinterpret_cast<float4*>(p + k) = make_float4(v[k], v[k + 1], v[k + 2], v[k + 3]);
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) p[k] = v[k];
  }
}

template <int N>
__device__ __forceinline__ void add_floats(float* p, const float (&v)[N]) {
  float old[N];
  load_floats(p, old);
#pragma unroll
  for (int k = 0; k < N; ++k) old[k] += v[k];
  store_floats(p, old);
}

/// Step 2 (see the file header). grid.x: chunks, grid.y: column stripes of kThreads * kVec.
template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads)
embedding_backward_chunk_kernel(const uint32_t* __restrict__ keys, const int32_t* __restrict__ tok,
                                const T* __restrict__ dout, float* __restrict__ dweight,
                                float* __restrict__ lead, float* __restrict__ tail, int64_t n,
                                int64_t hidden, uint32_t vocab) {
  const int64_t j = (static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x) * kVec;
  if (j >= hidden) return;
  const int64_t c = blockIdx.x;
  const int64_t s = c * kChunk;
  const int64_t e = s + kChunk < n ? s + kChunk : n;

  float acc[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) acc[k] = 0.0f;
  uint32_t key = keys[s];
  int64_t piece = s;  // first sorted position of the current piece
  auto flush = [&](int64_t piece_end) {
    if (key >= vocab) return;  // tokens outside the shard: no gradient
    const bool starts_run = piece == 0 || keys[piece - 1] != key;
    const bool ends_run = piece_end == n || keys[piece_end] != key;
    if (starts_run && ends_run) add_floats(dweight + static_cast<int64_t>(key) * hidden + j, acc);
    else if (starts_run) store_floats(tail + c * hidden + j, acc);
    else store_floats(lead + c * hidden + j, acc);
  };

  for (int64_t base = s; base < e; base += kBatch) {
    uint32_t k_batch[kBatch];
    Vec<T, kVec> rows[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (base + b < e) {
        k_batch[b] = keys[base + b];
        rows[b] = *reinterpret_cast<const Vec<T, kVec>*>(dout + static_cast<int64_t>(tok[base + b]) * hidden + j);
      }
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (base + b >= e) break;
      if (k_batch[b] != key) {
        flush(base + b);
        key = k_batch[b];
        piece = base + b;
#pragma unroll
        for (int k = 0; k < kVec; ++k) acc[k] = 0.0f;
      }
#pragma unroll
      for (int k = 0; k < kVec; ++k) acc[k] += to_float(rows[b].v[k]);
    }
  }
  flush(e);
}

/// Step 3: the chunk where a multi-chunk run starts sums its pieces in chunk order.
template <int kVec>
__global__ void __launch_bounds__(kThreads)
embedding_backward_merge_kernel(const uint32_t* __restrict__ keys, const float* __restrict__ lead,
                                const float* __restrict__ tail, float* __restrict__ dweight,
                                int64_t n, int64_t hidden, uint32_t vocab) {
  const int64_t j = (static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x) * kVec;
  if (j >= hidden) return;
  const int64_t c = blockIdx.x;
  const int64_t s = c * kChunk;
  const int64_t e = s + kChunk < n ? s + kChunk : n;
  const uint32_t key = keys[e - 1];
  if (key >= vocab) return;
  if (e == n || keys[e] != key) return;                  // the last run ends in this chunk
  if (s > 0 && keys[s] == key && keys[s - 1] == key) return;  // ...or started in an earlier one
  float acc[kVec], piece[kVec];
  load_floats(tail + c * hidden + j, acc);
  for (int64_t d = c + 1;; ++d) {
    load_floats(lead + d * hidden + j, piece);
#pragma unroll
    for (int k = 0; k < kVec; ++k) acc[k] += piece[k];
    const int64_t end_d = (d + 1) * kChunk < n ? (d + 1) * kChunk : n;
    if (end_d == n || keys[end_d] != key) break;
  }
  add_floats(dweight + static_cast<int64_t>(key) * hidden + j, acc);
}

}  // namespace

void embedding_forward(const Tensor& weight, const Tensor& ids, Tensor& out, int64_t vocab_start,
                       const Stream& stream) {
  NvtxRange range("embedding_forward");
  const int64_t tokens = ids.numel(), vocab = weight.size(0), hidden = weight.size(1);
  if (tokens == 0 || hidden == 0) return;
  cudaStream_t s = megadlm::detail::native_stream(stream);
  dispatch_activation_dtype(weight.dtype(), "embedding_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kVec = kVec16<T>;
    const T* pw = static_cast<const T*>(weight.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    const bool vectorizable = hidden % kVec == 0 && is_aligned(pw, 16) && is_aligned(po, 16);
    const int vec = vectorizable ? kVec : 1;
    const dim3 grid(static_cast<unsigned>(ceil_div(hidden / vec, kThreads)),
                    static_cast<unsigned>(std::min<int64_t>(tokens, 65535)));
    if (vectorizable)
      embedding_forward_kernel<T, kVec><<<grid, kThreads, 0, s>>>(pw, ids.data<int32_t>(), po, tokens,
                                                                  vocab, hidden, vocab_start);
    else
      embedding_forward_kernel<T, 1><<<grid, kThreads, 0, s>>>(pw, ids.data<int32_t>(), po, tokens,
                                                               vocab, hidden, vocab_start);
  });
  MDLM_CUDA_CHECK_LAUNCH();
}

void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dweight,
                        int64_t vocab_start, const Stream& stream) {
  NvtxRange range("embedding_backward");
  const int64_t n = ids.numel(), vocab = dweight.size(0), hidden = dweight.size(1);
  if (n == 0 || hidden == 0) return;
  MDLM_CHECK(n <= INT32_MAX && vocab < INT32_MAX, "embedding_backward: ", n, " tokens and ", vocab,
             " rows exceed the CUDA backend's 32-bit sort keys");
  cudaStream_t s = megadlm::detail::native_stream(stream);

  // 1. keys and stable sort.
  Tensor keys_in = Tensor::empty({n}, DType::I32, stream);
  Tensor keys_out = Tensor::empty({n}, DType::I32, stream);
  Tensor tok_in = Tensor::empty({n}, DType::I32, stream);
  Tensor tok_out = Tensor::empty({n}, DType::I32, stream);
  auto* pk_in = static_cast<uint32_t*>(keys_in.data_ptr());
  auto* pk_out = static_cast<uint32_t*>(keys_out.data_ptr());
  embedding_keys_kernel<<<static_cast<unsigned>(ceil_div(n, 256)), 256, 0, s>>>(
      ids.data<int32_t>(), pk_in, tok_in.data<int32_t>(), n, vocab, vocab_start);
  MDLM_CUDA_CHECK_LAUNCH();
  int end_bit = 1;
  while ((int64_t{1} << end_bit) <= vocab) ++end_bit;  // keys are 0..vocab (sentinel included)
  size_t temp_bytes = 0;
  MDLM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, pk_in, pk_out,
                                                  tok_in.data<int32_t>(), tok_out.data<int32_t>(),
                                                  static_cast<int>(n), 0, end_bit, s));
  Tensor temp = Tensor::empty({static_cast<int64_t>(temp_bytes / 4 + 1)}, DType::I32, stream);
  MDLM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.data_ptr(), temp_bytes, pk_in, pk_out,
                                                  tok_in.data<int32_t>(), tok_out.data<int32_t>(),
                                                  static_cast<int>(n), 0, end_bit, s));

  // 2. and 3. chunk sums and multi-chunk runs.
  const int64_t chunks = ceil_div(n, kChunk);
  Tensor pieces = Tensor::empty({2, chunks, hidden}, DType::F32, stream);
  float* lead = pieces.data<float>();
  float* tail = lead + chunks * hidden;
  float* pdw = dweight.data<float>();
  dispatch_activation_dtype(dout.dtype(), "embedding_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kVec = kVec16<T>;
    const T* pd = static_cast<const T*>(dout.data_ptr());
    const bool vectorizable = hidden % kVec == 0 && is_aligned(pd, 16) && is_aligned(pdw, 16);
    auto run = [&](auto vec_tag) {
      constexpr int V = decltype(vec_tag)::value;
      const dim3 grid(static_cast<unsigned>(chunks), static_cast<unsigned>(ceil_div(hidden / V, kThreads)));
      embedding_backward_chunk_kernel<T, V><<<grid, kThreads, 0, s>>>(
          pk_out, tok_out.data<int32_t>(), pd, pdw, lead, tail, n, hidden,
          static_cast<uint32_t>(vocab));
      MDLM_CUDA_CHECK_LAUNCH();
      embedding_backward_merge_kernel<V><<<grid, kThreads, 0, s>>>(pk_out, lead, tail, pdw, n, hidden,
                                                                   static_cast<uint32_t>(vocab));
      MDLM_CUDA_CHECK_LAUNCH();
    };
    if (vectorizable) run(std::integral_constant<int, kVec>{});
    else run(std::integral_constant<int, 1>{});
  });
}

}  // namespace megadlm::ops::cuda
