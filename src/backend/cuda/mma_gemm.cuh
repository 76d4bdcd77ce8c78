// Warp tiles of the quantized GEMMs (dense decode linear, grouped MoE experts) on the FP8 tensor
// cores: mma.sync m16n8k32 e4m3 x e4m3 -> f32, one MMA per 32-wide K block, whose partial is scaled
// by the activation and weight E8M0 scales and added to an fp32 accumulator on the CUDA cores (the
// structure of the reference's fp8_gemm / fp4_gemm and of CpuBackend::linear; the block partial itself
// is summed by the tensor core, so results equal the CPU's to rounding, not bit for bit).
//
// Swap-AB: the weight is the MMA's A operand (16 output features x 32 K), the activation its B
// operand (8 tokens x 32 K), so one weight byte serves up to 8 * NT tokens. A warp owns 32 output
// features (two m16 tiles; one FP8 scale row block) and up to 64 tokens (NT n8 tiles).
//
// K permutation: lane (g = lane / 4, q = lane % 4) feeds the MMA with the physical K bytes
// [8q, 8q + 8) of its rows / token (first 4 bytes in fragment register 0 / 2, the next 4 in 1 / 3).
// The sum over a K block does not depend on which MMA k slot a byte occupies, as long as weight and
// activation use the same assignment, so every lane reads 8 contiguous bytes of a weight row (one
// 8-byte load; 4 lanes cover a row's 32-byte sector) and 8 of an activation row.
//
// MXFP4 weights (E2M1, per-row-per-32 E8M0 scales) are widened to E4M3 in registers (every E2M1
// value is exact in E4M3): 4 packed bytes of a row give the lane's 8 codes.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_common.cuh"

namespace di::cuda::mma {

inline constexpr int kWarps = 4;                      // warps per CTA
inline constexpr int kThreads = kWarps * 32;
inline constexpr int kWarpRows = 32;                  // output features per warp
inline constexpr int kCtaRows = kWarps * kWarpRows;   // output features per CTA
inline constexpr int kMaxNt = 8;                      // n8 token tiles per warp
inline constexpr int kTokTile = 8 * kMaxNt;           // tokens per CTA pass

enum class WFmt { kFp8Block, kFp4Row };

// Weight stream: read once per launch, so it bypasses L1.
__device__ __forceinline__ uint2 ld_stream8(const uint8_t* p) {
  uint2 v;
  asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}

// 4 E2M1 codes (nibbles of the low 16 bits, first code lowest) -> 4 E4M3 bytes.
__device__ __forceinline__ uint32_t e2m1x4_to_e4m3x4(uint32_t x) {
  x &= 0xFFFFu;
  // magnitudes 0, .5, 1, 1.5 | 2, 3, 4, 6 as E4M3 bytes, looked up by the 3 magnitude bits
  const uint32_t mag = __byte_perm(0x3C383000u, 0x4C484440u, x & 0x7777u);
  uint32_t n = (x | (x << 8)) & 0x00FF00FFu;  // nibble i -> low nibble of byte i
  n = (n | (n << 4)) & 0x0F0F0F0Fu;
  return mag | ((n << 4) & 0x80808080u);  // the sign (bit 3 of the nibble) -> bit 7 of the byte
}

// d = A (16x32 e4m3) x B (32x8 e4m3), fresh fp32 accumulators.
__device__ __forceinline__ void mma_e4m3(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %11, %12, %13};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f), "f"(0.0f), "f"(0.0f), "f"(0.0f));
}

// Where a warp's tokens live. Per lane: xoff[nt] = byte offset of token (nt*8 + g)'s activation row
// plus 8q (-1: no token), soff[nt][j] = element offset of token (nt*8 + 2q + j)'s scale row (-1: none).
template <int NT>
struct TokenRows {
  int xoff[NT];
  int soff[NT][2];
  int nt_active;  // n8 tiles holding at least one token (warp-uniform)
};

// act_row(i) -> activation row of the i-th token of the tile (i < count), count <= 8 * NT.
template <int NT, class ActRow>
__device__ __forceinline__ TokenRows<NT> token_rows(int count, int K, const ActRow& act_row) {
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3, nb = K / 32;
  TokenRows<NT> t;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int i = nt * 8 + g;
    t.xoff[nt] = i < count ? act_row(i) * K + 8 * q : -1;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int c = nt * 8 + 2 * q + j;
      t.soff[nt][j] = c < count ? act_row(c) * nb : -1;
    }
  }
  t.nt_active = (count + 7) / 8;
  return t;
}

// The warp's fp32 accumulators over K blocks [kb0, kb1): acc[mt][nt][i] is output feature
// row0 + 16 mt + g (+8 for i >= 2) and token nt*8 + 2q + (i & 1) of the tile. w: row-major weight
// [N, K] (FP8 codes, or E2M1 pairs with the even column in the low nibble); wscale: E8M0 scales,
// [ceil(N/32), scale_cols] (FP8) or [N, scale_cols] (FP4); xc / xs: activation E4M3 codes [*, K] and
// their scales as floats [*, K/32].
template <WFmt F, int NT>
__device__ __forceinline__ void warp_tile(const uint8_t* __restrict__ w, const uint8_t* __restrict__ wscale,
                                          int64_t scale_cols, int N, int K, int row0, int kb0, int kb1,
                                          const uint8_t* __restrict__ xc, const float* __restrict__ xs,
                                          const TokenRows<NT>& tok, float (&acc)[2][NT][4]) {
  constexpr int kU = NT >= 4 ? 2 : 4;  // K blocks loaded ahead of their first use
  constexpr int kRowBytesDiv = F == WFmt::kFp8Block ? 1 : 2;
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int64_t row_bytes = K / kRowBytesDiv;
  const uint8_t* wr[2][2];
  const uint8_t* sr[2][2];
  bool ok[2][2];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = row0 + 16 * mt + 8 * h + g;
      ok[mt][h] = r < N;
      const int rr = ok[mt][h] ? r : 0;
      wr[mt][h] = w + rr * row_bytes + (F == WFmt::kFp8Block ? 8 * q : 4 * q);
      sr[mt][h] = wscale + (F == WFmt::kFp8Block ? static_cast<int64_t>(row0 / 32) : static_cast<int64_t>(rr)) * scale_cols;
    }
  for (int kb = kb0; kb < kb1; kb += kU) {
    uint32_t a[kU][2][4];
    if constexpr (F == WFmt::kFp8Block) {
#pragma unroll
      for (int u = 0; u < kU; ++u)
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const uint2 v = kb + u < kb1 && ok[mt][h] ? ld_stream8(wr[mt][h] + (kb + u) * 32) : make_uint2(0u, 0u);
            a[u][mt][h] = v.x;      // row g (h = 0) / g + 8 (h = 1), bytes 8q .. 8q+3
            a[u][mt][2 + h] = v.y;  // bytes 8q+4 .. 8q+7
          }
    } else {
      uint32_t raw[kU][2][2];
#pragma unroll
      for (int u = 0; u < kU; ++u)
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            raw[u][mt][h] = kb + u < kb1 && ok[mt][h]
                                ? __ldg(reinterpret_cast<const uint32_t*>(wr[mt][h] + (kb + u) * 16))
                                : 0u;
#pragma unroll
      for (int u = 0; u < kU; ++u)
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            a[u][mt][h] = e2m1x4_to_e4m3x4(raw[u][mt][h]);
            a[u][mt][2 + h] = e2m1x4_to_e4m3x4(raw[u][mt][h] >> 16);
          }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int k = kb + u;
      if (k >= kb1) break;
      float ws[2][2];  // [mt][h]: the scale of rows 16 mt + 8 h + g
      if constexpr (F == WFmt::kFp8Block) {
        const float s = e8m0_to_float(__ldg(sr[0][0] + k));  // one 32-row block per warp
        ws[0][0] = ws[0][1] = ws[1][0] = ws[1][1] = s;
      } else {
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int h = 0; h < 2; ++h) ws[mt][h] = e8m0_to_float(__ldg(sr[mt][h] + k));
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        if (nt >= tok.nt_active) break;
        const uint2 b = tok.xoff[nt] >= 0 ? __ldg(reinterpret_cast<const uint2*>(xc + tok.xoff[nt] + k * 32))
                                          : make_uint2(0u, 0u);
        const float s0 = tok.soff[nt][0] >= 0 ? __ldg(xs + tok.soff[nt][0] + k) : 0.0f;
        const float s1 = tok.soff[nt][1] >= 0 ? __ldg(xs + tok.soff[nt][1] + k) : 0.0f;
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          float d[4];
          mma_e4m3(d, a[u][mt], b.x, b.y);
          // partial * (act scale * weight scale): both powers of two, so this is the CPU's
          // (partial * xs) * ws unless an intermediate leaves the normal range
          acc[mt][nt][0] = fmaf(d[0], s0 * ws[mt][0], acc[mt][nt][0]);
          acc[mt][nt][1] = fmaf(d[1], s1 * ws[mt][0], acc[mt][nt][1]);
          acc[mt][nt][2] = fmaf(d[2], s0 * ws[mt][1], acc[mt][nt][2]);
          acc[mt][nt][3] = fmaf(d[3], s1 * ws[mt][1], acc[mt][nt][3]);
        }
      }
    }
  }
}

// Visits the warp's accumulators: f(row, token index in the tile, value) for rows < N, tokens < count.
template <int NT, class F>
__device__ __forceinline__ void for_each_acc(const float (&acc)[2][NT][4], int row0, int N, int count, const F& f) {
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = row0 + 16 * mt + 8 * (i >> 1) + g, t = nt * 8 + 2 * q + (i & 1);
        if (r < N && t < count) f(r, t, acc[mt][nt][i]);
      }
}

// Split-K fix-up: after every CTA of a tile group has stored its partials, the last one to arrive
// (counter) sums them in split order, so the result does not depend on the arrival order. Returns
// true in the CTA that must do the sum; it then resets the counter to zero for the next launch.
// Call with the whole CTA, after the partial stores.
__device__ __forceinline__ bool split_last_arrival(unsigned* counter, int splits) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(counter, 1u) == static_cast<unsigned>(splits - 1);
    if (last) *counter = 0u;  // no other CTA of this launch touches it again
  }
  __syncthreads();
  if (last) __threadfence();
  return last;
}

}  // namespace di::cuda::mma
