// The one conversion from resolved flag values into the typed RunConfig. Each field a flag fills
// directly is one row of the lists below (dest → field); its type picks the conversion (ints,
// reals, booleans, strings, lists, optionals set only when the flag is not None, and enums
// through flag_enums.h). What combines several flags (FSDP, recomputation, the mask, checkpoint
// steps, the collective log directory) follows the lists as code.
#include <algorithm>
#include <filesystem>
#include <optional>
#include <sstream>
#include <type_traits>
#include "training/arguments/flag_enums.h"
#include "training/arguments/logging_rules.h"
#include "training/arguments/rules_common.h"

namespace megadlm::training::detail {

namespace {

template <class T>
struct IsOptional : std::false_type {};
template <class T>
struct IsOptional<std::optional<T>> : std::true_type {};
template <class T>
struct IsEnumVector : std::false_type {};
template <class E>
struct IsEnumVector<std::vector<E>> : std::is_enum<E> {};

// `out` = the flag `dest`, converted to the field's type. None reads as 0, false, "" or an empty
// list (as the string accessors do), except for optionals and enums, which keep their default.
template <class T>
void assign(const ArgState& a, const char* dest, T& out) {
  if constexpr (IsOptional<T>::value) {
    if (!a.is_set(dest)) return;
    typename T::value_type v{};
    assign(a, dest, v);
    out = v;
  } else if constexpr (std::is_same_v<T, bool>) {
    out = a.b(dest);
  } else if constexpr (std::is_enum_v<T>) {
    out = enum_flag<T>(a, dest, out);
  } else if constexpr (std::is_integral_v<T>) {
    out = static_cast<T>(a.i(dest));
  } else if constexpr (std::is_floating_point_v<T>) {
    out = static_cast<T>(a.f(dest));
  } else if constexpr (std::is_same_v<T, std::string>) {
    out = a.s(dest);
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    out = a.strings(dest);
  } else if constexpr (IsEnumVector<T>::value) {  // a list flag whose words are enum choices
    out.clear();
    for (const std::string& w : a.strings(dest)) out.push_back(enum_of_word<typename T::value_type>(w));
  } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
    out = a.ints(dest);
  } else {
    static_assert(std::is_same_v<T, std::vector<int>>, "no conversion for this field type");
    out.clear();
    for (int64_t v : a.ints(dest)) out.push_back(static_cast<int>(v));
  }
}

// Fields a flag sets directly: FIELD(dest, field of RunConfig r). IF_SET(dest, field) keeps the
// field's default while the flag is None (non-optional fields whose default is not 0 or "").
#define MEGADLM_RUN_CONFIG_FIELDS(FIELD, IF_SET)                                                  \
  FIELD(world_size, parallel.world_size)                                                        \
  FIELD(tensor_model_parallel_size, parallel.tensor_model_parallel_size)                        \
  FIELD(pipeline_model_parallel_size, parallel.pipeline_model_parallel_size)                    \
  FIELD(context_parallel_size, parallel.context_parallel_size)                                  \
  FIELD(expert_model_parallel_size, parallel.expert_model_parallel_size)                        \
  FIELD(expert_tensor_parallel_size, parallel.expert_tensor_parallel_size)                      \
  FIELD(data_parallel_size, parallel.data_parallel_size)                                        \
  FIELD(expert_data_parallel_size, parallel.expert_data_parallel_size)                          \
  FIELD(virtual_pipeline_model_parallel_size, parallel.virtual_pipeline_model_parallel_size)    \
  FIELD(microbatch_group_size_per_vp_stage, parallel.microbatch_group_size_per_vp_stage)        \
  FIELD(decoder_first_pipeline_num_layers, parallel.decoder_first_pipeline_num_layers)          \
  FIELD(decoder_last_pipeline_num_layers, parallel.decoder_last_pipeline_num_layers)            \
  FIELD(account_for_embedding_in_pipeline_split, parallel.account_for_embedding_in_pipeline_split) \
  FIELD(account_for_loss_in_pipeline_split, parallel.account_for_loss_in_pipeline_split)        \
  FIELD(sequence_parallel, parallel.sequence_parallel)                                          \
  FIELD(use_tp_pp_dp_mapping, parallel.use_tp_pp_dp_mapping)                                    \
  FIELD(overlap_p2p_comm, parallel.overlap_p2p_comm)                                            \
  FIELD(align_param_gather, parallel.align_param_gather)                                        \
  FIELD(align_grad_reduce, parallel.align_grad_reduce)                                          \
  FIELD(cp_comm_type, parallel.cp_comm_type)                                                    \
  FIELD(hierarchical_context_parallel_sizes, parallel.hierarchical_context_parallel_sizes)      \
  FIELD(num_distributed_optimizer_instances, parallel.num_distributed_optimizer_instances)      \
  FIELD(overlap_grad_reduce, parallel.overlap_grad_reduce)                                      \
  FIELD(overlap_param_gather, parallel.overlap_param_gather)                                    \
  FIELD(ddp_bucket_size, parallel.ddp_bucket_size)                                              \
  FIELD(ddp_average_in_collective, parallel.ddp_average_in_collective)                          \
  FIELD(tp_comm_overlap, parallel.tp_comm_overlap)                                              \
  FIELD(distributed_timeout_minutes, parallel.distributed_timeout_minutes)                      \
  FIELD(recompute_granularity, model.recompute_granularity)                                     \
  FIELD(recompute_method, model.recompute_method)                                               \
  IF_SET(recompute_num_layers, model.recompute_num_layers)                                      \
  FIELD(num_layers, model.num_layers)                                                           \
  FIELD(hidden_size, model.hidden_size)                                                         \
  FIELD(ffn_hidden_size, model.ffn_hidden_size)                                                 \
  FIELD(num_attention_heads, model.num_attention_heads)                                         \
  FIELD(num_query_groups, model.num_query_groups)                                               \
  FIELD(kv_channels, model.kv_channels)                                                         \
  FIELD(seq_length, model.seq_length)                                                           \
  FIELD(max_position_embeddings, model.max_position_embeddings)                                 \
  FIELD(position_embedding_type, model.position_embedding_type)                                 \
  FIELD(rotary_base, model.rotary_base)                                                         \
  FIELD(rotary_percent, model.rotary_percent)                                                   \
  FIELD(normalization, model.normalization)                                                     \
  FIELD(norm_epsilon, model.norm_epsilon)                                                       \
  FIELD(qk_layernorm, model.qk_layernorm)                                                       \
  FIELD(add_bias_linear, model.add_bias_linear)                                                 \
  FIELD(add_qkv_bias, model.add_qkv_bias)                                                       \
  FIELD(untie_embeddings_and_output_weights, model.untie_embeddings_and_output_weights)        \
  FIELD(vocab_size, model.vocab_size)                                                           \
  FIELD(padded_vocab_size, model.padded_vocab_size)                                             \
  FIELD(init_method_std, model.init_method_std)                                                 \
  FIELD(attention_dropout, model.attention_dropout)                                             \
  FIELD(hidden_dropout, model.hidden_dropout)                                                   \
  FIELD(attention_backend, model.attention_backend)                                             \
  FIELD(deterministic_mode, model.deterministic_mode)                                           \
  FIELD(model_running_mode, diffusion.mode)                                                     \
  FIELD(mask_token, diffusion.mask_token)                                                       \
  FIELD(difflm_varilen_prob, diffusion.varilen_prob)                                            \
  FIELD(dlm_sft_loss_norm, diffusion.sft_loss_norm)                                             \
  FIELD(dlm_loss_weight, diffusion.loss_weight)                                                 \
  FIELD(dlm_min_masked, diffusion.min_masked)                                                   \
  FIELD(dlm_t_granularity, diffusion.t_granularity)                                             \
  FIELD(lr, optimizer.lr)                                                                       \
  FIELD(min_lr, optimizer.min_lr)                                                               \
  FIELD(lr_warmup_init, optimizer.lr_warmup_init)                                               \
  FIELD(lr_decay_style, optimizer.decay_style)                                                  \
  FIELD(lr_wsd_decay_style, optimizer.wsd_decay_style)                                          \
  FIELD(lr_warmup_iters, optimizer.lr_warmup_iters)                                             \
  FIELD(lr_decay_iters, optimizer.lr_decay_iters)                                               \
  FIELD(lr_wsd_decay_iters, optimizer.lr_wsd_decay_iters)                                       \
  FIELD(weight_decay, optimizer.weight_decay)                                                   \
  FIELD(adam_beta1, optimizer.adam_beta1)                                                       \
  FIELD(adam_beta2, optimizer.adam_beta2)                                                       \
  FIELD(adam_eps, optimizer.adam_eps)                                                           \
  FIELD(clip_grad, optimizer.clip_grad)                                                         \
  FIELD(micro_batch_size, training.micro_batch_size)                                            \
  FIELD(global_batch_size, training.global_batch_size)                                          \
  FIELD(train_iters, training.train_iters)                                                      \
  FIELD(seed, training.seed)                                                                    \
  FIELD(bf16, training.bf16)                                                                    \
  FIELD(device, training.device)                                                                \
  FIELD(gpu_memory_gb, training.gpu_memory_gb)                                                  \
  FIELD(log_interval, training.log_interval)                                                    \
  FIELD(save_gradients, training.save_gradients)                                                \
  FIELD(save_gradients_iteration, training.save_gradients_iteration)                            \
  FIELD(profile, training.profile)                                                              \
  FIELD(profile_step_start, training.profile_step_start)                                        \
  FIELD(profile_step_end, training.profile_step_end)                                            \
  FIELD(profile_ranks, training.profile_ranks)                                                  \
  FIELD(metrics_jsonl, training.metrics_jsonl)                                                  \
  FIELD(tensorboard_dir, training.tensorboard_dir)                                              \
  FIELD(tensorboard_log_interval, training.tensorboard_log_interval)                            \
  FIELD(log_timers_to_tensorboard, training.log_timers_to_tensorboard)                          \
  FIELD(log_throughput, training.log_throughput)                                                \
  FIELD(log_memory_to_tensorboard, training.log_memory_to_tensorboard)                          \
  FIELD(log_validation_ppl_to_tensorboard, training.log_validation_ppl_to_tensorboard)          \
  FIELD(eval_interval, training.eval_interval)                                                  \
  FIELD(eval_iters, training.eval_iters)                                                        \
  FIELD(exit_interval, training.exit_interval)                                                  \
  FIELD(exit_duration_in_mins, training.exit_duration_in_mins)                                  \
  FIELD(exit_signal_handler, training.exit_signal_handler)                                      \
  FIELD(check_for_nan_in_loss_and_grad, training.check_for_nan_in_loss_and_grad)                \
  FIELD(mock_data, data.mock_data)                                                              \
  FIELD(data_path, data.data_path)                                                              \
  FIELD(sft_data_path, data.sft_data_path)                                                      \
  FIELD(sft_chat_template, data.sft_chat_template)                                              \
  IF_SET(split, data.split)                                                                     \
  FIELD(data_cache_path, data.data_cache_path)                                                  \
  FIELD(reset_position_ids, data.reset_position_ids)                                            \
  FIELD(reset_attention_mask, data.reset_attention_mask)                                        \
  FIELD(eod_mask_loss, data.eod_mask_loss)                                                      \
  FIELD(train_data_path, data.train_data_path)                                                  \
  FIELD(valid_data_path, data.valid_data_path)                                                  \
  FIELD(test_data_path, data.test_data_path)                                                    \
  FIELD(renormalize_blend_weights, data.renormalize_blend_weights)                              \
  FIELD(cut_off_varlen_to_seqlen, data.cut_off_varlen_to_seqlen)                                \
  FIELD(per_document_attention, data.per_document_attention)                                    \
  FIELD(tokenizer_type, data.tokenizer_type)                                                    \
  FIELD(tokenizer_model, data.tokenizer_model)                                                  \
  FIELD(vocab_file, data.vocab_file)                                                            \
  FIELD(merge_file, data.merge_file)                                                            \
  FIELD(save, checkpoint.save)                                                                  \
  IF_SET(save_interval, checkpoint.save_interval)                                               \
  FIELD(load, checkpoint.load)                                                                  \
  FIELD(ckpt_step, checkpoint.ckpt_step)                                                        \
  FIELD(finetune, checkpoint.finetune)                                                          \
  FIELD(async_save, checkpoint.async_save)                                                      \
  FIELD(exit_on_missing_checkpoint, checkpoint.exit_on_missing_checkpoint)                      \
  FIELD(override_opt_param_scheduler, checkpoint.override_opt_param_scheduler)                  \
  FIELD(use_checkpoint_opt_param_scheduler, checkpoint.use_checkpoint_opt_param_scheduler)      \
  IF_SET(non_persistent_save_interval, checkpoint.non_persistent_save_interval)                 \
  IF_SET(keep_last_n_checkpoints, checkpoint.keep_last_n_checkpoints)                           \
  FIELD(overwrite_checkpoints, checkpoint.overwrite_checkpoints)                                \
  FIELD(non_persistent_global_ckpt_dir, checkpoint.non_persistent_global_ckpt_dir)              \
  FIELD(rerun_mode, fault_detection.rerun_mode)                                                 \
  FIELD(check_for_spiky_loss, fault_detection.check_spiky_loss)                                 \
  FIELD(check_for_large_grads, fault_detection.check_large_grads)                               \
  FIELD(error_injection_rate, fault_detection.error_injection_rate)                             \
  FIELD(error_injection_type, fault_detection.error_injection_type)                             \
  IF_SET(fp8, fp8.format)                                                                       \
  FIELD(fp8_recipe, fp8.recipe)                                                                 \
  FIELD(fp8_margin, fp8.margin)                                                                 \
  FIELD(fp8_amax_history_len, fp8.amax_history_len)                                             \
  FIELD(fp8_amax_compute_algo, fp8.amax_compute_algo)                                           \
  FIELD(fp8_wgrad, fp8.wgrad)                                                                   \
  FIELD(fp8_param_gather, fp8.param_gather)                                                     \
  FIELD(first_last_layers_bf16, fp8.first_last_layers_bf16)                                    \
  FIELD(num_layers_at_start_in_bf16, fp8.num_layers_at_start_in_bf16)                           \
  FIELD(num_layers_at_end_in_bf16, fp8.num_layers_at_end_in_bf16)

// The MoE fields, filled only when --num-experts is given (a dense model keeps MoeConfig's
// defaults).
#define MEGADLM_MOE_FIELDS(FIELD, IF_SET)                                                         \
  FIELD(num_experts, num_experts)                                                               \
  FIELD(moe_router_topk, topk)                                                                  \
  FIELD(moe_router_score_function, score)                                                       \
  FIELD(moe_router_pre_softmax, pre_softmax)                                                    \
  FIELD(moe_router_topk_scaling_factor, topk_scaling_factor)                                    \
  IF_SET(moe_router_num_groups, num_groups)                                                     \
  IF_SET(moe_router_group_topk, group_topk)                                                     \
  IF_SET(moe_router_topk_limited_devices, topk_limited_devices)                                 \
  FIELD(moe_router_load_balancing_type, load_balancing)                                         \
  FIELD(moe_aux_loss_coeff, aux_loss_coeff)                                                     \
  IF_SET(moe_z_loss_coeff, z_loss_coeff)                                                        \
  FIELD(moe_router_enable_expert_bias, expert_bias)                                             \
  FIELD(moe_router_bias_update_rate, bias_update_rate)                                          \
  FIELD(moe_router_force_load_balancing, force_load_balancing)                                  \
  FIELD(moe_expert_capacity_factor, capacity_factor)                                            \
  FIELD(moe_pad_expert_input_to_capacity, pad_to_capacity)                                      \
  FIELD(moe_token_drop_policy, drop_policy)                                                     \
  FIELD(moe_batch_level_expert_choice, batch_level_expert_choice)                               \
  FIELD(moe_ffn_hidden_size, ffn_hidden_size)                                                   \
  IF_SET(moe_shared_expert_intermediate_size, shared_expert_size)                               \
  FIELD(moe_grouped_gemm, grouped_gemm)                                                         \
  FIELD(moe_token_dispatcher_type, dispatcher)

}  // namespace

RunConfig build_run_config(const ArgState& a) {
  RunConfig r;
#define MEGADLM_FIELD(dest, field) assign(a, #dest, r.field);
#define MEGADLM_IF_SET(dest, field) \
  if (a.is_set(#dest)) assign(a, #dest, r.field);
  MEGADLM_RUN_CONFIG_FIELDS(MEGADLM_FIELD, MEGADLM_IF_SET)
  if (a.is_set("num_experts")) {
    MoeConfig& moe = r.model.moe;
#undef MEGADLM_FIELD
#undef MEGADLM_IF_SET
#define MEGADLM_FIELD(dest, field) assign(a, #dest, moe.field);
#define MEGADLM_IF_SET(dest, field) \
  if (a.is_set(#dest)) assign(a, #dest, moe.field);
    MEGADLM_MOE_FIELDS(MEGADLM_FIELD, MEGADLM_IF_SET)
    std::string error;
    moe.moe_layers = parse_moe_layer_freq(a.s("moe_layer_freq"), a.i("num_layers"), error);
  }
#undef MEGADLM_FIELD
#undef MEGADLM_IF_SET

  // FSDP: --use-torch-fsdp2 is full sharding; Megatron-FSDP's sharding strategies imply the
  // distributed optimizer (upstream v1 forces it), no_shard is plain DDP.
  ParallelConfig& p = r.parallel;
  p.use_torch_fsdp2 = a.b("use_torch_fsdp2");
  p.use_custom_fsdp = a.b("use_custom_fsdp") || p.use_torch_fsdp2;
  p.data_parallel_sharding_strategy =
      p.use_torch_fsdp2 ? ShardingStrategy::OptimGradsParams
                        : enum_flag(a, "data_parallel_sharding_strategy", ShardingStrategy::OptimGradsParams);
  p.use_distributed_optimizer = p.use_custom_fsdp
                                    ? p.data_parallel_sharding_strategy != ShardingStrategy::NoShard
                                    : a.b("use_distributed_optimizer");

  TransformerConfig& m = r.model;
  if (m.recompute_granularity == RecomputeGranularity::Selective) {
    const std::vector<std::string> modules = a.strings("recompute_modules");
    m.recompute_norms = std::find(modules.begin(), modules.end(), "layernorm") != modules.end();
  }
  m.activation = a.b("swiglu") ? MlpActivation::SwiGLU : MlpActivation::Gelu;
  // vanilla mode always trains causally (MegaDLMs forces it per layer).
  m.attention_mask = r.diffusion.mode == RunningMode::Vanilla
                         ? AttentionMaskType::Causal
                         : enum_flag(a, "attention_mask_type", AttentionMaskType::NoMask);
  r.diffusion.sft = a.is_set("sft_data_path");
  if (m.attention_mask == AttentionMaskType::BlockCausal) {
    r.diffusion.block_size = a.i("dlm_block_size");
    if (a.is_set("dlm_block_size_schedule")) {
      const std::string bad = parse_block_size_schedule(a.strings("dlm_block_size_schedule"),
                                                        r.diffusion.block_size_schedule);
      MDLM_CHECK(bad.empty(), "--dlm-block-size-schedule: ", bad);
    }
    m.block_diffusion_causal_clean = a.s("dlm_bd_clean_attention") == "causal";
    if (m.block_diffusion_causal_clean) {
      r.diffusion.ar_loss_weight = static_cast<float>(a.f("dlm_ar_loss_weight"));
      r.diffusion.diffusion_loss_scale = static_cast<float>(a.f("dlm_diffusion_loss_scale"));
    }
  }

  TrainingConfig& t = r.training;
  // Next to the logs: the metrics file's directory, else the checkpoints'.
  if (a.is_set("collective_log_dir")) t.collective_log_dir = a.s("collective_log_dir");
  else if (a.is_set("metrics_jsonl"))
    t.collective_log_dir = std::filesystem::path(a.s("metrics_jsonl")).parent_path().string();
  else if (a.is_set("save")) t.collective_log_dir = a.s("save");
  if (a.is_set("metrics_jsonl") && !a.is_set("collective_log_dir") && t.collective_log_dir.empty())
    t.collective_log_dir = ".";

  CheckpointConfig& ck = r.checkpoint;
  if (a.is_set("checkpoint_steps")) {
    std::string list = a.s("checkpoint_steps");
    for (char& ch : list) if (ch == ',') ch = ' ';
    std::istringstream in(list);
    for (int64_t v; in >> v;) ck.extra_save_iterations.push_back(v);
  }
  ck.save_optim = !a.b("no_save_optim");
  ck.save_rng = !a.b("no_save_rng");
  ck.load_optim = !a.b("no_load_optim");
  ck.load_rng = !a.b("no_load_rng");
  ck.non_persistent_global = a.is_set("non_persistent_ckpt_type") && a.s("non_persistent_ckpt_type") == "global";

  r.logging = build_logging_config(a);
  return r;
}

std::vector<std::string> check_enum_flags() {
  std::vector<std::string> problems;
  RunConfig r;
  // Both directions: each choice has a row, each row is a choice.
  auto check = [&](const char* dest, auto& field) {
    using F = std::remove_reference_t<decltype(field)>;
    using T = typename std::conditional_t<IsEnumVector<F>::value, F, std::vector<F>>::value_type;
    if constexpr (std::is_enum_v<T>) {
      const FlagSpec* flag = nullptr;
      for (const FlagSpec& f : flag_table())
        if (flag == nullptr && flag_dest(f) == dest) flag = &f;
      if (flag == nullptr) {
        problems.push_back(std::string(dest) + ": no flag has this dest");
        return;
      }
      const auto rows = enum_choices(static_cast<T*>(nullptr));
      for (const std::string& w : split_words(flag->choices))
        if (std::none_of(rows.begin(), rows.end(), [&](const auto& c) { return c.word == w; }))
          problems.push_back(std::string(flag->name) + ": choice '" + w + "' has no enum row");
      for (const auto& c : rows)
        if (!word_in(flag->choices, c.word))
          problems.push_back(std::string(flag->name) + ": enum row '" + std::string(c.word) +
                             "' is not a choice");
    }
  };
#define MEGADLM_CHECK_FIELD(dest, field) check(#dest, r.field);
  MEGADLM_RUN_CONFIG_FIELDS(MEGADLM_CHECK_FIELD, MEGADLM_CHECK_FIELD)
#undef MEGADLM_CHECK_FIELD
#define MEGADLM_CHECK_FIELD(dest, field) check(#dest, r.model.moe.field);
  MEGADLM_MOE_FIELDS(MEGADLM_CHECK_FIELD, MEGADLM_CHECK_FIELD)
#undef MEGADLM_CHECK_FIELD
  check("data_parallel_sharding_strategy", r.parallel.data_parallel_sharding_strategy);
  check("attention_mask_type", r.model.attention_mask);
  Fp8Format fp8_format{};
  check("fp8", fp8_format);  // an optional in the config, so not reached through the list above
  return problems;
}

}  // namespace megadlm::training::detail
