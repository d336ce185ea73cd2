// Resolution and validation of parsed flags (docs/rules.md) and the typed RunConfig
// built from them; the parallel-layout and batch rules are in parallel_rules.cpp. Every rule
// reports into Diagnostics with its id, nothing stops at the first problem. Ids: V-* validate_args,
// B-* micro-batch calculator, C-* config dataclasses, G-* process groups, R-* runtime pre-checks,
// D-* DiffLM, FP8-* FP8/FP4 precision (check_fp8), and megadlm's own:
//   M-1 --world-size only with --dry-run          M-9  --lr required
//   M-2 sizes and hyper-parameters in range        M-10 a data source required
//   M-3 --device cuda needs --bf16 (not yet)       M-11 --vocab-size required
//   M-4 --device cuda needs a visible GPU          M-12 --dlm-min-masked within [0, seq-length]
//   M-5 --seq-length required                      M-13 query groups divide the heads
//   M-6 (retired: attention dropout is supported)  M-14 --rotary-percent within (0, 1]
//   M-7 --bf16 on the CPU warns (fp32 compute)     M-15 dropout probabilities within [0, 1)
//   M-8 --train-iters required unless --dry-run    M-16 one source of LR-scheduler settings
//                                                  M-17 --checkpoint-steps is a list of iterations
//                                                  M-18 the blends and the files holding them parse
//                                                  M-19 rolling (non-persistent) checkpoints
//                                                  M-20 the logging flags (logging_rules.cpp)
//                                                  M-21 forced cuDNN attention without dropout
//                                                  M-22 SFT needs difflm-noshift
//                                                  M-23 SFT needs a tokenizer
//                                                  M-24 a2a+p2p takes two hierarchical CP levels
//                                                  M-30 output directories usable at start-up
//                                                  M-31 the parameters fit the memory (the program)
//                                                  M-32 error injection needs validate_results
// Every number flag is finite and inside its flag-table range (M-2, or the rule named in
// argument_safety.cpp): the single-value ranges below are rows of the table, not code.
// Not checked here: V-14 (program defaults live in the flag table), V-24 (dtype mapping of
// not-yet precision flags), the GPU half of V-40 and the NCCL_ALGO half of V-54 (the library
// neither probes devices nor reads the environment), V-46 (documented only, per the spec), C-1
// (V-44 turns SP off first), C-3 (the pipeline dtype is always the params dtype), C-20
// (variable_seq_lengths is never on in pre-training), C-22 (init std belongs to model init), G-6
// (V-53 plus RankGenerator's own checks), R-2 (batch_p2p_comm is !overlap_p2p_comm by
// construction), R-9…R-13 and D-8 (MoE runtime checks that cannot fail in megadlm's MoE), and
// D-5 on purpose (see check_diffusion). The MoE rules live in moe_rules.cpp.
#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <filesystem>
#include <sstream>
#include "megadlm/core/error.h"
#include "megadlm/data/gpt_dataset.h"
#include "megadlm/diffusion/diffusion_config.h"
#include "megadlm/data/tokenizer.h"
#include "training/arguments/argument_safety.h"
#include "training/arguments/rules_common.h"

namespace megadlm::training::detail {

namespace {

// ------------------------------------------------------------------ flag status (V-8, V-12)

void check_removed_and_ignored(ArgState& a, Diagnostics& d) {
  for (const FlagSpec* f : a.given_flags()) {
    const std::string name = backticked(f->name);
    if (f->status == FlagStatus::Removed)
      d.error(f->name == "--pipeline-model-parallel-split-rank" ? "V-8" : "V-12",
              name + " is no longer a valid flag: " + std::string(f->hint));
    if (f->status == FlagStatus::Ignored)
      d.warn(name + " has no effect in megadlm" +
             (f->hint.empty() ? std::string() : " (" + std::string(f->hint) + ")"));
  }
}

// Runs after resolution, so that values Megatron normalises back to the default (--num-experts 0,
// a negative capacity factor) are not reported.
void check_not_yet(const ArgState& a, Diagnostics& d) {
  for (const FlagSpec* f : a.given_flags()) {
    const std::string dest = flag_dest(*f);
    if (f->status == FlagStatus::NotYet &&
        python_repr(a.value(dest)) != python_repr(default_flag_value(*f)))
      d.unsupported(a.flag_value(dest) + " is not supported yet by megadlm" +
                    (f->hint.empty() ? std::string() : ": " + std::string(f->hint)) +
                    " (see docs/flags.md)");
    if (f->not_yet.empty()) continue;
    std::vector<std::string> chosen = a.strings(dest);
    if (std::holds_alternative<std::string>(a.value(dest))) chosen.push_back(a.s(dest));
    for (const std::string& v : chosen) {
      if (!word_in(f->not_yet, v)) continue;
      std::string supported;
      for (const std::string& c : split_words(f->choices))
        if (!word_in(f->not_yet, c)) supported += (supported.empty() ? "" : ", ") + c;
      d.unsupported(backticked(std::string(f->name) + " " + v) +
                    " is not supported yet by megadlm (see docs/flags.md); supported: " + supported);
    }
  }
}

// ------------------------------------------------------------- model shape (V-31…V-36, M-2)

void resolve_model_shape(ArgState& a, Ctx& c, Diagnostics& d) {
  // V-31: exactly one of --num-layers / --encoder-num-layers.
  if (a.is_set("num_layers") && a.is_set("encoder_num_layers")) {
    d.error("V-31", "give only one of " + a.flag_value("num_layers") + " and " +
                        a.flag_value("encoder_num_layers"));
  } else if (!a.is_set("num_layers") && a.is_set("encoder_num_layers")) {
    a.set("num_layers", a.value("encoder_num_layers"));
  }
  // V-36: exactly one of --seq-length / --encoder-seq-length.
  if (a.is_set("seq_length") && a.is_set("encoder_seq_length")) {
    d.error("V-36", "give only one of " + a.flag_value("seq_length") + " and " +
                        a.flag_value("encoder_seq_length"));
  } else if (!a.is_set("seq_length") && a.is_set("encoder_seq_length")) {
    a.set("seq_length", a.value("encoder_seq_length"));
  }
  // V-32 / M-5: required model flags.
  for (const char* dest : {"num_layers", "hidden_size", "num_attention_heads",
                           "max_position_embeddings", "seq_length"}) {
    if (a.is_set(dest)) continue;
    c.model_ok = false;
    d.error(std::string(dest) == "seq_length" ? "M-5" : "V-32",
            a.flag(dest) + " is required");
  }
  // M-2: sizes are positive and fit the int fields of TransformerConfig.
  for (const char* dest : {"num_layers", "hidden_size", "num_attention_heads",
                           "max_position_embeddings", "seq_length", "ffn_hidden_size",
                           "kv_channels", "num_query_groups", "make_vocab_size_divisible_by",
                           "vocab_size"}) {
    if (!a.is_set(dest)) continue;
    const int64_t v = a.i(dest);
    if (v >= 1 && v <= INT_MAX) continue;
    d.error("M-2", a.flag_value(dest) + " must be between 1 and " + num(int64_t{INT_MAX}));
    const std::string s(dest);
    if (s == "num_layers" || s == "hidden_size" || s == "num_attention_heads" || s == "seq_length")
      c.model_ok = false;
    a.set(dest, FlagValue());  // keep later rules from dividing by it
  }
  c.num_layers = a.i("num_layers");
  c.hidden = a.i("hidden_size");
  c.heads = a.i("num_attention_heads");
  c.seq = a.i("seq_length");
  // V-36: positions cover the sequence.
  const int64_t max_pos = a.i("max_position_embeddings");
  if (max_pos > 0 && c.seq > 0 && max_pos < c.seq)
    d.error("V-36", a.flag_value("max_position_embeddings") + " is smaller than " +
                        a.flag_value("seq_length") + "; valid: at least " + num(c.seq));
  if (max_pos > 0 && a.is_set("decoder_seq_length") && max_pos < a.i("decoder_seq_length"))
    d.error("V-36", a.flag_value("max_position_embeddings") + " is smaller than " +
                        a.flag_value("decoder_seq_length") + "; valid: at least " +
                        num(a.i("decoder_seq_length")));

  // V-33: ffn width.
  if (!a.is_set("ffn_hidden_size") && c.hidden > 0) {
    const int64_t ffn = a.b("swiglu") ? static_cast<int64_t>((4.0 * static_cast<double>(c.hidden) * 2.0 / 3.0) / 64.0) * 64
                                      : 4 * c.hidden;
    a.set("ffn_hidden_size", ffn);
  }
  c.ffn = a.i("ffn_hidden_size");
  // V-34: head dimension.
  if (!a.is_set("kv_channels") && c.hidden > 0 && c.heads > 0) {
    if (c.hidden % c.heads != 0)
      d.error("V-34", a.flag_value("num_attention_heads") + " does not divide " +
                          a.flag_value("hidden_size") + " (needed for the default " +
                          a.flag("kv_channels") + "); valid: " + divisors_text(c.hidden) +
                          ", or give " + a.flag("kv_channels"));
    else
      a.set("kv_channels", c.hidden / c.heads);
  }
  c.kv = a.i("kv_channels");
  // C-10 derived: query groups = heads unless GQA.
  if (!a.b("group_query_attention")) {
    if (c.heads > 0) a.set("num_query_groups", c.heads);
  } else if (a.is_set("num_query_groups") && c.heads > 0) {
    const int64_t g = a.i("num_query_groups");
    if (g > c.heads || c.heads % g != 0)
      d.error("M-13", a.flag_value("num_query_groups") + " must divide " +
                          a.flag_value("num_attention_heads") + " (heads share key/value groups "
                          "evenly); valid: " + divisors_text(c.heads));
  }
  c.query_groups = a.i("num_query_groups");
}

// -------------------------------------------------------- precision (V-26, V-27, V-39, V-40, C-8)

void check_precision(ArgState& a, Diagnostics& d) {
  const bool fp16 = a.b("fp16"), bf16 = a.b("bf16");
  if (fp16 && bf16) d.error("V-26, C-8", "`--fp16` and `--bf16` are mutually exclusive");
  if (fp16 && !a.is_set("loss_scale") && a.b("check_for_nan_in_loss_and_grad")) {
    d.warn("`--fp16` with dynamic loss scaling: NaN checks turned off (overflow is the scaler's "
           "signal)");
    a.set("check_for_nan_in_loss_and_grad", false);
  }
  if (bf16 && a.b("accumulate_allreduce_grads_in_fp32") && a.s("main_grads_dtype") != "fp32")
    d.error("V-27", "`--accumulate-allreduce-grads-in-fp32` needs `--main-grads-dtype fp32` (got " +
                        a.flag_value("main_grads_dtype") + ")");
  if (bf16 && a.s("main_grads_dtype") == "fp32") a.set("accumulate_allreduce_grads_in_fp32", true);
  a.set("params_dtype", std::string(bf16 ? "torch.bfloat16" : fp16 ? "torch.float16" : "torch.float32"));
  if (a.b("fp16_lm_cross_entropy") && !fp16)
    d.error("V-39", "`--fp16-lm-cross-entropy` needs `--fp16`");
  if (a.b("fp32_residual_connection") && !fp16 && !bf16)
    d.error("V-39", "`--fp32-residual-connection` needs `--fp16` or `--bf16`");
  if (a.b("moe_grouped_gemm") && !bf16)
    d.error("V-40", "`--moe-grouped-gemm` needs `--bf16`");
}

// ------------------------------------------------------------------------ FP8 (FP8-1…FP8-6)
// Megatron's FP8 checks (validate_args and TransformerConfig) plus the Hopper limits. Runs after
// the pipeline rules: FP8-5 bounds the bf16 layer counts by the layers per pipeline stage.

void check_fp8(ArgState& a, const Ctx& c, Diagnostics& d) {
  const bool fp8 = a.is_set("fp8");
  const std::string recipe = a.s("fp8_recipe");
  if (recipe == "mxfp8")
    d.error("FP8-1", a.flag_value("fp8_recipe") + " is Blackwell-only (1x32 blocks with E8M0 "
                     "scales need SM 10.x tensor cores); megadlm targets Hopper: valid recipes "
                     "are delayed, tensorwise, blockwise");
  if (a.is_set("fp4_format"))
    d.error("FP8-1", a.flag_value("fp4_format") + " is Blackwell-only (NVFP4 needs SM 10.x "
                     "tensor cores); megadlm targets Hopper: use `--fp8-format` or `--bf16`");
  if (a.was_given("fp4_recipe") && !a.is_set("fp4_format"))
    d.warn(a.flag_value("fp4_recipe") + " has no effect without `--fp4-format`");
  if (recipe == "custom")
    d.error("FP8-2", a.flag_value("fp8_recipe") + " needs a Python quantizer factory "
                     "(`--fp8-quantizer-factory`), which megadlm cannot load; valid recipes are "
                     "delayed, tensorwise, blockwise");
  if (fp8 && a.is_set("fp4_format"))
    d.error("FP8-3", a.flag_value("fp8") + " and " + a.flag_value("fp4_format") +
                         " are mutually exclusive; give one of them");
  if (a.b("first_last_layers_bf16")) {
    if (recipe == "delayed")
      d.error("FP8-4", "`--first-last-layers-bf16` cannot be used with `--fp8-recipe delayed` "
                       "(bf16 layers break the shared amax reduction of delayed scaling); valid: "
                       "`--fp8-recipe tensorwise`");
    if (c.model_ok && c.sizes_ok && c.pp > 0) {
      const int64_t per_stage = c.num_layers / c.pp;
      for (const char* dest : {"num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16"}) {
        const int64_t v = a.i(dest);
        if (v < 0 || v > per_stage)
          d.error("FP8-5", a.flag_value(dest) + " must lie in [0, " + num(per_stage) +
                               "] (`--num-layers " + num(c.num_layers) + "` / pipeline size " +
                               num(c.pp) + ")");
      }
    }
  }
  if (fp8 && recipe == "blockwise") {
    // FP8-7: the blockwise recipe's shapes. Every GEMM dimension of the FP8 linears must be a
    // multiple of 128: K for cuBLASLt's VEC128 / BLK128x128 modes (M and N too: the block-scaled
    // shapes measured on the device's cuBLAS), and every shard boundary (TP on features, CP on
    // tokens) on a 128 multiple, so that each 1x128 tile / 128x128 block holds the same
    // elements under every layout (docs/fp8.md "Blockwise scaling"). Checked on every device:
    // the CPU emulation follows the same tiles.
    if (c.model_ok && c.sizes_ok && c.tp > 0 && c.cp > 0) {
      const int64_t groups = c.query_groups > 0 ? c.query_groups : c.heads;
      const std::string tp_text = " / tensor-parallel size " + num(c.tp);
      const std::pair<std::string, int64_t> dims[] = {
          {a.flag_value("hidden_size"), c.hidden},
          {a.flag_value("ffn_hidden_size") + tp_text, c.ffn / c.tp},
          {"heads x kv channels (" + num(c.heads) + " x " + num(c.kv) + ")" + tp_text, c.heads * c.kv / c.tp},
          {"query groups x kv channels (" + num(groups) + " x " + num(c.kv) + ")" + tp_text, groups * c.kv / c.tp},
          {c.cp > 1 ? a.flag_value("seq_length") + " / (2 x context-parallel size " + num(c.cp) +
                          ") (the sequence chunk a context-parallel rank holds)"
                    : a.flag_value("seq_length"),
           c.cp > 1 ? c.seq / (2 * c.cp) : c.seq}};
      for (const auto& [what, v] : dims)
        if (v > 0 && v % 128 != 0)
          d.error("FP8-7", a.flag_value("fp8_recipe") + ": " + what + " = " + num(v) +
                               " must be a multiple of 128 (1x128 tiles and 128x128 blocks along every "
                               "GEMM dimension, shard boundaries on block edges); use sizes that are, or "
                               "`--fp8-recipe tensorwise`");
    }
    if (a.is_set("num_experts") && a.i("num_experts") > 0)
      d.error("FP8-7", a.flag_value("fp8_recipe") + " with MoE (" + a.flag_value("num_experts") +
                           ") is not built: the expert GEMMs' token counts vary per step and are not "
                           "multiples of 128; use `--fp8-recipe tensorwise` or `delayed` for MoE models");
    if (a.b("fp8_param_gather"))
      d.error("FP8-7", a.flag_value("fp8_recipe") + " with `--fp8-param-gather` is not built (the shard "
                           "cast would need 128x128-aligned shards and per-block scales in the gather); "
                           "drop `--fp8-param-gather`");
  }
  if (fp8 && a.b("tp_comm_overlap"))
    d.warn("`--tp-comm-overlap` has no effect on the FP8 linears (they run the plain sequence-parallel "
           "collectives; docs/fp8.md)");
  if (a.b("fp8_param_gather") && !fp8)
    d.error("FP8-6", "`--fp8-param-gather` needs `--fp8-format` (e4m3 or hybrid)");
  if (fp8 && a.b("fp8_param_gather") && (a.b("use_custom_fsdp") || a.b("use_torch_fsdp2")))
    d.error("FP8-9", "`--fp8-param-gather` with Megatron-FSDP (`--use-custom-fsdp`) is not built yet: "
                     "FSDP gathers its own parameter shards (docs/fp8.md); use "
                     "`--use-distributed-optimizer` without FSDP, or drop `--fp8-param-gather`");
  // Megatron ignores these silently; a warning says which setting does nothing.
  if (!fp8) {
    for (const char* dest : {"fp8_recipe", "fp8_margin", "fp8_amax_history_len",
                             "fp8_amax_compute_algo", "fp8_wgrad", "first_last_layers_bf16"})
      if (a.was_given(dest) && !(recipe == "mxfp8" || recipe == "custom"))
        d.warn(a.flag_value(dest) + " has no effect without `--fp8-format`");
  } else if (recipe != "delayed") {
    for (const char* dest : {"fp8_margin", "fp8_amax_history_len", "fp8_amax_compute_algo"})
      if (a.was_given(dest))
        d.warn(a.flag_value(dest) + " has no effect with " + a.flag_value("fp8_recipe") +
               " (it tunes delayed scaling)");
  }
}

// ------------------------------------------ schedule lengths and LR (V-29, V-30, V-37, V-41, V-60, M-8, M-9)

void check_schedule(ArgState& a, Ctx& c, Diagnostics& d) {
  const bool iters = a.is_set("train_iters"), samples = a.is_set("train_samples");
  if (iters) {
    if (samples) d.error("V-29", "give only one of " + a.flag_value("train_iters") + " and " + a.flag_value("train_samples"));
    if (a.is_set("lr_decay_samples"))
      d.error("V-29", "iteration-based training (`--train-iters`) takes `--lr-decay-iters`, not " +
                          a.flag_value("lr_decay_samples"));
    if (a.i("lr_warmup_samples") != 0)
      d.error("V-29", "iteration-based training (`--train-iters`) takes `--lr-warmup-iters`, not " +
                          a.flag_value("lr_warmup_samples"));
    if (a.is_set("rampup_batch_size"))
      d.error("V-29", "`--rampup-batch-size` needs sample-based training (`--train-samples`)");
    if (a.is_set("lr_warmup_fraction") && a.i("lr_warmup_iters") != 0)
      d.error("V-29", "give only one of " + a.flag_value("lr_warmup_fraction") + " and " +
                          a.flag_value("lr_warmup_iters"));
    if (a.i("train_iters") < 1) d.error("M-2", a.flag_value("train_iters") + " must be >= 1");
    if (a.is_set("save_gradients") && (a.i("save_gradients_iteration") < 1 || a.i("save_gradients_iteration") > a.i("train_iters")))
      d.error("M-2", a.flag_value("save_gradients_iteration") + " must be between 1 and " +
                         a.flag_value("train_iters") + ": the iteration whose gradients --save-gradients writes");
  } else if (samples) {
    if (a.is_set("lr_decay_iters"))
      d.error("V-30", "sample-based training (`--train-samples`) takes `--lr-decay-samples`, not " +
                          a.flag_value("lr_decay_iters"));
    if (a.i("lr_warmup_iters") != 0)
      d.error("V-30", "sample-based training (`--train-samples`) takes `--lr-warmup-samples`, not " +
                          a.flag_value("lr_warmup_iters"));
    if (a.is_set("lr_warmup_fraction") && a.i("lr_warmup_samples") != 0)
      d.error("V-30", "give only one of " + a.flag_value("lr_warmup_fraction") + " and " +
                          a.flag_value("lr_warmup_samples"));
  } else if (!c.dry_run) {
    d.error("M-8", "`--train-iters` is required (only `--dry-run` can do without it)");
  }
  // M-9 / V-37 / V-60: learning rate and its schedule.
  if (!a.is_set("lr")) {
    d.error("M-9", "`--lr` is required");
  } else {
    // Each value's own range (finite, >= 0) is the table's (argument_safety.cpp); these rules
    // compare values, and stay quiet when one of them is already out of range.
    const double lr = a.f("lr"), min_lr = a.f("min_lr"), init = a.f("lr_warmup_init");
    if (min_lr > lr && std::isfinite(lr) && std::isfinite(min_lr) && lr >= 0)
      d.error("V-37", a.flag_value("min_lr") + " exceeds " + a.flag_value("lr") +
                          "; valid: 0 to " + num(lr));
    if (init > lr && std::isfinite(lr) && std::isfinite(init) && lr >= 0)
      d.error("V-60", a.flag_value("lr_warmup_init") + " must lie in [0, " + a.flag_value("lr") + "]");
  }
  if (iters) {
    if (!a.is_set("lr_decay_iters")) a.set("lr_decay_iters", a.value("train_iters"));
    const int64_t decay = a.i("lr_decay_iters");
    if (decay < 1) d.error("V-60", a.flag_value("lr_decay_iters") + " must be >= 1");
    if (a.is_set("lr_warmup_fraction")) {
      const double frac = a.f("lr_warmup_fraction");
      // Out of [0, 1) (or not finite) is the table range's error; Megatron keeps the fractional
      // sample count, iterations are whole here (rounds down).
      if (frac >= 0 && frac < 1)
        a.set("lr_warmup_iters", static_cast<int64_t>(frac * static_cast<double>(decay)));
    }
    const int64_t warmup = a.i("lr_warmup_iters");
    if (warmup < 0) d.error("V-60", a.flag_value("lr_warmup_iters") + " must be >= 0");
    if (decay >= 1 && warmup >= decay)
      d.error("V-60", "warm-up (" + num(warmup) + " iterations) must be shorter than the decay "
                      "horizon " + a.flag_value("lr_decay_iters") + " (which includes warm-up)");
    if (a.s("lr_decay_style") == "WSD") {
      if (!a.is_set("lr_wsd_decay_iters"))
        d.error("V-60", "`--lr-decay-style WSD` needs `--lr-wsd-decay-iters`");
      else if (a.i("lr_wsd_decay_iters") < 1 || a.i("lr_wsd_decay_iters") > decay)
        d.error("V-60", a.flag_value("lr_wsd_decay_iters") + " must lie in [1, " +
                            a.flag_value("lr_decay_iters") + "]");
    }
  }
  // V-41: weight-decay schedule.
  const std::string incr = a.s("weight_decay_incr_style");
  const bool start = a.is_set("start_weight_decay"), end = a.is_set("end_weight_decay");
  if (incr == "constant") {
    if (start || end)
      d.error("V-41", "`--start-weight-decay`/`--end-weight-decay` need a non-constant "
                      "`--weight-decay-incr-style`");
    a.set("start_weight_decay", a.value("weight_decay"));
    a.set("end_weight_decay", a.value("weight_decay"));
  } else if (!start || !end) {
    d.error("V-41", a.flag_value("weight_decay_incr_style") +
                        " needs both `--start-weight-decay` and `--end-weight-decay`");
  }
  // Each weight decay's own range is the table's; the schedule must not decrease.
  const double swd = a.f("start_weight_decay"), ewd = a.f("end_weight_decay");
  if (swd >= 0 && ewd >= 0 && ewd < swd)
    d.error("V-60", "weight decay must satisfy 0 <= start (" + num(swd) + ") <= end (" + num(ewd) + ")");
  // M-2: the optimizer hyper-parameters' ranges (betas in [0, 1), eps > 0, clip and decay >= 0)
  // are rows of the flag table, checked with every other number (argument_safety.cpp).
  for (const char* dest : {"log_interval", "eval_interval"})
    if (a.i(dest) < 1) d.error("M-2", a.flag_value(dest) + " must be >= 1");
  if (a.i("eval_iters") < 0) d.error("M-2", a.flag_value("eval_iters") + " must be >= 0");
  if (a.is_set("exit_interval") && a.i("exit_interval") < 1)
    d.error("M-2", a.flag_value("exit_interval") + " must be >= 1");
  if (a.i("seed") < 0) d.error("M-2", a.flag_value("seed") + " must be >= 0");
  // Values that land in the int fields of the typed configs.
  for (const char* dest : {"log_interval", "eval_interval", "eval_iters", "dlm_min_masked",
                           "distributed_timeout_minutes", "microbatch_group_size_per_vp_stage",
                           "num_distributed_optimizer_instances"})
    if (a.i(dest) > INT_MAX)
      d.error("M-2", a.flag_value(dest) + " must be at most " + num(int64_t{INT_MAX}));
}

// -------------------------------------------- checkpoints (V-1, V-38, V-57, V-58, M-19)

void check_checkpoint(ArgState& a, Diagnostics& d) {
  // V-1 (Megatron accepts global and local, not in_memory): megadlm has the global type only;
  // the flag table's not-yet list rejects local and in_memory naming the supported value.
  // Megatron has no default type: an interval without one fails at its first rolling save,
  // which megadlm reports before training.
  if (a.is_set("non_persistent_save_interval")) {
    if (a.i("non_persistent_save_interval") < 1)
      d.error("M-2", a.flag_value("non_persistent_save_interval") + " must be >= 1");
    if (!a.is_set("non_persistent_ckpt_type"))
      d.error("M-19", a.flag_value("non_persistent_save_interval") +
                          " needs `--non-persistent-ckpt-type global` (Megatron-LM has no default type)");
    if (!a.is_set("save") && !a.is_set("non_persistent_global_ckpt_dir"))
      d.error("M-19", a.flag_value("non_persistent_save_interval") +
                          " needs `--save` (rolling checkpoints go to <save>/non_persistent) or "
                          "`--non-persistent-global-ckpt-dir`");
  } else if (a.is_set("non_persistent_ckpt_type") && !a.is_set("load")) {
    d.warn(a.flag_value("non_persistent_ckpt_type") +
           " has no effect without `--non-persistent-save-interval` or `--load`");
  }
  if (a.is_set("non_persistent_global_ckpt_dir")) {
    if (!a.is_set("non_persistent_ckpt_type"))
      d.warn(a.flag_value("non_persistent_global_ckpt_dir") +
             " has no effect without `--non-persistent-ckpt-type global`");
    // Rolling cleanup deletes every other iter_* there: never the persistent checkpoints.
    const auto same_dir = [](const std::string& x, const std::string& y) {
      return std::filesystem::path(x).lexically_normal() / "" == std::filesystem::path(y).lexically_normal() / "";
    };
    if (a.is_set("save") && same_dir(a.s("non_persistent_global_ckpt_dir"), a.s("save")))
      d.error("M-19", a.flag_value("non_persistent_global_ckpt_dir") + " is also " + a.flag_value("save") +
                          ": rolling saves delete the other checkpoints of their directory; "
                          "give another one (default <save>/non_persistent)");
  }
  if (a.is_set("save") && !a.is_set("save_interval"))
    d.error("V-38", a.flag_value("save") + " needs `--save-interval`");
  if (a.b("moe_use_upcycling") && !a.is_set("save"))
    d.error("V-57", "`--moe-use-upcycling` needs `--save`");
  if (a.b("use_checkpoint_args") && !a.is_set("load"))
    d.error("V-58", "`--use-checkpoint-args` needs `--load`");
  // Checkpoint flags of megadlm's own checkpointing (docs/checkpoints.md).
  for (const char* dest : {"save_interval", "exit_duration_in_mins"})
    if (a.is_set(dest) && a.i(dest) < 1) d.error("M-2", a.flag_value(dest) + " must be >= 1");
  if (a.is_set("ckpt_step") && a.i("ckpt_step") < 0)
    d.error("M-2", a.flag_value("ckpt_step") + " must be >= 0");
  // Megatron saves asynchronously only in its torch_dist format; megadlm writes one
  // format, so an explicit other --ckpt-format with --async-save is rejected as Megatron does.
  if (a.b("async_save") && a.s("ckpt_format") != "torch_dist")
    d.error("R-14", "`--async-save` needs `--ckpt-format torch_dist` (got " +
                        a.flag_value("ckpt_format") + "); megadlm writes its own format either "
                        "way, so drop `--ckpt-format`");
  if (a.b("override_opt_param_scheduler") && a.b("use_checkpoint_opt_param_scheduler"))
    d.error("M-16", "`--override-opt_param-scheduler` and `--use-checkpoint-opt_param-scheduler` "
                    "are mutually exclusive (take the LR-scheduler settings from the flags or "
                    "from the checkpoint)");
  if (a.is_set("checkpoint_steps")) {
    std::string list = a.s("checkpoint_steps");
    bool ok = !list.empty();
    for (char& ch : list) {
      if (ch == ',') ch = ' ';
      else if (!std::isdigit(static_cast<unsigned char>(ch)) && ch != ' ') ok = false;
    }
    if (!ok) d.error("M-17", a.flag_value("checkpoint_steps") + " must be a comma-separated list "
                                 "of iteration numbers (e.g. `--checkpoint-steps 100,250`)");
    else if (!a.is_set("save")) d.warn(a.flag_value("checkpoint_steps") + " has no effect without `--save`");
  }
  for (const char* dest : {"finetune", "no_load_optim", "no_load_rng", "exit_on_missing_checkpoint"})
    if (a.b(dest) && !a.is_set("load")) d.warn(a.flag(dest) + " has no effect without `--load`");
  // M-32: injected faults exercise the replay; without it they would only be silently ignored.
  if (a.i("error_injection_rate") > 0 && a.s("rerun_mode") != "validate_results")
    d.error("M-32", a.flag_value("error_injection_rate") + " needs `--rerun-mode validate_results` (got " +
                        a.flag_value("rerun_mode") + "): faults are injected where results are replayed");
  if (a.is_set("keep_last_n_checkpoints") && !a.is_set("save"))
    d.warn(a.flag_value("keep_last_n_checkpoints") + " has no effect without `--save`");
  for (const char* dest : {"no_save_optim", "no_save_rng", "async_save", "overwrite_checkpoints"})
    if (a.b(dest) && !a.is_set("save")) d.warn(a.flag(dest) + " has no effect without `--save`");
  if (a.is_set("ckpt_convert_format") && (!a.is_set("ckpt_convert_save") || !a.is_set("load")))
    d.error("V-58", a.flag_value("ckpt_convert_format") + " needs `--ckpt-convert-save` and `--load`");
}

// ----------------------------------------------- layer options (V-6, V-47, V-48, V-54, V-55, C-16, C-17)

void check_layer_options(ArgState& a, Ctx& c, Diagnostics& d) {
  // V-6
  const std::vector<std::string> spec = a.strings("spec");
  if (a.s("attention_backend") == "local" && (spec.empty() || spec[0] != "local"))
    d.error("V-6", "`--attention-backend local` needs `--spec local`");
  // V-47
  if (!a.b("add_bias_linear")) a.set("bias_gelu_fusion", false);
  if (a.b("add_bias_linear")) a.set("add_qkv_bias", true);
  // V-48
  if (a.b("use_rotary_position_embeddings")) a.set("position_embedding_type", std::string("rope"));
  if (a.b("rotary_interleaved") && a.b("apply_rope_fusion"))
    d.error("V-48, C-17", "`--rotary-interleaved` does not work with fused RoPE; add `--no-rope-fusion`");
  if (a.s("position_embedding_type") != "rope") a.set("apply_rope_fusion", false);
  if (!a.b("add_position_embedding") && a.s("position_embedding_type") != "rope")
    d.error("V-48", "`--no-position-embedding` needs `--position-embedding-type rope` (got " +
                        a.flag_value("position_embedding_type") + ")");
  if (a.b("multi_latent_attention") && a.b("rotary_interleaved"))
    d.error("C-17", "`--multi-latent-attention` does not support `--rotary-interleaved`");
  // V-55
  if (a.b("apply_query_key_layer_scaling")) a.set("attention_softmax_in_fp32", true);
  // C-16: fused bias + activation exists for GeLU and SiLU only.
  const bool swiglu = a.b("swiglu");
  const bool fusion = swiglu ? a.b("bias_swiglu_fusion") : a.b("bias_gelu_fusion");
  if (fusion && (a.b("squared_relu") || a.b("openai_gelu")))
    d.error("C-16", std::string(a.b("squared_relu") ? "`--squared-relu`" : "`--openai-gelu`") +
                        " has no fused bias-activation kernel; add `--no-bias-gelu-fusion` or "
                        "`--disable-bias-linear`");
  if (swiglu && a.b("squared_relu"))
    d.error("C-16", "`--swiglu` and `--squared-relu` are mutually exclusive");
  // V-54
  if (a.b("deterministic_mode") && (a.b("use_flash_attn") || a.b("cross_entropy_loss_fusion")))
    d.error("V-54", "`--deterministic-mode` cannot be combined with `--use-flash-attn` or "
                    "`--cross-entropy-loss-fusion`");
  // V-56
  if (a.i("inference_batch_times_seqlen_threshold") > -1 && c.pp <= 1)
    d.error("V-56", a.flag_value("inference_batch_times_seqlen_threshold") + " needs " +
                        a.flag_value("pipeline_model_parallel_size") + " > 1");
  // M-14 (--rotary-percent in (0, 1]), M-15 (drop probabilities in [0, 1): 1 would drop
  // everything), --norm-epsilon and --init-method-std >= 0: ranges of the flag table.
  if (a.i("rotary_base") < 1) d.error("M-2", a.flag_value("rotary_base") + " must be >= 1");
  // cuDNN's attention dropout is not keyed by global coordinates: forced cuDNN cannot run it.
  const std::string backend = a.s("attention_backend");
  if ((backend == "fused" || backend == "cudnn") && a.f("attention_dropout") > 0)
    d.error("M-21", a.flag_value("attention_backend") + " cannot run " +
                        a.flag_value("attention_dropout") +
                        " (cuDNN's dropout mask is not megadlm's, which is keyed by global "
                        "coordinates); use `--attention-backend auto` or `flash`, or "
                        "`--attention-dropout 0`");
}

// ------------------------- data sources and tokenizer (V-15, V-16, V-28, V-52, V-59, M-10, M-11, M-18, R-15)

// M-18: reads the files of --data-args-path / --per-split-data-args-path into the flags they
// stand for, then parses every blend (the dataset builder parses them again, with the same
// function, and would otherwise be the first to complain).
void check_blends(ArgState& a, bool data_args, bool per_split_args, Diagnostics& d) {
  static const char* const kSplitDests[3] = {"train_data_path", "valid_data_path",
                                             "test_data_path"};
  static const char* const kSplitFlags[3] = {"--train-data-path", "--valid-data-path",
                                             "--test-data-path"};
  try {
    if (data_args) a.set("data_path", data::read_data_args_file(a.s("data_args_path")));
    if (per_split_args) {
      const auto lists = data::read_per_split_data_args_file(a.s("per_split_data_args_path"));
      for (size_t s = 0; s < 3; ++s)
        if (lists[s]) a.set(kSplitDests[s], *lists[s]);
    }
  } catch (const Error& e) {
    d.error("M-18", e.what());
    return;
  }
  auto check_blend = [&](const char* dest, const std::string& source) {
    const std::vector<std::string> words = a.strings(dest);
    if (words.empty()) return;  // an empty --*-data-path means no data for that split
    try {
      data::parse_blend(words, source);
    } catch (const Error& e) {
      d.error("M-18", e.what());
    }
  };
  check_blend("data_path", data_args ? "--data-args-path " + a.s("data_args_path") : "--data-path");
  for (size_t s = 0; s < 3; ++s)
    check_blend(kSplitDests[s],
                per_split_args ? "--per-split-data-args-path " + a.s("per_split_data_args_path") +
                                     ", key \"" +
                                     data::split_name(static_cast<data::Split>(s)) + "\""
                               : std::string(kSplitFlags[s]));
}

void check_data(ArgState& a, Ctx& c, Diagnostics& d) {
  const size_t errors_before = d.errors.size();
  const bool mock = a.b("mock_data");
  const bool data_path = a.is_set("data_path");
  const bool data_args = a.is_set("data_args_path");
  const bool per_split_paths =
      a.is_set("train_data_path") || a.is_set("valid_data_path") || a.is_set("test_data_path");
  const bool per_split_args = a.is_set("per_split_data_args_path");
  const bool sft = a.is_set("sft_data_path");
  // The files stand for the flags they replace.
  const bool single_blend = data_path || data_args;
  const bool per_split = per_split_paths || per_split_args;
  // V-52
  if (static_cast<int>(mock) + static_cast<int>(single_blend) + static_cast<int>(per_split) +
          static_cast<int>(sft) > 1)
    d.error("V-52", "give one data source: `--mock-data`, `--data-path` (or `--data-args-path`), "
                    "`--sft-data-path`, or the per-split `--train/valid/test-data-path` (or "
                    "`--per-split-data-args-path`)");
  if (sft && a.s("model_running_mode") == "vanilla")
    d.error("M-22", "`--sft-data-path` fine-tunes a masked-diffusion model: it needs "
                     "`--model-running-mode difflm-noshift`");
  if (sft && a.s("tokenizer_type").empty())
    d.error("M-23", "`--sft-data-path` needs `--tokenizer-type` (responses end with its end-of-document "
                     "token; NullTokenizer takes token ids as text)");
  // V-16
  if (data_path && data_args)
    d.error("V-16", "give only one of `--data-path` and `--data-args-path`");
  if (per_split_paths && per_split_args)
    d.error("V-16", "give only one of the per-split `--*-data-path` flags and "
                    "`--per-split-data-args-path`");
  // M-10
  if (!mock && !single_blend && !per_split && !sft)
    d.error("M-10", "no training data: pass `--mock-data` or `--data-path`");
  // V-15. Megatron applies the legacy default to --data-path only and fails later without
  // --split for --data-args-path; the file stands for --data-path here too (docs/compat.md).
  if (single_blend && !a.is_set("split")) {
    a.set("split", std::string("969, 30, 1"));
    d.warn(std::string("`--split` not given with `") +
           (data_args ? "--data-args-path" : "--data-path") +
           "`: using Megatron's legacy default \"969, 30, 1\"");
  }
  // M-18: the blend files are read now, not when the datasets are built as in Megatron, so that
  // a missing file or a bad blend stops the run (and `--dry-run`) before anything starts. Their
  // lists then take the place of the flags they stand for: the datasets are built from
  // --data-path and --train/valid/test-data-path alone, whichever way they were given.
  if (d.errors.size() == errors_before) check_blends(a, data_args, per_split_args, d);
  // Megatron checks the proportions only when it builds the datasets, after reading them
  // with a pattern that drops minus signs and "nan"; here each is read whole, before the start.
  if (a.is_set("split")) {
    try {
      (void)data::parse_split(a.s("split"));
    } catch (const Error& e) {
      d.error("R-15", e.what());
    }
  }
  // V-28
  if (!a.is_set("dataloader_type")) a.set("dataloader_type", std::string("single"));
  if (a.i("num_dataset_builder_threads") < 1)
    d.error("V-28", a.flag_value("num_dataset_builder_threads") + " must be > 0");
  // V-59: tokenizer files.
  const std::string tok = a.s("tokenizer_type");
  if (tok == "GPT2BPETokenizer" && (!a.is_set("vocab_file") || !a.is_set("merge_file")))
    d.error("V-59", "`--tokenizer-type GPT2BPETokenizer` needs `--vocab-file` and `--merge-file`");
  if ((tok == "SentencePieceTokenizer" || tok == "GPTSentencePieceTokenizer" ||
       tok == "Llama2Tokenizer" || tok == "TikTokenizer" || tok == "HuggingFaceTokenizer") &&
      !a.is_set("tokenizer_model"))
    d.error("V-59", a.flag_value("tokenizer_type") + " needs `--tokenizer-model`");
  if ((tok == "BertWordPieceLowerCase" || tok == "BertWordPieceCase") && !a.is_set("vocab_file"))
    d.error("V-59", a.flag_value("tokenizer_type") + " needs `--vocab-file`");
  // The tokenizer, when one is named (NullTokenizer excepted), gives the vocabulary: loading it
  // here checks its files before anything starts (Megatron ignores --vocab-size for it too).
  if (!tok.empty() && tok != "NullTokenizer" && d.errors.size() == errors_before) {
    try {
      data::TokenizerConfig tc;
      tc.type = tok;
      tc.model = a.s("tokenizer_model");
      tc.vocab_file = a.s("vocab_file");
      tc.merge_file = a.s("merge_file");
      const auto t = data::load_tokenizer(tc);
      if (a.is_set("vocab_size") && a.i("vocab_size") != t->vocab_size())
        d.warn(a.flag_value("vocab_size") + " is ignored: the tokenizer has " +
               num(t->vocab_size()) + " ids");
      a.set("vocab_size", t->vocab_size());
      a.set("tokenizer_eod", static_cast<int64_t>(t->eod()));
    } catch (const Error& e) {
      d.error("V-59", std::string("cannot load the tokenizer: ") + e.what());
      return;
    }
  } else if (!tok.empty() && tok != "NullTokenizer") {
    // The tokenizer was not loaded because of the errors above: its vocabulary is unknown, and
    // --vocab-size (which it overrides) would only produce follow-up complaints (the mask token
    // outside a vocabulary that is not the real one).
    return;
  }
  // M-11 (V-59 for NullTokenizer): without a tokenizer the vocabulary comes from --vocab-size.
  if (!a.is_set("vocab_size")) {
    d.error(tok == "NullTokenizer" ? "V-59" : "M-11",
            "`--vocab-size` is required without a tokenizer (or give `--tokenizer-type` and its "
            "files: the vocabulary then comes from the tokenizer)");
    return;
  }
  // The EOD id: the tokenizer's, mock data's 0, or unknown (no document boundaries).
  if (tok == "NullTokenizer") a.set("tokenizer_eod", a.i("vocab_size") - 1);
  const bool eod_known = mock || a.is_set("tokenizer_eod");
  for (const char* dest : {"eod_mask_loss", "reset_position_ids", "reset_attention_mask"})
    if (a.b(dest) && !eod_known)
      d.error("V-59", a.flag_value(dest) + " needs the end-of-document id: give `--tokenizer-type` "
                      "(and its files) with `--data-path`");
  // Padded vocabulary. Megatron's NullTokenizer reserves one more id for EOD and pads
  // vocab_size + 1; megadlm takes --vocab-size as the full vocabulary (the EOD id included),
  // which is what the MegaDLMs 1.7B example means by --vocab-size 50289 with its HF tokenizer.
  const int64_t vocab = a.i("vocab_size");
  // Mock documents need their end-of-document id (0), the mask token and one token to count.
  if (mock && vocab >= 1 && vocab < 3)
    d.error("M-2", a.flag_value("vocab_size") + " is too small for `--mock-data` (its documents "
                   "use the end-of-document id 0, the mask token and at least one other id); "
                   "valid: at least 3");
  const int64_t multiple = a.i("make_vocab_size_divisible_by") * (c.sizes_ok ? c.tp : 1);
  if (multiple > 0) a.set("padded_vocab_size", (vocab + multiple - 1) / multiple * multiple);
}

// ------------------------------------------------------------- diffusion (D-2, D-3, D-4, D-6, D-7, D-10, D-11, D-12, M-12)

void check_diffusion(ArgState& a, Ctx& c, Diagnostics& d) {
  const std::string mode = a.s("model_running_mode");
  const bool difflm = mode == "difflm-noshift";
  // Mask default: MegaDLMs' causal_bottom_right crashes with difflm-noshift (docs/compat.md).
  if (!a.is_set("attention_mask_type"))
    a.set("attention_mask_type", std::string(mode == "vanilla" ? "causal" : "no_mask"));
  const std::string mask = a.s("attention_mask_type");
  // D-2
  if (difflm && mask != "no_mask" && mask != "block_causal")
    d.error("D-2", "`--model-running-mode difflm-noshift` needs `--attention-mask-type no_mask` "
                   "(full-sequence diffusion) or `block_causal` (block diffusion) (got " +
                       a.flag_value("attention_mask_type") + "); valid: no_mask, block_causal");
  // D-10, D-11: block diffusion (docs/training_objectives.md).
  const bool block = mask == "block_causal";
  if (block && !difflm)
    d.error("D-10", "`--attention-mask-type block_causal` trains block diffusion, which needs "
                   "`--model-running-mode difflm-noshift` (got " + a.flag_value("model_running_mode") + ")");
  if (block && !a.is_set("dlm_block_size"))
    d.error("D-10", "`--attention-mask-type block_causal` needs `--dlm-block-size B` (the diffusion "
                   "block length, dividing `--seq-length`)");
  if (a.is_set("dlm_block_size")) {
    const int64_t bs = a.i("dlm_block_size");
    if (!block)
      d.error("D-10", a.flag_value("dlm_block_size") + " needs `--attention-mask-type block_causal` "
                     "(block diffusion); got " + a.flag_value("attention_mask_type"));
    else if (bs < 1 || (c.seq > 0 && c.seq % bs != 0))
      d.error("D-10", a.flag_value("dlm_block_size") + " must divide " + a.flag_value("seq_length") +
                         (c.seq > 0 ? "; valid: a divisor of " + num(c.seq) + " (e.g. " +
                                          num(c.seq % 32 == 0 ? 32 : c.seq) + ")" : std::string()));
  }
  // D-12: the block-size warm-up schedule.
  if (a.is_set("dlm_block_size_schedule")) {
    const std::string flag = a.flag_value("dlm_block_size_schedule");
    std::vector<std::pair<int64_t, int64_t>> sched;
    const std::string bad = parse_block_size_schedule(a.strings("dlm_block_size_schedule"), sched);
    if (!block) {
      d.error("D-12", flag + " needs `--attention-mask-type block_causal` with `--dlm-block-size`");
    } else if (!bad.empty()) {
      d.error("D-12", flag + ": " + bad);
    } else if (a.is_set("dlm_block_size")) {
      const int64_t final_size = a.i("dlm_block_size");
      for (size_t k = 0; k < sched.size(); ++k) {
        const auto [size, until] = sched[k];
        const std::string entry = "entry " + num(static_cast<int64_t>(size)) + ":" + num(until);
        if (size >= final_size) {
          d.error("D-12", flag + ": " + entry + " is not smaller than the final " +
                             a.flag_value("dlm_block_size") + "; valid: sizes below it");
          break;
        }
        if (k > 0 && (size <= sched[k - 1].first || until <= sched[k - 1].second)) {
          d.error("D-12", flag + ": " + entry + " does not grow: sizes and iterations must both "
                             "increase from one entry to the next");
          break;
        }
        if (c.seq > 0 && c.seq % size != 0) {
          d.error("D-12", flag + ": block size " + num(size) + " does not divide " +
                             a.flag_value("seq_length") + "; valid: divisors of " + num(c.seq));
          break;
        }
      }
    }
  }
  if (block) {
    if (c.cp > 1) {
      // CP splits the L original positions into 2·cp chunks of whole blocks, both copies of a
      // position on one rank (docs/parallelism/context_parallel.md, "Block diffusion").
      const int64_t unit = 2 * static_cast<int64_t>(c.cp) * std::max<int64_t>(a.i("dlm_block_size"), 1);
      if (a.is_set("dlm_block_size") && c.seq > 0 && c.seq % unit != 0)
        d.error("D-11", "block diffusion under context parallelism cuts " + a.flag_value("seq_length") +
                           " into 2 x " + a.flag_value("context_parallel_size") + " chunks of whole "
                           "blocks of " + a.flag_value("dlm_block_size") + ", which does not divide; "
                           "valid: `--seq-length` a multiple of " + num(unit) + ", or a block size "
                           "dividing " + (c.seq % (2 * c.cp) == 0 ? num(c.seq / (2 * c.cp)) : std::string("it")) +
                           ", or another `--context-parallel-size`");
      if (a.is_set("dlm_block_size_schedule"))
        d.error("D-11", "block diffusion under context parallelism keeps one block size; " +
                           a.flag_value("dlm_block_size_schedule") + " is not supported with " +
                           a.flag_value("context_parallel_size") + " yet; valid: no schedule");
      if (a.f("hidden_dropout") > 0)
        d.error("D-11", "block diffusion under context parallelism runs without hidden dropout (its "
                           "masks are keyed by the position of the doubled row, which the shard's "
                           "rows do not map yet); got " + a.flag_value("hidden_dropout") +
                           "; valid: `--hidden-dropout 0`");
      if (a.b("moe_router_force_load_balancing"))
        d.error("D-11", "block diffusion under context parallelism does not draw random router logits "
                           "(`--moe-router-force-load-balancing`, keyed by position) yet; drop the flag");
    }
    if (a.f("attention_dropout") > 0)
      d.error("D-11", "block diffusion's attention kernels run without attention dropout; got " +
                         a.flag_value("attention_dropout") + "; valid: `--attention-dropout 0`");
  }
  for (const char* dest : {"dlm_t_granularity", "dlm_bd_clean_attention"})
    if (!block && a.was_given(dest))
      d.error("D-10", a.flag_value(dest) + " needs `--attention-mask-type block_causal`");
  // The AR loss belongs to the causal clean half: a block-causal clean token sees the token it
  // would predict.
  for (const char* dest : {"dlm_ar_loss_weight", "dlm_diffusion_loss_scale"})
    if (a.was_given(dest) && !(block && a.s("dlm_bd_clean_attention") == "causal"))
      d.error("D-10", a.flag_value(dest) + " needs `--attention-mask-type block_causal "
                      "--dlm-bd-clean-attention causal` (the next-token loss needs a causal clean "
                      "half: a block-causal clean token sees the token it would predict)");
  if (block && a.s("dlm_bd_clean_attention") == "causal" &&
      (a.f("dlm_ar_loss_weight") <= 0 || a.f("dlm_diffusion_loss_scale") <= 0))
    d.error("D-10", a.flag_value("dlm_ar_loss_weight") + " and " + a.flag_value("dlm_diffusion_loss_scale") +
                        " must be positive");
  if (mode == "vanilla" && mask != "causal" && mask != "causal_bottom_right")
    d.warn("`--model-running-mode vanilla` always trains with causal attention (as MegaDLMs "
           "does); " + a.flag_value("attention_mask_type") + " is not used");
  // D-3 (MegaDLMs' block_causal needs --core-attn-implementation FlexAttention; megadlm runs
  // block diffusion on its own kernels, so that half of the rule does not apply.)
  if (difflm && a.s("transformer_impl") == "local")
    d.error("D-3", "`--transformer-impl local` silently builds causal attention in MegaDLMs, "
                   "which breaks `--model-running-mode difflm-noshift`; remove it");
  // D-4
  if (a.is_set("padded_vocab_size")) {
    const int64_t padded = a.i("padded_vocab_size");
    const int64_t m = a.i("mask_token");
    if (m < 0 || m >= padded)
      d.error("D-4", a.flag_value("mask_token") + " is outside the padded vocabulary of " +
                         num(padded) + " (" + a.flag_value("vocab_size") + " padded to a multiple of " +
                         a.flag_value("make_vocab_size_divisible_by") + " × TP); valid: 0 to " +
                         num(padded - 1));
    // A mask token that is also the end-of-document id would be a masked position the data
    // itself contains.
    const int64_t eod = a.b("mock_data") ? 0 : a.is_set("tokenizer_eod") ? a.i("tokenizer_eod") : -1;
    if (difflm && eod >= 0 && m == eod)
      d.error("D-4", a.flag_value("mask_token") + " is the end-of-document id of " +
                         (a.b("mock_data") ? std::string("`--mock-data`") : a.flag_value("tokenizer_type")) +
                         "; the mask token must be an id that no document contains");
  }
  // D-5 (difflm-noshift ⇒ pp = cp = 1 and no SP) is deliberately not enforced: megadlm keeps the
  // fixed length S for difflm-noshift (docs/architecture.md, compatibility decisions), so pipeline,
  // context and sequence splits stay divisible.
  // D-6: packed (THD) batches.
  if (difflm && a.b("reset_position_ids") && a.b("reset_attention_mask")) {
    // MegaDLMs also refuses packing with CP (its cu_seqlens use multiples of S, not of the
    // local length); megadlm's CP attention keeps documents by global document id, so packed
    // batches split over CP ranks compute what they compute at CP = 1.
    if (!a.b("cut_off_varlen_to_seqlen"))
      d.error("D-6", "packed batches (`--reset-position-ids --reset-attention-mask`) with "
                     "difflm-noshift need `--cut-off-varlen-to-seqlen`");
  }
  // Per-document attention: MegaDLMs' packed difflm batches, or Megatron's blocked causal mask.
  const bool per_document = a.b("reset_attention_mask") &&
                            (!difflm || (a.b("reset_position_ids") && a.b("cut_off_varlen_to_seqlen")));
  a.set("per_document_attention", per_document);
  if (difflm && a.b("reset_attention_mask") && !per_document)
    d.warn("`--reset-attention-mask` without `--reset-position-ids --cut-off-varlen-to-seqlen` "
           "has no effect with difflm-noshift (bidirectional attention ignores the dataloader "
           "mask, as in MegaDLMs)");
  // D-7 (--difflm-varilen-prob in [0, 1]) is a range of the flag table.
  // M-12
  const int64_t min_masked = a.i("dlm_min_masked");
  if (min_masked < 0 || (c.seq > 0 && min_masked > c.seq))
    d.error("M-12", a.flag_value("dlm_min_masked") + " must lie in [0, " +
                        (c.seq > 0 ? a.flag_value("seq_length") : std::string("seq-length")) + "]");
}

// ------------------------------------------------------------- device (M-3, M-4, M-7)

void check_device(ArgState& a, Ctx& c, Diagnostics& d) {
  const bool given = a.is_set("device");
  if (!given) a.set("device", std::string(a.launch().visible_gpus > 0 ? "cuda" : "cpu"));
  const std::string device_text =
      given ? a.flag_value("device") : "`--device cuda` (the default when a GPU is visible)";
  if (a.s("device") == "cuda" && a.b("fp8_param_gather") && a.is_set("fp8"))
    d.error("FP8-9", device_text + " with `--fp8-param-gather`: the FP8 parameter gather runs on the "
                     "CPU backend only so far (its CUDA shard cast into the gather buffer and the "
                     "transposed codes after the gather are not built; docs/fp8.md); drop "
                     "`--fp8-param-gather` (the weights are then gathered in bf16) or use `--device cpu`");
  if (a.s("device") == "cuda") {
    // FP8-8: Hopper's FP8 GEMMs need leading dimensions that are multiples of 16 (every GEMM
    // dimension of the FP8 linears is a leading dimension of one of its three GEMMs).
    if (a.is_set("fp8") && c.model_ok && c.sizes_ok && c.tp > 0 && c.cp > 0) {
      const int64_t groups = c.query_groups > 0 ? c.query_groups : c.heads;
      const int64_t tokens = a.i("micro_batch_size") * c.seq / c.cp;
      const std::pair<std::string, int64_t> dims[] = {
          {a.flag_value("hidden_size"), c.hidden},
          {a.flag_value("ffn_hidden_size") + " / tensor-parallel size", c.ffn / c.tp},
          {"heads x kv channels / tensor-parallel size", c.heads * c.kv / c.tp},
          {"query groups x kv channels / tensor-parallel size", groups * c.kv / c.tp},
          {a.flag_value("micro_batch_size") + " x " + a.flag_value("seq_length") +
               " / context-parallel size (tokens of a micro-batch)", tokens},
          // MoE experts: the expert width per expert-TP rank (fc1's output, fc2's K). Their
          // token counts vary per step: the weight-gradient GEMMs pad them to 16 (docs/fp8.md).
          {(a.was_given("moe_ffn_hidden_size") ? a.flag_value("moe_ffn_hidden_size") : std::string("the expert width")) +
               " / expert-tensor-parallel size",
           a.is_set("num_experts") && a.i("num_experts") > 0 && c.etp > 0 ? a.i("moe_ffn_hidden_size") / c.etp : 0}};
      for (const auto& [what, v] : dims)
        if (v > 0 && v % 16 != 0)
          d.error("FP8-8", a.flag_value("fp8") + " on CUDA: " + what + " = " + num(v) +
                               " must be a multiple of 16 (FP8 tensor-core GEMM leading dimensions); "
                               "use sizes that are, or `--device cpu`");
    }
    if (a.b("per_document_attention") && c.kv != 64 && c.kv != 128)
      d.warn(device_text + " with per-document attention (`--reset-attention-mask`) and " +
             a.flag_value("kv_channels") + ": packed batches run on the simple CUDA attention "
             "kernels, which are much slower than the flash kernels (head_dim 64 and 128; "
             "docs/kernels/attention.md)");
    if (!a.b("bf16"))
      d.unsupported(device_text + " without `--bf16`: fp32 training on CUDA is not supported yet "
                    "by megadlm; add `--bf16` (or use `--device cpu`)");
    if (a.launch().visible_gpus == 0 && !c.dry_run)
      d.error("M-4", device_text + " but no GPU is visible; use `--device cpu`");
  } else if (a.b("bf16")) {
    d.warn("`--bf16` with `--device cpu`: the CPU backend computes in fp32");
  }
  if (!(a.f("gpu_memory_gb") > 0))
    d.error("M-2", a.flag_value("gpu_memory_gb") + " must be a positive number of GB");
}

}  // namespace

void resolve_and_validate(ArgState& a, bool dry_run, Diagnostics& d) {
  Ctx c;
  c.dry_run = dry_run;
  check_removed_and_ignored(a, d);
  check_value_ranges(a, d);
  check_output_paths(a, dry_run, d);
  resolve_world(a, c, d);
  resolve_model_shape(a, c, d);
  check_tensor_parallel(a, c, d);
  check_pipeline(a, c, d);
  check_context_parallel(a, c, d);
  check_batch(a, c, d);
  check_recompute(a, c, d);
  check_data_parallel(a, c, d);
  check_precision(a, d);
  check_fp8(a, c, d);
  check_schedule(a, c, d);
  check_checkpoint(a, d);
  check_layer_options(a, c, d);
  check_moe(a, c, d);
  check_data(a, c, d);
  check_diffusion(a, c, d);
  check_device(a, c, d);
  check_not_yet(a, d);
  check_support(a, c, d);
}

}  // namespace megadlm::training::detail
