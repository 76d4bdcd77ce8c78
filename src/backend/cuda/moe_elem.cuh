// Device reads of small float weights stored as BF16, F16 or F32 (router gate and bias, Engram
// q/k weights): element i as fp32, exactly as the CPU's weight_row_f32 / weight_at.
#pragma once

#include <cuda_fp16.h>

#include <string>

#include "backend/cuda/cuda_common.cuh"

namespace di::cuda::moe {

enum class ElemType : int { kBf16, kF16, kF32 };

inline ElemType elem_type(DType t, const char* what) {
  switch (t) {
    case DType::kBF16: return ElemType::kBf16;
    case DType::kF16: return ElemType::kF16;
    case DType::kF32: return ElemType::kF32;
    default: throw Error(std::string(what) + ": expected a BF16, F16 or F32 weight, got " + dtype_name(t));
  }
}

template <ElemType T>
__device__ __forceinline__ float load_elem(const uint8_t* p, int64_t i) {
  if constexpr (T == ElemType::kBf16) return bf16_bits_to_float(reinterpret_cast<const uint16_t*>(p)[i]);
  else if constexpr (T == ElemType::kF16) return __half2float(reinterpret_cast<const __half*>(p)[i]);
  else return reinterpret_cast<const float*>(p)[i];
}

__device__ __forceinline__ float load_elem(const uint8_t* p, ElemType t, int64_t i) {
  switch (t) {
    case ElemType::kBf16: return load_elem<ElemType::kBf16>(p, i);
    case ElemType::kF16: return load_elem<ElemType::kF16>(p, i);
    default: return load_elem<ElemType::kF32>(p, i);
  }
}

// exp / log1p of a float, computed in fp64 and rounded once: correctly rounded but for vanishingly
// rare cases, so almost always the value glibc's expf (< 0.502 ulp) gives the CPU backend, where
// CUDA's expf / log1pf (up to 2 ulp off) would flip a later bf16 rounding now and then.
__device__ __forceinline__ float exp_f32(float x) { return static_cast<float>(exp(static_cast<double>(x))); }
__device__ __forceinline__ float log1p_f32(float x) { return static_cast<float>(log1p(static_cast<double>(x))); }

// SwiGLU of one gate / up pair, before the routing weight and the bf16 rounding: silu(min(g, limit)) *
// clamp(u, +-limit) (no clamps when limit <= 0), in the CPU's expression order (g / (1 + exp(-g)) * u);
// __f*_rn keeps nvcc from fusing into FMAs. std::clamp / std::min semantics: NaN stays NaN.
__device__ __forceinline__ float swiglu_value(float g, float u, float limit) {
  if (limit > 0) {
    u = u < -limit ? -limit : (limit < u ? limit : u);
    g = limit < g ? limit : g;
  }
  return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, exp_f32(-g))), u);
}

}  // namespace di::cuda::moe
