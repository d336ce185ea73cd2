#include "megadlm/parallel/parameter_store.h"
#include <algorithm>
#include <numeric>
#include "megadlm/core/philox.h"
#include "megadlm/ops/elementwise.h"
#include "megadlm/ops/random.h"

namespace megadlm {

namespace {
constexpr int64_t kAlign = 64;  // elements; keeps 16-byte vector loads aligned for any dtype
int64_t align_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }
}  // namespace

ParameterStore::Handle ParameterStore::add(const std::string& name, const Shape& global_shape,
                                           const ParamSpec& spec) {
  const TpSlice& tp = spec.tp;
  MDLM_CHECK(!materialized(), "parameter ", name, " added after materialize()");
  MDLM_CHECK(tp.size >= 1 && tp.rank >= 0 && tp.rank < tp.size, "parameter ", name,
             ": bad tensor-parallel rank ", tp.rank, " of ", tp.size);
  Shape shape = global_shape;
  int64_t row_offset = 0, col_offset = 0;
  if (tp.split != TpSplit::Replicated && tp.size > 1) {
    const size_t dim = tp.split == TpSplit::Rows ? 0 : 1;
    MDLM_CHECK(global_shape.size() > dim && global_shape[dim] % tp.size == 0, "parameter ", name,
               " ", shape_str(global_shape), ": dimension ", dim, " does not split into ", tp.size,
               " tensor-parallel parts");
    shape[dim] = global_shape[dim] / tp.size;
    (dim == 0 ? row_offset : col_offset) = shape[dim] * tp.rank;
  }
  for (const ParamDesc& d : descs_) MDLM_CHECK(d.name != name, "duplicate parameter name ", name);
  if (spec.fuse_with_previous) {
    MDLM_CHECK(!descs_.empty(), "parameter ", name, " fused with nothing");
    const ParamDesc& prev = descs_.back();
    MDLM_CHECK(prev.shape.size() == shape.size() &&
                   shape_numel(prev.shape) / prev.shape[0] == shape_numel(shape) / shape[0],
               "parameter ", name, " cannot be fused with ", prev.name,
               ": rows must have the same width");
  }
  ParamDesc d;
  d.name = name;
  d.shape = shape;
  d.init = spec.init;
  d.weight_decay = spec.weight_decay;
  d.fuse_with_previous = spec.fuse_with_previous;
  d.global_shape = global_shape;
  d.tp = tp;
  d.pipeline_share = spec.pipeline_share;
  d.expert = spec.expert;
  d.row_offset = row_offset;
  d.col_offset = col_offset;
  descs_.push_back(std::move(d));
  return static_cast<Handle>(descs_.size() - 1);
}

int64_t ParameterStore::num_parameters() const {
  int64_t n = 0;
  for (const ParamDesc& d : descs_) n += d.numel();
  return n;
}

void ParameterStore::lay_out(const BufferLayout& layout) {
  MDLM_CHECK(!materialized(), "lay_out() after materialize()");
  MDLM_CHECK(layout.bucket_multiple > 0 && layout.bucket_size >= 0, "bad buffer layout");
  MDLM_CHECK(layout.unit_of.empty() || layout.unit_of.size() == descs_.size(), "buffer layout names ",
             layout.unit_of.size(), " units for ", descs_.size(), " parameters");
  layout_ = layout;
  buckets_.clear();
  // Fused groups in reverse registration order, members in registration order.
  std::vector<std::vector<Handle>> groups;
  for (Handle h = 0; h < static_cast<Handle>(descs_.size()); ++h) {
    if (descs_[static_cast<size_t>(h)].fuse_with_previous) groups.back().push_back(h);
    else groups.push_back({h});
  }
  std::reverse(groups.begin(), groups.end());
  auto unit_of = [&](Handle h) {
    return layout.unit_of.empty() ? 0 : layout.unit_of[static_cast<size_t>(h)];
  };

  bucket_of_.assign(descs_.size(), -1);
  int64_t offset = 0;
  GradBucket current;
  int64_t multiple = layout.bucket_multiple;
  auto close_bucket = [&] {
    if (current.params.empty()) return;
    offset = align_up(offset, std::lcm(kAlign, multiple));
    current.end = offset;
    buckets_.push_back(current);
    const bool expert = current.expert;
    current = GradBucket{};
    current.begin = offset;
    current.expert = expert;
  };
  // Dense parameters, then the expert ones: their buckets reduce over another group.
  for (const bool expert_region : {false, true}) {
    if (expert_region) {
      close_bucket();
      current.expert = true;
      current.begin = offset;
      if (layout.expert_bucket_multiple > 0) multiple = layout.expert_bucket_multiple;
    }
    for (const auto& g : groups) {
      if (descs_[static_cast<size_t>(g.front())].expert != expert_region) continue;
      // A weight shared across pipeline stages gets a bucket of its own, laid out the same on
      // both stages, so that its gradient can be summed over the embedding group before its
      // bucket is reduced (and its distributed-optimizer shards line up on both stages).
      const bool shared = descs_[static_cast<size_t>(g.front())].pipeline_share != PipelineShare::None;
      if (shared) close_bucket();
      // FSDP: a unit's parameters are gathered and freed together, so a bucket holds one unit.
      if (!current.params.empty() && unit_of(current.params.front()) != unit_of(g.front())) close_bucket();
      offset = align_up(offset, kAlign);
      for (Handle h : g) {
        ParamDesc& d = descs_[static_cast<size_t>(h)];
        MDLM_CHECK(d.expert == expert_region, "parameter ", d.name,
                   " is fused with parameters of the other kind (expert / dense)");
        MDLM_CHECK(unit_of(h) == unit_of(g.front()), "fused parameters ", descs_[static_cast<size_t>(g.front())].name,
                   " and ", d.name, " are in different units");
        d.offset = offset;
        offset += d.numel();
        current.params.push_back(h);
        bucket_of_[static_cast<size_t>(h)] = static_cast<int>(buckets_.size());
      }
      if (shared || (layout.bucket_size > 0 && offset - current.begin >= layout.bucket_size))
        close_bucket();
    }
  }
  close_bucket();
  flat_size_ = offset;
}

void ParameterStore::materialize(DType param_dtype, uint64_t seed, const Stream& stream,
                                 const BufferLayout& layout) {
  MDLM_CHECK(!materialized(), "materialize() called twice");
  lay_out(layout);
  seed_ = seed;
  param_dtype_ = param_dtype;
  grad_dtype_ = param_dtype == DType::F64 ? DType::F64 : DType::F32;
  bound_params_.assign(buckets_.size(), Tensor());
  bound_grads_.assign(buckets_.size(), Tensor());

  if (!layout.shard_params) {
    params_ = Tensor::zeros({std::max<int64_t>(flat_size_, 1)}, param_dtype, stream).slice_flat(0, {flat_size_});
    for (size_t i = 0; i < descs_.size(); ++i) {
      const ParamDesc& d = descs_[i];
      Tensor p = params_.slice_flat(d.offset, {d.numel()});
      fill_param_range(p, 0, d, 0, d.numel(), stream);
    }
  }
  if (!layout.shard_grads)
    grads_ = Tensor::zeros({std::max<int64_t>(flat_size_, 1)}, grad_dtype_, stream).slice_flat(0, {flat_size_});
  materialized_ = true;
}

void ParameterStore::bind_params(int b, Tensor window) {
  MDLM_CHECK(layout_.shard_params, "bind_params on a store whose weights are not sharded");
  const GradBucket& bucket = buckets_.at(static_cast<size_t>(b));
  MDLM_CHECK(window.numel() == bucket.end - bucket.begin && window.dtype() == param_dtype_,
             "bucket ", b, " needs a window of ", bucket.end - bucket.begin, " ", dtype_name(param_dtype_),
             " elements, got ", window.str());
  bound_params_[static_cast<size_t>(b)] = std::move(window);
}

void ParameterStore::bind_grads(int b, Tensor window) {
  MDLM_CHECK(layout_.shard_grads, "bind_grads on a store whose gradients are not sharded");
  const GradBucket& bucket = buckets_.at(static_cast<size_t>(b));
  MDLM_CHECK(window.numel() == bucket.end - bucket.begin && window.dtype() == grad_dtype_,
             "bucket ", b, " needs a gradient window of ", bucket.end - bucket.begin, " ",
             dtype_name(grad_dtype_), " elements, got ", window.str());
  bound_grads_[static_cast<size_t>(b)] = std::move(window);
}

void ParameterStore::unbind_params(int b) { bound_params_.at(static_cast<size_t>(b)) = Tensor(); }
void ParameterStore::unbind_grads(int b) { bound_grads_.at(static_cast<size_t>(b)) = Tensor(); }

void ParameterStore::fill_param_range(Tensor& out, int64_t out_offset, const ParamDesc& d,
                                      int64_t start, int64_t count, const Stream& stream) const {
  if (count <= 0) return;
  switch (d.init.kind) {
    case InitKind::Ones: {
      Tensor t = out.slice_flat(out_offset, {count});
      ops::fill(t, 1.0f, stream);
      return;
    }
    case InitKind::Zeros: {
      Tensor t = out.slice_flat(out_offset, {count});
      ops::fill(t, 0.0f, stream);
      return;
    }
    case InitKind::Normal: break;
  }
  // A flat range of a local [rows, cols] tensor is a partial row, whole rows, a partial row; each
  // piece is a rectangle for fill_normal, which keys every element by its index in the global
  // (unsplit) tensor: local (r, c) is global (row_offset + r, col_offset + c).
  const bool vector = d.shape.size() < 2;
  const int64_t cols = vector ? d.numel() : d.numel() / d.shape[0];
  const int64_t global_cols =
      vector ? shape_numel(d.global_shape) : shape_numel(d.global_shape) / d.global_shape[0];
  ops::NormalInitArgs a;
  a.seed = seed_;
  a.param_id = stable_name_id(d.name.c_str());
  a.std = d.init.std;
  a.global_cols = global_cols;
  int64_t pos = start, done = 0;
  while (done < count) {
    const int64_t row = pos / cols, col = pos % cols;
    int64_t rows = 1, width = std::min(cols - col, count - done);
    if (col == 0 && count - done >= cols) {
      rows = (count - done) / cols;
      width = cols;
    }
    // A 1-D parameter is one row: its split (if any) moves along the columns.
    a.row_offset = vector ? 0 : row + d.row_offset;
    a.col_offset = col + (vector ? d.row_offset : d.col_offset);
    Tensor piece = out.slice_flat(out_offset + done, {rows, width});
    ops::fill_normal(piece, a, stream);
    pos += rows * width;
    done += rows * width;
  }
}

void ParameterStore::fill_initial_values(Tensor& out, int64_t begin, const Stream& stream) const {
  const int64_t end = begin + out.numel();
  MDLM_CHECK(begin >= 0 && end <= flat_size_, "fill_initial_values: range [", begin, ", ", end,
             ") outside the flat buffer of ", flat_size_);
  ops::fill(out, 0.0f, stream);
  for (const ParamDesc& d : descs_) {
    const int64_t s = std::max(begin, d.offset), e = std::min(end, d.offset + d.numel());
    if (s < e) fill_param_range(out, s - begin, d, s - d.offset, e - s, stream);
  }
}

Tensor ParameterStore::view(const Tensor& flat, const std::vector<Tensor>& bound, const char* what,
                            Handle first, Handle last) const {
  MDLM_CHECK(materialized_, "parameters used before materialize()");
  MDLM_CHECK(first >= 0 && last >= first && last < static_cast<Handle>(descs_.size()),
             "bad parameter range ", first, "..", last);
  const ParamDesc& a = descs_[static_cast<size_t>(first)];
  Shape shape = a.shape;
  if (first != last) {
    int64_t rows = a.shape[0];
    for (Handle h = first + 1; h <= last; ++h) {
      const ParamDesc& d = descs_[static_cast<size_t>(h)];
      MDLM_CHECK(d.fuse_with_previous, "parameters ", a.name, " .. ", d.name, " are not fused");
      rows += d.shape[0];
    }
    shape[0] = rows;
  }
  if (flat.defined()) return flat.slice_flat(a.offset, shape);
  // A sharded buffer: the bucket's gathered window, which exists only while a unit uses it.
  const int b = bucket_of_[static_cast<size_t>(first)];
  const Tensor& window = bound[static_cast<size_t>(b)];
  MDLM_CHECK(window.defined(), "the ", what, " of ", a.name, " were touched outside their FSDP gather "
             "window (bucket ", b, " is not gathered): the block reading them must announce it "
             "through ParamHooks first");
  return window.slice_flat(a.offset - buckets_[static_cast<size_t>(b)].begin, shape);
}

void ParameterStore::zero_grads(const Stream& stream) {
  if (grads_.defined()) ops::fill(grads_, 0.0f, stream);
}

}  // namespace megadlm
