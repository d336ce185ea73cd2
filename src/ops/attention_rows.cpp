// Attention on row windows (contract in attention_rows.h): cuDNN in place on CUDA where the
// support table gives the piece to cuDNN's dense rows, else copies of the windows.
#include "ops/attention_rows.h"
#include "megadlm/ops/row_block.h"
#include "ops/dispatch.h"
#if MEGADLM_WITH_CUDA
#include "ops/cuda/cuda_ops.h"
#endif

namespace megadlm::ops {

namespace {

/// Rows [row0, row0 + n) of each of `batch` batch rows of x viewed as [batch * rows, width], into
/// a new contiguous [batch * n, width] tensor.
Tensor read_rows(const Tensor& x, int64_t batch, int64_t rows, int64_t row0, int64_t n, const Stream& stream) {
  const Tensor x2 = x.view({batch * rows, x.numel() / (batch * rows)});
  Tensor out = Tensor::empty({batch * n, x2.cols()}, x.dtype(), stream);
  read_row_block(x2, out, batch, row0, stream);
  return out;
}

}  // namespace

void attention_forward_rows(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                            const AttentionArgs& a, const AttentionRowWindow& w, const Stream& stream) {
  bool done = false;
  if (stream.is_cuda()) MDLM_CUDA_BACKEND(done = cuda::attention_forward_rows(q, k, v, out, lse, a, w, stream));
  if (done) return;
  const int64_t B = a.batch, n = a.seq, H = a.num_heads, Hkv = a.num_kv_heads, D = a.head_dim;
  const Tensor qp = read_rows(q, B, w.rows, w.q_row0, n, stream).view({B, n, H, D});
  const Tensor kp = read_rows(k, B, w.rows, w.kv_row0, n, stream).view({B, n, Hkv, D});
  const Tensor vp = read_rows(v, B, w.rows, w.kv_row0, n, stream).view({B, n, Hkv, D});
  attention_forward(qp, kp, vp, out, lse, a, stream);
}

void attention_backward_rows(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& out, const Tensor& lse, Tensor& dq, Tensor& dk, Tensor& dv,
                             const AttentionArgs& a, const AttentionRowWindow& w, const Stream& stream) {
  bool done = false;
  if (stream.is_cuda())
    MDLM_CUDA_BACKEND(done = cuda::attention_backward_rows(dout, q, k, v, out, lse, dq, dk, dv, a, w, stream));
  if (done) return;
  const int64_t B = a.batch, n = a.seq, H = a.num_heads, Hkv = a.num_kv_heads, D = a.head_dim;
  const Tensor dop = read_rows(dout, B, w.rows, w.q_row0, n, stream).view({B, n, H, D});
  const Tensor qp = read_rows(q, B, w.rows, w.q_row0, n, stream).view({B, n, H, D});
  const Tensor op = read_rows(out, B, w.rows, w.q_row0, n, stream).view({B, n, H, D});
  const Tensor kp = read_rows(k, B, w.rows, w.kv_row0, n, stream).view({B, n, Hkv, D});
  const Tensor vp = read_rows(v, B, w.rows, w.kv_row0, n, stream).view({B, n, Hkv, D});
  const Tensor lp = read_rows(lse, B * H, w.rows, w.q_row0, n, stream).view({B, H, n});
  attention_backward(dop, qp, kp, vp, op, lp, dq, dk, dv, a, stream);
}

}  // namespace megadlm::ops
