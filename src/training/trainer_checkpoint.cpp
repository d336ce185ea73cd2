// Trainer's checkpoint side (docs/checkpoints.md): loading at construction, saving on schedule,
// at exit and on a stop request, and the iteration-boundary decisions every rank must take
// together. The format, the safety protocol and the layout independence live in
// training/checkpoint/; this file only maps the trainer's state onto them.
#include <array>
#include <cmath>
#include <filesystem>
#include <ostream>
#include <set>
#include <sstream>
#include "megadlm/training/checkpoint/checkpoint.h"
#include "megadlm/training/checkpoint/config_json.h"
#include "megadlm/training/checkpoint/training_state.h"
#include "megadlm/training/checkpoint_args.h"
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

}  // namespace

void Trainer::set_stop_request(std::function<bool()> stop_requested) {
  stop_requested_ = std::move(stop_requested);
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
  checkpoint::StateSnapshot snap =
      checkpoint::snapshot_state(pm_->store, *pm_->optimizer, writer, ck.save_optim, pm_->runtime.stream);
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
        if (logging_rank())
          log_ << "WARNING: could not remove older non-persistent checkpoints in " << dir << ": "
               << e.what() << std::endl;
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

void Trainer::load_checkpoint() {
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
    if (logging_rank())
      log_ << "WARNING: could not find a checkpoint in --load " << ck.load << " (no "
           << checkpoint::kLatestFileName << "): training starts from scratch" << std::endl;
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
      else if (logging_rank()) log_ << "WARNING: checkpoint differs from this run in " << line << std::endl;
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

  // Verify the files this load reads (spread over the ranks, agreed), then read. A rank that
  // fails while reading makes every rank fail here, before any step.
  std::vector<std::string> prefixes = {checkpoint::kModelPrefix};
  if (load_optim) prefixes.push_back("optimizer/");
  reader->verify_files(reader->files_with(prefixes), world, s);
  error.clear();
  try {
    checkpoint::load_state(*reader, pm_->store, *pm_->optimizer, load_optim, s);
  } catch (const std::exception& e) {
    error = e.what();
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
    // The RNG state is the seed: every random number is a function of (seed, global position).
    if (ck.load_rng && st.rng_seed && *st.rng_seed != cfg_.training.seed) {
      if (logging_rank())
        log_ << "WARNING: using the checkpoint's seed " << *st.rng_seed << " instead of --seed "
             << cfg_.training.seed << " (its RNG state; --no-load-rng keeps --seed)" << std::endl;
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
