// The MoE's last step as a device function: a token's expert outputs summed in expert-id order, plus the shared
// expert's, rounded to bf16. Its own kernel (moe::combine) and hc_post_pre_norm's fused form (a layer's MoE
// output read straight into the next mHC site) both use it, so both give the same bits.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_common.cuh"

namespace di::cuda {

struct MoeCombine {
  const float* down;     // [entries, D] the down projections, sorted by expert
  const int32_t* order;  // [S, k] each token's entries in expert-id order (-1: none further)
  int k;
  const float* shared;  // [S, D] the shared expert's output
};

// Value (t, c) of the MoE's output [S, D].
__device__ __forceinline__ float moe_combined(const MoeCombine& m, int64_t t, int64_t c, int64_t d) {
  float acc = 0.0f;
  for (int j = 0; j < m.k; ++j) {
    const int32_t p = m.order[t * m.k + j];
    if (p < 0) break;
    acc = __fadd_rn(acc, m.down[static_cast<int64_t>(p) * d + c]);
  }
  return round_bf16(__fadd_rn(acc, m.shared[t * d + c]));
}

}  // namespace di::cuda
