// Device helpers shared by the attention / mHC / selection kernels: small-weight element reads, the
// CPU's exact fp32 summation order (cpu::dot), a correctly rounded exp, and sortable keys.
//
// Bit-exactness with the CPU backend: the CPU build targets baseline x86-64 (no FMA), so its
// `acc += a * b` is a rounded multiply then a rounded add. Kernels that must reproduce CPU bits
// spell that as __fadd_rn(acc, __fmul_rn(a, b)) so nvcc cannot contract it into an FMA.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_scratch.cuh"
#include "backend/tensor.h"
#include "core/error.h"

namespace di::cuda::attn {

// Stored dtype of a small float weight (sinks, mHC scales / bases / fn), as a kernel argument.
enum class WType : int { kBf16 = 0, kF16 = 1, kF32 = 2 };

inline WType weight_type(const Weight& w, const char* op, const char* what) {
  switch (w.dtype) {
    case DType::kBF16: return WType::kBf16;
    case DType::kF16: return WType::kF16;
    case DType::kF32: return WType::kF32;
    default:
      throw Error(std::string("cuda op ") + op + ": weight '" + what + "' has dtype " + dtype_name(w.dtype) +
                  ", expected BF16, F16 or F32");
  }
}

// Element i of a float weight in device memory (exact conversion to fp32, as cpu::weight_at).
__device__ __forceinline__ float weight_elem(const uint8_t* p, WType t, int64_t i) {
  switch (t) {
    case WType::kBf16: return bf16_bits_to_float(reinterpret_cast<const uint16_t*>(p)[i]);
    case WType::kF16: return __half2float(__ushort_as_half(reinterpret_cast<const uint16_t*>(p)[i]));
    default: return reinterpret_cast<const float*>(p)[i];
  }
}

// std::exp on a float as glibc's expf computes it (correctly rounded in practice): exp in double,
// rounded once. Used where CPU bits matter (mHC mixes, softmax pooling).
__device__ __forceinline__ float exp_ref(float x) { return static_cast<float>(exp(static_cast<double>(x))); }

// std::max(a, b) for floats: `a < b ? b : a` (keeps a on ties and on NaN).
__device__ __forceinline__ float std_max(float a, float b) { return a < b ? b : a; }

// cpu::dot(a, b, n) bit for bit: eight interleaved fp32 partial sums over the multiple-of-8 part,
// a sequential tail, combined as ((s0+s1)+(s2+s3))+((s4+s5)+(s6+s7)) + tail. One thread.
__device__ __forceinline__ float cpu_dot_exact(const float* a, const float* b, int64_t n) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
#pragma unroll
    for (int j = 0; j < 8; ++j) s[j] = __fadd_rn(s[j], __fmul_rn(a[i + j], b[i + j]));
  }
  float tail = 0;
  for (; i < n; ++i) tail = __fadd_rn(tail, __fmul_rn(a[i], b[i]));
  return sum_dot_chains(s, tail);
}

// Selection key: smaller key = better (larger value). -0 and +0 share a key, so keys are equal
// exactly when the CPU's float comparisons call the values equal (no NaNs in scores).
__device__ __forceinline__ uint32_t desc_key(float v) {
  uint32_t b = __float_as_uint(v);
  if (b == 0x80000000u) b = 0;
  return (b & 0x80000000u) ? b : (~b & 0x7fffffffu);
}
// The key of -inf: blocks / positions with this key are not finite.
constexpr uint32_t kNegInfKey = 0xff800000u;

// Per-call device scratch (stream-ordered; see cuda_scratch.cuh).
using cuda::Scratch;
using cuda::upload;

}  // namespace di::cuda::attn
