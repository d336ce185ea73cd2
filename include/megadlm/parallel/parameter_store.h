// Parameters of a model in contiguous flat buffers (the layout data-parallel buckets need):
// model weights in the model dtype and fp32 main gradients. Each parameter is a view into them.
// Optimizer state (fp32 masters, Adam moments) lives with the optimizer (training/optimizer.h),
// which may own only a shard of the flat range (distributed optimizer).
//
// Layout: parameters in *reverse* registration order (≈ the order backward finishes them, so a
// bucket at the front of the buffer is ready first), dense parameters first and expert ones
// after them in buckets of their own, each start padded to 64 elements, except
// that parameters registered with `fuse_with_previous` stay right after their predecessor, in
// registration order, so they form one matrix (q, k, v -> one QKV GEMM; gate, up -> one fc1 GEMM).
// The buffer is cut into buckets of about `bucket_size` elements at parameter boundaries; each
// bucket's length is padded to a multiple of `bucket_multiple` (data-parallel size x 64 under the
// distributed optimizer, so that every rank's shard is whole and aligned).
// Initialisation: every element by its global index (ops/random.h), so any slice of a parameter
// equals the slice of the unsplit parameter, and fill_initial_values() can regenerate any range.
// FSDP (parallel/data_parallel/fsdp.h): buckets follow the model's units (one bucket per unit
// and parameter kind — a MoE layer has a dense and an expert bucket —, never two units in one), and the full weight or gradient buffer may be left unallocated: the
// wrapper then binds a gathered window per bucket while a unit is in use, and reading a
// parameter of an unbound bucket is an error (the #1643 "touched outside its gather" check).
#pragma once
#include <string>
#include <vector>
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"

namespace megadlm {

enum class InitKind { Normal, Ones, Zeros };

/// How a parameter is split over the tensor-parallel ranks (its local tensor is a box of the
/// global one): Replicated (every rank holds all of it), Rows (dim 0 split evenly: column-parallel
/// weights, their biases, vocab-parallel embeddings), Cols (dim 1 split: row-parallel weights).
enum class TpSplit : uint8_t { Replicated, Rows, Cols };

struct TpSlice {
  TpSplit split = TpSplit::Replicated;
  int rank = 0;
  int size = 1;
  /// Replicated parameters whose gradient each TP rank computes only in part (norms under
  /// sequence parallelism, QK-layernorm weights): summed over the TP group before the optimizer.
  bool partial_grad = false;
};

struct ParamInit {
  InitKind kind = InitKind::Normal;
  float std = 0.02f;
};

/// Tied embeddings across pipeline stages: the first stage's word embedding (Original) and the
/// last stage's copy used as the output layer (Copy) get their gradients summed over the
/// embedding group; each sits in a bucket of its own, and norms count only the Original.
enum class PipelineShare : uint8_t { None, Original, Copy };

/// How ParameterStore::add registers a parameter; call sites name what they set
/// (`{.init = init, .weight_decay = false, .tp = slice}`).
struct ParamSpec {
  ParamInit init = {};
  bool weight_decay = true;
  /// Laid out right after the previously registered parameter (rows of the same width), so
  /// that the two form one matrix: q, k, v -> one QKV GEMM; gate, up -> one fc1 GEMM.
  bool fuse_with_previous = false;
  /// With a TP split, this rank keeps the slice `tp` describes (the split dimension must
  /// divide evenly).
  TpSlice tp = {};
  /// An expert parameter (ParamDesc::expert).
  bool expert = false;
  /// A tied weight shared with another pipeline stage (ParamDesc::pipeline_share).
  PipelineShare pipeline_share = PipelineShare::None;
};

struct ParamDesc {
  std::string name;  ///< global name, e.g. "decoder.layers.3.self_attention.linear_q.weight"
  Shape shape;       ///< this rank's (local) shape
  ParamInit init;
  bool weight_decay = true;
  bool fuse_with_previous = false;
  int64_t offset = 0;  ///< element offset in the flat buffers (set by materialize)
  Shape global_shape;  ///< the unsplit tensor's shape
  TpSlice tp;          ///< how this rank's tensor sits in the global one
  PipelineShare pipeline_share = PipelineShare::None;
  /// An expert parameter (model/moe.h): laid out in expert buckets after the dense ones and
  /// reduced over the expert-data-parallel group instead of dp×cp; `tp` then describes its
  /// split over expert TP. Each EP rank holds other experts (names carry the global index).
  bool expert = false;
  int64_t row_offset = 0, col_offset = 0;  ///< global coordinates of local element [0, 0]
  int64_t numel() const { return shape_numel(shape); }
  /// Gradient norms count a replicated parameter on one TP rank only.
  bool replicated() const { return tp.split == TpSplit::Replicated; }
};

struct BufferLayout {
  int64_t bucket_size = 0;      ///< elements per bucket; 0: one bucket for everything
  int64_t bucket_multiple = 64; ///< each bucket's length is a multiple of this
  int64_t expert_bucket_multiple = 0;  ///< the same for expert buckets (0: bucket_multiple)
  /// Per parameter handle: the unit it belongs to (FSDP). A bucket closes wherever the unit
  /// changes, so no bucket spans two units. Empty: no units.
  std::vector<int> unit_of;
  /// FSDP: the full weight / gradient buffers are not allocated; bind_params / bind_grads give
  /// each bucket its window while the wrapper holds it gathered.
  bool shard_params = false;
  bool shard_grads = false;
};

/// A range [begin, end) of flat elements that one rank's optimizer owns (all of them, or its
/// shard under the distributed optimizer), and where it sits in the compact optimizer buffers.
struct OwnedRange {
  int64_t begin = 0, end = 0;
  int64_t compact_offset = 0;
};

struct GradBucket {
  int64_t begin = 0, end = 0;  ///< flat element range (end - begin is a multiple of bucket_multiple)
  std::vector<int> params;     ///< handles of the parameters inside
  bool expert = false;         ///< holds expert parameters only (reduced over expert-dp)
};

class ParameterStore {
 public:
  using Handle = int;

  /// Registers a parameter of global shape `global_shape` as `spec` says (before materialize).
  Handle add(const std::string& name, const Shape& global_shape, const ParamSpec& spec);

  /// Lays out and allocates the buffers on `stream`'s device, zeroes the gradients and
  /// initialises the weights from `seed` in `param_dtype` (f32 on CPU, bf16 on CUDA).
  void materialize(DType param_dtype, uint64_t seed, const Stream& stream,
                   const BufferLayout& layout = {});

  /// Computes the offsets and buckets of `layout` without allocating anything (materialize()
  /// does this first): what a memory planner needs. May be called again with another layout.
  void lay_out(const BufferLayout& layout);
  bool materialized() const { return materialized_; }
  DType param_dtype() const { return param_dtype_; }
  uint64_t seed() const { return seed_; }
  const std::vector<ParamDesc>& descs() const { return descs_; }
  const ParamDesc& desc(Handle h) const { return descs_[static_cast<size_t>(h)]; }
  int64_t num_parameters() const;  ///< real elements (without padding)
  int64_t flat_size() const { return flat_size_; }
  const std::vector<GradBucket>& buckets() const { return buckets_; }
  int bucket_of(Handle h) const { return bucket_of_[static_cast<size_t>(h)]; }

  Tensor param(Handle h) const { return view(params_, bound_params_, "weights", h, h); }
  Tensor grad(Handle h) const { return view(grads_, bound_grads_, "gradients", h, h); }
  /// One tensor over parameters first..last, which must have been fused; its shape is
  /// [sum of rows, cols] of the members.
  Tensor param_span(Handle first, Handle last) const {
    return view(params_, bound_params_, "weights", first, last);
  }
  Tensor grad_span(Handle first, Handle last) const {
    return view(grads_, bound_grads_, "gradients", first, last);
  }
  /// The full buffers (undefined when the layout shards them: FSDP).
  Tensor flat_params() const { return params_; }
  Tensor flat_grads() const { return grads_; }
  bool params_sharded() const { return layout_.shard_params; }
  bool grads_sharded() const { return layout_.shard_grads; }
  /// FSDP: bucket `b`'s weights / gradients are `window` ([end - begin] elements of the model /
  /// fp32 gradient dtype) until unbound. Only for buffers the layout shards.
  void bind_params(int b, Tensor window);
  void bind_grads(int b, Tensor window);
  void unbind_params(int b);
  void unbind_grads(int b);
  bool params_bound(int b) const { return bound_params_[static_cast<size_t>(b)].defined(); }
  bool grads_bound(int b) const { return bound_grads_[static_cast<size_t>(b)].defined(); }
  DType grad_dtype() const { return grad_dtype_; }

  /// out (f32 or f64, [end - begin]) = the initial values of flat elements [begin, end), exactly
  /// as Philox defines them (padding elements are 0). For optimizer master weights.
  void fill_initial_values(Tensor& out, int64_t begin, const Stream& stream) const;

  /// Zeroes the full gradient buffer (nothing when the layout shards it: the wrapper owns the shards).
  void zero_grads(const Stream& stream);

 private:
  Tensor view(const Tensor& flat, const std::vector<Tensor>& bound, const char* what, Handle first,
              Handle last) const;
  void fill_param_range(Tensor& out, int64_t out_offset, const ParamDesc& d, int64_t start,
                        int64_t count, const Stream& stream) const;

  std::vector<ParamDesc> descs_;
  std::vector<GradBucket> buckets_;
  std::vector<int> bucket_of_;
  Tensor params_, grads_;
  std::vector<Tensor> bound_params_, bound_grads_;  // per bucket (sharded buffers only)
  BufferLayout layout_;
  DType param_dtype_ = DType::F32, grad_dtype_ = DType::F32;
  bool materialized_ = false;
  int64_t flat_size_ = 0;
  uint64_t seed_ = 0;
};

}  // namespace megadlm
