// CPU reference of the fused QK-norm + RoPE (include/megadlm/ops/qk_norm_rope.h): per token and
// head, the RMSNorm of ops/cpu/norm.cpp (statistic in double) then the rotation of
// ops/cpu/rope.cpp (angles formed in the activation type as Megatron does, cos/sin in double).
// Backward: the rotation by -theta, then the RMSNorm backward
//   dx = r g - x r^3 mean(g x),  g = dn * w,  dw += dn x r.
#include <cmath>
#include <memory>
#include <vector>
#include "ops/cpu/cpu_common.h"
#include "ops/cpu/cpu_ops.h"

namespace megadlm::ops::cpu {
namespace {

using detail::FloatAccess;

/// cos/sin of theta_i = p * inv_freq_i for one position (inv_freq in T, as ops/cpu/rope.cpp).
template <typename T>
void angles(int32_t position, const QkNormRopeArgs& a, std::vector<double>& c, std::vector<double>& s) {
  const int64_t half = a.rotary_dim / 2;
  c.resize(static_cast<size_t>(half));
  s.resize(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const T exponent = static_cast<T>(2 * i) / static_cast<T>(a.rotary_dim);
    const T inv = T(1) / std::pow(static_cast<T>(a.base), exponent);
    const T theta = static_cast<T>(position) * inv;
    c[static_cast<size_t>(i)] = std::cos(static_cast<double>(theta));
    s[static_cast<size_t>(i)] = std::sin(static_cast<double>(theta));
  }
}

/// v rotated by sign * theta over its first rotary_dim elements.
void rotate(std::vector<double>& v, const std::vector<double>& c, const std::vector<double>& s,
            double sign) {
  const size_t half = c.size();
  for (size_t i = 0; i < half; ++i) {
    const double x1 = v[i], x2 = v[i + half], sn = sign * s[i];
    v[i] = x1 * c[i] - x2 * sn;
    v[i + half] = x2 * c[i] + x1 * sn;
  }
}

template <typename T>
void forward(const Tensor& qkv, const Tensor& q_weight, const Tensor& k_weight,
             const Tensor& positions, Tensor& out, Tensor& rstd, const QkNormRopeArgs& a) {
  const int64_t d = a.head_dim, heads = a.heads + 2 * a.kv_heads, tokens = qkv.rows();
  const T* x = qkv.data<T>();
  T* y = out.data<T>();
  const int32_t* pos = positions.data<int32_t>();
  const bool norm = q_weight.defined();
  const T* wq = norm ? q_weight.data<T>() : nullptr;
  const T* wk = norm ? k_weight.data<T>() : nullptr;
  std::unique_ptr<FloatAccess> rs;
  if (norm) rs = std::make_unique<FloatAccess>("qk_norm_rope_forward", rstd, "rstd");
  std::vector<double> c, s, v(static_cast<size_t>(d));
  for (int64_t t = 0; t < tokens; ++t) {
    angles<T>(pos[t], a, c, s);
    for (int64_t h = 0; h < heads; ++h) {
      const T* xh = x + (t * heads + h) * d;
      T* yh = y + (t * heads + h) * d;
      if (h >= a.heads + a.kv_heads) {  // value head
        if (a.copy_values) for (int64_t i = 0; i < d; ++i) yh[i] = xh[i];
        continue;
      }
      for (int64_t i = 0; i < d; ++i) v[static_cast<size_t>(i)] = xh[i];
      if (norm) {
        const T* w = h < a.heads ? wq : wk;
        double ss = 0;
        for (int64_t i = 0; i < d; ++i) ss += v[static_cast<size_t>(i)] * v[static_cast<size_t>(i)];
        const double r = 1.0 / std::sqrt(ss / static_cast<double>(d) + static_cast<double>(a.eps));
        for (int64_t i = 0; i < d; ++i) v[static_cast<size_t>(i)] *= r * static_cast<double>(w[i]);
        rs->set(t * (a.heads + a.kv_heads) + h, r);
      }
      rotate(v, c, s, +1.0);
      for (int64_t i = 0; i < d; ++i) yh[i] = static_cast<T>(v[static_cast<size_t>(i)]);
    }
  }
}

template <typename T>
void backward(Tensor& dqkv, const Tensor& qkv, const Tensor& q_weight, const Tensor& k_weight,
              const Tensor& rstd, const Tensor& positions, Tensor& dq_weight, Tensor& dk_weight,
              const QkNormRopeArgs& a) {
  const int64_t d = a.head_dim, heads = a.heads + 2 * a.kv_heads, tokens = qkv.rows();
  const T* x = qkv.data<T>();
  T* g = dqkv.data<T>();
  const int32_t* pos = positions.data<int32_t>();
  const bool norm = q_weight.defined();
  std::unique_ptr<FloatAccess> rs, dwq, dwk;
  if (norm) {
    rs = std::make_unique<FloatAccess>("qk_norm_rope_backward", rstd, "rstd");
    dwq = std::make_unique<FloatAccess>("qk_norm_rope_backward", dq_weight, "dq_weight");
    dwk = std::make_unique<FloatAccess>("qk_norm_rope_backward", dk_weight, "dk_weight");
  }
  std::vector<double> acc_q(static_cast<size_t>(d), 0.0), acc_k(static_cast<size_t>(d), 0.0);
  std::vector<double> c, s, dn(static_cast<size_t>(d));
  for (int64_t t = 0; t < tokens; ++t) {
    angles<T>(pos[t], a, c, s);
    for (int64_t h = 0; h < a.heads + a.kv_heads; ++h) {
      const T* xh = x + (t * heads + h) * d;
      T* gh = g + (t * heads + h) * d;
      for (int64_t i = 0; i < d; ++i) dn[static_cast<size_t>(i)] = gh[i];
      rotate(dn, c, s, -1.0);
      if (norm) {
        const T* w = (h < a.heads ? q_weight : k_weight).template data<T>();
        std::vector<double>& acc = h < a.heads ? acc_q : acc_k;
        const double r = rs->get(t * (a.heads + a.kv_heads) + h);
        double gx = 0;
        for (int64_t i = 0; i < d; ++i) gx += dn[static_cast<size_t>(i)] * static_cast<double>(w[i]) * xh[i];
        const double coef = r * r * r * gx / static_cast<double>(d);
        for (int64_t i = 0; i < d; ++i) {
          const double dni = dn[static_cast<size_t>(i)];
          acc[static_cast<size_t>(i)] += dni * static_cast<double>(xh[i]) * r;
          dn[static_cast<size_t>(i)] = r * dni * static_cast<double>(w[i]) - static_cast<double>(xh[i]) * coef;
        }
      }
      for (int64_t i = 0; i < d; ++i) gh[i] = static_cast<T>(dn[static_cast<size_t>(i)]);
    }
  }
  if (norm) {
    for (int64_t i = 0; i < d; ++i) {
      dwq->add(i, acc_q[static_cast<size_t>(i)]);
      dwk->add(i, acc_k[static_cast<size_t>(i)]);
    }
  }
}

}  // namespace

void qk_norm_rope_forward(const Tensor& qkv, const Tensor& q_weight, const Tensor& k_weight,
                          const Tensor& positions, Tensor& out, Tensor& rstd,
                          const QkNormRopeArgs& args, const Stream& stream) {
  detail::with_float_type("qk_norm_rope_forward", qkv, [&](auto t) {
    forward<decltype(t)>(qkv, q_weight, k_weight, positions, out, rstd, args);
  });
}

void qk_norm_rope_backward(Tensor& dqkv, const Tensor& qkv, const Tensor& q_weight,
                           const Tensor& k_weight, const Tensor& rstd, const Tensor& positions,
                           Tensor& dq_weight, Tensor& dk_weight, const QkNormRopeArgs& args,
                           const Stream& stream) {
  detail::with_float_type("qk_norm_rope_backward", qkv, [&](auto t) {
    backward<decltype(t)>(dqkv, qkv, q_weight, k_weight, rstd, positions, dq_weight, dk_weight, args);
  });
}

}  // namespace megadlm::ops::cpu
