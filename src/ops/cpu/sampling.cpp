// CPU reference of ops/sampling.h: one pass per row in double, tokens visited in order (first
// index wins ties), the softmax denominator summed in order. The executable specification the
// CUDA kernel and tests/golden/llada_reference.py are checked against.
#include <cmath>
#include <limits>
#include <vector>
#include "ops/cpu/cpu_ops.h"
#include "ops/sampling_math.h"

namespace megadlm::ops::cpu {

namespace {

template <typename T>
void proposals(const Tensor& logits, const Tensor& uncond, const Tensor& keys,
               const ProposalArgs& a, Tensor& tokens, Tensor& confidence) {
  const int64_t rows = logits.rows(), vocab = logits.cols();
  const T* pc = logits.data<T>();
  const T* pu = uncond.defined() ? uncond.data<T>() : nullptr;
  const int32_t* pk = keys.data<int32_t>();
  int32_t* out_tok = tokens.data<int32_t>();
  double* out_conf = confidence.data<double>();
  const PhiloxKey gumbel = PhiloxKey::make(a.seed, RngPurpose::SamplerGumbel);
  const PhiloxKey remask = PhiloxKey::make(a.seed, RngPurpose::SamplerRemask);
  const float w1 = static_cast<float>(static_cast<double>(a.cfg_scale) + 1.0);
  std::vector<double> l(static_cast<size_t>(vocab));
  for (int64_t r = 0; r < rows; ++r) {
    const uint32_t g = static_cast<uint32_t>(pk[2 * r]), j = static_cast<uint32_t>(pk[2 * r + 1]);
    const T* c = pc + r * vocab;
    for (int64_t v = 0; v < vocab; ++v) {
      l[v] = pu != nullptr ? detail::cfg_combine(static_cast<float>(c[v]), static_cast<float>(pu[r * vocab + v]), w1)
                           : static_cast<double>(c[v]);
    }
    if (a.suppress_token >= 0 && a.suppress_token < vocab)
      l[a.suppress_token] = -std::numeric_limits<double>::infinity();
    int64_t best = 0;
    double best_score = -std::numeric_limits<double>::infinity();
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t v = 0; v < vocab; ++v) {
      m = std::max(m, l[v]);
      double score = l[v];
      if (a.temperature > 0) {
        const double u = detail::gumbel_uniform(gumbel, v, j, g, a.step);
        score = std::exp(l[v]) / std::pow(-std::log(u), a.temperature);
      }
      if (score > best_score) {
        best_score = score;
        best = v;
      }
    }
    out_tok[r] = static_cast<int32_t>(best);
    if (a.confidence == ProposalConfidence::Random) {
      out_conf[r] = detail::remask_uniform(remask, j, g, a.step);
    } else {
      double s = 0;
      for (int64_t v = 0; v < vocab; ++v) s += std::exp(l[v] - m);
      out_conf[r] = std::exp(l[best] - m) / s;
    }
  }
}

}  // namespace

void sample_proposals(const Tensor& logits, const Tensor& uncond_logits, const Tensor& keys,
                      const ProposalArgs& args, Tensor& tokens, Tensor& confidence,
                      const Stream& stream) {
  (void)stream;
  if (logits.dtype() == DType::F64) proposals<double>(logits, uncond_logits, keys, args, tokens, confidence);
  else proposals<float>(logits, uncond_logits, keys, args, tokens, confidence);
}

}  // namespace megadlm::ops::cpu
