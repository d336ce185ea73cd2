// Dispatch for the random family (see include/megadlm/ops/random.h).
#include "megadlm/ops/random.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/dispatch.h"
#if MEGADLM_WITH_CUDA
#include "ops/cuda/cuda_ops.h"
#endif

namespace megadlm::ops {

void fill_normal(Tensor& x, const NormalInitArgs& args, const Stream& stream) {
  detail::check_device("fill_normal", stream, {&x});
  MDLM_CHECK(is_floating(x.dtype()), "fill_normal: ", x.str(), " is not a float tensor");
  NormalInitArgs a = args;
  if (a.global_cols == 0) a.global_cols = x.cols();
  MDLM_CHECK(a.col_offset + x.cols() <= a.global_cols, "fill_normal: columns [", a.col_offset, ", ",
             a.col_offset + x.cols(), ") exceed the global width ", a.global_cols);
  if (stream.is_cuda()) MDLM_CUDA_BACKEND(cuda::fill_normal(x, a, stream));
  else cpu::fill_normal(x, a, stream);
}

}  // namespace megadlm::ops
