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

// SMs of the current device (queried once; launch plans size their grids by it).
int sm_count();

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

// RMSNorm's scale from a row's sum of squares, in the CPU's fp32 order: 1 / sqrt(sum_sq / n + eps).
__device__ __forceinline__ float rms_scale(float sum_sq, int64_t n, float eps) {
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(sum_sq, static_cast<float>(n)), eps)));
}

// cpu::sum_squares's final step over its 256 chains, chain t being thread t's `s`: the same pairwise
// tree -- shared memory down to 32 partials, then shuffles. With 128 threads, thread t's `s` must be
// chains t + (t + 128), the tree's first level. Every thread gets the result; call from every thread
// of the CTA, once.
template <int kThreads>
__device__ __forceinline__ float block_chains_total(float s) {
  static_assert(kThreads == 256 || kThreads == 128, "one thread per chain of cpu::sum_squares, or per pair");
  __shared__ float part[kThreads];
  __shared__ float total;
  part[threadIdx.x] = s;
  __syncthreads();
#pragma unroll
  for (int h = kThreads / 2; h >= 32; h /= 2) {
    if (threadIdx.x < h) part[threadIdx.x] = __fadd_rn(part[threadIdx.x], part[threadIdx.x + h]);
    __syncthreads();
  }
  if (threadIdx.x < 32) {
    float v = part[threadIdx.x];
#pragma unroll
    for (int h = 16; h > 0; h /= 2) v = __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, h));
    if (threadIdx.x == 0) total = v;
  }
  __syncthreads();
  return total;
}

// Clamped loads: `i < n ? x[i] : 0` (or an `if` around a load) can compile to a branch per load whose
// join waits for the load, so a batch of such loads costs one memory round trip per load
// (bench/gpu/probe_split_sum.cu: a sum over 80 splits ~14 us against ~1 us). ptxas turns many such
// branches into predicated loads, not all: the SASS says which (bench/RESULTS.md). Where it did not,
// hot loops load x[min(i, n - 1)] unconditionally and leave the extra values out of the arithmetic.

// Where no clamped address is at hand, a predicated load: zeros when `on` is false, without a branch.
// asm volatile: issued where written (a load whose value is used under a condition is otherwise
// sunk into that condition's branch).
__device__ __forceinline__ uint4 ldg16_if(bool on, const void* p) {
  uint4 v = make_uint4(0u, 0u, 0u, 0u);
  asm volatile("{\n .reg .pred q;\n setp.ne.u32 q, %4, 0;\n @q ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%5];\n}"
      : "+r"(v.x), "+r"(v.y), "+r"(v.z), "+r"(v.w)
      : "r"(static_cast<unsigned>(on)), "l"(p));
  return v;
}
__device__ __forceinline__ uint2 ldg8_if(bool on, const void* p) {
  uint2 v = make_uint2(0u, 0u);
  asm volatile("{\n .reg .pred q;\n setp.ne.u32 q, %2, 0;\n @q ld.global.nc.v2.u32 {%0, %1}, [%3];\n}"
      : "+r"(v.x), "+r"(v.y)
      : "r"(static_cast<unsigned>(on)), "l"(p));
  return v;
}
__device__ __forceinline__ uint32_t ldg4_if(bool on, const void* p) {
  uint32_t v = 0u;
  asm volatile("{\n .reg .pred q;\n setp.ne.u32 q, %1, 0;\n @q ld.global.nc.u32 %0, [%2];\n}"
      : "+r"(v)
      : "r"(static_cast<unsigned>(on)), "l"(p));
  return v;
}
__device__ __forceinline__ uint32_t ldg1_if(bool on, const void* p) {
  uint32_t v = 0u;
  asm volatile("{\n .reg .pred q;\n setp.ne.u32 q, %1, 0;\n @q ld.global.nc.u8 %0, [%2];\n}"
      : "+r"(v)
      : "r"(static_cast<unsigned>(on)), "l"(p));
  return v;
}

// cpu::sum_squares(x, n) bit for bit, computed by a CTA of 256 threads: thread t runs chain t (the
// elements i = t mod 256, loads 32 at a time), then block_chains_total. Call from every thread of the
// CTA, once. With cpu::dot's 8 chains this was a chain of n / 8 dependent adds (~5.6 us at n = 20480).
template <int kThreads>
__device__ __forceinline__ float block_sum_squares_exact(const float* __restrict__ x, int64_t n) {
  constexpr int kBatch = 32;
  float s = 0.0f;
  for (int64_t i0 = threadIdx.x; i0 < n; i0 += kBatch * kThreads) {
    float v[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) v[k] = x[min(i0 + k * kThreads, n - 1)];  // clamped loads (above)
#pragma unroll
    for (int k = 0; k < kBatch; ++k)
      if (i0 + k * kThreads < n) s = __fadd_rn(s, __fmul_rn(v[k], v[k]));
  }
  return block_chains_total<kThreads>(s);
}

// The same sum by a CTA of 128 threads (the GEMM tiles): thread t runs chains t and t + 128 (elements
// i = t, t + 256, ... and i = t + 128, t + 384, ...) and adds them as the tree's first level would.
__device__ __forceinline__ float block_sum_squares_exact128(const float* __restrict__ x, int64_t n) {
  constexpr int kBatch = 8;
  float s0 = 0.0f, s1 = 0.0f;
  for (int64_t i0 = threadIdx.x; i0 < n; i0 += kBatch * 256) {
    float v[kBatch][2];
#pragma unroll
    for (int k = 0; k < kBatch; ++k)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        v[k][c] = x[min(i0 + k * 256 + c * 128, n - 1)];  // clamped loads (above)
      }
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      if (i0 + k * 256 < n) s0 = __fadd_rn(s0, __fmul_rn(v[k][0], v[k][0]));
      if (i0 + k * 256 + 128 < n) s1 = __fadd_rn(s1, __fmul_rn(v[k][1], v[k][1]));
    }
  }
  return block_chains_total<128>(__fadd_rn(s0, s1));
}

// Split fix-up: after every CTA of a group has stored its part, the last one to arrive (counter)
// finishes the group -- split-K sums in split order, so the result does not depend on the arrival
// order. Returns true in the CTA that must finish; it then resets the counter to zero for the next
// launch, and sees every other CTA's stores (read them past L1: __ldcg). Call with the whole CTA.
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

}  // namespace di::cuda
