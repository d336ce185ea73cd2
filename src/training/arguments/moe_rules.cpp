// The mixture-of-experts flags (docs/rules.md: V-49, V-51, C-5, C-11…C-19, R-4,
// ) and megadlm's own MoE rules:
//   MOE-1 --moe-router-topk within [1, --num-experts]
//   MOE-3 group-limited routing: groups divide the experts and can hold the top-k
//   MOE-5 the expert bias needs top-k routing and a positive update rate
//   MOE-6 expert choice takes post-softmax scores only (no pre-softmax, scaling, device limit)
//   MOE-7 --moe-layer-freq parses, has --num-layers entries and selects an MoE layer
// and the typed MoeConfig built from them. Not rules here: R-9 (megadlm's per-expert GEMMs take
// any expert width) and R-12 (seq_aux_loss sums its per-sequence counts over TP and CP).
#include <algorithm>
#include <cctype>
#include <cmath>
#include "training/arguments/rules_common.h"

namespace megadlm::training::detail {

namespace {

// A tiny parser for the Python list expressions Megatron evaluates for --moe-layer-freq:
//   expr := term ('+' term)* ;  term := atom ('*' int)* ;  atom := '[' ints ']' | '(' expr ')'
class PatternParser {
 public:
  explicit PatternParser(const std::string& text) : s_(text) {}

  bool parse(std::vector<int64_t>& out, std::string& error) {
    if (!expr(out, error)) return false;
    skip();
    if (pos_ != s_.size()) return fail(error, "unexpected '" + s_.substr(pos_, 1) + "'");
    return true;
  }

 private:
  void skip() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  bool eat(char c) {
    skip();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool fail(std::string& error, const std::string& what) {
    error = what + " at position " + std::to_string(pos_);
    return false;
  }
  bool integer(int64_t& v, std::string& error) {
    skip();
    const size_t start = pos_;
    while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    if (start == pos_) return fail(error, "expected a number");
    if (pos_ - start > 6) return fail(error, "number too large");
    v = std::stoll(s_.substr(start, pos_ - start));
    return true;
  }
  bool atom(std::vector<int64_t>& out, std::string& error) {
    if (eat('[')) {
      if (eat(']')) return true;
      do {
        int64_t v = 0;
        if (!integer(v, error)) return false;
        out.push_back(v);
      } while (eat(','));
      return eat(']') || fail(error, "expected ']'");
    }
    if (eat('(')) {
      if (!expr(out, error)) return false;
      return eat(')') || fail(error, "expected ')'");
    }
    return fail(error, "expected '[' or '('");
  }
  bool term(std::vector<int64_t>& out, std::string& error) {
    std::vector<int64_t> v;
    if (!atom(v, error)) return false;
    while (eat('*')) {
      int64_t n = 0;
      if (!integer(n, error)) return false;
      if (static_cast<int64_t>(v.size()) * n > 100000) return fail(error, "pattern too long");
      std::vector<int64_t> rep;
      for (int64_t i = 0; i < n; ++i) rep.insert(rep.end(), v.begin(), v.end());
      v = std::move(rep);
    }
    out.insert(out.end(), v.begin(), v.end());
    return true;
  }
  bool expr(std::vector<int64_t>& out, std::string& error) {
    if (!term(out, error)) return false;
    while (eat('+'))
      if (!term(out, error)) return false;
    return true;
  }

  const std::string& s_;
  size_t pos_ = 0;
};

}  // namespace

std::vector<bool> parse_moe_layer_freq(const std::string& text, int64_t num_layers, std::string& error) {
  error.clear();
  std::vector<bool> out;
  const std::string t = text;
  const bool all_digits = !t.empty() && t.find_first_not_of("0123456789") == std::string::npos;
  if (all_digits) {
    const int64_t n = t.size() > 6 ? 0 : std::stoll(t);
    if (n < 1) {
      error = "an integer frequency must be >= 1";
      return {};
    }
    for (int64_t i = 0; i < num_layers; ++i) out.push_back(i % n == 0);
    return out;
  }
  std::vector<int64_t> values;
  if (!PatternParser(t).parse(values, error)) return {};
  for (int64_t v : values) {
    if (v != 0 && v != 1) {
      error = "pattern entries must be 0 or 1, got " + std::to_string(v);
      return {};
    }
    out.push_back(v == 1);
  }
  if (static_cast<int64_t>(out.size()) != num_layers) {
    error = "the pattern has " + std::to_string(out.size()) + " entries for " +
            std::to_string(num_layers) + " layers";
    return {};
  }
  return out;
}

void check_moe(ArgState& a, Ctx& c, Diagnostics& d) {
  if (a.is_set("num_experts") && a.i("num_experts") == 0) a.set("num_experts", FlagValue());
  const bool moe = a.is_set("num_experts");
  if (moe && a.i("num_experts") < 0)
    d.error("C-11", a.flag_value("num_experts") + " must be > 0");
  if (moe && !a.strings("spec").empty())
    d.error("V-49", "`--spec` cannot be combined with " + a.flag_value("num_experts"));
  if (!a.is_set("moe_ffn_hidden_size") && c.ffn > 0) a.set("moe_ffn_hidden_size", c.ffn);
  if (a.is_set("moe_expert_capacity_factor") && a.f("moe_expert_capacity_factor") < 0)
    a.set("moe_expert_capacity_factor", FlagValue());
  if (!c.sizes_ok) return;
  // V-51 / C-11
  if (c.ep > 1) {
    if (!moe)
      d.error("V-51, C-11", a.flag_value("expert_model_parallel_size") +
                                " needs `--num-experts` (a multiple of " + num(c.ep) +
                                ", so that the EP ranks hold equal shares of the experts)");
    else if (a.i("num_experts") % c.ep != 0)
      d.error("V-51", a.flag_value("expert_model_parallel_size") + " does not divide " +
                          a.flag_value("num_experts") + "; valid: " +
                          divisors_text(a.i("num_experts")));
    if (a.b("fp16")) d.error("V-51", a.flag_value("expert_model_parallel_size") + " does not support `--fp16`");
  }
  // C-5 / R-8: tokens enter the MoE layer sequence-parallel when TP > 1.
  if (c.tp > 1 && !a.b("sequence_parallel") && (c.ep > 1 || moe))
    d.error(c.ep > 1 ? "C-5" : "R-8",
            std::string(c.ep > 1 ? a.flag_value("expert_model_parallel_size") : a.flag_value("num_experts")) +
                " with " + a.flag_value("tensor_model_parallel_size") +
                " needs `--sequence-parallel`");
  const std::string dispatcher = a.s("moe_token_dispatcher_type");
  // C-12
  if (a.is_set("moe_shared_expert_intermediate_size") && a.i("moe_shared_expert_intermediate_size") <= 0)
    d.error("C-12", a.flag_value("moe_shared_expert_intermediate_size") + " must be > 0");
  if (a.b("moe_shared_expert_overlap") && dispatcher != "alltoall")
    d.error("C-12", "`--moe-shared-expert-overlap` needs `--moe-token-dispatcher-type alltoall`");
  const std::string lb = a.s("moe_router_load_balancing_type");
  // C-13 / C-14
  if (a.is_set("moe_expert_capacity_factor")) {
    if (dispatcher != "alltoall" && dispatcher != "alltoall_seq")
      d.error("C-13", a.flag_value("moe_expert_capacity_factor") + " (token dropping) needs "
                      "`--moe-token-dispatcher-type alltoall` or `alltoall_seq`");
    if (lb != "aux_loss" && lb != "seq_aux_loss" && lb != "none")
      d.error("C-13", a.flag_value("moe_expert_capacity_factor") + " needs load balancing "
                      "aux_loss, seq_aux_loss or none (got " +
                      a.flag_value("moe_router_load_balancing_type") + ")");
  } else if (a.b("moe_pad_expert_input_to_capacity")) {
    d.error("C-14", "`--moe-pad-expert-input-to-capacity` needs `--moe-expert-capacity-factor`");
  }
  // C-18
  if (dispatcher == "alltoall_seq" && c.tp != c.etp)
    d.error("C-18", "`--moe-token-dispatcher-type alltoall_seq` needs " +
                        a.flag_value("expert_tensor_parallel_size") + " equal to " +
                        a.flag_value("tensor_model_parallel_size"));
  // C-19
  if (a.is_set("moe_router_topk_limited_devices") && a.i("moe_router_topk_limited_devices") > c.ep)
    d.error("C-19", a.flag_value("moe_router_topk_limited_devices") + " exceeds " +
                        a.flag_value("expert_model_parallel_size") + "; valid: 1 to " + num(c.ep));
  // expert MLP width split over expert TP.
  if (moe && a.i("moe_ffn_hidden_size") > 0 && a.i("moe_ffn_hidden_size") % c.etp != 0)
    d.error("R-4", a.flag_value("expert_tensor_parallel_size") + " does not divide " +
                       (a.was_given("moe_ffn_hidden_size") ? a.flag_value("moe_ffn_hidden_size")
                                                           : "the expert MLP width " + num(a.i("moe_ffn_hidden_size"))) +
                       "; valid: " + divisors_text(a.i("moe_ffn_hidden_size")));
  if (!moe) return;

  const int64_t experts = a.i("num_experts"), k = a.i("moe_router_topk");
  const bool expert_choice = lb == "softmax_expert_choice" || lb == "sinkhorn_expert_choice";
  // MOE-1, R-10
  if (experts > 0 && (k < 1 || k > experts))
    d.error("MOE-1", a.flag_value("moe_router_topk") + " must lie in [1, " + num(experts) +
                         "] (" + a.flag_value("num_experts") + ")");
  if (k == 1 && !a.b("moe_router_pre_softmax") && a.s("moe_router_score_function") == "softmax" &&
      lb != "sinkhorn" && !expert_choice)
    d.error("R-10", "`--moe-router-topk 1` needs `--moe-router-pre-softmax` (a softmax over one "
                     "selected expert is constant and trains nothing)");
  // MOE-3: group-limited routing.
  const bool groups = a.is_set("moe_router_num_groups") || a.is_set("moe_router_group_topk");
  if (groups) {
    const int64_t g = a.i("moe_router_num_groups"), gk = a.i("moe_router_group_topk");
    if (!a.is_set("moe_router_num_groups") || !a.is_set("moe_router_group_topk"))
      d.error("MOE-3", "group-limited routing needs both `--moe-router-num-groups` and "
                       "`--moe-router-group-topk`");
    else if (g < 1 || experts % g != 0)
      d.error("MOE-3", a.flag_value("moe_router_num_groups") + " does not divide " +
                           a.flag_value("num_experts") + "; valid: " + divisors_text(experts));
    else if (gk < 1 || gk > g)
      d.error("MOE-3", a.flag_value("moe_router_group_topk") + " must lie in [1, " + num(g) + "]");
    else if (k > gk * (experts / g))
      d.error("MOE-3", a.flag_value("moe_router_group_topk") + " groups of " + num(experts / g) +
                           " experts cannot hold " + a.flag_value("moe_router_topk"));
    if (a.is_set("moe_router_topk_limited_devices"))
      d.error("MOE-3", "give only one of `--moe-router-num-groups` and "
                       "`--moe-router-topk-limited-devices`");
  }
  if (a.is_set("moe_router_topk_limited_devices") && a.i("moe_router_topk_limited_devices") < 1)
    d.error("C-19", a.flag_value("moe_router_topk_limited_devices") + " must be >= 1");
  //
  if (lb == "sinkhorn" && a.f("moe_aux_loss_coeff") != 0.0)
    d.error("R-11", "`--moe-router-load-balancing-type sinkhorn` balances without an aux loss; "
                     "remove " + a.flag_value("moe_aux_loss_coeff"));
  // MOE-5
  if (a.b("moe_router_enable_expert_bias")) {
    if (lb == "sinkhorn" || expert_choice)
      d.error("MOE-5", "`--moe-router-enable-expert-bias` needs top-k routing, not " +
                           a.flag_value("moe_router_load_balancing_type"));
    if (a.f("moe_router_bias_update_rate") <= 0)
      d.error("MOE-5", a.flag_value("moe_router_bias_update_rate") + " must be > 0");
  }
  // MOE-6
  if (expert_choice) {
    for (const char* dest : {"moe_router_pre_softmax"})
      if (a.b(dest)) d.error("MOE-6", "expert choice takes post-softmax scores; remove `--moe-router-pre-softmax`");
    for (const char* dest : {"moe_router_topk_scaling_factor", "moe_router_topk_limited_devices",
                             "moe_router_num_groups"})
      if (a.is_set(dest))
        d.error("MOE-6", a.flag_value(dest) + " does not apply to expert choice (" +
                             a.flag_value("moe_router_load_balancing_type") + ")");
  }
  // MOE-7
  if (c.num_layers > 0) {
    std::string error;
    const std::vector<bool> pattern = parse_moe_layer_freq(a.s("moe_layer_freq"), c.num_layers, error);
    if (!error.empty())
      d.error("MOE-7", a.flag_value("moe_layer_freq") + ": " + error +
                           " (valid: an integer N >= 1, or a list of " + num(c.num_layers) +
                           " zeros and ones such as \"[1]*" + num(c.num_layers) + "\")");
    else if (std::find(pattern.begin(), pattern.end(), true) == pattern.end())
      d.error("MOE-7", a.flag_value("moe_layer_freq") + " selects no MoE layer; drop " +
                           a.flag_value("num_experts") + " for a dense model");
  }
  // What a layout cannot run yet with experts.
  if (c.cp > 1 && (expert_choice || lb == "seq_aux_loss" || a.is_set("moe_expert_capacity_factor")))
    d.unsupported(a.flag_value("context_parallel_size") + " with " +
                  (a.is_set("moe_expert_capacity_factor") ? a.flag_value("moe_expert_capacity_factor")
                                                          : a.flag_value("moe_router_load_balancing_type")) +
                  ": routing across a sequence split over CP is not supported yet by megadlm");
  if (a.i("num_distributed_optimizer_instances") > 1)
    d.unsupported(a.flag_value("num_distributed_optimizer_instances") + " with " +
                  a.flag_value("num_experts") +
                  ": expert parameters in several distributed-optimizer instances are not "
                  "supported yet by megadlm");
}

}  // namespace megadlm::training::detail
