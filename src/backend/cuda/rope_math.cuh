// RoPE's arithmetic on the GPU, shared by the rope kernels (cuda_dense.cu), the GEMM epilogue that
// rotates the queries' projection (dense_linear.cu) and wo_a's staging of the attention output
// (dense_bf16_mma.cu): one copy of the code, so all give the same bits.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_quant.cuh"

namespace di::cuda {

// The rotation of pair i at position pos: cos/sin in fp64 rounded to fp32 (correctly rounded, as close
// as possible to the CPU's cosf/sinf).
__device__ __forceinline__ void rope_cos_sin(int64_t pos, float freq, bool inverse, float& c, float& sn) {
  const float angle = __fmul_rn(static_cast<float>(pos), freq);
  c = static_cast<float>(cos(static_cast<double>(angle)));
  sn = static_cast<float>(sin(static_cast<double>(angle)));
  if (inverse) sn = -sn;
}
// The rotated pair (a, b), bf16 out.
__device__ __forceinline__ float rope_first(float a, float b, float c, float sn) {
  return dq::round_bf16(__fsub_rn(__fmul_rn(a, c), __fmul_rn(b, sn)));
}
__device__ __forceinline__ float rope_second(float a, float b, float c, float sn) {
  return dq::round_bf16(__fadd_rn(__fmul_rn(a, sn), __fmul_rn(b, c)));
}

// The forward rotation of one value of a row: `v` at column `col` of heads of head_dim values whose
// trailing rope_dim are rotated in interleaved pairs, `other` the value at col ^ 1 (its pair partner).
// Returns v unchanged outside the rotated dims.
struct RowRope {
  const float* freqs;  // [rope_dim / 2]
  int head_dim, rope_dim;
};
__device__ __forceinline__ float rope_value(float v, float other, int64_t col, int64_t pos, const RowRope& rope) {
  const int c = static_cast<int>(col % rope.head_dim), first = rope.head_dim - rope.rope_dim;
  if (c < first) return v;
  float cs, sn;
  rope_cos_sin(pos, rope.freqs[(c - first) / 2], false, cs, sn);
  return (c - first) % 2 == 0 ? rope_first(v, other, cs, sn) : rope_second(other, v, cs, sn);
}

// Pair (a, b) rotated in place by the angle pos x freq.
__device__ __forceinline__ void rope_pair_at(float& a, float& b, int64_t pos, float freq, bool inverse) {
  float cs, sn;
  rope_cos_sin(pos, freq, inverse, cs, sn);
  const float a0 = a;
  a = rope_first(a0, b, cs, sn);
  b = rope_second(a0, b, cs, sn);
}

// Pair (a, b) at columns col, col + 1 (col even) of such a row, rotated in place as rope_kernel
// rotates it (unchanged outside the rotated dims).
__device__ __forceinline__ void rope_pair(float& a, float& b, int64_t col, int64_t pos, const RowRope& rope,
                                          bool inverse) {
  const int c = static_cast<int>(col % rope.head_dim), first = rope.head_dim - rope.rope_dim;
  if (c < first) return;
  rope_pair_at(a, b, pos, rope.freqs[(c - first) / 2], inverse);
}

}  // namespace di::cuda
