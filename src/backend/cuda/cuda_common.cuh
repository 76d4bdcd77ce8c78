// Shared CUDA helpers: error checks, device views of tensors and weights, and the number formats of
// spec §2.8 as device functions (bit-exact with src/model/quant.h).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "backend/tensor.h"
#include "core/error.h"

#define DI_CUDA_CHECK(expr)                                                                          \
  do {                                                                                               \
    cudaError_t di_err_ = (expr);                                                                    \
    if (di_err_ != cudaSuccess)                                                                      \
      ::di::check_failed(#expr, __FILE__, __LINE__, cudaGetErrorString(di_err_));                    \
  } while (0)

// After a kernel launch: checks the launch (not the completion).
#define DI_CUDA_LAUNCH_CHECK() DI_CUDA_CHECK(cudaGetLastError())

namespace di::cuda {

inline int blocks_for(int64_t n, int threads) { return static_cast<int>((n + threads - 1) / threads); }

// Device pointer of an uploaded weight's data / scale.
inline const uint8_t* wdata(const Weight& w) {
  DI_CHECK_MSG(w.device != nullptr, "weight was not prepared on the CUDA backend");
  return static_cast<const uint8_t*>(w.device.get());
}
// The scale bytes follow the data bytes in the same device allocation (see prepare()).
int64_t weight_data_bytes(const Weight& w);
inline const uint8_t* wscale(const Weight& w) { return wdata(w) + weight_data_bytes(w); }

// ---- number formats (device) ----------------------------------------------------------------------

__device__ __forceinline__ float round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

__device__ __forceinline__ float bf16_bits_to_float(uint16_t b) { return __uint_as_float(static_cast<uint32_t>(b) << 16); }

// Selects, not branches: the GEMM tiles convert four weight scales per K block (as branches, ~40
// instructions per block).
__device__ __forceinline__ float e8m0_to_float(uint8_t e) {
  const uint32_t bits = static_cast<uint32_t>(e) << 23;
  return __uint_as_float(e == 255 ? 0x7fc00000u : (e == 0 ? 0x00400000u : bits));
}

__device__ __forceinline__ float e4m3_to_float(uint8_t c) {
  const int e = (c >> 3) & 15, m = c & 7;
  float v;
  if (e == 15 && m == 7) v = __int_as_float(0x7fc00000);
  else if (e == 0) v = static_cast<float>(m) * 0.001953125f;  // m * 2^-9
  else v = ldexpf(static_cast<float>(8 + m), e - 10);
  return (c & 0x80) ? -v : v;
}

__device__ __forceinline__ float e2m1_to_float(uint8_t c) {
  const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  float v = mag[c & 7];
  return (c & 8) ? -v : v;
}

// ---- exact reductions (device) ----------------------------------------------------------------------

// cpu::dot's final step: its eight interleaved fp32 chains (chain j sums the products i = j mod 8)
// combined as ((c0+c1)+(c2+c3))+((c4+c5)+(c6+c7)), plus the sequential tail.
__device__ __forceinline__ float sum_dot_chains(const float* c, float tail) {
  return __fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(c[0], c[1]), __fadd_rn(c[2], c[3])),
                             __fadd_rn(__fadd_rn(c[4], c[5]), __fadd_rn(c[6], c[7]))),
                   tail);
}

// cpu::dot(x, x, n) bit for bit, computed by a whole CTA of kThreads threads; every thread gets the
// result. The CPU sums eight interleaved fp32 chains (chain j: x[8i + j]^2, i ascending), then a
// sequential tail, combined as ((s0+s1)+(s2+s3))+((s4+s5)+(s6+s7)) + tail. One warp alone was
// latency-bound (a 512-float batch's 64 adds per chain take far less than a load's round trip), so
// warps 1.. stage the row in shared memory piece by piece, every load of a piece in flight at once,
// while lanes 0-7 of warp 0 run the chains over the previous piece: the time is the chain of n/8
// dependent adds (~1.4 us at n = 5120, ~5.6 us at 20480). Call from every thread of the CTA, once.
template <int kThreads>
__device__ __forceinline__ float block_sum_squares_exact(const float* __restrict__ x, int64_t n) {
  static_assert(kThreads % 32 == 0 && kThreads >= 64, "one chain warp and at least one loading warp");
  constexpr int kPiece = 2048;  // floats per piece, a multiple of 8 (two pieces: 16 KB of shared memory)
  __shared__ float piece[2][kPiece];
  __shared__ float chains[9];  // eight chain sums, then the tail
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t n8 = n - n % 8;
  const int64_t pieces = (n8 + kPiece - 1) / kPiece;
  constexpr int kLoaders = kThreads - 32;  // warps 1..
  constexpr int kLoads = (kPiece + kLoaders - 1) / kLoaders;
  auto stage = [&](int64_t p) {  // by warps 1..: every load first, then the stores
    float v[kLoads];
#pragma unroll
    for (int k = 0; k < kLoads; ++k) {
      const int i = threadIdx.x - 32 + k * kLoaders;
      const int64_t g = p * kPiece + i;
      v[k] = i < kPiece && g < n8 ? x[g] : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < kLoads; ++k) {
      const int i = threadIdx.x - 32 + k * kLoaders;
      if (i < kPiece) piece[p & 1][i] = v[k];
    }
  };
  if (warp > 0 && pieces > 0) stage(0);
  __syncthreads();
  float s = 0.0f;
  for (int64_t p = 0; p < pieces; ++p) {
    if (warp > 0) {
      if (p + 1 < pieces) stage(p + 1);
    } else if (lane < 8) {
      const float* src = piece[p & 1];
      const int64_t left = n8 - p * kPiece;
      const int len = left < kPiece ? static_cast<int>(left) : kPiece;  // a multiple of 8
#pragma unroll 16
      for (int i = lane; i < len; i += 8) s = __fadd_rn(s, __fmul_rn(src[i], src[i]));
    }
    __syncthreads();
  }
  if (warp == 0) {
    if (lane < 8) chains[lane] = s;
    if (lane == 8) {
      float tail = 0.0f;
      for (int64_t i = n8; i < n; ++i) tail = __fadd_rn(tail, __fmul_rn(x[i], x[i]));
      chains[8] = tail;
    }
  }
  __syncthreads();
  return sum_dot_chains(chains, chains[8]);
}

}  // namespace di::cuda
