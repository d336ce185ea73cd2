#include "megadlm/training/gradient_dump.h"
#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <sstream>
#include <vector>
#include "megadlm/core/error.h"
#include "megadlm/training/checkpoint/checkpoint.h"
#include "megadlm/training/checkpoint/format.h"
#include "megadlm/training/checkpoint/safetensors.h"
#include "megadlm/training/checkpoint/training_state.h"

namespace megadlm {

namespace {

namespace fs = std::filesystem;

// This rank's reduced gradients as checkpoint pieces: the same geometry as snapshot_state's
// masters (checkpoint/training_state.cpp), read from the wrapper's optimizer_grads() (compact,
// or indexed by flat offset when optimizer_grads_flat()).
std::vector<checkpoint::OutgoingPiece> gradient_pieces(const ParallelModel& pm, const Tensor& host,
                                                       bool writer, bool expert_writer) {
  std::vector<checkpoint::OutgoingPiece> pieces;
  const DataParallelWrapper& dp = *pm.data_parallel;
  const bool flat = dp.optimizer_grads_flat();
  const size_t esize = dtype_size(host.dtype());
  for (const OwnedRange& r : dp.owned_ranges()) {
    for (const ParamDesc& d : pm.store.descs()) {
      const int64_t s = std::max(r.begin, d.offset), e = std::min(r.end, d.offset + d.numel());
      if (s >= e) continue;
      const checkpoint::ParamPlacement pl = checkpoint::placement_of(d);
      if (!pl.primary || !(d.expert ? expert_writer : writer)) continue;
      checkpoint::Region region;
      region.offset = pl.offset;
      region.extent = d.shape;
      region.begin = s - d.offset;
      region.end = e - d.offset;
      const int64_t at = flat ? s : r.compact_offset + (s - r.begin);
      MDLM_CHECK(at + (e - s) <= host.numel(), "--save-gradients: ", d.name, "'s elements [", at, ", ",
                 at + (e - s), ") lie outside this rank's ", host.numel(), " gradient elements");
      pieces.push_back({checkpoint::kModelPrefix + d.name, pl.global_shape, region, host.dtype(),
                        static_cast<const char*>(host.data_ptr()) + static_cast<size_t>(at) * esize, false});
    }
  }
  return pieces;
}

// The layout that computed the gradients, for the file's metadata (people read it, nothing parses it).
std::string layout_text(const ParallelModel& pm, const RunConfig& c) {
  const ParallelConfig& p = c.parallel;
  std::ostringstream os;
  os << "world " << p.world_size << ": tp " << p.tensor_model_parallel_size << ", pp "
     << p.pipeline_model_parallel_size << ", cp " << p.context_parallel_size << ", ep "
     << p.expert_model_parallel_size << ", dp x cp " << pm.grad_group_size() << pm.data_parallel->summary()
     << ", micro-batch " << c.training.micro_batch_size << " of global batch " << c.training.global_batch_size;
  return os.str();
}

}  // namespace

std::string save_gradients(const ParallelModel& pm, const RunConfig& config, const std::string& dir,
                           int64_t iteration) {
  const std::string layout = layout_text(pm, config);
  const Stream& s = pm.runtime.stream;
  // Who writes which element: as a checkpoint save decides it (Trainer::save_checkpoint).
  const bool writer = pm.data_parallel->checkpoint_writer();
  const bool expert_writer = config.parallel.use_distributed_optimizer
                                 ? writer
                                 : (!pm.expert_grad_group || pm.expert_grad_group->rank() == 0);
  auto host = std::make_shared<Tensor>(pm.data_parallel->optimizer_grads().to(Device::cpu(), s));
  s.synchronize();
  MDLM_CHECK(host->dtype() == DType::F32, "--save-gradients: the optimizer's gradients are ",
             dtype_name(host->dtype()), ", expected fp32 main gradients");
  std::vector<checkpoint::OutgoingPiece> pieces = gradient_pieces(pm, *host, writer, expert_writer);

  const std::string sharded = (fs::path(dir) / "sharded").string();
  const std::string tag = std::to_string(iteration);
  checkpoint::CheckpointState state;
  state.iteration = iteration;
  state.saved_under = layout;
  state.created_by = "megadlm pretrain_difflm --save-gradients";
  {
    checkpoint::CheckpointWriter ckpt(pm.world, s);
    ckpt.save(sharded, tag, state, std::move(pieces), host, /*async=*/false);
  }
  const std::string path = (fs::path(dir) / kGradientsFileName).string();
  if (pm.rank != 0) return path;

  // Rank 0: every tensor whole, through the reader that assembles any layout.
  const checkpoint::CheckpointReader reader(checkpoint::checkpoint_dir(sharded, tag));
  const std::string prefix = checkpoint::kModelPrefix;
  std::vector<Tensor> whole;
  std::vector<checkpoint::SafetensorsEntry> entries;
  for (const auto& [name, info] : reader.index().tensors) {
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    whole.push_back(reader.read_whole(name));
    entries.push_back({name.substr(prefix.size()), whole.back().dtype(), info.shape, whole.back().data_ptr()});
  }
  const std::map<std::string, std::string> metadata = {
      {"format", "megadlm-gradients"}, {"iteration", tag}, {"layout", layout},
      {"contents", "reduced fp32 gradients of the loss / global loss tokens, before clipping"}};
  checkpoint::write_safetensors(path, entries, metadata);
  std::error_code ec;
  fs::remove_all(sharded, ec);  // only the assembled file is kept; a leftover is disk space only
  return path;
}

}  // namespace megadlm
