// Values of synthetic (random) checkpoint tensors as a pure function of (tensor seed, element
// index), so the same bytes can be produced on the host (CPU backend, small models) or directly in
// device memory (src/backend/cuda/synthetic_fill.cu) without ever holding a 100 GB checkpoint in
// host memory. Distributions follow checkpoint_writer.cpp: FP8 e4m3 codes that are never NaN, E8M0
// scales sized so a dot product over fan_in inputs stays O(1), any E2M1 nibble, norms around 1.
// Header-only and CUDA-agnostic: DI_HD marks the functions __host__ __device__ under nvcc.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define DI_HD __host__ __device__ __forceinline__
#else
#define DI_HD inline
#endif

namespace di::synthetic {

// What the bytes of one tensor hold (mirrors TensorKind of checkpoint_validate.h, kept separate so
// this header needs nothing but <cstdint>).
enum class FillKind : uint8_t {
  kFp8Code,       // F8_E4M3: |value| in [0.25, 3.75], never the NaN codes
  kFp4Pair,       // I8: two E2M1 codes (every nibble is valid)
  kE8m0Scale,     // F8_E8M0: 2^e with code_rms * 2^e ~ 1/sqrt(fan_in), e in [-20, 0]
  kE8m0TableRow,  // F8_E8M0 of Engram table rows: 2^-2 .. 2^-1
  kUniform,       // BF16 / F32 uniform in [lo, hi)
};

struct FillSpec {
  FillKind kind = FillKind::kUniform;
  uint8_t elem_bytes = 1;  // 1 (codes, scales), 2 (bf16), 4 (f32)
  uint64_t seed = 0;       // per tensor
  float lo = 0, hi = 0;    // kUniform
  int8_t scale_exp = 0;    // kE8m0Scale: the exponent before jitter
};

DI_HD uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// 64 random bits of element i (a counter-based generator: any element in any order).
DI_HD uint64_t element_bits(uint64_t seed, uint64_t i) { return mix64(seed + (i + 1) * 0x9e3779b97f4a7c15ull); }

DI_HD uint16_t float_to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);  // round to nearest even (finite inputs)
  return static_cast<uint16_t>(u >> 16);
}

// Writes element i of the tensor described by `spec` to `out` (spec.elem_bytes bytes).
DI_HD void fill_element(const FillSpec& spec, uint64_t i, uint8_t* out) {
  const uint64_t r = element_bits(spec.seed, i);
  switch (spec.kind) {
    case FillKind::kFp8Code: {
      const unsigned c = static_cast<unsigned>(r & 63);  // sign | exponent 5..8 | mantissa
      *out = static_cast<uint8_t>(((c >> 5) << 7) | ((5 + ((c >> 3) & 3)) << 3) | (c & 7));
      return;
    }
    case FillKind::kFp4Pair: *out = static_cast<uint8_t>(r); return;
    case FillKind::kE8m0Scale: {
      int e = spec.scale_exp - static_cast<int>(r & 1);
      e = e < -20 ? -20 : (e > 0 ? 0 : e);
      *out = static_cast<uint8_t>(127 + e);
      return;
    }
    case FillKind::kE8m0TableRow: *out = static_cast<uint8_t>(125 + (r & 1)); return;
    case FillKind::kUniform: {
      const float u = static_cast<float>(static_cast<double>(r >> 11) * 0x1.0p-53);
      const float v = spec.lo + (spec.hi - spec.lo) * u;
      if (spec.elem_bytes == 2) {
        const uint16_t h = float_to_bf16_bits(v);
        std::memcpy(out, &h, 2);
      } else {
        std::memcpy(out, &v, 4);
      }
      return;
    }
  }
}

// The E8M0 exponent that makes code_rms * 2^e ~ 1/sqrt(fan_in) (host only: used to build specs).
inline int8_t scale_exponent(int64_t fan_in, double code_rms) {
  const double f = static_cast<double>(fan_in < 1 ? 1 : fan_in);
  long e = std::lround(-std::log2(code_rms * std::sqrt(f)));
  return static_cast<int8_t>(e < -20 ? -20 : (e > 0 ? 0 : e));
}

}  // namespace di::synthetic
