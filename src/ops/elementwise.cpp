// Dispatch for the elementwise family (see include/megadlm/ops/elementwise.h).
#include "megadlm/ops/elementwise.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/dispatch.h"
#if MEGADLM_WITH_CUDA
#include "ops/cuda/cuda_ops.h"
#endif

namespace megadlm::ops {

void add(const Tensor& a, const Tensor& b, Tensor& out, const Stream& stream) {
  detail::check_device("add", stream, {&a, &b, &out});
  MDLM_CHECK(a.numel() == b.numel() && a.numel() == out.numel() && a.dtype() == b.dtype() &&
                 a.dtype() == out.dtype(),
             "add: ", a.str(), " + ", b.str(), " -> ", out.str(), " must match");
  if (stream.is_cuda()) MDLM_CUDA_BACKEND(cuda::add(a, b, out, stream));
  else cpu::add(a, b, out, stream);
}

void scale_inplace(Tensor& x, float s, const Stream& stream) {
  detail::check_device("scale_inplace", stream, {&x});
  if (stream.is_cuda()) MDLM_CUDA_BACKEND(cuda::scale_inplace(x, s, stream));
  else cpu::scale_inplace(x, s, stream);
}

void fill(Tensor& x, float value, const Stream& stream) {
  detail::check_device("fill", stream, {&x});
  if (stream.is_cuda()) MDLM_CUDA_BACKEND(cuda::fill(x, value, stream));
  else cpu::fill(x, value, stream);
}

void copy(const Tensor& src, Tensor& dst, const Stream& stream) {
  detail::check_device("copy", stream, {&src, &dst});
  detail::check_numel("copy", dst, src.numel(), "dst");
  if (stream.is_cuda()) MDLM_CUDA_BACKEND(cuda::copy(src, dst, stream));
  else cpu::copy(src, dst, stream);
}

void split_columns(const Tensor& x, const std::vector<Tensor*>& outs, const Stream& stream) {
  detail::check_device("split_columns", stream, {&x});
  int64_t total = 0;
  for (Tensor* o : outs) {
    detail::check_device("split_columns", stream, {o});
    MDLM_CHECK(o->rows() == x.rows() && o->dtype() == x.dtype(), "split_columns: part ", o->str(),
               " must have x's rows and dtype ", x.str());
    total += o->cols();
  }
  MDLM_CHECK(total == x.cols(), "split_columns: parts have ", total, " columns, x ", x.str());
  if (stream.is_cuda()) MDLM_CUDA_BACKEND(cuda::split_columns(x, outs, stream));
  else cpu::split_columns(x, outs, stream);
}

void concat_columns(const std::vector<const Tensor*>& parts, Tensor& out, const Stream& stream) {
  detail::check_device("concat_columns", stream, {&out});
  int64_t total = 0;
  for (const Tensor* p : parts) {
    detail::check_device("concat_columns", stream, {p});
    MDLM_CHECK(p->rows() == out.rows() && p->dtype() == out.dtype(), "concat_columns: part ",
               p->str(), " must have out's rows and dtype ", out.str());
    total += p->cols();
  }
  MDLM_CHECK(total == out.cols(), "concat_columns: parts have ", total, " columns, out ", out.str());
  if (stream.is_cuda()) MDLM_CUDA_BACKEND(cuda::concat_columns(parts, out, stream));
  else cpu::concat_columns(parts, out, stream);
}

void gather_rows(const Tensor& src, const Tensor& index, Tensor& dst, const Stream& stream) {
  detail::check_device("gather_rows", stream, {&src, &index, &dst});
  MDLM_CHECK(index.dtype() == DType::I32 && dst.dtype() == src.dtype() &&
                 dst.numel() == index.numel() * src.cols(),
             "gather_rows: src ", src.str(), ", int32 index ", index.str(), " -> dst ", dst.str(),
             " (dst must be [index, src cols] of src's dtype)");
  if (stream.is_cuda()) MDLM_CUDA_BACKEND(cuda::gather_rows(src, index, dst, stream));
  else cpu::gather_rows(src, index, dst, stream);
}

Tensor gather_rows(const Tensor& src, const Tensor& index, const Stream& stream) {
  Tensor dst = Tensor::empty({index.numel(), src.cols()}, src.dtype(), stream);
  gather_rows(src, index, dst, stream);
  return dst;
}

}  // namespace megadlm::ops
