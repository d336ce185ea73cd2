// Parameters of a model in contiguous flat buffers (the layout DDP buckets and the optimizer
// need): model weights in the model dtype, fp32 main gradients, fp32 master weights and Adam
// moments. Each parameter is a view into these buffers.
//
// Layout: all weight-decayed parameters first, then the others (norm weights, biases), each in
// registration order, starts padded to 64 elements, except a parameter registered with
// `fuse_with_previous`, which follows the previous one directly so that the two (or more) form
// one matrix (q, k, v -> one QKV GEMM; gate, up -> one fc1 GEMM).
// Initialisation: every element by its global index (ops/random.h), so any slice of a
// parameter equals the slice of the unsplit parameter.
#pragma once
#include <string>
#include <vector>
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"

namespace megadlm {

enum class InitKind { Normal, Ones, Zeros };

struct ParamInit {
  InitKind kind = InitKind::Normal;
  float std = 0.02f;
};

struct ParamDesc {
  std::string name;  ///< global name, e.g. "decoder.layers.3.self_attention.linear_q.weight"
  Shape shape;
  ParamInit init;
  bool weight_decay = true;
  bool fuse_with_previous = false;
  int64_t offset = 0;  ///< element offset in the flat buffers (set by materialize)
};

class ParameterStore {
 public:
  using Handle = int;

  Handle add(const std::string& name, const Shape& shape, ParamInit init, bool weight_decay,
             bool fuse_with_previous = false);

  /// Allocates every buffer on `stream`'s device, zeroes gradients and Adam moments and
  /// initialises the weights from `seed`. `param_dtype` is the model dtype (f32 on CPU, bf16 on
  /// CUDA); when it is f32 the master weights are the model weights themselves.
  void materialize(DType param_dtype, uint64_t seed, const Stream& stream);

  bool materialized() const { return params_.defined(); }
  DType param_dtype() const { return params_.dtype(); }
  const std::vector<ParamDesc>& descs() const { return descs_; }
  int64_t num_parameters() const;  ///< real elements (without padding)
  int64_t flat_size() const { return flat_size_; }

  Tensor param(Handle h) const { return view(params_, h, h); }
  Tensor grad(Handle h) const { return view(grads_, h, h); }
  Tensor master(Handle h) const { return view(master_, h, h); }
  /// One tensor over parameters first..last, which must have been fused; its shape is
  /// [sum of rows, cols] of the members.
  Tensor param_span(Handle first, Handle last) const { return view(params_, first, last); }
  Tensor grad_span(Handle first, Handle last) const { return view(grads_, first, last); }

  /// Flat buffers for the optimizer: [0, decay_size) holds every weight-decayed element.
  Tensor flat_params() const { return params_; }
  Tensor flat_master() const { return master_; }
  Tensor flat_grads() const { return grads_; }
  Tensor flat_exp_avg() const { return exp_avg_; }
  Tensor flat_exp_avg_sq() const { return exp_avg_sq_; }
  int64_t decay_size() const { return decay_size_; }
  bool master_is_param() const { return master_is_param_; }

  void zero_grads(const Stream& stream);

 private:
  Tensor view(const Tensor& flat, Handle first, Handle last) const;

  std::vector<ParamDesc> descs_;
  Tensor params_, grads_, master_, exp_avg_, exp_avg_sq_;
  int64_t flat_size_ = 0;
  int64_t decay_size_ = 0;
  bool master_is_param_ = false;
};

}  // namespace megadlm
