#include "megadlm/training/parallelize.h"
#include <algorithm>
#include "megadlm/parallel/pipeline_parallel/layer_partition.h"
#include "megadlm/parallel/rank_layout.h"

namespace megadlm {

Fp8Settings fp8_settings(const RunConfig& cfg) {
  const Fp8Config& f = cfg.fp8;
  MDLM_CHECK(f.enabled(), "fp8_settings without --fp8-format");
  MDLM_CHECK(f.recipe == Fp8Recipe::Delayed || f.recipe == Fp8Recipe::Tensorwise ||
                 f.recipe == Fp8Recipe::Blockwise,
             "FP8 training implements the delayed, tensorwise and blockwise recipes (docs/fp8.md)");
  Fp8Settings s;
  s.scaling = f.recipe == Fp8Recipe::Delayed      ? Fp8Scaling::Delayed
              : f.recipe == Fp8Recipe::Tensorwise ? Fp8Scaling::Tensorwise
                                                  : Fp8Scaling::Blockwise;
  s.fwd_type = ops::Fp8Type::E4M3;
  s.grad_type = *f.format == Fp8Format::Hybrid ? ops::Fp8Type::E5M2 : ops::Fp8Type::E4M3;
  s.margin = f.margin;
  s.history_len = f.amax_history_len;
  s.algo = f.amax_compute_algo == Fp8AmaxComputeAlgo::Max ? ops::AmaxComputeAlgo::Max
                                                          : ops::AmaxComputeAlgo::MostRecent;
  s.wgrad = f.wgrad;
  s.param_gather = f.param_gather;
  s.num_layers = cfg.model.num_layers;
  if (f.first_last_layers_bf16) {
    s.bf16_start = f.num_layers_at_start_in_bf16;
    s.bf16_end = f.num_layers_at_end_in_bf16;
  }
  return s;
}

std::unique_ptr<ParallelModel> parallelize(const RunConfig& cfg, const parallel::ProcessGroups* groups) {
  auto pm = std::make_unique<ParallelModel>();
  const ParallelConfig& pc = cfg.parallel;
  const bool cuda = cfg.training.device == DeviceKind::Cuda;
  if (groups != nullptr) {
    pm->world = groups->world;
    pm->rank = groups->world ? groups->world->rank() : 0;
    pm->data_group = groups->dp;
    pm->grad_group = groups->dp_cp;
    pm->expert_grad_group = groups->expert_dp;
    pm->pipeline = groups->pp;
    pm->model_parallel = ModelParallel::from(*groups, pc);
    MDLM_CHECK(!pm->grad_group ||
                   pm->grad_group->size() == pc.data_parallel_size * pc.context_parallel_size,
               "the dp-cp group has ", pm->grad_group ? pm->grad_group->size() : 1,
               " ranks but the configuration says dp ", pc.data_parallel_size, " x cp ",
               pc.context_parallel_size);
    if (pm->data_group) pm->data_shard = {pm->data_group->rank(), pm->data_group->size()};
    // The sample assignment the trainer uses must be the layout's
    // (docs/parallelism/data_parallel.md).
    const DataShard expected = DataShard::of(parallel::RankLayout::build(pc), pm->rank);
    MDLM_CHECK(pm->data_shard == expected, "rank ", pm->rank, ": the data group says data rank ",
               pm->data_shard.rank, " of ", pm->data_shard.size, ", the layout says ", expected.rank,
               " of ", expected.size);
  }
  MDLM_CHECK(pm->model_parallel.tp.size == pc.tensor_model_parallel_size, "the tp group has ",
             pm->model_parallel.tp.size, " ranks but --tensor-model-parallel-size is ",
             pc.tensor_model_parallel_size);
  ModelRuntime& rt = pm->runtime;
  rt.stream = Stream::for_device(
      cuda ? (pm->grad_group ? pm->grad_group->device() : Device::cuda(0)) : Device::cpu());
  rt.dtype = cuda ? DType::BF16 : DType::F32;
  rt.seed = cfg.training.seed;
  rt.training = true;

  // Pipeline: this rank's chunks of layers (several with virtual stages); the first virtual
  // stage holds the embedding, the last one the head.
  if (pm->pipeline) {
    pm->pp_rank = pm->pipeline->rank();
    pm->pp_size = pm->pipeline->size();
  }
  MDLM_CHECK(pm->pp_size == pc.pipeline_model_parallel_size, "the pp group has ", pm->pp_size,
             " ranks but --pipeline-model-parallel-size is ", pc.pipeline_model_parallel_size);
  // FP8 linears (--fp8-format): one scaling state shared by every linear of this rank.
  if (cfg.fp8.enabled()) pm->model_parallel.fp8 = std::make_shared<Fp8State>(fp8_settings(cfg));
  const int vpp = std::max(1, pc.virtual_pipeline_model_parallel_size);
  const auto ranges = pp::stage_layers(cfg.model.num_layers, pm->pp_size, vpp, pm->pp_rank,
                                       pc.decoder_first_pipeline_num_layers,
                                       pc.decoder_last_pipeline_num_layers);
  for (int c = 0; c < static_cast<int>(ranges.size()); ++c) {
    ModelChunkSpec spec;
    spec.embedding = pm->pp_rank == 0 && c == 0;
    spec.head = pm->pp_rank == pm->pp_size - 1 && c == static_cast<int>(ranges.size()) - 1;
    spec.first_layer = ranges[static_cast<size_t>(c)].first;
    spec.num_layers = ranges[static_cast<size_t>(c)].count;
    pm->chunks.push_back(std::make_unique<GptModel>(cfg.model, pm->store, pm->model_parallel, spec));
  }

  // Buffers and the data-parallel wrapper. Gradients reduce over dp-cp; with several
  // distributed-optimizer instances the shards live in the intra-instance group and are
  // all-reduced across instances.
  // Expert parameters reduce (and shard) over expert-dp: the ranks holding the same experts.
  const int expert_dp = pm->expert_grad_group ? pm->expert_grad_group->size() : 1;
  DataParallelGroups dp_groups{.pp = pm->pipeline};
  if (groups != nullptr) {
    dp_groups.tp = groups->tp;
    dp_groups.embedding = groups->embedding;
    dp_groups.expert = {.dp = groups->expert_dp, .ep = groups->ep, .tp = groups->expert_tp};
  }
  if (pc.use_custom_fsdp) {
    MDLM_CHECK(!cfg.fp8.param_gather, "--fp8-param-gather with Megatron-FSDP is not built yet (rule FP8-9)");
    // FSDP: the chunks' blocks are the units, in forward order; one bucket per unit.
    std::vector<FsdpUnit> units;
    for (int c = 0; c < static_cast<int>(pm->chunks.size()); ++c)
      for (std::vector<int>& handles : pm->chunks[static_cast<size_t>(c)]->param_units())
        units.push_back({c, std::move(handles)});
    FsdpOptions fo;
    fo.strategy = pc.data_parallel_sharding_strategy;
    const int d = pm->grad_group ? pm->grad_group->size() : 1;
    pm->store.materialize(rt.dtype, cfg.training.seed, rt.stream,
                          FullyShardedDataParallel::buffer_layout(
                              fo.strategy, d, units, static_cast<int>(pm->store.descs().size()), expert_dp));
    auto fsdp = std::make_unique<FullyShardedDataParallel>(pm->store, std::move(units), pm->grad_group,
                                                           fo, rt.stream, dp_groups);
    pm->fsdp = fsdp.get();
    OptimizerLayout ol;
    ol.flat_grads = fsdp->optimizer_grads_flat();
    ol.model_shards = fsdp->model_shards();
    // The CPU backend's weights are fp32: the masters are the weights (no extra bytes).
    ol.alias_master = rt.dtype == DType::F32 || rt.dtype == DType::F64;
    pm->data_parallel = std::move(fsdp);
    pm->optimizer = std::make_unique<AdamWOptimizer>(pm->store, pm->data_parallel->owned_ranges(),
                                                     cfg.optimizer, rt.stream, ol);
  } else {
    DataParallelOptions dpo;
    dpo.overlap_grad_reduce = pc.overlap_grad_reduce;
    dpo.distributed_optimizer = pc.use_distributed_optimizer;
    dpo.overlap_param_gather = pc.overlap_param_gather;
    dpo.bucket_size = pc.ddp_bucket_size;
    std::shared_ptr<comm::Communicator> shard_group = pm->grad_group;
    if (groups != nullptr && dpo.distributed_optimizer && groups->dist_opt_intra) {
      shard_group = groups->dist_opt_intra;
      pm->dist_opt_inter = dp_groups.inter = groups->dist_opt_inter;
    }
    pm->store.materialize(rt.dtype, cfg.training.seed, rt.stream,
                          DataParallel::buffer_layout(dpo, shard_group ? shard_group->size() : 1, expert_dp));
    auto dp = std::make_unique<DataParallel>(pm->store, shard_group, dpo, rt.stream, dp_groups);
    if (pm->model_parallel.fp8 && cfg.fp8.param_gather) dp->set_fp8_param_gather(pm->model_parallel.fp8);
    pm->data_parallel = std::move(dp);
    pm->optimizer = std::make_unique<AdamWOptimizer>(pm->store, pm->data_parallel->owned_ranges(),
                                                     cfg.optimizer, rt.stream);
  }
  rt.hooks = pm->data_parallel.get();
  if (cfg.model.moe.enabled()) {
    pm->moe = std::make_unique<MoeStepState>(cfg.model, rt.stat_dtype(), rt.stream);
    // The aux and z losses of each micro-batch weigh 1 / (micro-batches of the global batch):
    // the objective holds their mean over the global batch.
    pm->moe->aux_grad_scale = static_cast<float>(cfg.training.micro_batch_size) /
                              static_cast<float>(cfg.training.global_batch_size);
    rt.moe = pm->moe.get();
  }
  rt.stream.synchronize();
  return pm;
}

}  // namespace megadlm
