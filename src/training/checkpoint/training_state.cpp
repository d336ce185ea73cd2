#include "megadlm/training/checkpoint/file_io.h"
#include "megadlm/training/checkpoint/training_state.h"
#include <algorithm>
#include "megadlm/ops/elementwise.h"

namespace megadlm::checkpoint {

namespace {

// Calls fn(desc, piece region, compact offset) for every (owned range x parameter) overlap.
template <typename Fn>
void for_each_owned_piece(const ParameterStore& store, const AdamWOptimizer& optimizer, Fn&& fn) {
  for (const OwnedRange& r : optimizer.owned()) {
    for (const ParamDesc& d : store.descs()) {
      const int64_t s = std::max(r.begin, d.offset), e = std::min(r.end, d.offset + d.numel());
      if (s >= e) continue;
      const ParamPlacement pl = placement_of(d);
      Region region;
      region.offset = pl.offset;
      region.extent = d.shape;
      region.begin = s - d.offset;
      region.end = e - d.offset;
      fn(d, pl, region, r.compact_offset + (s - r.begin));
    }
  }
}

struct HostBuffers {
  Tensor master, exp_avg, exp_avg_sq;
};

}  // namespace

ParamPlacement placement_of(const ParamDesc& d) {
  ParamPlacement p;
  p.global_shape = d.global_shape.empty() ? d.shape : d.global_shape;
  p.offset.assign(d.shape.size(), 0);
  if (!p.offset.empty()) p.offset[0] = d.row_offset;
  if (p.offset.size() > 1) p.offset[1] = d.col_offset;
  p.primary = (d.tp.split != TpSplit::Replicated || d.tp.rank == 0) &&
              d.pipeline_share != PipelineShare::Copy;
  return p;
}

StateSnapshot snapshot_state(const ParameterStore& store, const AdamWOptimizer& optimizer,
                             bool writer, bool moments, const Stream& stream,
                             std::optional<bool> expert_writer) {
  StateSnapshot snap;
  const bool experts = expert_writer.value_or(writer);
  if (!writer && !experts) return snap;
  auto buffers = std::make_shared<HostBuffers>();
  // Always a copy (even on the host): an asynchronous save writes while training goes on. The
  // masters may be views of the model weights (fp32 weights): copied range by range.
  if (optimizer.master().defined()) {
    buffers->master = optimizer.master().to(Device::cpu(), stream);
  } else {
    buffers->master = Tensor::empty({std::max<int64_t>(optimizer.compact_size(), 1)},
                                    optimizer.exp_avg().dtype(), Stream::cpu());
    for (const OwnedRange& r : optimizer.owned()) {
      if (r.end == r.begin) continue;
      Tensor dst = buffers->master.slice_flat(r.compact_offset, {r.end - r.begin});
      copy_tensor(optimizer.master_slice(r.compact_offset, r.end - r.begin), dst, stream);
    }
  }
  if (moments) {
    buffers->exp_avg = optimizer.exp_avg().to(Device::cpu(), stream);
    buffers->exp_avg_sq = optimizer.exp_avg_sq().to(Device::cpu(), stream);
  }
  stream.synchronize();
  const size_t esize = dtype_size(buffers->master.dtype());
  auto at = [&](const Tensor& t, int64_t c) {
    return static_cast<const char*>(t.data_ptr()) + static_cast<size_t>(c) * esize;
  };
  for_each_owned_piece(store, optimizer,
                       [&](const ParamDesc& d, const ParamPlacement& pl, const Region& region, int64_t c) {
                         if (!pl.primary || !(d.expert ? experts : writer)) return;
                         const DType dt = buffers->master.dtype();
                         snap.pieces.push_back({kModelPrefix + d.name, pl.global_shape, region, dt,
                                                at(buffers->master, c), false});
                         if (!moments) return;
                         snap.pieces.push_back({kExpAvgPrefix + d.name, pl.global_shape, region, dt,
                                                at(buffers->exp_avg, c), true});
                         snap.pieces.push_back({kExpAvgSqPrefix + d.name, pl.global_shape, region, dt,
                                                at(buffers->exp_avg_sq, c), true});
                       });
  snap.keep_alive = buffers;
  return snap;
}

void load_state(const CheckpointReader& reader, ParameterStore& store, AdamWOptimizer& optimizer,
                bool moments, const Stream& stream) {
  Tensor m = optimizer.exp_avg(), v = optimizer.exp_avg_sq();
  if (!moments) {
    ops::fill(m, 0.0f, stream);
    ops::fill(v, 0.0f, stream);
  }
  // Every (tensor, owned region) is one task; tasks read on several threads (each into its own
  // host buffer, so memory in flight is bounded by kLoadThreads pieces) and copy on `stream`.
  // The masters are read into their owned slices (views of the weights when they alias them).
  struct ReadTask {
    std::string name;
    Shape global_shape;
    Region region;
    Tensor dst;
  };
  std::vector<ReadTask> tasks;
  for_each_owned_piece(store, optimizer,
                       [&](const ParamDesc& d, const ParamPlacement& pl, const Region& region, int64_t c) {
                         const int64_t n = region.numel();
                         tasks.push_back({kModelPrefix + d.name, pl.global_shape, region, optimizer.master_slice(c, n)});
                         if (!moments) return;
                         tasks.push_back({kExpAvgPrefix + d.name, pl.global_shape, region, m.slice_flat(c, {n})});
                         tasks.push_back({kExpAvgSqPrefix + d.name, pl.global_shape, region, v.slice_flat(c, {n})});
                       });
  constexpr size_t kLoadThreads = 4;
  run_io_tasks(tasks.size(), [&](size_t i) {
    ReadTask& t = tasks[i];
    Tensor host = Tensor::empty({t.region.numel()}, t.dst.dtype(), Stream::cpu());
    reader.read(t.name, t.global_shape, t.region, host);
    copy_tensor(host, t.dst, stream);
    stream.synchronize();  // `host` is freed next
  }, kLoadThreads);
  optimizer.write_model_weights(stream);  // rounds to the model dtype as the optimizer step does
  stream.synchronize();
}

}  // namespace megadlm::checkpoint
