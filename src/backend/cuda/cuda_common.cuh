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

__device__ __forceinline__ float e8m0_to_float(uint8_t e) {
  if (e == 255) return __int_as_float(0x7fc00000);
  if (e == 0) return __uint_as_float(0x00400000u);
  return __uint_as_float(static_cast<uint32_t>(e) << 23);
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

// cpu::dot(x, x, n) bit for bit, computed by one whole warp (every lane gets the result). The CPU sums
// eight interleaved fp32 chains (chain j: x[8i + j]^2, i ascending), then a sequential tail, combined
// as ((s0+s1)+(s2+s3))+((s4+s5)+(s6+s7)) + tail. Here the warp loads 32 consecutive floats per
// step (lanes j, j+8, j+16, j+24 hold chain j's next four terms) and lane j < 8 adds them in order
// after shuffles; loads run one batch ahead so the chain of n/8 dependent adds, not the memory
// latency, sets the time. Padding beyond the multiple-of-8 part adds +0, which leaves a sum of squares
// unchanged.
__device__ __forceinline__ float warp_sum_squares_exact(const float* __restrict__ x, int64_t n) {
  constexpr unsigned kAll = 0xffffffffu;
  constexpr int kU = 16;  // 32-float groups per batch
  const int lane = threadIdx.x & 31;
  const int64_t n8 = n - n % 8;
  float s = 0.0f;
  float cur[kU], nxt[kU];
  auto load = [&](float* v, int64_t base) {
#pragma unroll
    for (int k = 0; k < kU; ++k) {
      const int64_t i = base + 32 * k + lane;
      const float t = i < n8 ? x[i] : 0.0f;
      v[k] = __fmul_rn(t, t);
    }
  };
  load(cur, 0);
  for (int64_t base = 0; base < n8; base += 32 * kU) {
    if (base + 32 * kU < n8) load(nxt, base + 32 * kU);
#pragma unroll
    for (int k = 0; k < kU; ++k) {
      const float b = __shfl_down_sync(kAll, cur[k], 8);
      const float c = __shfl_down_sync(kAll, cur[k], 16);
      const float d = __shfl_down_sync(kAll, cur[k], 24);
      s = __fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(s, cur[k]), b), c), d);
    }
#pragma unroll
    for (int k = 0; k < kU; ++k) cur[k] = nxt[k];
  }
  float tail = 0.0f;
  if (lane == 0)
    for (int64_t i = n8; i < n; ++i) tail = __fadd_rn(tail, __fmul_rn(x[i], x[i]));
  float c[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) c[k] = __shfl_sync(kAll, s, k);
  tail = __shfl_sync(kAll, tail, 0);
  return __fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(c[0], c[1]), __fadd_rn(c[2], c[3])),
                             __fadd_rn(__fadd_rn(c[4], c[5]), __fadd_rn(c[6], c[7]))),
                   tail);
}

}  // namespace di::cuda
