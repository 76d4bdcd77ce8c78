// CPU backend: MoE routing (sqrtsoftplus, selection-only bias, renormalised top-k) and the experts
// (SwiGLU with the reference's clamps, routing weight applied before w2, fp32 accumulation).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/torch_topk.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "model/quant.h"

namespace di {

MoeRoute CpuBackend::moe_route(const Tensor& x, const Weight& gate, const Weight& bias, int top_k,
                               float route_scale, float gate_temp) {
  int64_t s = x.rows(), n_exp = gate.rows;
  Weight g32 = gate;
  g32.mode = WeightMode::kF32;  // the reference promotes the gate to fp32
  Tensor logits = linear(x, g32);
  MoeRoute route{alloc(TType::kF32, {s, top_k}), alloc(TType::kI32, {s, top_k})};
  std::vector<float> b(n_exp);
  for (int64_t e = 0; e < n_exp; ++e) b[e] = cpu::weight_at(bias, e);
  std::vector<float> sc(n_exp), biased(n_exp);
  std::vector<int64_t> order(n_exp);
  for (int64_t r = 0; r < s; ++r) {
    for (int64_t e = 0; e < n_exp; ++e) {
      float l = logits.f32()[r * n_exp + e] / gate_temp;
      float sp = l > 20.0f ? l : std::log1p(std::exp(l));  // torch softplus, threshold 20
      sc[e] = std::sqrt(sp);
      biased[e] = sc[e] + b[e];
    }
    order = cpu::torch_topk_indices(biased.data(), n_exp, top_k);
    float sum = 0;
    for (int k = 0; k < top_k; ++k) sum += sc[order[k]];
    for (int k = 0; k < top_k; ++k) {
      float w = sc[order[k]];
      if (top_k > 1) w /= (sum + 1e-20f);
      route.weights.f32()[r * top_k + k] = w * route_scale;
      route.experts.i32()[r * top_k + k] = static_cast<int32_t>(order[k]);
    }
  }
  return route;
}

namespace {

// One SwiGLU expert over the rows of x; `row_weights` (may be null) scales the hidden state.
Tensor run_expert(CpuBackend& be, const Tensor& x, const ExpertWeights& ew, const float* row_weights, float limit) {
  Tensor gate = be.linear(x, ew.w1);
  Tensor up = be.linear(x, ew.w3);
  int64_t s = x.rows(), inter = gate.row_size();
  for (int64_t r = 0; r < s; ++r)
    for (int64_t i = 0; i < inter; ++i) {
      float g = gate.f32()[r * inter + i], u = up.f32()[r * inter + i];
      if (limit > 0) {
        u = std::clamp(u, -limit, limit);
        g = std::min(g, limit);
      }
      float h = g / (1.0f + std::exp(-g)) * u;
      if (row_weights) h = row_weights[r] * h;
      gate.f32()[r * inter + i] = quant::round_bf16(h);
    }
  return be.linear(gate, ew.w2);
}

}  // namespace

Tensor CpuBackend::moe_experts(const Tensor& x, const MoeRoute& route, const std::vector<ExpertWeights>& experts,
                               const ExpertWeights& shared, float swiglu_limit) {
  int64_t s = x.rows(), d = x.row_size(), k = route.experts.row_size();
  std::vector<float> acc(s * d, 0.0f);
  // Experts in id order, as the reference loops; each token's contributions add in that order.
  for (int64_t e = 0; e < static_cast<int64_t>(experts.size()); ++e) {
    std::vector<int64_t> rows;
    std::vector<float> weights;
    for (int64_t r = 0; r < s; ++r)
      for (int64_t j = 0; j < k; ++j)
        if (route.experts.i32()[r * k + j] == e) {
          rows.push_back(r);
          weights.push_back(route.weights.f32()[r * k + j]);
        }
    if (rows.empty()) continue;
    Tensor xe = alloc(TType::kF32, {static_cast<int64_t>(rows.size()), d});
    for (size_t i = 0; i < rows.size(); ++i) copy_rows(xe, static_cast<int64_t>(i), x, rows[i], 1);
    Tensor ye = run_expert(*this, xe, experts[e], weights.data(), swiglu_limit);
    for (size_t i = 0; i < rows.size(); ++i)
      for (int64_t c = 0; c < d; ++c) acc[rows[i] * d + c] += ye.f32()[i * d + c];
  }
  Tensor ys = run_expert(*this, x, shared, nullptr, swiglu_limit);
  Tensor out = alloc(TType::kF32, {s, d});
  for (int64_t i = 0; i < s * d; ++i) out.f32()[i] = quant::round_bf16(acc[i] + ys.f32()[i]);
  return out;
}

Tensor CpuBackend::engram_lookup(const Tensor& cols, const Weight& table) {
  int64_t s = cols.rows(), n = cols.row_size(), hd = table.cols, nb = hd / 32;
  Tensor out = alloc(TType::kF32, {s, n * hd});
  for (int64_t i = 0; i < s * n; ++i) {
    int64_t row = cols.i32()[i];
    DI_CHECK(row >= 0 && row < table.rows);
    const uint8_t* w = table.data + row * hd;
    const uint8_t* sc = table.scale + row * nb;
    for (int64_t c = 0; c < hd; ++c)
      out.f32()[i * hd + c] = quant::round_bf16(quant::e4m3_to_float(w[c]) * quant::e8m0_to_float(sc[c / 32]));
  }
  return out;
}

Tensor CpuBackend::engram_inject(const Tensor& x, const Tensor& kv, const Weight& q_weight, const Weight& k_weight,
                                 int hc, float eps) {
  int64_t s = x.rows(), d = x.row_size() / hc;
  DI_CHECK(kv.row_size() == (hc + 1) * d);
  Tensor out = alloc(TType::kF32, {s, hc * d});
  std::vector<float> wgt(hc * d);
  for (int64_t i = 0; i < hc * d; ++i) wgt[i] = cpu::weight_at(q_weight, i) * cpu::weight_at(k_weight, i);
  float inv_sqrt_d = 1.0f / std::sqrt(static_cast<float>(d));
  for (int64_t r = 0; r < s; ++r) {
    const float* value = kv.f32() + r * (hc + 1) * d + hc * d;
    for (int k = 0; k < hc; ++k) {
      const float* h = x.f32() + (r * hc + k) * d;
      const float* key = kv.f32() + r * (hc + 1) * d + k * d;
      float hh = cpu::dot(h, h, d) / static_cast<float>(d);
      float kk = cpu::dot(key, key, d) / static_cast<float>(d);
      float rstd = (1.0f / std::sqrt(hh + eps)) * (1.0f / std::sqrt(kk + eps));
      float dotv = 0;
      for (int64_t i = 0; i < d; ++i) dotv += h[i] * wgt[k * d + i] * key[i];
      dotv = dotv * rstd * inv_sqrt_d;
      float mag = std::sqrt(std::max(std::fabs(dotv), 1e-6f));
      float gate = 1.0f / (1.0f + std::exp(-std::copysign(mag, dotv)));
      for (int64_t i = 0; i < d; ++i) out.f32()[(r * hc + k) * d + i] = quant::round_bf16(h[i] + gate * value[i]);
    }
  }
  return out;
}

}  // namespace di
