// CPU reference token embedding for one vocabulary shard [vocab_start, vocab_start + V):
// forward copies rows (zero rows for ids outside the shard), backward scatters-adds dout rows into
// dweight. weight/out/dout f32 or f64; dweight f32 or dout's dtype (accumulated, +=).
#include <algorithm>
#include "ops/cpu/cpu_common.h"
#include "ops/cpu/cpu_ops.h"

namespace megadlm::ops::cpu {

namespace {

template <typename T>
void embedding_fwd(const Tensor& weight, const Tensor& ids, Tensor& out, int64_t vocab_start) {
  const int64_t vocab = weight.size(0), hidden = weight.size(1);
  const int32_t* pid = ids.data<int32_t>();
  const T* pw = weight.data<T>();
  T* po = out.data<T>();
  for (int64_t t = 0; t < ids.numel(); ++t) {
    const int64_t row = static_cast<int64_t>(pid[t]) - vocab_start;
    T* orow = po + t * hidden;
    if (row >= 0 && row < vocab) std::copy(pw + row * hidden, pw + (row + 1) * hidden, orow);
    else std::fill(orow, orow + hidden, T(0));
  }
}

template <typename T>
void embedding_bwd(const Tensor& ids, const Tensor& dout, Tensor& dweight, int64_t vocab_start) {
  const int64_t vocab = dweight.size(0), hidden = dweight.size(1);
  const int32_t* pid = ids.data<int32_t>();
  const T* pd = dout.data<T>();
  const detail::FloatAccess dw("embedding_backward", dweight, "dweight");
  for (int64_t t = 0; t < ids.numel(); ++t) {
    const int64_t row = static_cast<int64_t>(pid[t]) - vocab_start;
    if (row < 0 || row >= vocab) continue;  // another shard's token
    for (int64_t h = 0; h < hidden; ++h) dw.add(row * hidden + h, pd[t * hidden + h]);
  }
}

}  // namespace

void embedding_forward(const Tensor& weight, const Tensor& ids, Tensor& out, int64_t vocab_start,
                       const Stream& stream) {
  detail::with_float_type("embedding_forward", weight, [&](auto t) {
    embedding_fwd<decltype(t)>(weight, ids, out, vocab_start);
  });
}

void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dweight,
                        int64_t vocab_start, const Stream& stream) {
  detail::with_float_type("embedding_backward", dout, [&](auto t) {
    embedding_bwd<decltype(t)>(ids, dout, dweight, vocab_start);
  });
}

}  // namespace megadlm::ops::cpu
