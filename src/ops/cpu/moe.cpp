// CPU reference for the MoE family (include/megadlm/ops/moe.h): plain loops in double over f32
// or f64 tensors, written to be read next to Megatron-Core's MoE code (router, permutation,
// experts).
//   softmax scores  s_e = exp(l_e - lse),   lse = log sum_e exp(l_e)
//   sigmoid scores  s_e = 1 / (1 + exp(-l_e))
//   post-softmax probs over the selected set S:  q_j = exp(l_j) / sum_{m in S} exp(l_m)
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>
#include "ops/cpu/cpu_common.h"
#include "ops/cpu/cpu_ops.h"

namespace megadlm::ops::cpu {

namespace {

using detail::FloatAccess;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();
constexpr double kSigmoidEps = 1e-20;  // Megatron's guard of the sigmoid normaliser

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

/// Softmax of one row (n values) into s; returns the log-sum-exp.
double softmax_row(const FloatAccess& l, int64_t base, int64_t n, std::vector<double>& s) {
  double m = kNegInf;
  for (int64_t e = 0; e < n; ++e) m = std::max(m, l.get(base + e));
  double z = 0;
  for (int64_t e = 0; e < n; ++e) z += std::exp(l.get(base + e) - m);
  const double lse = m + std::log(z);
  s.resize(static_cast<size_t>(n));
  for (int64_t e = 0; e < n; ++e) s[static_cast<size_t>(e)] = std::exp(l.get(base + e) - lse);
  return lse;
}

/// Indices of the k largest values, in descending order (ties to the lower index).
std::vector<int> top_indices(const std::vector<double>& v, int k) {
  std::vector<int> order(v.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return v[static_cast<size_t>(a)] > v[static_cast<size_t>(b)]; });
  order.resize(static_cast<size_t>(k));
  return order;
}

/// Sinkhorn normalisation of exp(logits) (Megatron's sinkhorn(), tolerance 1e-4): returns the
/// normalised [T, E] matrix used for the selection only.
std::vector<double> sinkhorn(const FloatAccess& l, int64_t rows, int64_t experts) {
  std::vector<double> cost(static_cast<size_t>(rows * experts));
  for (int64_t i = 0; i < rows * experts; ++i) cost[static_cast<size_t>(i)] = std::exp(l.get(i));
  std::vector<double> d0(static_cast<size_t>(rows), 1.0), d1(static_cast<size_t>(experts), 1.0);
  const double eps = 1e-8, tol = 1e-4;
  for (int iter = 0; iter < 10000; ++iter) {
    for (int64_t t = 0; t < rows; ++t) {
      double s = 0;
      for (int64_t e = 0; e < experts; ++e) s += d1[static_cast<size_t>(e)] * cost[static_cast<size_t>(t * experts + e)];
      d0[static_cast<size_t>(t)] = (1.0 / static_cast<double>(rows)) / (s + eps);
    }
    double err = 0;
    for (int64_t e = 0; e < experts; ++e) {
      double s = 0;
      for (int64_t t = 0; t < rows; ++t) s += d0[static_cast<size_t>(t)] * cost[static_cast<size_t>(t * experts + e)];
      const double next = (1.0 / static_cast<double>(experts)) / (s + eps);
      err += std::fabs(d1[static_cast<size_t>(e)] - next);
      d1[static_cast<size_t>(e)] = next;
    }
    if (err / static_cast<double>(experts) <= tol) break;
  }
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t e = 0; e < experts; ++e)
      cost[static_cast<size_t>(t * experts + e)] *= d1[static_cast<size_t>(e)] * d0[static_cast<size_t>(t)];
  return cost;
}

/// Masks (to -inf) the experts outside the best `group_topk` of `num_groups` groups.
void limit_groups(std::vector<double>& sel, const RouterTopkArgs& a) {
  const int experts = static_cast<int>(sel.size());
  const int per_group = experts / a.num_groups;
  std::vector<double> group_score(static_cast<size_t>(a.num_groups));
  const int best_in_group = a.group_score == RouterGroupScore::Max ? 1 : std::max(1, a.topk / a.group_topk);
  for (int g = 0; g < a.num_groups; ++g) {
    std::vector<double> members(sel.begin() + g * per_group, sel.begin() + (g + 1) * per_group);
    std::sort(members.begin(), members.end(), std::greater<double>());
    double s = 0;
    for (int i = 0; i < best_in_group; ++i) s += members[static_cast<size_t>(i)];
    group_score[static_cast<size_t>(g)] = s;
  }
  std::vector<int> keep = top_indices(group_score, a.group_topk);
  std::vector<bool> kept(static_cast<size_t>(a.num_groups), false);
  for (int g : keep) kept[static_cast<size_t>(g)] = true;
  for (int e = 0; e < experts; ++e)
    if (!kept[static_cast<size_t>(e / per_group)]) sel[static_cast<size_t>(e)] = kNegInf;
}

int64_t group_of(const RowGroups& g, int64_t row) {
  return g.rows_per_group > 0 ? (g.row_offset + row) / g.rows_per_group : 0;
}

}  // namespace

void moe_router_topk_forward(const Tensor& logits, const Tensor& expert_bias, Tensor& probs,
                             Tensor& indices, const RouterTopkArgs& a, const Stream&) {
  const int64_t rows = logits.rows(), experts = logits.cols();
  const int k = a.topk;
  FloatAccess l("moe_router_topk_forward", logits, "logits");
  FloatAccess p("moe_router_topk_forward", probs, "probs");
  int32_t* idx = indices.data<int32_t>();
  std::vector<double> normalised;
  if (a.selection == RouterSelection::Sinkhorn) normalised = sinkhorn(l, rows, experts);
  std::vector<double> bias(static_cast<size_t>(experts), 0.0);
  if (expert_bias.defined()) {
    FloatAccess b("moe_router_topk_forward", expert_bias, "expert_bias");
    for (int64_t e = 0; e < experts; ++e) bias[static_cast<size_t>(e)] = b.get(e);
  }
  std::vector<double> s, sel(static_cast<size_t>(experts));
  for (int64_t t = 0; t < rows; ++t) {
    const int64_t base = t * experts;
    // Scores (what probs are made of) and the selection key.
    if (a.score == RouterScore::Softmax) {
      softmax_row(l, base, experts, s);
    } else {
      s.resize(static_cast<size_t>(experts));
      for (int64_t e = 0; e < experts; ++e) s[static_cast<size_t>(e)] = sigmoid(l.get(base + e));
    }
    for (int64_t e = 0; e < experts; ++e) {
      double key = a.score == RouterScore::Softmax && !a.pre_softmax ? l.get(base + e) : s[static_cast<size_t>(e)];
      if (a.selection == RouterSelection::Sinkhorn) key = normalised[static_cast<size_t>(base + e)];
      sel[static_cast<size_t>(e)] = key + bias[static_cast<size_t>(e)];
    }
    if (a.num_groups > 0) limit_groups(sel, a);
    const std::vector<int> chosen = top_indices(sel, k);
    // Probabilities of the chosen experts.
    std::vector<double> pr(static_cast<size_t>(k));
    if (a.score == RouterScore::Softmax && a.pre_softmax) {
      for (int j = 0; j < k; ++j) pr[static_cast<size_t>(j)] = s[static_cast<size_t>(chosen[static_cast<size_t>(j)])];
    } else if (a.score == RouterScore::Softmax) {
      double m = kNegInf, z = 0;
      for (int j = 0; j < k; ++j) m = std::max(m, l.get(base + chosen[static_cast<size_t>(j)]));
      for (int j = 0; j < k; ++j) z += std::exp(l.get(base + chosen[static_cast<size_t>(j)]) - m);
      for (int j = 0; j < k; ++j) pr[static_cast<size_t>(j)] = std::exp(l.get(base + chosen[static_cast<size_t>(j)]) - m) / z;
    } else {
      double d = 0;
      for (int j = 0; j < k; ++j) d += s[static_cast<size_t>(chosen[static_cast<size_t>(j)])];
      for (int j = 0; j < k; ++j)
        pr[static_cast<size_t>(j)] = k > 1 ? s[static_cast<size_t>(chosen[static_cast<size_t>(j)])] / (d + kSigmoidEps)
                                           : s[static_cast<size_t>(chosen[static_cast<size_t>(j)])];
    }
    for (int j = 0; j < k; ++j) {
      p.set(t * k + j, pr[static_cast<size_t>(j)] * static_cast<double>(a.scaling));
      idx[t * k + j] = chosen[static_cast<size_t>(j)];
    }
  }
}

void moe_router_topk_backward(const Tensor& dprobs, const Tensor& logits, const Tensor& indices,
                              Tensor& dlogits, const RouterTopkArgs& a, const Stream&) {
  const int64_t rows = logits.rows(), experts = logits.cols(), slots = indices.cols();
  FloatAccess l("moe_router_topk_backward", logits, "logits");
  FloatAccess dp("moe_router_topk_backward", dprobs, "dprobs");
  FloatAccess dl("moe_router_topk_backward", dlogits, "dlogits");
  const int32_t* idx = indices.data<int32_t>();
  const double scale = a.scaling;
  std::vector<double> s;
  for (int64_t t = 0; t < rows; ++t) {
    const int64_t base = t * experts;
    for (int64_t e = 0; e < experts; ++e) dl.set(base + e, 0.0);
    std::vector<int64_t> js;  // selected slots
    for (int64_t j = 0; j < slots; ++j)
      if (idx[t * slots + j] >= 0) js.push_back(j);
    if (js.empty()) continue;
    auto expert = [&](int64_t j) { return static_cast<int64_t>(idx[t * slots + j]); };
    if (a.score == RouterScore::Softmax && a.pre_softmax) {
      softmax_row(l, base, experts, s);
      double dot = 0;
      for (int64_t j : js) dot += dp.get(t * slots + j) * s[static_cast<size_t>(expert(j))];
      for (int64_t e = 0; e < experts; ++e) dl.set(base + e, -scale * s[static_cast<size_t>(e)] * dot);
      for (int64_t j : js) dl.add(base + expert(j), scale * s[static_cast<size_t>(expert(j))] * dp.get(t * slots + j));
    } else if (a.score == RouterScore::Softmax) {
      double m = kNegInf, z = 0;
      for (int64_t j : js) m = std::max(m, l.get(base + expert(j)));
      for (int64_t j : js) z += std::exp(l.get(base + expert(j)) - m);
      double dot = 0;
      for (int64_t j : js) dot += dp.get(t * slots + j) * std::exp(l.get(base + expert(j)) - m) / z;
      for (int64_t j : js) {
        const double q = std::exp(l.get(base + expert(j)) - m) / z;
        dl.set(base + expert(j), scale * q * (dp.get(t * slots + j) - dot));
      }
    } else {
      const bool normalised = a.topk > 1;
      double d = 0, dot = 0;
      for (int64_t j : js) d += sigmoid(l.get(base + expert(j)));
      d += kSigmoidEps;
      for (int64_t j : js) dot += dp.get(t * slots + j) * sigmoid(l.get(base + expert(j)));
      for (int64_t j : js) {
        const double sj = sigmoid(l.get(base + expert(j)));
        const double ds = normalised ? scale * (dp.get(t * slots + j) / d - dot / (d * d))
                                     : scale * dp.get(t * slots + j);
        dl.set(base + expert(j), ds * sj * (1.0 - sj));
      }
    }
  }
}

void moe_expert_choice_forward(const Tensor& logits, Tensor& probs, Tensor& indices,
                               const ExpertChoiceArgs& a, const Stream&) {
  const int64_t rows = logits.rows(), experts = logits.cols();
  FloatAccess l("moe_expert_choice_forward", logits, "logits");
  FloatAccess p("moe_expert_choice_forward", probs, "probs");
  int32_t* idx = indices.data<int32_t>();
  for (int64_t i = 0; i < rows * experts; ++i) idx[i] = -1;
  const int64_t seq = a.seq > 0 ? a.seq : rows;
  for (int64_t first = 0; first < rows; first += seq) {
    const int64_t n = std::min(seq, rows - first);
    const int64_t c = std::min(a.capacity, n);
    for (int64_t e = 0; e < experts; ++e) {
      std::vector<int64_t> order(static_cast<size_t>(n));
      std::iota(order.begin(), order.end(), first);
      std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) {
        return l.get(x * experts + e) > l.get(y * experts + e);
      });
      for (int64_t i = 0; i < c; ++i) idx[order[static_cast<size_t>(i)] * experts + e] = static_cast<int32_t>(e);
    }
  }
  for (int64_t t = 0; t < rows; ++t) {
    const int64_t base = t * experts;
    double m = kNegInf, z = 0, d = 0;
    for (int64_t e = 0; e < experts; ++e)
      if (idx[base + e] >= 0) m = std::max(m, l.get(base + e));
    for (int64_t e = 0; e < experts; ++e) {
      if (idx[base + e] < 0) continue;
      z += std::exp(l.get(base + e) - m);
      d += sigmoid(l.get(base + e));
    }
    for (int64_t e = 0; e < experts; ++e) {
      double v = 0;
      if (idx[base + e] >= 0)
        v = a.score == RouterScore::Softmax ? std::exp(l.get(base + e) - m) / z
                                            : sigmoid(l.get(base + e)) / (d + kSigmoidEps);
      p.set(base + e, v);
    }
  }
}

void moe_capacity_drop(const Tensor& probs, const Tensor& indices, Tensor& kept, int64_t capacity,
                       int num_experts, CapacityDropPolicy policy, const Stream&) {
  const int64_t rows = indices.rows(), slots = indices.cols();
  FloatAccess p("moe_capacity_drop", probs, "probs");
  const int32_t* idx = indices.data<int32_t>();
  int32_t* out = kept.data<int32_t>();
  for (int64_t i = 0; i < rows * slots; ++i) out[i] = idx[i];
  for (int e = 0; e < num_experts; ++e) {
    std::vector<int64_t> slots_of_e;  // flat (row, slot) positions, ascending row
    for (int64_t i = 0; i < rows * slots; ++i)
      if (idx[i] == e) slots_of_e.push_back(i);
    if (static_cast<int64_t>(slots_of_e.size()) <= capacity) continue;
    if (policy == CapacityDropPolicy::Probs)
      std::stable_sort(slots_of_e.begin(), slots_of_e.end(),
                       [&](int64_t x, int64_t y) { return p.get(x) > p.get(y); });
    for (size_t i = static_cast<size_t>(capacity); i < slots_of_e.size(); ++i) out[slots_of_e[i]] = -1;
  }
}

void moe_router_stats(const Tensor& logits, Tensor& score_sums, Tensor& lse_sq,
                      const RowGroups& groups, const Stream&) {
  const int64_t rows = logits.rows(), experts = logits.cols();
  FloatAccess l("moe_router_stats", logits, "logits");
  std::vector<double> s;
  double lse_total = 0;
  std::vector<double> sums(score_sums.defined() ? static_cast<size_t>(score_sums.numel()) : 0, 0.0);
  for (int64_t t = 0; t < rows; ++t) {
    const double lse = softmax_row(l, t * experts, experts, s);
    lse_total += lse * lse;
    if (!sums.empty()) {
      const int64_t g = group_of(groups, t);
      for (int64_t e = 0; e < experts; ++e) sums[static_cast<size_t>(g * experts + e)] += s[static_cast<size_t>(e)];
    }
  }
  if (score_sums.defined()) {
    FloatAccess out("moe_router_stats", score_sums, "score_sums");
    for (size_t i = 0; i < sums.size(); ++i) out.add(static_cast<int64_t>(i), sums[i]);
  }
  if (lse_sq.defined()) FloatAccess("moe_router_stats", lse_sq, "lse_sq").add(0, lse_total);
}

void moe_count_tokens(const Tensor& indices, Tensor& counts, const RowGroups& groups, const Stream&) {
  const int64_t rows = indices.rows(), slots = indices.cols(), experts = counts.cols();
  const int32_t* idx = indices.data<int32_t>();
  FloatAccess c("moe_count_tokens", counts, "counts");
  for (int64_t t = 0; t < rows; ++t) {
    const int64_t g = group_of(groups, t);
    for (int64_t j = 0; j < slots; ++j) {
      const int32_t e = idx[t * slots + j];
      if (e >= 0) c.add(g * experts + e, 1.0);
    }
  }
}

void moe_router_loss_backward(const Tensor& logits, const Tensor& w, Tensor& dlogits,
                              const RouterLossArgs& a, const Stream&) {
  const int64_t rows = logits.rows(), experts = logits.cols();
  FloatAccess l("moe_router_loss_backward", logits, "logits");
  FloatAccess dl("moe_router_loss_backward", dlogits, "dlogits");
  const bool with_aux = w.defined() && a.aux_coeff != 0.0f;
  std::vector<double> s;
  for (int64_t t = 0; t < rows; ++t) {
    const double lse = softmax_row(l, t * experts, experts, s);
    double ws = 0;
    const int64_t g = group_of(a.groups, t);
    if (with_aux) {
      FloatAccess wa("moe_router_loss_backward", w, "w");
      for (int64_t e = 0; e < experts; ++e) ws += wa.get(g * experts + e) * s[static_cast<size_t>(e)];
      for (int64_t e = 0; e < experts; ++e)
        dl.add(t * experts + e, static_cast<double>(a.aux_coeff) * s[static_cast<size_t>(e)] *
                                    (wa.get(g * experts + e) - ws));
    }
    if (a.z_coeff != 0.0f)
      for (int64_t e = 0; e < experts; ++e)
        dl.add(t * experts + e, static_cast<double>(a.z_coeff) * 2.0 * lse * s[static_cast<size_t>(e)]);
  }
}

void moe_expert_choice_aux(const Tensor& logits, const Tensor& experts_per_row, Tensor& value,
                           Tensor& dlogits, float grad_scale, const Stream&) {
  const int64_t rows = logits.rows(), experts = logits.cols();
  FloatAccess l("moe_expert_choice_aux", logits, "logits");
  FloatAccess n("moe_expert_choice_aux", experts_per_row, "experts_per_row");
  FloatAccess dl("moe_expert_choice_aux", dlogits, "dlogits");
  double total = 0;
  for (int64_t e = 0; e < experts; ++e) {
    double m = kNegInf, z = 0, a = 0;
    for (int64_t t = 0; t < rows; ++t) m = std::max(m, l.get(t * experts + e));
    for (int64_t t = 0; t < rows; ++t) z += std::exp(l.get(t * experts + e) - m);
    for (int64_t t = 0; t < rows; ++t) a += std::exp(l.get(t * experts + e) - m) / z * n.get(t);
    total += a;
    for (int64_t t = 0; t < rows; ++t) {
      const double s = std::exp(l.get(t * experts + e) - m) / z;
      dl.add(t * experts + e, static_cast<double>(grad_scale) * s * (n.get(t) - a));
    }
  }
  FloatAccess("moe_expert_choice_aux", value, "value").add(0, total);
}

void moe_dispatch_plan(const Tensor& indices, int first_expert, int num_experts, Tensor& dest,
                       Tensor& counts, const Stream&) {
  const int64_t n = indices.numel();
  const int32_t* idx = indices.data<int32_t>();
  int32_t* d = dest.data<int32_t>();
  int32_t* c = counts.data<int32_t>();
  std::vector<int64_t> count(static_cast<size_t>(num_experts), 0);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t e = idx[i] - first_expert;
    if (idx[i] >= 0 && e >= 0 && e < num_experts) ++count[static_cast<size_t>(e)];
  }
  std::vector<int64_t> next(static_cast<size_t>(num_experts), 0);
  for (int e = 1; e < num_experts; ++e) next[static_cast<size_t>(e)] = next[static_cast<size_t>(e - 1)] + count[static_cast<size_t>(e - 1)];
  // Slots in row-major order visit each expert's rows in ascending token order.
  for (int64_t i = 0; i < n; ++i) {
    const int32_t e = idx[i] - first_expert;
    d[i] = idx[i] >= 0 && e >= 0 && e < num_experts ? static_cast<int32_t>(next[static_cast<size_t>(e)]++) : -1;
  }
  for (int e = 0; e < num_experts; ++e) c[e] = static_cast<int32_t>(count[static_cast<size_t>(e)]);
}

void moe_permute(const Tensor& x, const Tensor& dest, Tensor& out, const Stream&) {
  const int64_t rows = dest.rows(), slots = dest.cols(), h = x.cols();
  FloatAccess xi("moe_permute", x, "x");
  FloatAccess o("moe_permute", out, "out");
  const int32_t* d = dest.data<int32_t>();
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t j = 0; j < slots; ++j) {
      const int32_t r = d[t * slots + j];
      if (r < 0) continue;
      for (int64_t c = 0; c < h; ++c) o.set(r * h + c, xi.get(t * h + c));
    }
}

void moe_random_logits(Tensor& logits, const RandomLogitsArgs& a, const Stream&) {
  const int64_t rows = logits.rows(), experts = logits.cols();
  FloatAccess out("moe_random_logits", logits, "logits");
  const PhiloxKey key = PhiloxKey::make(a.seed, RngPurpose::MoeRandomLogits);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t g = a.row_offset + r;
    const int64_t sample = a.sample_offset + g / a.seq_len, position = a.chunks.global(g % a.seq_len);
    for (int64_t e = 0; e < experts; ++e) out.set(r * experts + e, random_logit_value(key, a.layer, sample, position, e));
  }
}

void moe_unpermute(const Tensor& y, const Tensor& dest, const Tensor& probs, Tensor& out,
                   const Stream&) {
  const int64_t rows = dest.rows(), slots = dest.cols(), h = out.cols();
  FloatAccess yi("moe_unpermute", y, "y");
  FloatAccess o("moe_unpermute", out, "out");
  const int32_t* d = dest.data<int32_t>();
  std::vector<double> acc(static_cast<size_t>(h));
  for (int64_t t = 0; t < rows; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t j = 0; j < slots; ++j) {
      const int32_t r = d[t * slots + j];
      if (r < 0) continue;
      const double w = probs.defined() ? FloatAccess("moe_unpermute", probs, "probs").get(t * slots + j) : 1.0;
      for (int64_t c = 0; c < h; ++c) acc[static_cast<size_t>(c)] += w * yi.get(r * h + c);
    }
    for (int64_t c = 0; c < h; ++c) o.set(t * h + c, acc[static_cast<size_t>(c)]);
  }
}

void moe_unpermute_backward(const Tensor& dout, const Tensor& y, const Tensor& dest,
                            const Tensor& probs, Tensor& dy, Tensor& dprobs, const Stream&) {
  const int64_t rows = dest.rows(), slots = dest.cols(), h = dout.cols();
  FloatAccess g("moe_unpermute_backward", dout, "dout");
  FloatAccess yi("moe_unpermute_backward", y, "y");
  FloatAccess p("moe_unpermute_backward", probs, "probs");
  FloatAccess o("moe_unpermute_backward", dy, "dy");
  FloatAccess dp("moe_unpermute_backward", dprobs, "dprobs");
  const int32_t* d = dest.data<int32_t>();
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t j = 0; j < slots; ++j) {
      const int32_t r = d[t * slots + j];
      if (r < 0) {
        dp.set(t * slots + j, 0.0);
        continue;
      }
      const double w = p.get(t * slots + j);
      double dot = 0;
      for (int64_t c = 0; c < h; ++c) {
        dot += g.get(t * h + c) * yi.get(r * h + c);
        o.set(r * h + c, w * g.get(t * h + c));
      }
      dp.set(t * slots + j, dot);
    }
}

void grouped_gemm(const Tensor& a, const Tensor& b, Tensor& c, const std::vector<int64_t>& group_rows,
                  const GroupedGemmArgs& args, const Stream& stream) {
  const int64_t groups = static_cast<int64_t>(group_rows.size());
  int64_t row = 0;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t n = group_rows[static_cast<size_t>(g)];
    GemmArgs ga{.trans_a = args.trans_a, .trans_b = args.trans_b, .alpha = args.alpha, .beta = args.beta};
    Tensor bias;
    if (args.bias) {
      bias = args.bias->slice_flat(g * c.cols(), {c.cols()});
      ga.bias = &bias;
    }
    if (!args.trans_a) {
      if (n > 0) {
        const int64_t b_rows = b.rows() / groups;
        Tensor bg = b.slice_flat(g * b_rows * b.cols(), {b_rows, b.cols()});
        Tensor ag = a.narrow(row, n);
        Tensor cg = c.narrow(row, n);
        cpu::gemm(ag, bg, cg, ga, stream);
      }
    } else {
      const int64_t c_rows = c.rows() / groups;
      Tensor ag = a.narrow(row, n);
      Tensor bg = b.narrow(row, n);
      Tensor cg = c.slice_flat(g * c_rows * c.cols(), {c_rows, c.cols()});
      cpu::gemm(ag, bg, cg, ga, stream);
    }
    row += n;
  }
}

}  // namespace megadlm::ops::cpu
