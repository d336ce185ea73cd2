// Rules on the parallel layout and batch sizes (docs/rules.md: V-2…V-23, B-*, C-4…C-7,
// C-9, C-10, C-15, C-21, G-*, R-1, R-3…R-7), and the list of parallel features this
// single-process build cannot run yet. Each block reports into Diagnostics with its rule id.
#include <algorithm>
#include <climits>
#include <cstdlib>
#include <functional>
#include "training/arguments/flag_enums.h"
#include "training/arguments/rules_common.h"

namespace megadlm::training::detail {

std::string divisors_text(int64_t n) {
  if (n <= 0) return "none";
  if (n > (int64_t{1} << 40)) return "the divisors of " + std::to_string(n);  // keep it O(sqrt)
  std::vector<int64_t> small, large;
  for (int64_t d = 1; d * d <= n; ++d) {
    if (n % d != 0) continue;
    small.push_back(d);
    if (d != n / d) large.push_back(n / d);
  }
  small.insert(small.end(), large.rbegin(), large.rend());
  std::string out;
  for (int64_t d : small) out += (out.empty() ? "" : ", ") + std::to_string(d);
  return out;
}

// ------------------------------------------------------- world and parallel sizes (V-2…V-11, G-*)

void resolve_world(ArgState& a, Ctx& c, Diagnostics& d) {
  const LaunchInfo& launch = a.launch();
  if (c.dry_run && a.is_set("world_size")) {
    c.world = a.i("world_size");
    c.world_source = a.flag_value("world_size");
  } else {
    c.world = launch.world_size;
    c.world_source = "from the launcher";
  }
  if (!c.dry_run && a.is_set("world_size")) {
    if (a.i("world_size") != launch.world_size)
      d.error("M-1", a.flag_value("world_size") +
                         " is only used with `--dry-run`; a real launch takes the world size from "
                         "the launcher (here " + num(static_cast<int64_t>(launch.world_size)) + ")");
    else
      d.warn(a.flag_value("world_size") + " has no effect without `--dry-run`");
  }
  c.tp = a.i("tensor_model_parallel_size");
  c.pp = a.i("pipeline_model_parallel_size");
  c.cp = a.i("context_parallel_size");
  c.ep = a.i("expert_model_parallel_size");
  // V-11 / C-2: expert TP defaults to TP.
  if (!a.is_set("expert_tensor_parallel_size")) a.set("expert_tensor_parallel_size", c.tp);
  c.etp = a.i("expert_tensor_parallel_size");

  auto positive = [&](const std::string& what, const std::string& text, int64_t v) {
    if (v >= 1 && v <= kMaxParallelSize) return true;
    d.error("M-2", text + ": " + what + " must be between 1 and " + num(kMaxParallelSize));
    return false;
  };
  c.sizes_ok = positive("the world size", c.world_text(), c.world);
  for (const char* dest : {"tensor_model_parallel_size", "pipeline_model_parallel_size",
                           "context_parallel_size", "expert_model_parallel_size",
                           "expert_tensor_parallel_size"})
    c.sizes_ok = positive("a parallel size", a.flag_value(dest), a.i(dest)) && c.sizes_ok;

  // Encoder sizes (encoder-decoder models are out of scope; their flags are "not yet").
  int64_t enc_tp = a.i("encoder_tensor_model_parallel_size");
  const int64_t enc_pp = a.i("encoder_pipeline_model_parallel_size");
  if (enc_tp < 0 || enc_pp < 0 || enc_tp > kMaxParallelSize || enc_pp > kMaxParallelSize) {
    c.sizes_ok = false;
    d.error("M-2", "encoder parallel sizes must lie in [0, " + num(kMaxParallelSize) + "] (" +
                       a.flag_value("encoder_tensor_model_parallel_size") + ", " +
                       a.flag_value("encoder_pipeline_model_parallel_size") + ")");
  }
  if (enc_tp > 0 && c.sizes_ok) {
    const int64_t heads = a.i("num_attention_heads");
    if (heads > 0 && heads % enc_tp != 0)
      d.error("V-3", a.flag_value("encoder_tensor_model_parallel_size") + " does not divide " +
                         a.flag_value("num_attention_heads") + "; valid: " + divisors_text(heads));
    if (enc_tp > c.tp)
      d.error("V-3", a.flag_value("encoder_tensor_model_parallel_size") + " exceeds " +
                         a.flag_value("tensor_model_parallel_size") + "; valid: 1 to " + num(c.tp));
    // V-2 as Megatron states it also fires for an unset (0) encoder TP when --num-experts 0 is
    // given; we only check a TP the user actually set.
    if (enc_pp == 0 && enc_tp != c.tp)
      d.error("V-2", a.flag_value("encoder_tensor_model_parallel_size") +
                         " must equal " + a.flag_value("tensor_model_parallel_size") +
                         " when the encoder shares the first pipeline stage "
                         "(`--encoder-pipeline-model-parallel-size 0`)");
  }
  if (enc_pp > 0 && enc_tp == 0) enc_tp = c.tp;  // V-4
  if (!c.sizes_ok) return;

  // V-5 / G-1: the model-parallel size tiles the world.
  const int64_t model_size = c.tp * c.pp * c.cp + std::max<int64_t>(enc_tp, 0) * std::max<int64_t>(enc_pp, 0) * c.cp;
  if (c.world % model_size != 0) {
    d.error("V-5", c.world_text() + " is not divisible by tp·pp·cp = " + num(model_size) + " (" +
                       a.flag_value("tensor_model_parallel_size") + ", " +
                       a.flag_value("pipeline_model_parallel_size") + ", " +
                       a.flag_value("context_parallel_size") + "); valid world sizes: multiples of " +
                       num(model_size) +
                       (c.dry_run ? " (e.g. `--world-size " + num(model_size) + "`)" : "") +
                       "; valid for world size " + num(c.world) + ": sizes whose product tp·pp·cp "
                       "divides it (" + divisors_text(c.world) + ")");
  } else {
    c.dense_ok = true;
    c.dp = c.world / model_size;
  }
  // G-3: the expert layout tiles the same world (reported on its own only when it is not the
  // V-5 failure again through the default etp = tp).
  const int64_t expert_size = c.etp * c.ep * c.pp;
  const bool expert_flags = a.was_given("expert_tensor_parallel_size") || c.ep > 1;
  if (c.world % expert_size != 0 && (c.dense_ok || expert_flags)) {
    d.error("G-3", c.world_text() + " is not divisible by etp·ep·pp = " + num(expert_size) + " (" +
                       a.flag_value("expert_tensor_parallel_size") + ", " +
                       a.flag_value("expert_model_parallel_size") + ", " +
                       a.flag_value("pipeline_model_parallel_size") +
                       "); valid world sizes: multiples of " + num(expert_size));
  } else if (c.world % expert_size == 0) {
    c.expert_ok = true;
    c.edp = c.world / expert_size;
  }
  // V-53 / G-6: the tp-pp-dp order has no slot for cp or ep.
  if (a.b("use_tp_pp_dp_mapping") && c.cp * c.ep > 1)
    d.error("V-53", "`--use-tp-pp-dp-mapping` orders ranks tp-pp-dp, which has no slot for context "
                    "or expert parallelism: " + a.flag_value("context_parallel_size") + " and " +
                    a.flag_value("expert_model_parallel_size") + " must both be 1");
  // G-4: dense and expert pipeline groups coincide. With the default order pp is the slowest
  // dimension of both generators; with tp-pp-dp its stride is tp (dense) and etp (expert).
  if (a.b("use_tp_pp_dp_mapping") && c.pp > 1 && c.etp != c.tp)
    d.error("G-4", "with `--use-tp-pp-dp-mapping` and " +
                       a.flag_value("pipeline_model_parallel_size") + ", " +
                       a.flag_value("expert_tensor_parallel_size") + " must equal " +
                       a.flag_value("tensor_model_parallel_size") +
                       " so that dense and expert pipeline groups coincide; valid: " + num(c.tp));
  a.set("world_size", c.world);
  a.set("rank", static_cast<int64_t>(a.launch().rank));
  a.set("data_parallel_size", c.dense_ok ? FlagValue(c.dp) : FlagValue());
  a.set("expert_data_parallel_size", c.expert_ok ? FlagValue(c.edp) : FlagValue());
}

// --------------------------------------------------------- tensor-parallel splits (C-9, C-10, R-4)

void check_tensor_parallel(ArgState& a, Ctx& c, Diagnostics& d) {
  if (!c.sizes_ok) return;
  if (c.heads > 0 && c.heads % c.tp != 0)
    d.error("C-9", a.flag_value("tensor_model_parallel_size") + " does not divide " +
                       a.flag_value("num_attention_heads") + "; valid: " + divisors_text(c.heads));
  if (a.b("group_query_attention") && c.query_groups > 0 && c.query_groups % c.tp != 0)
    d.error("C-10", a.flag_value("tensor_model_parallel_size") + " does not divide " +
                        a.flag_value("num_query_groups") + "; valid: " +
                        divisors_text(c.query_groups));
  if (c.ffn > 0 && c.ffn % c.tp != 0)
    d.error("R-4", a.flag_value("tensor_model_parallel_size") + " does not divide the MLP width " +
                       (a.was_given("ffn_hidden_size")
                            ? a.flag_value("ffn_hidden_size")
                            : num(c.ffn) + " (the default " + a.flag("ffn_hidden_size") + ")") +
                       "; valid: " + divisors_text(c.ffn));
  // M-25: at TP 1 there is no TP communication to overlap (Megatron fails V-45's assertion
  // after turning SP off, which names the flag the user did give). Checked before V-44 does so.
  const bool overlap_without_tp = a.b("tp_comm_overlap") && c.tp == 1;
  if (overlap_without_tp)
    d.error("M-25", "`--tp-comm-overlap` overlaps tensor-parallel communication, and " +
                        a.flag_value("tensor_model_parallel_size") +
                        " has none; drop it or use a TP size > 1 with `--sequence-parallel`");
  // V-44: sequence parallelism is meaningless without TP.
  if (a.b("sequence_parallel") && c.tp == 1) {
    d.warn("`--sequence-parallel` has no effect with `--tensor-model-parallel-size 1`; turned off");
    a.set("sequence_parallel", false);
  }
  // V-45
  if (a.b("tp_comm_overlap") && !a.b("sequence_parallel") && !overlap_without_tp)
    d.error("V-45", "`--tp-comm-overlap` requires `--sequence-parallel`: it overlaps the "
                    "sequence-parallel all-gathers and reduce-scatters with the GEMMs");
  // the SP scatter splits the local sequence over TP.
  if (a.b("sequence_parallel") && c.seq > 0 && c.cp >= 1 && (c.seq / c.cp) % c.tp != 0)
    d.error("R-5", "`--sequence-parallel` splits the local sequence " + a.flag_value("seq_length") +
                       " / " + a.flag_value("context_parallel_size") + " = " + num(c.seq / c.cp) +
                       " over " + a.flag_value("tensor_model_parallel_size") +
                       ", which does not divide it; valid TP sizes: " + divisors_text(c.seq / c.cp));
}

// ------------------------------------------------------------- context parallelism (V-9, V-10, V-35, …)

namespace {

/// ", e.g. `--hierarchical-context-parallel-sizes 1 2` or `2 1`": up to three ordered ways to
/// write `cp` as `levels` level sizes (those with fewer levels of size 1 first).
std::string hierarchical_cp_examples(int64_t cp, size_t levels) {
  if (levels == 0 || levels > 8) return "";
  std::vector<std::vector<int64_t>> found;
  std::vector<int64_t> sizes;
  const std::function<void(int64_t)> split = [&](int64_t rest) {
    if (found.size() >= 64) return;  // enough to pick three from
    if (sizes.size() + 1 == levels) {
      sizes.push_back(rest);
      found.push_back(sizes);
      sizes.pop_back();
      return;
    }
    for (int64_t f = 1; f <= rest && found.size() < 64; ++f) {
      if (rest % f != 0) continue;
      sizes.push_back(f);
      split(rest / f);
      sizes.pop_back();
    }
  };
  split(cp);
  auto ones = [](const std::vector<int64_t>& v) { return std::count(v.begin(), v.end(), 1); };
  std::stable_sort(found.begin(), found.end(),
                   [&](const auto& x, const auto& y) { return ones(x) < ones(y); });
  found.resize(std::min<size_t>(found.size(), 3));
  std::string out;
  for (size_t i = 0; i < found.size(); ++i) {
    std::string text;
    for (int64_t v : found[i]) {
      if (!text.empty()) text += ' ';
      text += num(v);
    }
    if (i == 0) out += ", e.g. `--hierarchical-context-parallel-sizes " + text + "`";
    else out += (i + 1 == found.size() ? " or `" : ", `") + text + "`";
  }
  return out;
}

/// "; or `--context-parallel-size 8` to match these levels": the CP size the given levels
/// describe, with whether the world size fits it.
std::string cp_size_for_levels(const Ctx& c, int64_t product) {
  const std::string flag = "`--context-parallel-size " + num(product) + "`";
  const int64_t model_size = c.tp * c.pp * product;
  if (c.world % model_size == 0) return "; or " + flag + " to match these levels";
  return "; " + flag + " would match these levels but needs tp·pp·cp = " + num(c.tp) + "·" +
         num(c.pp) + "·" + num(product) + " = " + num(model_size) + " to divide the " +
         c.world_text();
}

}  // namespace

void check_context_parallel(ArgState& a, Ctx& c, Diagnostics& d) {
  std::vector<std::string> types = a.strings("cp_comm_type");
  for (std::string& t : types)
    if (t == "allgather") t = "all_gather";  // the help text's spelling; TE's token is all_gather
  a.set("cp_comm_type", types);
  const std::vector<int64_t> hier = a.ints("hierarchical_context_parallel_sizes");
  // V-9
  if (!hier.empty()) {
    int64_t product = 1;
    bool in_range = true;
    for (int64_t h : hier) {
      in_range = in_range && h >= 1 && h <= kMaxParallelSize;
      if (in_range) product = std::min(product * h, kMaxParallelSize + 1);  // no overflow
    }
    if (!in_range)
      d.error("M-2", a.flag_value("hierarchical_context_parallel_sizes") +
                         ": sizes must lie in [1, " + num(kMaxParallelSize) + "]");
    else if (c.sizes_ok && product != c.cp)
      d.error("V-9", a.flag_value("hierarchical_context_parallel_sizes") + " multiply to " +
                         (product > kMaxParallelSize ? "more than " + num(kMaxParallelSize)
                                                     : num(product)) + ", not to " + a.flag_value("context_parallel_size") +
                         "; valid: level sizes whose product is " + num(c.cp) +
                         hierarchical_cp_examples(c.cp, hier.size()) +
                         (product <= kMaxParallelSize ? cp_size_for_levels(c, product) : ""));
  }
  const bool a2a_p2p = std::find(types.begin(), types.end(), "a2a+p2p") != types.end();
  // V-10
  if (a2a_p2p && hier.empty())
    d.error("V-10", a.flag_value("cp_comm_type") + " needs `--hierarchical-context-parallel-sizes` "
                    "(level sizes whose product is the CP size)");
  // M-24: a2a+p2p runs the all-to-all inside level 1 and the ring across level 2 (Transformer
  // Engine takes exactly these two groups).
  if (a2a_p2p && hier.size() != 0 && hier.size() != 2)
    d.error("M-24", a.flag_value("cp_comm_type") + " uses two hierarchical levels (the "
                    "all-to-all size, then the ring size), but " +
                    a.flag_value("hierarchical_context_parallel_sizes") + " gives " +
                    num(static_cast<int64_t>(hier.size())) + "; valid: two sizes whose product is " +
                    a.flag_value("context_parallel_size") + hierarchical_cp_examples(c.cp, 2));
  // C-21: one type for all layers, or one per layer.
  if (types.size() > 1 && c.num_layers > 0 && static_cast<int64_t>(types.size()) != c.num_layers)
    d.error("C-21", a.flag_value("cp_comm_type") + " gives " + num(static_cast<int64_t>(types.size())) +
                        " values; valid: one value, or one per layer (" +
                        a.flag_value("num_layers") + ")");
  if (!c.sizes_ok || c.cp == 1) return;
  // V-35: load-balanced CP cuts the sequence into 2·cp chunks.
  if (c.seq > 0 && c.seq % (2 * c.cp) != 0)
    d.error("V-35", a.flag_value("seq_length") + " is not divisible by 2 × " +
                        a.flag_value("context_parallel_size") + " = " + num(2 * c.cp) +
                        " (CP splits the sequence into 2·cp chunks); valid: multiples of " +
                        num(2 * c.cp));
  // V-50
  if (a.b("use_legacy_models"))
    d.error("V-50", a.flag_value("context_parallel_size") + " is not available with "
                    "`--use-legacy-models`");
  // Ulysses (a2a) splits each rank's heads over its all-to-all group.
  const bool a2a = std::find(types.begin(), types.end(), "a2a") != types.end();
  if ((a2a || (a2a_p2p && !hier.empty())) && c.heads > 0 && c.heads % c.tp == 0) {
    const int64_t group = a2a ? c.cp : hier[0];
    const std::string group_text = a2a ? a.flag_value("context_parallel_size")
                                       : "the first hierarchical CP level (" + num(group) + ")";
    const int64_t local_heads = c.heads / c.tp;
    if (group > 0 && local_heads % group != 0)
      d.error("R-6", a.flag_value("cp_comm_type") + " splits the " + num(local_heads) +
                         " heads per TP rank (" + a.flag_value("num_attention_heads") + " / " +
                         a.flag_value("tensor_model_parallel_size") + ") over " + group_text +
                         ", which does not divide them; valid all-to-all sizes: " +
                         divisors_text(local_heads));
    if (group > 0 && c.query_groups > 0 && c.query_groups % c.tp == 0 &&
        (c.query_groups / c.tp) % group != 0)
      d.error("R-6", a.flag_value("cp_comm_type") + " splits the " + num(c.query_groups / c.tp) +
                         " key/value groups per TP rank over " + group_text +
                         ", which does not divide them; valid all-to-all sizes: " +
                         divisors_text(c.query_groups / c.tp));
  }
  // no TE backend implements a bottom-right causal mask under CP.
  if (a.s("attention_mask_type") == "causal_bottom_right")
    d.error("R-7", "`--attention-mask-type causal_bottom_right` cannot be used with " +
                       a.flag_value("context_parallel_size") +
                       "; valid: causal (the same mask for training) or no_mask");
  // (MoE under CP: a varilen-truncated micro-batch is padded to split over the CP ranks; the MoE
  // layer routes only the real rows, MicroBatch::unpadded_seq.)
}

// ------------------------------------------------------------ pipeline (V-18…V-20, G-2, R-1, R-3)

namespace {

// The interleaved schedule's size has three spellings: layers per virtual stage (Megatron's
// --num-layers-per-virtual-pipeline-stage) or virtual stages per pipeline rank (Megatron-Core's
// config field virtual_pipeline_model_parallel_size, and upstream Megatron-LM's
// --num-virtual-stages-per-pipeline-rank). Any of them may be given; given together they must
// describe the same split.
struct VirtualStageFlags {
  bool layers = false;  ///< --num-layers-per-virtual-pipeline-stage
  std::vector<const char*> stages;  ///< dests of the given virtual-stages-per-rank spellings
  bool any() const { return layers || !stages.empty(); }
  /// The given flags with their values, for messages.
  std::string text(const ArgState& a) const {
    std::string out = layers ? a.flag_value("num_layers_per_virtual_pipeline_stage") : "";
    for (const char* dest : stages) out += (out.empty() ? "" : " and ") + a.flag_value(dest);
    return out;
  }
};

VirtualStageFlags virtual_stage_flags(const ArgState& a) {
  VirtualStageFlags f;
  f.layers = a.is_set("num_layers_per_virtual_pipeline_stage");
  for (const char* dest : {"virtual_pipeline_model_parallel_size", "num_virtual_stages_per_pipeline_rank"})
    if (a.is_set(dest)) f.stages.push_back(dest);
  return f;
}

// M-2 for each given value, and V-19 for two virtual-stages spellings that disagree. Returns
// false when a value is unusable (later checks would divide by it).
bool check_virtual_stage_values(const ArgState& a, const VirtualStageFlags& f, Diagnostics& d) {
  bool ok = true;
  std::vector<const char*> dests(f.stages);
  if (f.layers) dests.push_back("num_layers_per_virtual_pipeline_stage");
  for (const char* dest : dests) {
    if (a.i(dest) >= 1 && a.i(dest) <= kMaxParallelSize) continue;
    d.error("M-2", a.flag_value(dest) + " must be between 1 and " + num(kMaxParallelSize));
    ok = false;
  }
  if (ok && f.stages.size() == 2 && a.i(f.stages[0]) != a.i(f.stages[1])) {
    d.error("V-19", a.flag_value(f.stages[0]) + " and " + a.flag_value(f.stages[1]) +
                        " are two spellings of the virtual pipeline stages per rank and disagree; "
                        "give one of them, or the same value to both");
    ok = false;
  }
  return ok;
}

/// "; with `--virtual-pipeline-model-parallel-size 4`: 7": the pipeline sizes that also split
/// `L` layers into whole virtual stages (added to V-18's message when virtual stages are given).
std::string pipeline_sizes_for_virtual_stages(const ArgState& a, int64_t L) {
  const VirtualStageFlags f = virtual_stage_flags(a);
  if (!f.any() || L <= 0) return "";
  const int64_t n = f.layers ? a.i("num_layers_per_virtual_pipeline_stage") : 0;
  const int64_t v = f.stages.empty() ? 0 : a.i(f.stages[0]);
  if ((f.layers && n < 1) || (!f.stages.empty() && v < 1)) return "";  // M-2 reports it
  // A pipeline size p fits when each stage's L/p layers make whole chunks: n layers each, or
  // v chunks (both: exactly v chunks of n). V-19 also needs p > 1 (p > 2 without p2p overlap).
  std::vector<int64_t> divisors;
  for (int64_t q = 1; q * q <= L; ++q) {
    if (L % q != 0) continue;
    divisors.push_back(q);
    if (q != L / q) divisors.push_back(L / q);
  }
  std::sort(divisors.begin(), divisors.end());
  std::string sizes;
  for (int64_t p : divisors) {
    if (p < (a.b("overlap_p2p_comm") ? 2 : 3)) continue;
    const int64_t per_stage = L / p;
    const bool fits = (!f.layers || per_stage % n == 0) && (v == 0 || per_stage % v == 0) &&
                      (!f.layers || v == 0 || per_stage == n * v);
    if (fits) sizes += (sizes.empty() ? "" : ", ") + num(p);
  }
  return "; with " + f.text(a) + ": " + (sizes.empty() ? std::string("none") : sizes);
}

// V-19: the virtual stages per rank, from whichever spellings were given, for `per_stage` layers
// on each pipeline stage (`per_stage_text` says where that number comes from). 0 on error.
int64_t resolve_virtual_stages(const ArgState& a, const VirtualStageFlags& f, int64_t per_stage,
                               const std::string& per_stage_text, Diagnostics& d) {
  if (!check_virtual_stage_values(a, f, d)) return 0;
  const std::string where = "the " + num(per_stage) + " layers per pipeline stage (" +
                            per_stage_text + ")";
  int64_t from_layers = 0, from_stages = 0;
  if (f.layers) {
    const int64_t n = a.i("num_layers_per_virtual_pipeline_stage");
    if (per_stage % n != 0)
      d.error("V-19", a.flag_value("num_layers_per_virtual_pipeline_stage") + " does not divide " +
                          where + "; valid: " + divisors_text(per_stage));
    else
      from_layers = per_stage / n;
  }
  if (!f.stages.empty()) {
    const int64_t v = a.i(f.stages[0]);
    if (per_stage % v != 0)
      d.error("V-19", a.flag_value(f.stages[0]) + " does not divide " + where +
                          " into whole virtual stages; valid: " + divisors_text(per_stage));
    else
      from_stages = v;
  }
  if (!f.layers) return from_stages;
  if (f.stages.empty()) return from_layers;
  if (from_layers == 0 || from_stages == 0) return 0;  // reported above
  if (from_layers != from_stages) {
    const std::string stages_flag = a.flag(f.stages[0]);
    const std::string layers_flag = a.flag("num_layers_per_virtual_pipeline_stage");
    auto pair = [&](int64_t v) {
      return stages_flag.substr(0, stages_flag.size() - 1) + " " + num(v) + "` with " +
             layers_flag.substr(0, layers_flag.size() - 1) + " " + num(per_stage / v) + "`";
    };
    d.error("V-19", a.flag_value(f.stages[0]) + " disagrees with " +
                        a.flag_value("num_layers_per_virtual_pipeline_stage") + ": " + where +
                        " split into " + num(from_stages) + " virtual stages give " +
                        num(per_stage / from_stages) +
                        (per_stage / from_stages == 1 ? " layer" : " layers") +
                        " per virtual stage, not " + num(per_stage / from_layers) +
                        "; values that agree: " +
                        pair(from_layers) + ", or " + pair(from_stages) +
                        " (or give only one of the two flags)");
    return 0;
  }
  return from_stages;
}

}  // namespace

void check_pipeline(ArgState& a, Ctx& c, Diagnostics& d) {
  if (!c.sizes_ok) return;
  const bool standalone = a.b("standalone_embedding_stage");
  c.transformer_pp = standalone ? c.pp - 1 : c.pp;
  if (c.transformer_pp < 1) {
    d.error("V-7", "`--standalone-embedding-stage` needs " +
                       a.flag_value("pipeline_model_parallel_size") + " > 1");
    c.transformer_pp = 1;
  }
  a.set("transformer_pipeline_model_parallel_size", c.transformer_pp);
  const bool first = a.is_set("decoder_first_pipeline_num_layers");
  const bool last = a.is_set("decoder_last_pipeline_num_layers");
  // Upstream's account-for flags count the embedding / loss as one layer each.
  const int64_t extra = (a.b("account_for_embedding_in_pipeline_split") ? 1 : 0) +
                        (a.b("account_for_loss_in_pipeline_split") ? 1 : 0);
  const int64_t L = c.num_layers + extra;
  const std::string layers_text =
      extra == 0 ? a.flag_value("num_layers")
                 : a.flag_value("num_layers") + " + " + num(extra) + " (account-for flags)";
  if (!first && !last) {
    // V-18
    if (c.num_layers > 0 && L % c.transformer_pp != 0)
      d.error("V-18", layers_text + " is not divisible by " +
                          a.flag_value("pipeline_model_parallel_size") +
                          (standalone ? " − 1 (standalone embedding stage)" : "") +
                          "; valid pipeline sizes: " + divisors_text(L) +
                          (standalone ? " (plus one)" : "") + pipeline_sizes_for_virtual_stages(a, L));
  } else if (c.num_layers > 0) {
    // uneven split.
    const int64_t f = a.i("decoder_first_pipeline_num_layers");
    const int64_t l = a.i("decoder_last_pipeline_num_layers");
    if ((first && f < 1) || (last && l < 1))
      d.error("R-3", "the first/last pipeline stage must hold at least one layer (" +
                         (first ? a.flag_value("decoder_first_pipeline_num_layers") : "") +
                         (first && last ? ", " : "") +
                         (last ? a.flag_value("decoder_last_pipeline_num_layers") : "") + ")");
    if (c.pp < 2) {
      d.error("R-3", "uneven pipeline splits need " + a.flag_value("pipeline_model_parallel_size") +
                         " >= 2");
    } else {
      const int64_t rest_layers = L - (first ? f : 0) - (last ? l : 0);
      const int64_t rest_stages = c.pp - (first ? 1 : 0) - (last ? 1 : 0);
      if (rest_layers < 0 || (rest_stages == 0 && rest_layers != 0) ||
          (rest_stages > 0 && rest_layers % rest_stages != 0))
        d.error("R-3", "uneven pipeline split: " + layers_text + " minus the first/last stage "
                       "layers leaves " + num(rest_layers) + " layers for the " + num(rest_stages) +
                       " middle stages of " + a.flag_value("pipeline_model_parallel_size") +
                       "; they must divide evenly");
    }
  }
  // V-19 / G-2: interleaved schedule, sized by layers per virtual stage or by virtual stages
  // per rank (see resolve_virtual_stages).
  const VirtualStageFlags vflags = virtual_stage_flags(a);
  const bool overlap_p2p = a.b("overlap_p2p_comm");
  if (vflags.any()) {
    const std::string nv = vflags.text(a);
    if (overlap_p2p && c.pp <= 1)
      d.error("V-19, G-2", nv + " needs " + a.flag_value("pipeline_model_parallel_size") + " > 1");
    if (!overlap_p2p && c.pp <= 2)
      d.error("V-19", nv + " with `--no-overlap-p2p-communication` needs " +
                          a.flag_value("pipeline_model_parallel_size") + " > 2");
    if (first || last)
      d.error("R-3", nv + " cannot be combined with an uneven pipeline split "
                     "(`--decoder-first/last-pipeline-num-layers`)");
    if (c.num_layers > 0 && L % c.transformer_pp == 0)
      c.vpp = resolve_virtual_stages(a, vflags, L / c.transformer_pp,
                                     layers_text + " / " + a.flag_value("pipeline_model_parallel_size"), d);
    else
      check_virtual_stage_values(a, vflags, d);
  } else {
    // V-20: without virtual stages there is nothing to overlap or align.
    a.set("overlap_p2p_comm", false);
    a.set("align_param_gather", false);
  }
  a.set("virtual_pipeline_model_parallel_size", c.vpp > 0 ? FlagValue(c.vpp) : FlagValue());
  a.set("batch_p2p_comm", !a.b("overlap_p2p_comm"));
  // C-6
  if (!a.is_set("microbatch_group_size_per_vp_stage")) a.set("microbatch_group_size_per_vp_stage", c.pp);
  if (a.i("microbatch_group_size_per_vp_stage") < 1)
    d.error("M-2", a.flag_value("microbatch_group_size_per_vp_stage") + " must be >= 1");
  // C-7
  if (a.b("overlap_p2p_communication_warmup_flush") &&
      !(a.b("overlap_p2p_comm") && !a.b("batch_p2p_comm")))
    d.error("C-7", "`--overlap-p2p-communication-warmup-flush` needs overlapped pipeline p2p "
                   "(virtual pipeline stages without `--no-overlap-p2p-communication`)");
}

// --------------------------------------------------------------- batch sizes (V-17, B-1…B-3, R-1)

void check_batch(ArgState& a, Ctx& c, Diagnostics& d) {
  // V-17
  if (!a.is_set("micro_batch_size")) {
    d.error("V-17", "`--micro-batch-size` is required");
    return;
  }
  const int64_t mbs = a.i("micro_batch_size");
  if (mbs < 1) {
    d.error("V-17", a.flag_value("micro_batch_size") + " must be > 0");
    return;
  }
  if (mbs > INT_MAX) {
    d.error("M-2", a.flag_value("micro_batch_size") + " must be at most " + num(int64_t{INT_MAX}));
    return;
  }
  if (!c.dense_ok) return;
  const int64_t per_step = mbs * c.dp;
  if (!a.is_set("global_batch_size")) a.set("global_batch_size", per_step);
  int64_t gbs = a.i("global_batch_size");
  if (gbs < 1) {
    d.error("V-17", a.flag_value("global_batch_size") + " must be > 0");
    return;
  }
  if (gbs > INT_MAX) {
    d.error("M-2", a.flag_value("global_batch_size") + " must be at most " + num(int64_t{INT_MAX}));
    return;
  }
  // B-2 / B-3: batch-size ramp-up.
  if (a.is_set("rampup_batch_size")) {
    const std::vector<std::string> r = a.strings("rampup_batch_size");
    int64_t v[3] = {0, 0, 0};
    bool ok = r.size() == 3;
    for (size_t i = 0; ok && i < 3; ++i) {
      char* end = nullptr;
      v[i] = std::strtoll(r[i].c_str(), &end, 10);
      ok = !r[i].empty() && *end == '\0';
    }
    const std::string rv = a.flag_value("rampup_batch_size");
    if (!ok) {
      d.error("B-2", rv + ": expected three integers: start-batch-size batch-size-increment "
                          "ramp-up-samples");
    } else if (v[0] <= 0 || v[1] <= 0 || v[2] < 0 || gbs < v[0] || (gbs - v[0]) % v[1] != 0) {
      d.error("B-2", rv + ": need start > 0, increment > 0, ramp-up samples >= 0, start <= " +
                          a.flag_value("global_batch_size") + " and (global − start) divisible by "
                          "the increment");
    } else {
      // The ramp visits start, start + increment, …, global; the first one that is not a whole
      // number of micro-batches per rank is the start or the first increment.
      const int64_t bad = v[0] % per_step != 0                             ? v[0]
                          : (v[1] % per_step != 0 && gbs - v[0] >= v[1]) ? v[0] + v[1]
                                                                         : 0;
      if (bad != 0)
        d.error("B-3", rv + " reaches a global batch of " + num(bad) + ", not divisible by " +
                           a.flag_value("micro_batch_size") + " × data-parallel size " + num(c.dp) +
                           " = " + num(per_step));
    }
  }
  // B-1: whole micro-batches on every data-parallel rank.
  if (gbs % per_step != 0) {
    if (a.b("decrease_batch_size_if_needed") && gbs >= per_step) {
      gbs = gbs / per_step * per_step;
      d.warn(a.flag_value("global_batch_size") + " rounded down to " + num(gbs) +
             " (`--decrease-batch-size-if-needed`)");
      a.set("global_batch_size", gbs);
    } else {
      d.error("B-1", a.flag_value("global_batch_size") + " is not divisible by " +
                         a.flag_value("micro_batch_size") + " × data-parallel size " + num(c.dp) +
                         " = " + num(per_step) + "; valid: multiples of " + num(per_step) +
                         (a.b("decrease_batch_size_if_needed")
                              ? ""
                              : ", or pass `--decrease-batch-size-if-needed` to round down"));
      return;
    }
  }
  c.num_micro = gbs / per_step;
  a.set("num_micro_batches", c.num_micro);
  // interleaved schedule needs pp <= N <= M and M % N == 0 or M % N >= pp.
  if (c.vpp > 0) {
    const int64_t N = a.i("microbatch_group_size_per_vp_stage");
    const int64_t M = c.num_micro;
    if (N >= 1 && !(c.pp <= N && N <= M && (M % N == 0 || M % N >= c.pp)))
      d.error("R-1", "the interleaved pipeline schedule runs M = " + num(M) +
                         " micro-batches (global batch " + num(gbs) + " / (" +
                         a.flag_value("micro_batch_size") + " × dp " + num(c.dp) +
                         ")) in groups of N = " + num(N) +
                         " (`--microbatch-group-size-per-virtual-pipeline-stage`, default pp); it "
                         "needs pp (" + num(c.pp) + ") <= N <= M and M % N == 0 or M % N >= pp; "
                         "valid global batches for N = pp: multiples of " + num(per_step * c.pp));
  }
}

// ---------------------------------------------------- recompute (V-13, V-42, V-43, C-15)

void check_recompute(ArgState& a, Ctx& c, Diagnostics& d) {
  if (a.b("recompute_activations")) a.set("recompute_granularity", std::string("selective"));
  const std::string gran = a.s("recompute_granularity");
  const std::string method = a.s("recompute_method");
  if (gran == "full" && (method.empty() || !a.is_set("recompute_num_layers")))
    d.error("C-15", "`--recompute-granularity full` needs `--recompute-method` (uniform or block) "
                    "and `--recompute-num-layers`");
  if (gran == "selective" && a.is_set("recompute_num_layers"))
    d.error("C-15", "selective recomputation takes no " + a.flag_value("recompute_num_layers"));
  if (gran == "selective" && !method.empty())
    d.error("V-43", "selective recomputation takes no " + a.flag_value("recompute_method"));
  if (a.was_given("recompute_modules") && gran != "selective")
    d.error("M-33", a.flag_value("recompute_modules") + " chooses what selective recomputation "
                    "re-runs: it needs `--recompute-granularity selective` (or "
                    "`--recompute-activations`)");
  if (a.b("distribute_saved_activations")) {
    if (a.b("sequence_parallel"))
      d.error("C-15", "`--distribute-saved-activations` cannot be combined with `--sequence-parallel`");
    if (c.tp <= 1 || gran != "full" || method.empty())
      d.error("V-42", "`--distribute-saved-activations` needs " +
                          a.flag_value("tensor_model_parallel_size") + " > 1, "
                          "`--recompute-granularity full` and `--recompute-method`");
  }
  if (!gran.empty() && c.vpp > 0 && c.num_layers > 0 && c.num_layers % c.vpp != 0)
    d.error("C-15", a.flag_value("num_layers") + " is not divisible by the " + num(c.vpp) +
                        " virtual pipeline stages");
}

// ----------------------------------------- data parallel, FSDP and optimizer (V-21…V-23, F-*, G-*)

void check_data_parallel(ArgState& a, Ctx& c, Diagnostics& d) {
  // FSDP (docs/parallelism/fsdp.md): --use-custom-fsdp / --use-megatron-fsdp with
  // --data-parallel-sharding-strategy, or --use-torch-fsdp2 = full sharding under FSDP2's rules.
  // The sharding strategies imply the distributed optimizer (Megatron-FSDP v1 forces it);
  // no_shard is plain DDP.
  const ShardingStrategy strategy =
      enum_flag(a, "data_parallel_sharding_strategy", ShardingStrategy::OptimGradsParams);
  const bool megatron_fsdp = a.b("use_custom_fsdp");
  const bool torch_fsdp2 = a.b("use_torch_fsdp2");
  const bool fsdp = megatron_fsdp || torch_fsdp2;
  const bool sharding = torch_fsdp2 || (megatron_fsdp && strategy != ShardingStrategy::NoShard);
  if (!fsdp && a.was_given("data_parallel_sharding_strategy"))
    d.warn(a.flag_value("data_parallel_sharding_strategy") +
              " has effect only with `--use-custom-fsdp` (`--use-megatron-fsdp`); without it use "
              "`--use-distributed-optimizer`");
  if (torch_fsdp2 && !megatron_fsdp && a.was_given("data_parallel_sharding_strategy"))
    d.warn(a.flag_value("data_parallel_sharding_strategy") +
           " has no effect with `--use-torch-fsdp2`, which always shards weights, gradients and "
           "optimizer state (optim_grads_params)");
  // F-13
  if (megatron_fsdp && torch_fsdp2)
    d.error("F-13", "`--use-torch-fsdp2` and `--use-megatron-fsdp` (`--use-custom-fsdp`) choose two "
                    "FSDP wrappers; pass one of them");
  if (megatron_fsdp && strategy == ShardingStrategy::NoShard && a.b("use_distributed_optimizer"))
    d.warn("`--use-distributed-optimizer` has no effect with `--use-megatron-fsdp "
           "--data-parallel-sharding-strategy no_shard` (plain DDP); use `optim` to shard the "
           "optimizer state");
  else if (megatron_fsdp && a.b("use_distributed_optimizer"))
    d.warn("`--use-distributed-optimizer` is implied by `--use-megatron-fsdp` with " +
           a.flag_value("data_parallel_sharding_strategy"));
  const bool dist_opt = a.b("use_distributed_optimizer") || sharding;
  // V-21 / F-1: only where weights are gathered, and with bucketed gradient reduction.
  if (a.b("overlap_param_gather") && (!dist_opt || !a.b("overlap_grad_reduce")))
    d.error("V-21", "`--overlap-param-gather` needs `--use-distributed-optimizer` (or a sharding "
                    "`--use-megatron-fsdp` strategy) and `--overlap-grad-reduce`");
  if (a.b("overlap_param_gather") && a.b("use_legacy_models"))
    d.error("V-21", "`--overlap-param-gather` is not available with `--use-legacy-models`");
  // V-22 / F-2: FSDP2 supports neither PP nor EP nor a second optimizer sharding.
  if (torch_fsdp2) {
    std::vector<std::string> bad;
    if (c.pp != 1) bad.push_back(a.flag_value("pipeline_model_parallel_size"));
    if (c.ep != 1) bad.push_back(a.flag_value("expert_model_parallel_size"));
    if (a.b("use_distributed_optimizer")) bad.push_back("`--use-distributed-optimizer`");
    if (a.b("gradient_accumulation_fusion")) bad.push_back("gradient accumulation fusion (pass "
                                                           "`--no-gradient-accumulation-fusion`)");
    const std::string fmt = a.s("ckpt_format");
    if (fmt != "torch_dist" && fmt != "torch_dcp") bad.push_back(a.flag_value("ckpt_format") + " (valid: torch_dist, torch_dcp)");
    if (!a.b("untie_embeddings_and_output_weights"))
      bad.push_back("tied embeddings (pass `--untie-embeddings-and-output-weights`)");
    if (a.b("fp16")) bad.push_back("`--fp16`");
    for (const std::string& b : bad) d.error("V-22", "`--use-torch-fsdp2` cannot be used with " + b);
  }
  // F-8 (megadlm): both FSDP formats upstream name our native, layout-independent format; a
  // Megatron-FSDP format without Megatron-FSDP is what upstream rejects.
  if (a.s("ckpt_format") == "fsdp_dtensor" && !megatron_fsdp)
    d.error("F-8", a.flag_value("ckpt_format") + " is Megatron-FSDP's format: it needs `--use-megatron-fsdp`");
  if (a.s("ckpt_format") == "torch_dcp" && !torch_fsdp2)
    d.error("F-8", a.flag_value("ckpt_format") + " is FSDP2's format: it needs `--use-torch-fsdp2`");
  // F-7: the weights are not replicated any more.
  if (sharding && (torch_fsdp2 || strategy == ShardingStrategy::OptimGradsParams) &&
      a.is_set("check_weight_hash_across_dp_replicas_interval"))
    d.error("F-7", a.flag_value("check_weight_hash_across_dp_replicas_interval") + " needs "
                   "replicated weights; `optim_grads_params` shards them over the data-parallel ranks");
  // F-10: nothing to shard at initialisation.
  if (a.b("init_model_with_meta_device") && !sharding)
    d.error("F-10", "`--init-model-with-meta-device` needs a sharding FSDP strategy (`--use-megatron-fsdp` "
                    "with optim, optim_grads or optim_grads_params)");
  // V-23
  if (a.b("overlap_param_gather_with_optimizer_step") &&
      (!dist_opt || !a.b("overlap_param_gather") || c.vpp == 0 || a.s("ckpt_format") != "torch"))
    d.error("V-23", "`--overlap-param-gather-with-optimizer-step` needs "
                    "`--use-distributed-optimizer`, `--overlap-param-gather`, virtual pipeline "
                    "stages and `--ckpt-format torch`");
  // V-25
  if (a.b("fp8_param_gather") && !dist_opt)
    d.error("V-25", "`--fp8-param-gather` needs `--use-distributed-optimizer`");
  // G-5, G-7, G-8: distributed-optimizer instances (with the upstream dp·cp fix, docs/compat.md).
  const int64_t inst = a.i("num_distributed_optimizer_instances");
  if (inst < 1) {
    d.error("M-2", a.flag_value("num_distributed_optimizer_instances") + " must be >= 1");
  } else {
    if (c.dense_ok && (c.dp * c.cp) % inst != 0)
      d.error("G-5", a.flag_value("num_distributed_optimizer_instances") + " does not divide "
                         "dp·cp = " + num(c.dp) + "·" + num(c.cp) + " = " + num(c.dp * c.cp) +
                         "; valid: " + divisors_text(c.dp * c.cp));
    if (inst > 1 && !dist_opt)
      d.error("G-7", a.flag_value("num_distributed_optimizer_instances") +
                         " needs `--use-distributed-optimizer`");
  }
  // Several instances under FSDP is hybrid FSDP (HSDP): not built yet.
  if (inst > 1 && fsdp)
    d.unsupported(a.flag_value("num_distributed_optimizer_instances") +
                  " with FSDP: hybrid sharding (HSDP) is not supported yet by megadlm; FSDP shards "
                  "over the whole dp×cp group");
  if (dist_opt && a.s("optimizer") != "adam")
    d.error("G-8", "`--use-distributed-optimizer` needs `--optimizer adam` (got " +
                       a.flag_value("optimizer") + ")");
  if (a.is_set("ddp_bucket_size") && a.i("ddp_bucket_size") < 1)
    d.error("M-2", a.flag_value("ddp_bucket_size") + " must be >= 1");
  if (a.i("distributed_timeout_minutes") < 1)
    d.error("M-2", a.flag_value("distributed_timeout_minutes") + " must be >= 1");
  // C-4
  if (a.b("defer_embedding_wgrad_compute") &&
      (c.pp <= 1 || !a.b("gradient_accumulation_fusion") || a.i("wgrad_deferral_limit") < 0))
    d.error("C-4", "`--defer-embedding-wgrad-compute` needs " +
                       a.flag_value("pipeline_model_parallel_size") + " > 1, gradient "
                       "accumulation fusion and `--wgrad-deferral-limit` >= 0");
}

// ------------------------------------------ parallel features that validate but do not run yet
//
// The dry-run / real-run split: everything here is a *valid* layout that this build cannot train
// yet. Each item goes to Diagnostics::not_supported, which `--dry-run` reports next to the printed
// layout (exit 0) and a real run refuses (parse_arguments throws ConfigError). Rule violations go
// to Diagnostics::errors instead and refuse both. When a dimension lands (the CP, EP and FSDP
// issues), its row goes from here.

void check_support(ArgState& a, Ctx& c, Diagnostics& d) {
  // Every parallel dimension and FSDP strategy of a layout that validates now runs (HSDP is
  // reported by check_data_parallel).
  (void)a;
  (void)c;
  (void)d;
}

}  // namespace megadlm::training::detail
