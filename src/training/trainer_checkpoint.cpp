// Trainer's checkpoint side (docs/checkpoints.md): loading at construction, saving on schedule,
// at exit and on a stop request, and the iteration-boundary decisions every rank must take
// together. The format, the safety protocol and the layout independence live in
// training/checkpoint/; this file only maps the trainer's state onto them.
#include <unistd.h>
#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <random>
#include <ostream>
#include <set>
#include <sstream>
#include "megadlm/core/logging.h"
#include "megadlm/training/checkpoint/checkpoint.h"
#include "megadlm/training/checkpoint/config_json.h"
#include "megadlm/training/checkpoint/directory_lock.h"
#include "megadlm/training/checkpoint/training_state.h"
#include "megadlm/training/arguments/checkpoint_args.h"
#include "megadlm/training/trainer.h"

namespace megadlm {

namespace {

// Megatron's "iteration" field width in its checkpoint messages.
std::string iter_text(int64_t it) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%8lld", static_cast<long long>(it));
  return buf;
}

double world_max(comm::Communicator* world, const Stream& s, double v) {
  if (world == nullptr || world->size() == 1) return v;
  Tensor t = Tensor::from_floats({0.0f}, {1}, DType::F64);
  t.data<double>()[0] = v;
  if (!world->device().is_cpu()) t = t.to(world->device(), s);
  world->all_reduce(t, comm::ReduceOp::Max, s);
  world->synchronize(s);
  if (!t.is_cpu()) t = t.to(Device::cpu(), s);
  return t.data<double>()[0];
}

// LR-scheduler inputs Megatron checks against the checkpoint (OptimizerParamScheduler):
// (flag, checkpoint value, this run's value) for each that differs.
std::vector<std::array<std::string, 3>> lr_differences(const OptimizerConfig& saved, const OptimizerConfig& now) {
  static const char* const kDecay[] = {"constant", "linear", "cosine", "inverse-square-root", "WSD"};
  static const char* const kWsd[] = {"exponential", "linear", "cosine"};
  std::vector<std::array<std::string, 3>> out;
  auto num = [](double v) {
    std::ostringstream os;
    os << v;
    return os.str();
  };
  auto cmp = [&](const char* flag, const std::string& a, const std::string& b) {
    if (a != b) out.push_back({flag, a, b});
  };
  cmp("--lr", num(saved.lr), num(now.lr));
  cmp("--min-lr", num(saved.min_lr), num(now.min_lr));
  cmp("--lr-warmup-init", num(saved.lr_warmup_init), num(now.lr_warmup_init));
  cmp("--lr-warmup-iters", std::to_string(saved.lr_warmup_iters), std::to_string(now.lr_warmup_iters));
  cmp("--lr-decay-iters", std::to_string(saved.lr_decay_iters), std::to_string(now.lr_decay_iters));
  cmp("--lr-decay-style", kDecay[static_cast<int>(saved.decay_style)], kDecay[static_cast<int>(now.decay_style)]);
  cmp("--lr-wsd-decay-iters", std::to_string(saved.lr_wsd_decay_iters), std::to_string(now.lr_wsd_decay_iters));
  cmp("--lr-wsd-decay-style", kWsd[static_cast<int>(saved.wsd_decay_style)], kWsd[static_cast<int>(now.wsd_decay_style)]);
  return out;
}

std::string layout_text(const RunConfig& c, int dp) {
  std::ostringstream os;
  os << "world " << c.parallel.world_size << ": tp " << c.parallel.tensor_model_parallel_size << ", pp "
     << c.parallel.pipeline_model_parallel_size << ", cp " << c.parallel.context_parallel_size << ", dp "
     << dp
     << (c.parallel.use_custom_fsdp
             ? std::string(", Megatron-FSDP ") + sharding_strategy_name(c.parallel.data_parallel_sharding_strategy)
             : c.parallel.use_distributed_optimizer ? ", distributed optimizer" : "")
     << (c.parallel.num_distributed_optimizer_instances > 1
             ? " (" + std::to_string(c.parallel.num_distributed_optimizer_instances) + " instances)"
             : std::string())
     << "; model dtype " << (c.training.device == DeviceKind::Cuda ? "bf16" : "f32");
  return os.str();
}

bool same_directory(const std::string& a, const std::string& b) {
  std::error_code ec;
  const std::filesystem::path x = std::filesystem::weakly_canonical(a, ec);
  const std::filesystem::path y = std::filesystem::weakly_canonical(b, ec);
  return (x / "").lexically_normal() == (y / "").lexically_normal();
}

// A new trajectory id: 16 hex digits, different for every run that draws one.
std::string new_trajectory_id() {
  std::random_device rd;
  uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  v ^= static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) * 0x9E3779B97F4A7C15ull;
  v ^= static_cast<uint64_t>(::getpid()) << 20;
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// "iter_0000015, iter_0000020" (the first 8, then how many in all).
// What a run trains, in words: the part of the configuration a resume must keep (the block
// size may change between stages; its warm-up is checked separately).
std::string objective_description(const RunConfig& c) {
  if (c.diffusion.mode == RunningMode::Vanilla) return "vanilla (autoregressive, causal)";
  if (c.model.attention_mask != AttentionMaskType::BlockCausal)
    return std::string("difflm-noshift (full-sequence diffusion, ") +
           (c.model.attention_mask == AttentionMaskType::NoMask ? "no_mask" : "causal") + ")";
  return std::string("difflm-noshift (block diffusion, clean half ") +
         (c.model.block_diffusion_causal_clean ? "causal with the AR loss" : "block_causal") + ")";
}

std::string schedule_text(const std::vector<std::pair<int64_t, int64_t>>& sched) {
  std::ostringstream out;
  for (size_t k = 0; k < sched.size(); ++k) out << (k ? " " : "") << sched[k].first << ":" << sched[k].second;
  return sched.empty() ? std::string("none") : out.str();
}

std::string iteration_list(const std::vector<int64_t>& its) {
  std::string out;
  for (size_t i = 0; i < its.size() && i < 8; ++i) out += (i ? ", " : "") + checkpoint::iteration_dir_name(its[i]);
  if (its.size() > 8) out += ", ... (" + std::to_string(its.size()) + " in all)";
  return out;
}

}  // namespace

void Trainer::set_stop_request(std::function<bool()> stop_requested) {
  stop_requested_ = std::move(stop_requested);
}

namespace {
std::string expert_bias_name(int layer) {
  return std::string(checkpoint::kMoeStatePrefix) + "expert_bias/decoder.layers." + std::to_string(layer);
}
}  // namespace

void Trainer::add_moe_state(checkpoint::StateSnapshot& snap) const {
  if (!pm_->moe) return;
  // Every rank of a stage holds the same biases: the first rank of its gradient and TP groups
  // writes them.
  if ((pm_->grad_group && pm_->grad_group->rank() != 0) || pm_->model_parallel.tp.rank != 0) return;
  auto host = std::make_shared<std::vector<Tensor>>();
  for (size_t l = 0; l < pm_->moe->expert_bias.size(); ++l) {
    const Tensor& bias = pm_->moe->expert_bias[l];
    if (!bias.defined()) continue;
    bool here = false;  // this rank's stage holds the layer
    for (const auto& chunk : pm_->chunks)
      here |= static_cast<int>(l) >= chunk->chunk().first_layer &&
              static_cast<int>(l) < chunk->chunk().first_layer + chunk->chunk().num_layers;
    if (!here) continue;
    host->push_back(bias.to(Device::cpu(), pm_->runtime.stream));
    checkpoint::OutgoingPiece p;
    p.tensor = expert_bias_name(static_cast<int>(l));
    p.global_shape = bias.shape();
    p.region = checkpoint::Region::whole(bias.shape());
    p.dtype = DType::F32;
    p.data = host->back().data_ptr();
    snap.pieces.push_back(p);
  }
  if (host->empty()) return;
  auto previous = snap.keep_alive;
  snap.keep_alive = std::make_shared<std::pair<std::shared_ptr<const void>, std::shared_ptr<std::vector<Tensor>>>>(
      previous, host);
}

void Trainer::load_moe_state(const checkpoint::CheckpointReader& reader) {
  if (!pm_->moe) return;
  for (size_t l = 0; l < pm_->moe->expert_bias.size(); ++l) {
    Tensor& bias = pm_->moe->expert_bias[l];
    const std::string name = expert_bias_name(static_cast<int>(l));
    if (!bias.defined() || !reader.has_tensor(name)) continue;  // older checkpoints: zero biases
    Tensor host = Tensor::empty(bias.shape(), DType::F32, Stream::cpu());
    reader.read(name, bias.shape(), checkpoint::Region::whole(bias.shape()), host);
    copy_tensor(host, bias, pm_->runtime.stream);
    pm_->runtime.stream.synchronize();
  }
}

void Trainer::add_fp8_state(checkpoint::StateSnapshot& snap) const {
  const std::shared_ptr<Fp8State>& fp8 = pm_->model_parallel.fp8;
  if (!fp8 || !fp8->delayed() || fp8->size() == 0) return;
  // After finish_step every rank of a stage holds the same state (the amaxes were reduced over
  // TP and data x context parallel): the first rank of its gradient and TP groups writes it.
  if ((pm_->grad_group && pm_->grad_group->rank() != 0) || pm_->model_parallel.tp.rank != 0) return;
  auto host = std::make_shared<std::vector<std::vector<float>>>();
  host->reserve(static_cast<size_t>(fp8->size()));
  for (int i = 0; i < fp8->size(); ++i) {
    host->push_back(fp8->state(i));
    checkpoint::OutgoingPiece p;
    p.tensor = std::string(checkpoint::kFp8StatePrefix) + fp8->name(i);
    p.global_shape = {static_cast<int64_t>(host->back().size())};
    p.region = checkpoint::Region::whole(p.global_shape);
    p.dtype = DType::F32;
    p.data = host->back().data();
    snap.pieces.push_back(p);
  }
  auto previous = snap.keep_alive;
  snap.keep_alive =
      std::make_shared<std::pair<std::shared_ptr<const void>, std::shared_ptr<std::vector<std::vector<float>>>>>(
          previous, host);
}

void Trainer::load_fp8_state(const checkpoint::CheckpointReader& reader) {
  const std::shared_ptr<Fp8State>& fp8 = pm_->model_parallel.fp8;
  if (!fp8 || !fp8->delayed()) return;
  int missing = 0;
  for (int i = 0; i < fp8->size(); ++i) {
    const std::string name = std::string(checkpoint::kFp8StatePrefix) + fp8->name(i);
    if (!reader.has_tensor(name)) {  // a bf16 or tensorwise checkpoint: scales start afresh
      ++missing;
      continue;
    }
    const int64_t n = cfg_.fp8.amax_history_len + 1;
    Tensor host = Tensor::empty({n}, DType::F32, Stream::cpu());
    reader.read(name, {n}, checkpoint::Region::whole({n}), host);
    fp8->set_state(i, host.to_floats(Stream::cpu()), pm_->runtime.stream);
  }
  if (missing > 0 && logging_rank())
    log_ << " the checkpoint has no FP8 delayed-scaling state for " << missing << " of " << fp8->size()
         << " tensors: their amax histories start empty" << std::endl;
}

void Trainer::save_checkpoint(bool non_persistent) {
  const CheckpointConfig& ck = cfg_.checkpoint;
  const std::string dir = non_persistent ? ck.non_persistent_save_dir() : ck.save;
  MDLM_CHECK(!dir.empty(), non_persistent ? "a rolling save without --save or --non-persistent-global-ckpt-dir"
                                          : "save_checkpoint() without a --save directory");
  if (!ckpt_writer_) ckpt_writer_ = std::make_unique<checkpoint::CheckpointWriter>(pm_->world, pm_->runtime.stream);
  // Who writes: each element of the optimizer state once. Without the distributed optimizer
  // every data-parallel rank holds everything and rank 0 of the group writes; with it (and with
  // a sharding FSDP strategy) every rank writes its shard, in the first distributed-optimizer
  // instance only.
  const bool writer = pm_->data_parallel->checkpoint_writer();
  if (logging_rank())
    log_ << "saving " << (non_persistent ? "non-persistent " : "") << "checkpoint at iteration "
         << iter_text(iteration_) << " to " << dir << (ck.async_save ? " (asynchronously)" : "") << std::endl;
  const auto t0 = std::chrono::steady_clock::now();
  // Expert parameters: their replicas are the expert-dp group (other EP ranks hold other experts).
  const bool expert_writer = cfg_.parallel.use_distributed_optimizer
                                 ? writer
                                 : (!pm_->expert_grad_group || pm_->expert_grad_group->rank() == 0);
  checkpoint::StateSnapshot snap = checkpoint::snapshot_state(pm_->store, *pm_->optimizer, writer, ck.save_optim,
                                                              pm_->runtime.stream, expert_writer);
  add_moe_state(snap);
  add_fp8_state(snap);
  checkpoint::CheckpointState st;
  st.iteration = iteration_;
  st.consumed_samples = consumed_samples_;
  st.optimizer_steps = pm_->optimizer->steps();
  st.skipped_iterations = skipped_iterations_;
  st.nan_iterations = nan_iterations_;
  st.has_optimizer = ck.save_optim;
  if (ck.save_rng) st.rng_seed = cfg_.training.seed;
  st.run_config_json = checkpoint::run_config_to_json(cfg_);
  st.model_args = training::checkpoint_model_args(cfg_);
  st.saved_under = layout_text(cfg_, pm_->grad_group ? pm_->grad_group->size() : 1);
  st.created_by = "megadlm pretrain_difflm";
  st.trajectory = trajectory_;
  const std::string tag = std::to_string(iteration_);
  std::function<void()> after_commit;
  if (non_persistent) {
    // Megatron keeps one rolling checkpoint. Removing the others only after this one has
    // committed (and "latest" names it) means a crash at any point leaves a loadable newest.
    after_commit = [this, dir, tag] {
      try {
        const std::vector<std::string> removed = checkpoint::remove_older_checkpoints(dir, tag);
        if (logging_rank() && !removed.empty()) {
          log_ << "  removed older non-persistent checkpoints:";
          for (const std::string& r : removed) log_ << " " << r;
          log_ << std::endl;
        }
      } catch (const std::exception& e) {
        // The new checkpoint is safe; a stale one left behind is only disk space.
        logging::warn("could not remove older non-persistent checkpoints in ", dir, ": ", e.what());
      }
    };
  } else if (ck.keep_last_n_checkpoints > 0) {
    // --keep-last-n-checkpoints: pruned only once this save has committed ("latest" names it),
    // so the newest complete checkpoint is never the one removed and a crash keeps N.
    // Only this run's trajectory is ranked (its saves and the history it continues), and the
    // checkpoint it was loaded from is never removed: a rewound run keeps its branch point and
    // its own saves, whatever newer checkpoints another trajectory left in the folder.
    const int64_t keep = ck.keep_last_n_checkpoints;
    std::vector<std::string> protect;
    if (!loaded_from_.empty() && same_directory(std::filesystem::path(loaded_from_).parent_path().string(), dir))
      protect.push_back(std::filesystem::path(loaded_from_).filename().string());
    after_commit = [this, dir, keep, protect] {
      try {
        const std::vector<std::string> removed = checkpoint::remove_checkpoints_beyond(dir, keep, trajectory_, protect);
        if (logging_rank() && !removed.empty()) {
          log_ << "  removed checkpoints beyond the newest " << keep << " (--keep-last-n-checkpoints):";
          for (const std::string& r : removed) log_ << " " << r;
          log_ << std::endl;
        }
      } catch (const std::exception& e) {
        logging::warn("could not remove old checkpoints in ", dir, ": ", e.what());
      }
    };
  }
  ckpt_writer_->save(dir, tag, st, std::move(snap.pieces), std::move(snap.keep_alive), ck.async_save,
                     std::move(after_commit));
  if (!non_persistent) last_checkpoint_iteration_ = iteration_;
  if (logging_rank() && !ckpt_writer_->pending())
    log_ << "  successfully saved " << (non_persistent ? "non-persistent " : "") << "checkpoint from iteration "
         << iter_text(iteration_) << " to " << dir << " ("
         << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s)"
         << std::endl;
}

bool Trainer::checkpoint_boundary() {
  const CheckpointConfig& ck = cfg_.checkpoint;
  const TrainingConfig& tc = cfg_.training;
  if (ckpt_writer_ && ckpt_writer_->pending() && ckpt_writer_->poll() && logging_rank())
    log_ << "  successfully saved checkpoint (asynchronously) to " << ckpt_writer_->last_committed()
         << std::endl;
  bool saved = false;
  if (!ck.save.empty()) {
    bool due = ck.save_interval > 0 && iteration_ % ck.save_interval == 0;
    // --checkpoint-steps counts the iteration before the step (MegaDLMs' pre-increment counter).
    for (int64_t k : ck.extra_save_iterations) due = due || k + 1 == iteration_;
    if (due) {
      save_checkpoint();
      saved = true;
    }
  }
  // Rolling saves only where no persistent one happens (Megatron's elif). Like Megatron, a
  // rolling save counts as this iteration's save: an exit here does not save again.
  if (!saved && ck.non_persistent_save_interval > 0 && iteration_ % ck.non_persistent_save_interval == 0) {
    save_checkpoint(/*non_persistent=*/true);
    saved = true;
  }
  std::string why;
  if (tc.exit_interval && iteration_ % *tc.exit_interval == 0) why = "--exit-interval";
  // A stop request (signal) or the time limit can differ between ranks: every rank takes the
  // largest verdict, so all save and stop after the same iteration.
  if (stop_requested_ || tc.exit_duration_in_mins) {
    double verdict = 0;
    if (stop_requested_ && stop_requested_()) verdict = 1;
    const double minutes =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time_).count() / 60.0;
    if (tc.exit_duration_in_mins && minutes > static_cast<double>(*tc.exit_duration_in_mins)) verdict = std::max(verdict, 2.0);
    verdict = world_max(pm_->world.get(), pm_->runtime.stream, verdict);
    if (verdict == 1) why = "stop requested (SIGTERM or SIGUSR1)";
    if (verdict == 2) why = "--exit-duration-in-mins " + std::to_string(*tc.exit_duration_in_mins);
  }
  if (why.empty()) return false;
  if (!ck.save.empty() && !saved) save_checkpoint();
  if (logging_rank()) log_ << " exiting program at iteration " << iteration_ << " (" << why << ")" << std::endl;
  return true;
}

void Trainer::finish_checkpoints(bool exiting) {
  const CheckpointConfig& ck = cfg_.checkpoint;
  // The end of training is saved persistently even after a rolling save there (Megatron's final
  // save); an exit has saved in checkpoint_boundary() already.
  if (!exiting && !ck.save.empty() && iteration_ > 0 && iteration_ != last_checkpoint_iteration_)
    save_checkpoint();
  if (ckpt_writer_ && ckpt_writer_->pending()) {
    ckpt_writer_->wait();
    if (logging_rank())
      log_ << "  successfully saved checkpoint (asynchronously) to " << ckpt_writer_->last_committed()
           << std::endl;
  }
}

void Trainer::stop_on_fault(const std::string& report) {
  // The update of this step was not applied: the weights are those after iteration_. That is
  // the last good state unless an earlier update came from a flagged result (a reproducible
  // spike, a possible divergence, applied as the rules say): then every state since is the
  // divergence's, and the last good one is the state before that update.
  std::string where;
  const CheckpointConfig& ck = cfg_.checkpoint;
  if (first_flagged_iteration_) {
    const int64_t good = *first_flagged_iteration_ - 1;
    std::string first = first_flagged_report_;
    if (first.size() > 200) first = first.substr(0, 200) + "...";
    where = "; no checkpoint was written: the state at iteration " + std::to_string(iteration_) +
            " is not a good state, it follows the update of iteration " + std::to_string(*first_flagged_iteration_) +
            ", whose result was flagged (" + first + ") and applied. The last good state is iteration " +
            std::to_string(good) + (good == 0 ? " (the initialisation)" : "");
    // This run's checkpoints (its trajectory's), and the one it was loaded from.
    std::vector<int64_t> ours;
    if (!ck.save.empty())
      for (int64_t it : checkpoint::list_checkpoint_iterations(ck.save))
        if (checkpoint::read_trajectory(checkpoint::checkpoint_dir(ck.save, std::to_string(it))) == trajectory_)
          ours.push_back(it);
    std::string held;
    if (std::find(ours.begin(), ours.end(), good) != ours.end()) held = checkpoint::checkpoint_dir(ck.save, std::to_string(good));
    else if (resumed_ && good == last_loaded_iteration_) held = loaded_from_;
    if (!held.empty()) {
      where += ": the checkpoint " + held + " (resume it with a lower --lr: --load " +
               std::filesystem::path(held).parent_path().string() + " --ckpt-step " + std::to_string(good) +
               ", with --overwrite-checkpoints or another --save to save past the later checkpoints)";
    } else {
      std::vector<int64_t> earlier;
      for (int64_t it : ours)
        if (it < good) earlier.push_back(it);
      where += ", which no checkpoint holds" +
               (earlier.empty() ? std::string(" (and none is older)")
                                : " (the newest older one: " + checkpoint::checkpoint_dir(ck.save, std::to_string(earlier.back())) + ")") +
               "; lower --lr and start again from there";
    }
  } else if (!ck.save.empty()) {
    if (last_checkpoint_iteration_ != iteration_) save_checkpoint();
    if (ckpt_writer_ && ckpt_writer_->pending()) ckpt_writer_->wait();
    where = "; the last good state (iteration " + std::to_string(iteration_) + ") is the checkpoint " +
            checkpoint::checkpoint_dir(ck.save, std::to_string(iteration_)) +
            " (resume it, on other hardware to rule out a device fault)";
  } else {
    where = "; no checkpoint was saved (no --save)";
  }
  if (ckpt_writer_ && ckpt_writer_->pending()) ckpt_writer_->wait();  // a scheduled save in flight
  throw FaultStop(report + ". Stopping the run" + where, kExitReproducibleFault);
}

void Trainer::load_checkpoint() {
  lock_save_directories();
  load_checkpoint_files();
  check_save_directories();
}

namespace {

// The directories a run saves into: --save, and the rolling directory when it saves there.
std::vector<std::pair<std::string, std::string>> save_directories(const CheckpointConfig& ck) {
  std::vector<std::pair<std::string, std::string>> out;
  if (!ck.save.empty()) out.emplace_back(ck.save, "--save");
  if (ck.non_persistent_save_interval > 0 && !ck.non_persistent_save_dir().empty()) {
    const bool inside = ck.non_persistent_global_ckpt_dir.empty();
    out.emplace_back(ck.non_persistent_save_dir(),
                     inside ? "--save (its non_persistent directory)" : "--non-persistent-global-ckpt-dir");
  }
  return out;
}

}  // namespace

void Trainer::lock_save_directories() {
  // Rank 0 writes the index and "latest": it holds the lock for the whole job. Rolling saves
  // inside --save (its non_persistent directory) are covered by its lock; an explicit rolling
  // directory gets one of its own.
  const CheckpointConfig& ck = cfg_.checkpoint;
  std::vector<std::pair<std::string, std::string>> dirs;
  if (!ck.save.empty()) dirs.emplace_back(ck.save, "--save");
  if (ck.non_persistent_save_interval > 0 && !ck.non_persistent_global_ckpt_dir.empty())
    dirs.emplace_back(ck.non_persistent_global_ckpt_dir, "--non-persistent-global-ckpt-dir");
  if (dirs.empty()) return;  // the same on every rank: no collective either
  std::string error, warning;
  if (logging_rank()) {
    try {
      for (const auto& [dir, flag] : dirs) {
        std::string w;
        save_locks_.push_back(std::make_unique<checkpoint::DirectoryLock>(dir, flag, &w));
        if (!w.empty()) warning += (warning.empty() ? "" : "\n") + w;
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  checkpoint::agree(pm_->world.get(), pm_->runtime.stream, error, "locking the checkpoint directory");
  if (!warning.empty()) logging::warn(warning);
}

void Trainer::check_save_directories() {
  // A save directory that holds checkpoints must be the one this run continues: otherwise its
  // saves would interleave with (and its "latest" would replace) another run's. Megatron
  // overwrites silently. A run resumed from the directory continues its own trajectory; one
  // rewound to an older checkpoint (an explicit --ckpt-step below newer ones) starts another,
  // and the newer checkpoints belong to the abandoned one: saving over them, and moving "latest"
  // back, needs --overwrite-checkpoints.
  const CheckpointConfig& ck = cfg_.checkpoint;
  if (!resumed_) trajectory_ = new_trajectory_id();
  if (save_directories(ck).empty()) return;
  std::string error, warning;
  if (logging_rank()) {
    std::vector<std::string> continued;
    if (resumed_) {
      continued.push_back(std::filesystem::path(loaded_from_).parent_path().string());
      continued.push_back(ck.load);
      if (ck.non_persistent_global) continued.push_back(ck.non_persistent_load_dir());
    }
    // Rewinding: the newer checkpoints of the folder the run was loaded from.
    const std::string loaded_dir = std::filesystem::path(loaded_from_).parent_path().string();
    if (resumed_ && ck.ckpt_step && !checkpoint::list_checkpoint_iterations(loaded_dir).empty() &&
        checkpoint::list_checkpoint_iterations(loaded_dir).back() > iteration_)
      trajectory_ = new_trajectory_id();
    // The iterations this run saves at (on schedule, --checkpoint-steps, the end).
    auto planned = [&](int64_t it) {
      const int64_t last = cfg_.training.train_iters;
      if (it <= iteration_ || it > last) return false;
      if (it == last || (ck.save_interval > 0 && it % ck.save_interval == 0)) return true;
      return std::find(ck.extra_save_iterations.begin(), ck.extra_save_iterations.end(), it - 1) !=
             ck.extra_save_iterations.end();
    };
    for (const auto& [dir, flag] : save_directories(ck)) {
      const std::vector<int64_t> held = checkpoint::list_checkpoint_iterations(dir);
      if (held.empty()) continue;
      bool ours = false;
      for (const std::string& c : continued) ours = ours || (!c.empty() && same_directory(c, dir));
      if (!ours) {
        std::ostringstream msg;
        msg << flag << " " << dir << " already holds " << held.size() << " checkpoint(s) of another run (newest: "
            << checkpoint::iteration_dir_name(held.back()) << ") and this run "
            << (loaded_from_.empty() ? "does not resume from it"
                : !resumed_          ? "starts anew from " + loaded_from_ + " (fine-tuning or a release checkpoint)"
                                     : "resumes from " + loaded_from_)
            << ": its saves would overwrite them";
        if (ck.overwrite_checkpoints) {
          warning += (warning.empty() ? "" : "\n") + msg.str() + " (--overwrite-checkpoints: they are replaced " +
                     "where this run saves the same iteration, and latest will name this run's)";
          continue;
        }
        msg << ". Resume from it with --load " << dir
            << ", save into an empty directory, or add --overwrite-checkpoints to save over them";
        error = msg.str();
        break;
      }
      // This run's folder: checkpoints newer than the one loaded that are not of this run's
      // trajectory (a rewind's abandoned ones, or those a forced rewind left behind).
      std::vector<int64_t> at_stake, overwritten;
      for (int64_t it : held) {
        if (it <= iteration_) continue;
        if (checkpoint::read_trajectory(checkpoint::checkpoint_dir(dir, std::to_string(it))) == trajectory_) continue;
        at_stake.push_back(it);
        if (planned(it)) overwritten.push_back(it);
      }
      if (at_stake.empty()) continue;
      const std::optional<std::string> latest = checkpoint::read_latest(dir);
      std::ostringstream msg;
      msg << flag << " " << dir << ": this run resumes from " << loaded_from_ << " (iteration " << iteration_
          << (ck.ckpt_step ? ", --ckpt-step " + std::to_string(*ck.ckpt_step) : std::string()) << "), but " << dir
          << " also holds " << at_stake.size() << " newer checkpoint(s) of another trajectory: "
          << iteration_list(at_stake) << (latest ? " (" + std::string(checkpoint::kLatestFileName) + " names " + *latest + ")" : "")
          << ". This run's saves would "
          << (overwritten.empty() ? std::string() : "overwrite " + iteration_list(overwritten) + " and ")
          << "move latest back to its own iterations";
      if (ck.overwrite_checkpoints) {
        warning += (warning.empty() ? "" : "\n") + msg.str() + " (--overwrite-checkpoints: going ahead; the "
                   "other trajectory's checkpoints this run does not reach stay)";
        continue;
      }
      msg << ". Save this run into another directory (--save NEW_DIR; --load " << ck.load
          << (ck.ckpt_step ? " --ckpt-step " + std::to_string(*ck.ckpt_step) : std::string())
          << " still reads from here), or add --overwrite-checkpoints to replace them";
      error = msg.str();
      break;
    }
  }
  checkpoint::agree(pm_->world.get(), pm_->runtime.stream, error, "checking the checkpoint directory");
  if (!warning.empty()) logging::warn(warning);
}

void Trainer::load_checkpoint_files() {
  const CheckpointConfig& ck = cfg_.checkpoint;
  if (ck.load.empty()) return;
  const auto t0 = std::chrono::steady_clock::now();
  const Stream& s = pm_->runtime.stream;
  comm::Communicator* world = pm_->world.get();
  // Every rank reads the same files; agree() turns one rank's failure into everyone's error.
  std::optional<std::string> dir;
  std::unique_ptr<checkpoint::CheckpointReader> reader;
  std::string error, choice, source = ck.load;
  try {
    dir = checkpoint::find_checkpoint(ck.load, ck.ckpt_step);
    if (dir) reader = std::make_unique<checkpoint::CheckpointReader>(*dir);
    // Megatron's _load_base_checkpoint: with rolling checkpoints configured, the newer of the
    // persistent and the rolling checkpoint (the rolling one on a tie). --ckpt-step names a
    // persistent iteration.
    if (ck.non_persistent_global && !ck.ckpt_step) {
      const std::string np_dir = ck.non_persistent_load_dir();
      if (const std::optional<std::string> np = checkpoint::find_checkpoint(np_dir, std::nullopt)) {
        if (std::filesystem::path(*np).filename() == checkpoint::kReleaseDirName)
          MDLM_FAIL("the non-persistent checkpoint directory ", np_dir,
                    " names a release checkpoint; rolling checkpoints are iterations of a run");
        auto np_reader = std::make_unique<checkpoint::CheckpointReader>(*np);
        const int64_t np_iter = np_reader->index().state.iteration;
        if (!reader || np_iter >= reader->index().state.iteration) {
          choice = "non-persistent checkpoint (iteration " + std::to_string(np_iter) + ", " +
                   (reader ? "persistent " + std::to_string(reader->index().state.iteration)
                           : std::string("no persistent one")) + ")";
          dir = np;
          source = np_dir;
          reader = std::move(np_reader);
        } else {
          choice = "persistent checkpoint (iteration " + std::to_string(reader->index().state.iteration) +
                   "; the non-persistent one in " + np_dir + " is older: " + std::to_string(np_iter) + ")";
        }
      } else {
        choice = "no non-persistent checkpoint in " + np_dir + " (no " + checkpoint::kLatestFileName + ")";
      }
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  checkpoint::agree(world, s, error, "opening the checkpoint in --load " + ck.load);
  if (!choice.empty() && logging_rank()) log_ << " loading: " << choice << std::endl;
  if (!dir) {
    if (ck.exit_on_missing_checkpoint)
      MDLM_FAIL("--load ", ck.load, " holds no checkpoint (no ", checkpoint::kLatestFileName,
                ") and --exit-on-missing-checkpoint is set");
    logging::warn("could not find a checkpoint in --load ", ck.load, " (no ", checkpoint::kLatestFileName,
              "): training starts from scratch");
    return;
  }
  const checkpoint::CheckpointState& st = reader->index().state;
  const bool release = std::filesystem::path(*dir).filename() == checkpoint::kReleaseDirName;
  const bool resume = !ck.finetune && !release;
  const bool load_optim = resume && ck.load_optim;
  if (logging_rank())
    log_ << " loading checkpoint from " << source << " at iteration " << st.iteration << " ("
         << *dir << ", saved under " << (st.saved_under.empty() ? "an unknown layout" : st.saved_under)
         << ")" << std::endl;

  // The model the checkpoint holds must be this model: flags first (named), then every tensor
  // by name and global shape against a full, unsplit copy of this model's parameter list.
  std::vector<std::string> problems;
  std::optional<RunConfig> saved;
  if (!st.run_config_json.empty()) {
    saved = checkpoint::run_config_from_json(st.run_config_json, *dir + "/" + checkpoint::kIndexFileName);
    for (const checkpoint::ConfigMismatch& m : checkpoint::compare_run_configs(*saved, cfg_, !resume)) {
      const std::string line = m.field + ": checkpoint " + m.saved + ", this run " + m.current;
      if (m.fatal) problems.push_back(line);
      else logging::warn("checkpoint differs from this run in ", line);
    }
  }
  if (problems.empty()) {
    ParameterStore full;
    GptModel reference(cfg_.model, full);
    std::set<std::string> expected;
    for (const ParamDesc& d : full.descs()) {
      for (const char* prefix : {checkpoint::kModelPrefix, checkpoint::kExpAvgPrefix, checkpoint::kExpAvgSqPrefix}) {
        if (prefix != checkpoint::kModelPrefix && !load_optim) continue;
        const std::string name = prefix + d.name;
        expected.insert(name);
        const auto it = reader->index().tensors.find(name);
        if (it == reader->index().tensors.end())
          problems.push_back("missing tensor " + name);
        else if (it->second.shape != d.shape)
          problems.push_back("tensor " + name + ": checkpoint shape " + shape_str(it->second.shape) +
                             ", this model " + shape_str(d.shape));
      }
    }
    for (const auto& [name, t] : reader->index().tensors)
      if (name.rfind(checkpoint::kModelPrefix, 0) == 0 && expected.count(name) == 0)
        problems.push_back("unexpected tensor " + name + " (not a parameter of this model)");
    if (load_optim && !st.has_optimizer)
      problems.insert(problems.begin(),
                      "the checkpoint holds no optimizer state (saved with --no-save-optim, or "
                      "converted); add --no-load-optim to resume with fresh Adam moments, or --finetune");
  }
  if (!problems.empty()) {
    std::string msg = "checkpoint " + *dir + " does not fit this run:";
    const size_t shown = std::min<size_t>(problems.size(), 20);
    for (size_t i = 0; i < shown; ++i) msg += "\n  " + problems[i];
    if (problems.size() > shown) msg += "\n  ... and " + std::to_string(problems.size() - shown) + " more";
    if (saved && saved->model.padded_vocab_size != cfg_.model.padded_vocab_size && saved->model.vocab_size == cfg_.model.vocab_size) {
      // Megatron pads the vocabulary to --make-vocab-size-divisible-by x TP: another TP size pads
      // differently unless the multiple is chosen to match.
      const int tp = cfg_.parallel.tensor_model_parallel_size;
      int64_t divisor = 0;
      for (int64_t m : training::vocab_padding_multiples(saved->model.vocab_size, saved->model.padded_vocab_size))
        if (m % tp == 0 && (divisor == 0 || m / tp <= 128)) divisor = m / tp;
      msg += "\n(the padding depends on the tensor-parallel size: " +
             (divisor > 0 ? "`--make-vocab-size-divisible-by " + std::to_string(divisor) + "` pads to " +
                                std::to_string(saved->model.padded_vocab_size) + " at TP " + std::to_string(tp)
                          : "no --make-vocab-size-divisible-by pads to " + std::to_string(saved->model.padded_vocab_size) +
                                " at TP " + std::to_string(tp)) + ")";
    }
    msg += "\n(use the flags it was trained with, or add --use-checkpoint-args to take them from it)";
    MDLM_FAIL(msg);
  }
  // The objective (running mode, attention mask, block diffusion's clean half). A resume
  // continues one run, so it must train what the checkpoint trained; --finetune (Megatron's:
  // weights only, iteration 0) may start another objective from its weights, e.g. an AR model
  // adapted to block diffusion (docs/finetuning.md), and the new checkpoints record it.
  if (saved) {
    const std::string was = objective_description(*saved), now = objective_description(cfg_);
    if (was != now && resume)
      MDLM_FAIL("checkpoint ", *dir, " was trained with another objective: ", was, "; this run: ", now,
                "\n(a resume continues the same objective; add --finetune to train the new "
                "objective from its weights, starting at iteration 0: docs/finetuning.md)");
    if (was != now) {
      cfg_.diffusion.adapted_from = was + " (" + *dir + ", iteration " + std::to_string(st.iteration) + ")";
      if (logging_rank()) log_ << " adapting the checkpoint's weights from " << was << " to " << now << std::endl;
    } else if (cfg_.diffusion.adapted_from.empty()) {
      cfg_.diffusion.adapted_from = saved->diffusion.adapted_from;  // keep the record on resumes
    }
  }
  // LR schedule (Megatron's OptimizerParamScheduler.check_and_set_): the flags must agree with
  // the checkpoint unless one of the two sources is chosen explicitly.
  if (resume && saved && !ck.override_opt_param_scheduler) {
    const auto diffs = lr_differences(saved->optimizer, cfg_.optimizer);
    if (ck.use_checkpoint_opt_param_scheduler) {
      OptimizerConfig& o = cfg_.optimizer;
      const OptimizerConfig& c = saved->optimizer;
      o.lr = c.lr; o.min_lr = c.min_lr; o.lr_warmup_init = c.lr_warmup_init;
      o.lr_warmup_iters = c.lr_warmup_iters; o.lr_decay_iters = c.lr_decay_iters;
      o.decay_style = c.decay_style; o.lr_wsd_decay_iters = c.lr_wsd_decay_iters;
      o.wsd_decay_style = c.wsd_decay_style;
    } else if (!diffs.empty()) {
      std::ostringstream msg;
      msg << "checkpoint " << *dir << " was trained with another learning-rate schedule:";
      for (const auto& d : diffs) msg << "\n  " << d[0] << ": checkpoint " << d[1] << ", this run " << d[2];
      msg << "\n(give the same values, or choose a source: --override-opt_param-scheduler takes the "
             "flags, --use-checkpoint-opt_param-scheduler the checkpoint)";
      MDLM_FAIL(msg.str());
    }
  }

  // The block-size warm-up: a resume continues the checkpoint's schedule (taken from it when the
  // flags give none); --finetune starts the flags' schedule at iteration 0.
  if (resume && saved && !saved->diffusion.block_size_schedule.empty()) {
    DiffusionConfig& dc = cfg_.diffusion;
    if (dc.block_size_schedule.empty()) {
      dc.block_size_schedule = saved->diffusion.block_size_schedule;
      if (logging_rank())
        log_ << " continuing the checkpoint's block-size schedule (block size "
             << dc.block_size_at(st.iteration) << " at iteration " << st.iteration + 1 << ")" << std::endl;
    } else if (dc.block_size_schedule != saved->diffusion.block_size_schedule) {
      MDLM_FAIL("checkpoint ", *dir, " was trained with another --dlm-block-size-schedule (",
                schedule_text(saved->diffusion.block_size_schedule), "; this run ",
                schedule_text(dc.block_size_schedule), ")\n(give the same schedule or none to continue "
                "the checkpoint's, or --finetune to start a new one)");
    }
  }

  // Verify the files this load reads (spread over the ranks, agreed), then read. A rank that
  // fails while reading makes every rank fail here, before any step.
  std::vector<std::string> prefixes = {checkpoint::kModelPrefix, checkpoint::kMoeStatePrefix,
                                       checkpoint::kFp8StatePrefix};
  if (load_optim) prefixes.push_back("optimizer/");
  reader->verify_files(reader->files_with(prefixes), world, s);
  error.clear();
  try {
    checkpoint::load_state(*reader, pm_->store, *pm_->optimizer, load_optim, s);
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (error.empty()) {
    try {
      load_moe_state(*reader);
      load_fp8_state(*reader);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  checkpoint::agree(world, s, error, "loading checkpoint " + *dir);
  pm_->optimizer->set_steps(load_optim ? st.optimizer_steps : 0);
  pm_->data_parallel->start_param_gather();  // distributed optimizer: every rank's shard of the new weights
  pm_->data_parallel->finish_param_gather();
  s.synchronize();
  if (resume) {
    iteration_ = st.iteration;
    consumed_samples_ = st.consumed_samples;
    skipped_iterations_ = st.skipped_iterations;
    nan_iterations_ = st.nan_iterations;
    last_checkpoint_iteration_ = iteration_;
    resumed_ = true;
    trajectory_ = st.trajectory;
    last_loaded_iteration_ = iteration_;
    // The RNG state is the seed: every random number is a function of (seed, global position).
    if (ck.load_rng && st.rng_seed && *st.rng_seed != cfg_.training.seed) {
      logging::warn("using the checkpoint's seed ", *st.rng_seed, " instead of --seed ", cfg_.training.seed,
                " (its RNG state; --no-load-rng keeps --seed)");
      cfg_.training.seed = *st.rng_seed;
      pm_->runtime.seed = *st.rng_seed;
    }
  }
  loaded_from_ = *dir;
  if (logging_rank())
    log_ << "  successfully loaded checkpoint from " << *dir << " [ iteration " << iteration_
         << ", consumed samples " << consumed_samples_
         << (load_optim ? "" : resume ? ", fresh optimizer state" : ", fine-tuning from its weights")
         << " ] (" << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s)"
         << std::endl;
}

}  // namespace megadlm
