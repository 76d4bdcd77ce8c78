// DeepSeek-V4.1-Flash number formats (bf16, f16, E4M3, E8M0, E2M1) and the reference quantizers,
// bit-exact with the official reference kernels (upstream inference/kernel.py as ported to torch in
// tt-metal deepseek_v41/kernel_cpu.py; spec §2.8, §4.1).
//
// Quantizer contract shared by all three block quantizers:
//  - The reference kernels take bf16 input only; every quantizer here first rounds its input to bf16
//    (a no-op for values that already are bf16), then works in fp32 exactly as the reference does.
//  - "qdq" is the reference's inplace=True mode: quantize, dequantize in fp32, cast to bf16. The
//    result is returned as float (always a bf16 value). dequant(quant(x)) == qdq(x) bit for bit for
//    finite input.
//  - n must be a multiple of the block size (DI_CHECK).
#pragma once

#include <array>
#include <bit>
#include <cstdint>
#include <limits>

namespace di::quant {

// ---- bf16 / f16 -----------------------------------------------------------------------------------

// Round to nearest even; NaN stays NaN (sign kept, quiet bit set); overflow rounds to inf like torch.
inline uint16_t float_to_bf16(float x) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float bf16_to_float(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

// float -> bf16 -> float
inline float round_bf16(float x) { return bf16_to_float(float_to_bf16(x)); }

float f16_to_float(uint16_t h);

// ---- code tables (constant-initialised, usable in constexpr) ----------------------------------------

namespace detail {

constexpr float pow2(int e) {
  float r = 1.0f;
  for (; e > 0; --e) r *= 2.0f;
  for (; e < 0; ++e) r *= 0.5f;
  return r;
}

// OCP E4M3 "fn": bias 7, no inf, S.1111.111 = NaN, max 448, subnormals m * 2^-9.
constexpr std::array<float, 256> make_e4m3_table() {
  std::array<float, 256> t{};
  for (int c = 0; c < 256; ++c) {
    const int e = (c >> 3) & 15, m = c & 7;
    float v = 0.0f;
    if (e == 15 && m == 7) {
      v = std::numeric_limits<float>::quiet_NaN();
    } else if (e == 0) {
      v = static_cast<float>(m) * pow2(-9);
    } else {
      v = static_cast<float>(8 + m) * pow2(e - 10);
    }
    t[c] = (c & 0x80) ? -v : v;
  }
  return t;
}

// E2M1: bit 3 = sign, magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}; code 8 is -0.0.
constexpr std::array<float, 16> make_e2m1_table() {
  constexpr float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  std::array<float, 16> t{};
  for (int c = 0; c < 16; ++c) t[c] = (c & 8) ? -kMag[c & 7] : kMag[c & 7];
  return t;
}

}  // namespace detail

inline constexpr std::array<float, 256> kE4M3ToFloat = detail::make_e4m3_table();
inline constexpr std::array<float, 16> kE2M1ToFloat = detail::make_e2m1_table();

inline constexpr float kFp8Max = 448.0f;
inline constexpr float kFp4Max = 6.0f;

// ---- E4M3 -----------------------------------------------------------------------------------------

inline float e4m3_to_float(uint8_t code) { return kE4M3ToFloat[code]; }

// Exactly torch's x.to(torch.float8_e4m3fn): round to nearest even; |x| >= 464 (past the 448/480 tie)
// and +-inf give NaN (0x7F | sign). The reference always clamps to +-448 first ("satfinite").
// A NaN input gives 0x7F whatever its sign bit: the reference runs on GPUs, whose arithmetic only ever
// produces the positive canonical NaN, while x86 produces a negative one for 0/0 and inf/inf; ignoring
// the NaN's sign makes the CPU and CUDA quantizers agree bit for bit on non-finite blocks.
uint8_t float_to_e4m3(float x);

// clamp(x, -448, 448) then float_to_e4m3: the reference's _to_e4m3_satfinite. NaN stays NaN.
uint8_t float_to_e4m3_satfinite(float x);

// ---- E8M0 -----------------------------------------------------------------------------------------

// 2^(e-127); e = 0 is 2^-127 (an fp32 subnormal); 255 = NaN.
inline float e8m0_to_float(uint8_t e) {
  if (e == 255) return std::numeric_limits<float>::quiet_NaN();
  if (e == 0) return std::bit_cast<float>(0x00400000u);
  return std::bit_cast<float>(static_cast<uint32_t>(e) << 23);
}

// ---- E2M1 -----------------------------------------------------------------------------------------

inline float e2m1_to_float(uint8_t code) { return kE2M1ToFloat[code & 15]; }

// Nearest grid value, ties to the even code (0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4,
// 5->4); sign bit = signbit(x), so -0.1 -> code 8 (-0). Expects x already clamped to [-6, 6];
// larger magnitudes give 6. NaN gives code 0 (+0) whatever its sign bit, as the reference on a GPU
// (see float_to_e4m3 for why the sign of a NaN is ignored).
uint8_t float_to_e2m1(float x);

// ---- power-of-two scale ---------------------------------------------------------------------------

// The reference's fast_round_scale: 2^ceil(log2(amax * max_inv)) computed from the fp32 bits of the
// product (exponent field + (mantissa != 0)). amax and max_inv are fp32; max_inv is fp32(1/448) or
// fp32(1/6). Returns the scale's biased exponent (the UE8M0 byte for finite amax).
int round_scale_exponent(float amax, float max_inv);

// ---- quantizers -----------------------------------------------------------------------------------

// (1) FP8 activation / window-KV quant, UE8M0 scale per `block` values (block = 32 in the model):
//     amax = max(|x|, 1e-4); s = 2^ceil(log2(amax * fp32(1/448))) (bit trick);
//     q = e4m3(clamp(x / s, -448, 448)); qdq = bf16(float(q) * s).
void fp8_ue8m0_quant(const float* x, int n, int block, uint8_t* codes /*[n] e4m3*/,
                     uint8_t* scales_e8m0 /*[n/block]*/);
void fp8_ue8m0_qdq(const float* x, float* y, int n, int block);  // y may alias x

// (2) FP4 with E4M3 scale per 16 (compressed KV rows):
//     amax = max(|x|, 6*2^-9); s = e4m3_satfinite(amax / 6) (fp32 division, as the reference);
//     q = e2m1(clamp(x / s, -6, 6)); qdq = bf16(e2m1_value * s).
//     Packed: two codes per byte, EVEN element in the LOW nibble.
void fp4_e4m3_quant(const float* x, int n, uint8_t* packed /*[n/2]*/, uint8_t* scales_e4m3 /*[n/16]*/);
void fp4_e4m3_qdq(const float* x, float* y, int n);  // y may alias x

// (3) FP4 with UE8M0 scale per 32 (indexer keys and queries):
//     amax = max(|x|, 6*2^-126); s = 2^ceil(log2(amax * fp32(1/6))) (bit trick);
//     q = e2m1(clamp(x / s, -6, 6)); qdq = bf16(e2m1_value * s).
void fp4_ue8m0_quant(const float* x, int n, uint8_t* packed /*[n/2]*/, uint8_t* scales_e8m0 /*[n/32]*/);
void fp4_ue8m0_qdq(const float* x, float* y, int n);  // y may alias x

// Dequantizers of the packed forms: y = bf16(value * scale) (exact; the bf16 cast is a no-op for
// scales produced by the quantizers above).
void fp8_ue8m0_dequant(const uint8_t* codes, const uint8_t* scales, int n, int block, float* y);
void fp4_e4m3_dequant(const uint8_t* packed, const uint8_t* scales, int n, float* y);
void fp4_ue8m0_dequant(const uint8_t* packed, const uint8_t* scales, int n, float* y);

inline constexpr int kFp4E4M3Block = 16;
inline constexpr int kFp4Ue8m0Block = 32;

}  // namespace di::quant
