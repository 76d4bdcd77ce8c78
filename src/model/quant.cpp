// Number formats and reference quantizers; see quant.h. Every operation below mirrors one line of the
// reference kernels (tt-metal deepseek_v41/kernel_cpu.py, a port of upstream kernel.py), in the same
// order and dtype (fp32 unless noted).
#include "model/quant.h"

#include <bit>
#include <cmath>
#include <cstring>

#include "core/error.h"

namespace di::quant {

namespace {

// Reference constants: the kernels multiply by the reciprocal stored as an fp32 constant.
constexpr float kFp8MaxInv = 1.0f / 448.0f;  // fp32(1/448) = 0x1.24924ap-9
constexpr float kFp4MaxInv = 1.0f / 6.0f;    // fp32(1/6)   = 0x1.555556p-3
constexpr float kFp8AmaxFloor = 1e-4f;                   // act_quant clamp_min(1e-4), as fp32
constexpr float kFp4E4M3AmaxFloor = 6.0f * 0x1p-9f;      // fp4_act_quant, E4M3-scale path
constexpr float kFp4Ue8m0AmaxFloor = 6.0f * 0x1p-126f;   // fp4_act_quant, E8M0-scale path

// torch.clamp semantics: NaN passes through.
inline float clamp_sym(float v, float lim) { return v < -lim ? -lim : (v > lim ? lim : v); }

// torch amax over |x| of bf16-rounded input, NaN-propagating; then clamp_min(floor) (NaN stays).
inline float block_amax(const float* x, int n, float floor) {
  float amax = 0.0f;
  bool nan = false;
  for (int i = 0; i < n; ++i) {
    const float a = std::fabs(round_bf16(x[i]));
    if (std::isnan(a)) nan = true;
    if (a > amax) amax = a;
  }
  if (nan) return std::numeric_limits<float>::quiet_NaN();
  return amax < floor ? floor : amax;
}

// Float whose bits are (biased_exp << 23), as the reference builds the scale (may be inf or -0.0
// for non-finite amax, exactly like the reference's int32 shift).
inline float scale_from_exponent(int biased_exp) {
  return std::bit_cast<float>(static_cast<uint32_t>(biased_exp) << 23);
}

inline uint8_t e8m0_byte(int biased_exp) {
  return static_cast<uint8_t>(biased_exp >= 255 ? 255 : biased_exp);
}

void check_blocks(int n, int block) {
  DI_CHECK(block > 0);
  DI_CHECK(n >= 0 && n % block == 0);
}

// Shared body of the two FP4 quantizers: codes of one block given its scale.
inline uint8_t fp4_code(float x, float s) { return float_to_e2m1(clamp_sym(round_bf16(x) / s, kFp4Max)); }

}  // namespace

float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu;
  const uint32_t m = h & 0x3FFu;
  if (e == 0x1F) return std::bit_cast<float>(sign | 0x7F800000u | (m << 13));  // inf / NaN
  if (e != 0) return std::bit_cast<float>(sign | ((e + 112u) << 23) | (m << 13));
  const float v = static_cast<float>(m) * 0x1p-24f;  // subnormal or zero, exact
  return sign ? -v : v;
}

uint8_t float_to_e4m3(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return 0x7F;           // NaN -> the positive NaN code (see quant.h)
  if (a >= 0x43F00000u) return sign | 0x7F;  // |x| >= 480, inf -> NaN (torch)
  if (a < 0x3C800000u) {
    // |x| < 2^-6: subnormal grid m * 2^-9, m = RNE(|x| * 2^9) in 0..8 (8 is the smallest normal).
    const float y = std::bit_cast<float>(a) * 512.0f;  // exact
    const float fl = std::floor(y);
    const float frac = y - fl;  // exact
    uint32_t m = static_cast<uint32_t>(fl);
    if (frac > 0.5f || (frac == 0.5f && (m & 1u))) ++m;
    return sign | static_cast<uint8_t>(m);
  }
  // Normal: keep 3 of the 23 mantissa bits, round the other 20 to nearest even; a carry moves into
  // the exponent field. (464, 480) carries to 0x7F, which is NaN, as in torch.
  const uint32_t exp8 = (a >> 23) - 127u + 7u;  // 1..15
  const uint32_t mant = a & 0x7FFFFFu;
  uint32_t code = (exp8 << 3) | (mant >> 20);
  const uint32_t rest = mant & 0xFFFFFu;
  if (rest > 0x80000u || (rest == 0x80000u && (code & 1u))) ++code;
  return sign | static_cast<uint8_t>(code);
}

uint8_t float_to_e4m3_satfinite(float x) { return float_to_e4m3(clamp_sym(x, kFp8Max)); }

uint8_t float_to_e2m1(float x) {
  // Reference _e2m1_codes: count midpoints strictly below |x|, plus an exact tie at a midpoint whose
  // upper neighbour has an even code (0.75, 1.75, 3.5).
  static constexpr float kMids[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  static constexpr bool kTieUp[7] = {false, true, false, true, false, true, false};
  if (std::isnan(x)) return 0;  // the sign of a NaN is not a value (see quant.h)
  const float mag = std::fabs(x);
  uint8_t code = 0;
  for (int i = 0; i < 7; ++i) code += static_cast<uint8_t>((mag > kMids[i]) + (mag == kMids[i] && kTieUp[i]));
  return static_cast<uint8_t>(code | (std::signbit(x) ? 8 : 0));
}

int round_scale_exponent(float amax, float max_inv) {
  const uint32_t bits = std::bit_cast<uint32_t>(amax * max_inv);
  const int exp = static_cast<int>((bits >> 23) & 0xFFu);
  const int man_nonzero = (bits & 0x7FFFFFu) != 0 ? 1 : 0;
  return exp + man_nonzero;  // = ceil(log2(.)) + 127
}

// ---- (1) FP8, UE8M0 scale -------------------------------------------------------------------------

void fp8_ue8m0_quant(const float* x, int n, int block, uint8_t* codes, uint8_t* scales_e8m0) {
  check_blocks(n, block);
  for (int b = 0; b < n / block; ++b) {
    const float* xb = x + static_cast<size_t>(b) * block;
    const int eb = round_scale_exponent(block_amax(xb, block, kFp8AmaxFloor), kFp8MaxInv);
    const float s = scale_from_exponent(eb);
    for (int i = 0; i < block; ++i) codes[static_cast<size_t>(b) * block + i] = float_to_e4m3_satfinite(round_bf16(xb[i]) / s);
    scales_e8m0[b] = e8m0_byte(eb);
  }
}

void fp8_ue8m0_qdq(const float* x, float* y, int n, int block) {
  check_blocks(n, block);
  for (int b = 0; b < n / block; ++b) {
    const size_t off = static_cast<size_t>(b) * block;
    const float s = scale_from_exponent(round_scale_exponent(block_amax(x + off, block, kFp8AmaxFloor), kFp8MaxInv));
    for (int i = 0; i < block; ++i) {
      const uint8_t q = float_to_e4m3_satfinite(round_bf16(x[off + i]) / s);
      y[off + i] = round_bf16(e4m3_to_float(q) * s);
    }
  }
}

void fp8_ue8m0_dequant(const uint8_t* codes, const uint8_t* scales, int n, int block, float* y) {
  check_blocks(n, block);
  for (int b = 0; b < n / block; ++b) {
    const float s = e8m0_to_float(scales[b]);
    const size_t off = static_cast<size_t>(b) * block;
    for (int i = 0; i < block; ++i) y[off + i] = round_bf16(e4m3_to_float(codes[off + i]) * s);
  }
}

// ---- (2) FP4, E4M3 scale per 16 -------------------------------------------------------------------

namespace {
inline float fp4_e4m3_block_scale(const float* xb, uint8_t* code) {
  const float amax = block_amax(xb, kFp4E4M3Block, kFp4E4M3AmaxFloor);
  // Reference divides by 6.0 here (amax / FP4_MAX), not a multiply by fp32(1/6).
  *code = float_to_e4m3_satfinite(amax / kFp4Max);
  return e4m3_to_float(*code);
}
}  // namespace

void fp4_e4m3_quant(const float* x, int n, uint8_t* packed, uint8_t* scales_e4m3) {
  check_blocks(n, kFp4E4M3Block);
  for (int b = 0; b < n / kFp4E4M3Block; ++b) {
    const size_t off = static_cast<size_t>(b) * kFp4E4M3Block;
    const float s = fp4_e4m3_block_scale(x + off, &scales_e4m3[b]);
    for (int i = 0; i < kFp4E4M3Block; i += 2) {
      const uint8_t lo = fp4_code(x[off + i], s), hi = fp4_code(x[off + i + 1], s);
      packed[(off + i) / 2] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

void fp4_e4m3_qdq(const float* x, float* y, int n) {
  check_blocks(n, kFp4E4M3Block);
  for (int b = 0; b < n / kFp4E4M3Block; ++b) {
    const size_t off = static_cast<size_t>(b) * kFp4E4M3Block;
    uint8_t scode = 0;
    const float s = fp4_e4m3_block_scale(x + off, &scode);
    for (int i = 0; i < kFp4E4M3Block; ++i) y[off + i] = round_bf16(e2m1_to_float(fp4_code(x[off + i], s)) * s);
  }
}

void fp4_e4m3_dequant(const uint8_t* packed, const uint8_t* scales, int n, float* y) {
  check_blocks(n, kFp4E4M3Block);
  for (int i = 0; i < n; ++i) {
    const float s = e4m3_to_float(scales[i / kFp4E4M3Block]);
    const uint8_t code = (i & 1) ? (packed[i / 2] >> 4) : (packed[i / 2] & 0x0F);
    y[i] = round_bf16(e2m1_to_float(code) * s);
  }
}

// ---- (3) FP4, UE8M0 scale per 32 ------------------------------------------------------------------

void fp4_ue8m0_quant(const float* x, int n, uint8_t* packed, uint8_t* scales_e8m0) {
  check_blocks(n, kFp4Ue8m0Block);
  for (int b = 0; b < n / kFp4Ue8m0Block; ++b) {
    const size_t off = static_cast<size_t>(b) * kFp4Ue8m0Block;
    const int eb = round_scale_exponent(block_amax(x + off, kFp4Ue8m0Block, kFp4Ue8m0AmaxFloor), kFp4MaxInv);
    const float s = scale_from_exponent(eb);
    for (int i = 0; i < kFp4Ue8m0Block; i += 2) {
      const uint8_t lo = fp4_code(x[off + i], s), hi = fp4_code(x[off + i + 1], s);
      packed[(off + i) / 2] = static_cast<uint8_t>(lo | (hi << 4));
    }
    scales_e8m0[b] = e8m0_byte(eb);
  }
}

void fp4_ue8m0_qdq(const float* x, float* y, int n) {
  check_blocks(n, kFp4Ue8m0Block);
  for (int b = 0; b < n / kFp4Ue8m0Block; ++b) {
    const size_t off = static_cast<size_t>(b) * kFp4Ue8m0Block;
    const float s = scale_from_exponent(
        round_scale_exponent(block_amax(x + off, kFp4Ue8m0Block, kFp4Ue8m0AmaxFloor), kFp4MaxInv));
    for (int i = 0; i < kFp4Ue8m0Block; ++i) y[off + i] = round_bf16(e2m1_to_float(fp4_code(x[off + i], s)) * s);
  }
}

void fp4_ue8m0_dequant(const uint8_t* packed, const uint8_t* scales, int n, float* y) {
  check_blocks(n, kFp4Ue8m0Block);
  for (int i = 0; i < n; ++i) {
    const float s = e8m0_to_float(scales[i / kFp4Ue8m0Block]);
    const uint8_t code = (i & 1) ? (packed[i / 2] >> 4) : (packed[i / 2] & 0x0F);
    y[i] = round_bf16(e2m1_to_float(code) * s);
  }
}

}  // namespace di::quant
