// Device versions of the reference quantizers of src/model/quant.cpp (spec §2.8), bit-exact with
// them (same fp32 operations in the same order; divisions and products are spelled __fdiv_rn /
// __fmul_rn so no flag or contraction can change them). Non-finite blocks too: the encoders ignore
// the sign of a NaN (E4M3 0x7F, E2M1 code 0) on both sides, so the x86 negative default NaN and the
// GPU's positive canonical NaN quantize alike; NaN outputs may still differ in sign / payload bits.
//
// Three levels:
//  - scalar formats: bf16 rounding (same bits as quant::float_to_bf16), E4M3 / E2M1 encoders, the
//    power-of-two scale exponent (fp32-bit trick);
//  - per-element steps of the quantizers (code of one value given its block scale, qdq value);
//  - row quantizers: warp-cooperative (all 32 lanes call; lane i holds element i of each 32-chunk)
//    and serial (one thread, mirrors the CPU loops; for small or odd uses).
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_common.cuh"

namespace di::cuda::dq {

inline constexpr float kFp8Max = 448.0f;
inline constexpr float kFp4Max = 6.0f;
inline constexpr float kFp8MaxInv = 1.0f / 448.0f;           // fp32(1/448), as the reference
inline constexpr float kFp4MaxInv = 1.0f / 6.0f;             // fp32(1/6)
inline constexpr float kFp8AmaxFloor = 1e-4f;                // act_quant clamp_min(1e-4)
inline constexpr float kFp4E4M3AmaxFloor = 6.0f * 0x1p-9f;   // fp4_act_quant, E4M3-scale path
inline constexpr float kFp4Ue8m0AmaxFloor = 6.0f * 0x1p-126f;  // fp4_act_quant, E8M0-scale path
inline constexpr int kFp8Block = 32;
inline constexpr int kFp4E4M3Block = 16;
inline constexpr int kFp4Ue8m0Block = 32;
inline constexpr unsigned kFullMask = 0xffffffffu;

// ---- scalar formats ---------------------------------------------------------------------------------

// 4 E4M3 codes (bytes of u, low first) -> 4 floats, exact (E4M3 is a subset of f16).
__device__ __forceinline__ void e4m3x4(uint32_t u, float* out) {
  const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(u & 0xFFFFu), __NV_E4M3);
  const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(u >> 16), __NV_E4M3);
  const float2 a = __half22float2(__half2(lo)), b = __half22float2(__half2(hi));
  out[0] = a.x;
  out[1] = a.y;
  out[2] = b.x;
  out[3] = b.y;
}

// quant::float_to_bf16: RNE; NaN keeps sign and gets the quiet bit; overflow rounds to inf.
__device__ __forceinline__ uint16_t float_to_bf16_bits(float x) {
  uint32_t u = __float_as_uint(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

__device__ __forceinline__ float round_bf16(float x) {
  return __uint_as_float(static_cast<uint32_t>(float_to_bf16_bits(x)) << 16);
}

// torch.clamp(v, -lim, lim): NaN passes through.
__device__ __forceinline__ float clamp_sym(float v, float lim) { return v < -lim ? -lim : (v > lim ? lim : v); }

// quant::float_to_e4m3 (torch's .to(float8_e4m3fn)): RNE; |x| >= 480, inf -> NaN (0x7F | sign);
// NaN -> 0x7F.
__device__ __forceinline__ uint8_t float_to_e4m3(float x) {
  const uint32_t u = __float_as_uint(x);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return 0x7Fu;
  if (a >= 0x43F00000u) return static_cast<uint8_t>(sign | 0x7Fu);
  if (a < 0x3C800000u) {
    // subnormal grid m * 2^-9: m = RNE(|x| * 512) in 0..8 (8 is the smallest normal, code 0x08)
    const uint32_t m = __float2uint_rn(__fmul_rn(__uint_as_float(a), 512.0f));
    return static_cast<uint8_t>(sign | m);
  }
  const uint32_t exp8 = (a >> 23) - 127u + 7u;
  const uint32_t mant = a & 0x7FFFFFu;
  uint32_t code = (exp8 << 3) | (mant >> 20);
  const uint32_t rest = mant & 0xFFFFFu;
  if (rest > 0x80000u || (rest == 0x80000u && (code & 1u))) ++code;
  return static_cast<uint8_t>(sign | code);
}

// The reference's _to_e4m3_satfinite: clamp to +-448 first (NaN stays NaN).
__device__ __forceinline__ uint8_t float_to_e4m3_satfinite(float x) { return float_to_e4m3(clamp_sym(x, kFp8Max)); }

// quant::float_to_e2m1: nearest grid value, ties to the even code; sign bit = sign bit of x; NaN -> 0.
__device__ __forceinline__ uint8_t float_to_e2m1(float x) {
  if (x != x) return 0;
  const float mag = fabsf(x);
  uint32_t code = (mag > 0.25f) + (mag > 0.75f) + (mag == 0.75f) + (mag > 1.25f) + (mag > 1.75f) + (mag == 1.75f) +
                  (mag > 2.5f) + (mag > 3.5f) + (mag == 3.5f) + (mag > 5.0f);
  return static_cast<uint8_t>(code | ((__float_as_uint(x) >> 28) & 8u));
}

// E2M1 code (low 4 bits) -> float without a table: magnitudes >= 1 are (idx + 252) << 22 as fp32 bits.
__device__ __forceinline__ float e2m1_to_float_fast(uint32_t code) {
  const uint32_t idx = code & 7u;
  const float mag = idx >= 2u ? __uint_as_float((idx + 252u) << 22) : 0.5f * static_cast<float>(idx);
  return __uint_as_float(__float_as_uint(mag) | ((code & 8u) << 28));
}

// quant::round_scale_exponent: biased exponent of 2^ceil(log2(amax * max_inv)) from the fp32 bits.
__device__ __forceinline__ int round_scale_exponent(float amax, float max_inv) {
  const uint32_t bits = __float_as_uint(__fmul_rn(amax, max_inv));
  return static_cast<int>((bits >> 23) & 0xFFu) + ((bits & 0x7FFFFFu) != 0u ? 1 : 0);
}

// The scale as the reference builds it (int32 shift: may be inf or -0.0 for non-finite amax).
__device__ __forceinline__ float scale_from_exponent(int biased_exp) {
  return __uint_as_float(static_cast<uint32_t>(biased_exp) << 23);
}

__device__ __forceinline__ uint8_t e8m0_byte(int biased_exp) {
  return static_cast<uint8_t>(biased_exp >= 255 ? 255 : biased_exp);
}

// NaN-propagating max (torch amax): NaN wins over anything.
__device__ __forceinline__ float nanmax(float a, float b) { return (a > b || a != a) ? a : b; }

// ---- per-element steps ------------------------------------------------------------------------------

// RMSNorm of one element: bf16(w * (x * inv)), inv the row's inverse RMS (cpu rmsnorm's expression order; the
// explicit roundings keep nvcc from fusing into an FMA).
__device__ __forceinline__ float rms_normed(float x, float w, float inv) {
  return round_bf16(__fmul_rn(w, __fmul_rn(x, inv)));
}

// (1) FP8 / UE8M0: code of x in a block with scale s; the qdq value.
__device__ __forceinline__ uint8_t fp8_code(float x, float s) { return float_to_e4m3_satfinite(__fdiv_rn(round_bf16(x), s)); }
__device__ __forceinline__ float fp8_qdq_value(float x, float s) {
  return round_bf16(__fmul_rn(e4m3_to_float(fp8_code(x, s)), s));
}
// (2)/(3) FP4: code of x given the block scale; the qdq value.
__device__ __forceinline__ uint8_t fp4_code(float x, float s) {
  return float_to_e2m1(clamp_sym(__fdiv_rn(round_bf16(x), s), kFp4Max));
}
__device__ __forceinline__ float fp4_qdq_value(float x, float s) {
  return round_bf16(__fmul_rn(e2m1_to_float_fast(fp4_code(x, s)), s));
}
// (2) the E4M3 block scale code from the block amax (the reference divides by 6.0 here).
__device__ __forceinline__ uint8_t fp4_e4m3_scale_code(float amax) { return float_to_e4m3_satfinite(__fdiv_rn(amax, kFp4Max)); }

// ---- warp-cooperative building block ----------------------------------------------------------------

// amax of |bf16(v)| over aligned groups of W lanes (W = 16 or 32), NaN-propagating, then
// clamp_min(floor). Every lane of the warp must call it.
template <int W>
__device__ __forceinline__ float group_amax(float v, float floor) {
  float a = fabsf(round_bf16(v));
#pragma unroll
  for (int o = W / 2; o > 0; o >>= 1) a = nanmax(a, __shfl_xor_sync(kFullMask, a, o));
  return a < floor ? floor : a;
}

// The quantized GEMMs' activation quantizer (cuda::dense::quantize_activation): this lane's value v of
// a 32-value block -> its E4M3 code, and the block's E8M0 scale as a float. All 32 lanes call it.
__device__ __forceinline__ uint8_t act_quant_lane(float v, float& scale) {
  const int e = round_scale_exponent(group_amax<32>(v, kFp8AmaxFloor), kFp8MaxInv);
  scale = e8m0_to_float(e8m0_byte(e));
  return fp8_code(v, scale_from_exponent(e));
}

// Element `at` of an RMS-normalized row (x times the row's inverse RMS, times the norm weight w, bf16), written
// to normed (when set) and quantized by act_quant_lane into codes / scales (the next FP8 linear's input). The
// warp's lanes hold 32 consecutive elements. rmsnorm_quant_kernel's step.
__device__ __forceinline__ void norm_quant_elem(int64_t at, float x, float w, float inv, float* normed, uint8_t* codes,
                                                float* scales) {
  const float v = rms_normed(x, w, inv);
  if (normed) normed[at] = v;
  float scale;
  codes[at] = act_quant_lane(v, scale);
  if ((threadIdx.x & 31) == 0) scales[at / 32] = scale;
}

// ---- warp row quantizers (all 32 lanes call; n % 32 == 0) -----------------------------------------------

// (1) quant::fp8_ue8m0_quant with block 32: codes [n] e4m3, scales [n/32] e8m0.
__device__ __forceinline__ void warp_fp8_ue8m0_quant_row(const float* x, int n, uint8_t* codes, uint8_t* scales) {
  const int lane = threadIdx.x & 31;
  for (int base = 0; base < n; base += 32) {
    const float v = x[base + lane];
    const int e = round_scale_exponent(group_amax<32>(v, kFp8AmaxFloor), kFp8MaxInv);
    codes[base + lane] = fp8_code(v, scale_from_exponent(e));
    if (lane == 0) scales[base / 32] = e8m0_byte(e);
  }
}

// (1) quant::fp8_ue8m0_qdq with block 32, of this lane's value v of the warp's 32-value block.
__device__ __forceinline__ float lane_fp8_ue8m0_qdq(float v) {
  return fp8_qdq_value(v, scale_from_exponent(round_scale_exponent(group_amax<32>(v, kFp8AmaxFloor), kFp8MaxInv)));
}

// (2) quant::fp4_e4m3_quant: packed [n/2] (even element low nibble), scales [n/16] e4m3.
__device__ __forceinline__ void warp_fp4_e4m3_quant_row(const float* x, int n, uint8_t* packed, uint8_t* scales) {
  const int lane = threadIdx.x & 31;
  for (int base = 0; base < n; base += 32) {
    const float v = x[base + lane];
    const uint8_t sc = fp4_e4m3_scale_code(group_amax<16>(v, kFp4E4M3AmaxFloor));
    const uint32_t c = fp4_code(v, e4m3_to_float(sc));
    const uint32_t hi = __shfl_down_sync(kFullMask, c, 1);
    if ((lane & 1) == 0) packed[(base + lane) / 2] = static_cast<uint8_t>(c | (hi << 4));
    if ((lane & 15) == 0) scales[(base + lane) / 16] = sc;
  }
}

// (2) quant::fp4_e4m3_qdq of this lane's value v (blocks of 16 lanes).
__device__ __forceinline__ float lane_fp4_e4m3_qdq(float v) {
  return fp4_qdq_value(v, e4m3_to_float(fp4_e4m3_scale_code(group_amax<16>(v, kFp4E4M3AmaxFloor))));
}

// (3) quant::fp4_ue8m0_quant: packed [n/2], scales [n/32] e8m0.
__device__ __forceinline__ void warp_fp4_ue8m0_quant_row(const float* x, int n, uint8_t* packed, uint8_t* scales) {
  const int lane = threadIdx.x & 31;
  for (int base = 0; base < n; base += 32) {
    const float v = x[base + lane];
    const int e = round_scale_exponent(group_amax<32>(v, kFp4Ue8m0AmaxFloor), kFp4MaxInv);
    const uint32_t c = fp4_code(v, scale_from_exponent(e));
    const uint32_t hi = __shfl_down_sync(kFullMask, c, 1);
    if ((lane & 1) == 0) packed[(base + lane) / 2] = static_cast<uint8_t>(c | (hi << 4));
    if (lane == 0) scales[base / 32] = e8m0_byte(e);
  }
}

// (3) quant::fp4_ue8m0_qdq of this lane's value v (blocks of 32 lanes).
__device__ __forceinline__ float lane_fp4_ue8m0_qdq(float v) {
  return fp4_qdq_value(v, scale_from_exponent(round_scale_exponent(group_amax<32>(v, kFp4Ue8m0AmaxFloor), kFp4MaxInv)));
}

// ---- dequantizers of the packed forms (element i of a row; any thread mapping) ----------------------

__device__ __forceinline__ float fp8_ue8m0_dequant(uint8_t code, float scale) {  // scale: the block's E8M0 value
  return round_bf16(__fmul_rn(e4m3_to_float(code), scale));
}
__device__ __forceinline__ float fp8_ue8m0_dequant_at(const uint8_t* codes, const uint8_t* scales, int i) {
  return fp8_ue8m0_dequant(codes[i], e8m0_to_float(scales[i / 32]));
}
__device__ __forceinline__ float fp4_e4m3_dequant_at(const uint8_t* packed, const uint8_t* scales, int i) {
  const uint32_t code = (i & 1) ? (packed[i / 2] >> 4) : (packed[i / 2] & 0x0Fu);
  return round_bf16(__fmul_rn(e2m1_to_float_fast(code), e4m3_to_float(scales[i / 16])));
}
__device__ __forceinline__ float fp4_ue8m0_dequant_at(const uint8_t* packed, const uint8_t* scales, int i) {
  const uint32_t code = (i & 1) ? (packed[i / 2] >> 4) : (packed[i / 2] & 0x0Fu);
  return round_bf16(__fmul_rn(e2m1_to_float_fast(code), e8m0_to_float(scales[i / 32])));
}

// ---- serial row quantizers (one thread; mirror the CPU loops) ----------------------------------------

__device__ __forceinline__ float serial_amax(const float* x, int n, float floor) {
  float a = 0.0f;
  for (int i = 0; i < n; ++i) a = nanmax(fabsf(round_bf16(x[i])), a);
  return a < floor ? floor : a;
}

// quant::fp8_ue8m0_quant with any block size (n % block == 0).
__device__ __forceinline__ void serial_fp8_ue8m0_quant(const float* x, int n, int block, uint8_t* codes, uint8_t* scales) {
  for (int b = 0; b < n / block; ++b) {
    const int e = round_scale_exponent(serial_amax(x + b * block, block, kFp8AmaxFloor), kFp8MaxInv);
    const float s = scale_from_exponent(e);
    for (int i = 0; i < block; ++i) codes[b * block + i] = fp8_code(x[b * block + i], s);
    scales[b] = e8m0_byte(e);
  }
}

// quant::fp4_e4m3_quant (n % 16 == 0).
__device__ __forceinline__ void serial_fp4_e4m3_quant(const float* x, int n, uint8_t* packed, uint8_t* scales) {
  for (int b = 0; b < n / kFp4E4M3Block; ++b) {
    const float* xb = x + b * kFp4E4M3Block;
    const uint8_t sc = fp4_e4m3_scale_code(serial_amax(xb, kFp4E4M3Block, kFp4E4M3AmaxFloor));
    const float s = e4m3_to_float(sc);
    for (int i = 0; i < kFp4E4M3Block; i += 2)
      packed[(b * kFp4E4M3Block + i) / 2] = static_cast<uint8_t>(fp4_code(xb[i], s) | (fp4_code(xb[i + 1], s) << 4));
    scales[b] = sc;
  }
}

// quant::fp4_ue8m0_quant (n % 32 == 0).
__device__ __forceinline__ void serial_fp4_ue8m0_quant(const float* x, int n, uint8_t* packed, uint8_t* scales) {
  for (int b = 0; b < n / kFp4Ue8m0Block; ++b) {
    const float* xb = x + b * kFp4Ue8m0Block;
    const int e = round_scale_exponent(serial_amax(xb, kFp4Ue8m0Block, kFp4Ue8m0AmaxFloor), kFp4MaxInv);
    const float s = scale_from_exponent(e);
    for (int i = 0; i < kFp4Ue8m0Block; i += 2)
      packed[(b * kFp4Ue8m0Block + i) / 2] = static_cast<uint8_t>(fp4_code(xb[i], s) | (fp4_code(xb[i + 1], s) << 4));
    scales[b] = e8m0_byte(e);
  }
}

}  // namespace di::cuda::dq
