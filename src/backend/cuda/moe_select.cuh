// The router's expert selection (moe_kernels.cuh, router_select) as device functions: its own kernel
// (moe_route_kernels.cu) and the fused small-batch routing kernel (moe_grouped.cu) run the same code,
// so both give the same weights and ids bit for bit.
#pragma once

#include <climits>
#include <cmath>
#include <cstdint>

#include "backend/cuda/moe_elem.cuh"
#include "backend/cuda/moe_kernels.cuh"

namespace di::cuda::moe {

inline constexpr int kMaxRouted = 512;  // routed experts the selection takes (scores of one row in registers of a warp)

// An expert's score sqrt(softplus(logit / temp)) (torch softplus, threshold 20; fp64 exp / log1p, ~1 us).
__device__ __forceinline__ float route_score(float logit, float gate_temp) {
  const float l = logit / gate_temp;
  const float sp = l > 20.0f ? l : log1p_f32(exp_f32(l));
  return sqrtf(sp);
}

// One warp (all 32 lanes call): top_k warp-wide argmax passes over the biased scores of one row,
// held in registers -- "the k largest biased scores, ties to the lowest expert id" -- then lane 0
// writes the weights (scores renormalised in pick order, +1e-20 when top_k > 1, x route_scale) and
// ids (-1 for a NaN score's slot). sc / biased: the row's n_exp scores and biased scores.
__device__ __forceinline__ void pick_top_k(const float* sc, const float* biased, int n_exp, int top_k,
                                           float route_scale, float* weights, int32_t* experts) {
  constexpr unsigned kFull = 0xffffffffu;
  const int lane = threadIdx.x & 31;
  constexpr int kLane = kMaxRouted / 32;
  float v[kLane];  // expert lane + 32 k; NaN = padding or already picked: never wins
#pragma unroll
  for (int k = 0; k < kLane; ++k) v[k] = lane + 32 * k < n_exp ? biased[lane + 32 * k] : __int_as_float(0x7fc00000);
  int picks[kMaxTopK];
  for (int j = 0; j < top_k; ++j) {
    float bv = -INFINITY;
    int bi = INT_MAX;
#pragma unroll
    for (int k = 0; k < kLane; ++k)
      if (v[k] > bv || (v[k] == bv && lane + 32 * k < bi)) bv = v[k], bi = lane + 32 * k;
    for (int off = 16; off > 0; off >>= 1) {
      const float ov = __shfl_xor_sync(kFull, bv, off);
      const int oi = __shfl_xor_sync(kFull, bi, off);
      if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
    }
    picks[j] = bi;  // the same in every lane
#pragma unroll
    for (int k = 0; k < kLane; ++k)
      if (lane + 32 * k == bi) v[k] = __int_as_float(0x7fc00000);
  }
  if (lane != 0) return;
  float sum = 0;
  for (int j = 0; j < top_k; ++j)
    if (picks[j] < n_exp) sum += sc[picks[j]];
  for (int j = 0; j < top_k; ++j) {
    const bool ok = picks[j] < n_exp;  // false only for NaN scores
    float w = ok ? sc[picks[j]] : 0.0f;
    if (top_k > 1) w /= (sum + 1e-20f);
    weights[j] = w * route_scale;
    experts[j] = ok ? picks[j] : -1;
  }
}

}  // namespace di::cuda::moe
