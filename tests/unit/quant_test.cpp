// Number formats and reference quantizers (src/model/quant.h): exhaustive code tables, rounding checked
// against independent nearest-value searches, hand cases from the reference formulas, and properties of
// the block quantizers on fresh random data.
#include <gtest/gtest.h>

#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <limits>
#include <random>
#include <vector>

#include "model/quant.h"

namespace di::quant {
namespace {

uint32_t bits(float x) { return std::bit_cast<uint32_t>(x); }
float from_bits(uint32_t u) { return std::bit_cast<float>(u); }

// Fresh seed per process, printed so a failure can be replayed.
uint64_t test_seed() {
  static const uint64_t seed = [] {
    const uint64_t s = static_cast<uint64_t>(std::chrono::high_resolution_clock::now().time_since_epoch().count());
    std::printf("[quant_test] seed = %llu\n", static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

// ---- independent references -----------------------------------------------------------------------

// E4M3 value of a code from the format definition (no shared code with quant.h).
double e4m3_value_ref(int c) {
  const int s = (c >> 7) & 1, e = (c >> 3) & 15, m = c & 7;
  const double mag = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
  return s ? -mag : mag;
}

// torch .to(float8_e4m3fn) by nearest search: the 127 finite magnitudes plus the pseudo value 480 for
// code 0x7F (the overflow neighbour, which torch turns into NaN); ties go to the even code.
uint8_t e4m3_encode_ref(float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  if (!std::isfinite(x)) return sign | 0x7F;
  const double a = std::fabs(static_cast<double>(x));
  int best = 0;
  double best_d = a;
  for (int c = 1; c <= 0x7F; ++c) {
    const double v = c == 0x7F ? 480.0 : e4m3_value_ref(c);
    const double d = std::fabs(a - v);
    if (d < best_d || (d == best_d && (c & 1) == 0)) {
      best = c;
      best_d = d;
    }
  }
  if (a > 480.0) best = 0x7F;
  return static_cast<uint8_t>(sign | best);
}

// E2M1 by nearest search on the grid, ties to the even code.
uint8_t e2m1_encode_ref(float x) {
  static const double kGrid[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  const double a = std::fabs(static_cast<double>(x));
  int best = 0;
  for (int c = 1; c < 8; ++c) {
    const double d = std::fabs(a - kGrid[c]), bd = std::fabs(a - kGrid[best]);
    if (d < bd || (d == bd && (c & 1) == 0)) best = c;
  }
  return static_cast<uint8_t>(best | (std::signbit(x) ? 8 : 0));
}

bool same_bits_or_both_nan(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || bits(a) == bits(b);
}

// ---- bf16 / f16 -----------------------------------------------------------------------------------

TEST(QuantBf16, AllCodesRoundTrip) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const float f = bf16_to_float(static_cast<uint16_t>(b));
    EXPECT_EQ(bits(f), b << 16);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(f))));
      EXPECT_EQ(float_to_bf16(f) & 0x8000, b & 0x8000);  // sign kept
    } else {
      EXPECT_EQ(float_to_bf16(f), b);
    }
  }
}

TEST(QuantBf16, TiesToEvenAndEdges) {
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to 1 (even mantissa).
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f), 0x3F80);
  // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even): goes up.
  EXPECT_EQ(float_to_bf16(1.0f + 3 * 0x1p-8f), 0x3F82);
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3F81);  // above the tie
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds up to inf
  EXPECT_EQ(float_to_bf16(from_bits(0x7F7F7FFF)), 0x7F7F);
  EXPECT_EQ(float_to_bf16(from_bits(0x00008000)), 0x0000);              // subnormal tie -> even
  EXPECT_EQ(float_to_bf16(from_bits(0x00018000)), 0x0002);              // subnormal tie -> even (up)
  EXPECT_TRUE(std::isnan(round_bf16(from_bits(0x7F800001))));           // signalling NaN stays NaN
  EXPECT_TRUE(std::isnan(round_bf16(from_bits(0xFFC00000))));
  EXPECT_EQ(round_bf16(0.3f), 0.30078125f);
}

TEST(QuantBf16, RandomFloatsMatchNearestEven) {
  std::mt19937_64 rng(test_seed());
  for (int i = 0; i < 200000; ++i) {
    const uint32_t u = static_cast<uint32_t>(rng());
    const float x = from_bits(u);
    if (!std::isfinite(x)) continue;
    // Independent: pick the nearer of the two bf16 neighbours in double, ties to even.
    const uint32_t lo = u & 0xFFFF0000u, hi = lo + 0x10000u;
    const double dlo = std::fabs(static_cast<double>(x) - from_bits(lo));
    const float fhi = from_bits(hi);
    const double dhi = std::isinf(fhi) ? std::ldexp(1.0, 128) - std::fabs(static_cast<double>(x)) : std::fabs(static_cast<double>(fhi) - x);
    const uint32_t want = (dlo < dhi || (dlo == dhi && ((lo >> 16) & 1) == 0)) ? lo : hi;
    ASSERT_EQ(float_to_bf16(x), want >> 16) << std::hexfloat << x;
  }
}

TEST(QuantF16, HandCases) {
  EXPECT_EQ(f16_to_float(0x3C00), 1.0f);
  EXPECT_EQ(f16_to_float(0xC000), -2.0f);
  EXPECT_EQ(f16_to_float(0x7BFF), 65504.0f);
  EXPECT_EQ(f16_to_float(0x0400), 0x1p-14f);
  EXPECT_EQ(f16_to_float(0x0001), 0x1p-24f);
  EXPECT_EQ(f16_to_float(0x03FF), 1023 * 0x1p-24f);
  EXPECT_EQ(bits(f16_to_float(0x8000)), 0x80000000u);
  EXPECT_EQ(f16_to_float(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(f16_to_float(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(f16_to_float(0x7E00)));
  EXPECT_TRUE(std::isnan(f16_to_float(0x7C01)));
  EXPECT_EQ(f16_to_float(0x3555), 0x1.554p-2f);
}

TEST(QuantF16, AllCodesMatchDefinition) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const int s = (h >> 15) & 1, e = (h >> 10) & 31, m = h & 1023;
    if (e == 31) continue;
    const double mag = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
    const float want = static_cast<float>(s ? -mag : mag);
    ASSERT_EQ(bits(f16_to_float(static_cast<uint16_t>(h))), bits(want)) << h;
  }
}

// ---- E4M3 -----------------------------------------------------------------------------------------

TEST(QuantE4M3, AllCodesDecode) {
  int nans = 0;
  for (int c = 0; c < 256; ++c) {
    const float v = e4m3_to_float(static_cast<uint8_t>(c));
    EXPECT_TRUE(same_bits_or_both_nan(v, kE4M3ToFloat[c]));
    if ((c & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(v)) << c;
      ++nans;
      continue;
    }
    EXPECT_EQ(bits(v), bits(static_cast<float>(e4m3_value_ref(c)))) << c;
  }
  EXPECT_EQ(nans, 2);
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_float(0xFE), -448.0f);
  EXPECT_EQ(e4m3_to_float(0x01), 0x1p-9f);
  EXPECT_EQ(e4m3_to_float(0x07), 7 * 0x1p-9f);
  EXPECT_EQ(e4m3_to_float(0x08), 0x1p-6f);
  EXPECT_EQ(e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(bits(e4m3_to_float(0x80)), 0x80000000u);
  for (int c = 1; c < 0x7F; ++c) EXPECT_LT(e4m3_to_float(static_cast<uint8_t>(c - 1)), e4m3_to_float(static_cast<uint8_t>(c)));
}

TEST(QuantE4M3, DecodeEncodeRoundTrip) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;
    EXPECT_EQ(float_to_e4m3(e4m3_to_float(static_cast<uint8_t>(c))), c);
    EXPECT_EQ(float_to_e4m3_satfinite(e4m3_to_float(static_cast<uint8_t>(c))), c);
  }
}

TEST(QuantE4M3, HandCases) {
  EXPECT_EQ(float_to_e4m3(448.0f), 0x7E);
  EXPECT_EQ(float_to_e4m3(460.0f), 0x7E);
  EXPECT_EQ(float_to_e4m3(464.0f), 0x7E);                     // tie 448 (even) / 480: stays 448
  EXPECT_EQ(float_to_e4m3(std::nextafter(464.0f, 500.0f)), 0x7F);  // torch: NaN
  EXPECT_EQ(float_to_e4m3(479.0f), 0x7F);
  EXPECT_EQ(float_to_e4m3(480.0f), 0x7F);
  EXPECT_EQ(float_to_e4m3(1e6f), 0x7F);
  EXPECT_EQ(float_to_e4m3(-1e6f), 0xFF);
  EXPECT_EQ(float_to_e4m3(std::numeric_limits<float>::infinity()), 0x7F);
  EXPECT_EQ(float_to_e4m3(-std::numeric_limits<float>::infinity()), 0xFF);
  EXPECT_EQ(float_to_e4m3(std::numeric_limits<float>::quiet_NaN()), 0x7F);
  EXPECT_EQ(float_to_e4m3(from_bits(0xFFC00000)), 0x7F);  // x86's default NaN: its sign is ignored
  // satfinite (reference _to_e4m3_satfinite): clamp to +-448 first.
  EXPECT_EQ(float_to_e4m3_satfinite(1e6f), 0x7E);
  EXPECT_EQ(float_to_e4m3_satfinite(-470.0f), 0xFE);
  EXPECT_EQ(float_to_e4m3_satfinite(std::numeric_limits<float>::infinity()), 0x7E);
  // ties to even in the normal range: 1 + 1/16 between 1 (0x38) and 1.125 (0x39) -> 1.
  EXPECT_EQ(float_to_e4m3(1.0625f), 0x38);
  EXPECT_EQ(float_to_e4m3(1.1875f), 0x3A);                    // between 0x39 and 0x3A -> even 0x3A
  EXPECT_EQ(float_to_e4m3(std::nextafter(1.0625f, 2.0f)), 0x39);
  EXPECT_EQ(float_to_e4m3(1.9375f), 0x40);                    // 1.875/2 tie carries into the exponent
  EXPECT_EQ(float_to_e4m3(0.5f), 0x30);
  // subnormals: grid 2^-9; ties to even.
  EXPECT_EQ(float_to_e4m3(0x1p-10f), 0x00);                   // 0.5 step -> 0
  EXPECT_EQ(float_to_e4m3(std::nextafter(0x1p-10f, 1.0f)), 0x01);
  EXPECT_EQ(float_to_e4m3(3 * 0x1p-10f), 0x02);               // 1.5 steps -> 2
  EXPECT_EQ(float_to_e4m3(5 * 0x1p-10f), 0x02);               // 2.5 steps -> 2
  EXPECT_EQ(float_to_e4m3(15 * 0x1p-10f), 0x08);              // 7.5 steps -> 8 = 2^-6 (normal)
  EXPECT_EQ(float_to_e4m3(0x1p-30f), 0x00);
  EXPECT_EQ(float_to_e4m3(-0x1p-30f), 0x80);                  // -0
  EXPECT_EQ(float_to_e4m3(-0.0f), 0x80);
  EXPECT_EQ(float_to_e4m3(0.0f), 0x00);
  EXPECT_EQ(float_to_e4m3(from_bits(1)), 0x00);
}

TEST(QuantE4M3, AllBf16AndMidpointsMatchNearestSearch) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const float x = bf16_to_float(static_cast<uint16_t>(b));
    if (std::isnan(x)) continue;
    ASSERT_EQ(float_to_e4m3(x), e4m3_encode_ref(x)) << std::hexfloat << x;
  }
  // every midpoint between neighbouring codes, and one fp32 ulp either side
  for (int c = 0; c <= 0x7E; ++c) {
    const double lo = e4m3_value_ref(c), hi = c + 1 == 0x7F ? 480.0 : e4m3_value_ref(c + 1);
    const float mid = static_cast<float>((lo + hi) / 2);
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1000.0f)}) {
      ASSERT_EQ(float_to_e4m3(x), e4m3_encode_ref(x)) << std::hexfloat << x;
      ASSERT_EQ(float_to_e4m3(-x), e4m3_encode_ref(-x)) << std::hexfloat << -x;
    }
  }
}

TEST(QuantE4M3, RandomFloatsMatchNearestSearch) {
  std::mt19937_64 rng(test_seed() + 1);
  std::uniform_real_distribution<float> mag(-14.0f, 9.5f);  // log2 range that covers the grid
  for (int i = 0; i < 100000; ++i) {
    float x = std::exp2(mag(rng));
    if (rng() & 1) x = -x;
    ASSERT_EQ(float_to_e4m3(x), e4m3_encode_ref(x)) << std::hexfloat << x;
  }
}

// ---- E8M0 -----------------------------------------------------------------------------------------

TEST(QuantE8M0, AllValues) {
  for (int e = 0; e < 255; ++e) {
    const float v = e8m0_to_float(static_cast<uint8_t>(e));
    EXPECT_EQ(v, static_cast<float>(std::ldexp(1.0, e - 127))) << e;
    EXPECT_GT(v, 0.0f);
  }
  EXPECT_EQ(e8m0_to_float(127), 1.0f);
  EXPECT_EQ(e8m0_to_float(0), 0x1p-127f);
  EXPECT_EQ(e8m0_to_float(254), 0x1p127f);
  EXPECT_TRUE(std::isnan(e8m0_to_float(255)));
}

// ---- E2M1 -----------------------------------------------------------------------------------------

TEST(QuantE2M1, AllCodes) {
  const float want[16] = {0, .5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -.5f, -1, -1.5f, -2, -3, -4, -6};
  for (int c = 0; c < 16; ++c) {
    EXPECT_EQ(bits(e2m1_to_float(static_cast<uint8_t>(c))), bits(want[c])) << c;
    EXPECT_EQ(bits(kE2M1ToFloat[c]), bits(want[c]));
    EXPECT_EQ(float_to_e2m1(want[c]), c);  // round trip, -0 included
  }
}

TEST(QuantE2M1, TiesAndHandCases) {
  EXPECT_EQ(float_to_e2m1(0.25f), 0);   // 0 | 0.5 -> 0 (even)
  EXPECT_EQ(float_to_e2m1(0.75f), 2);   // 0.5 | 1 -> 1 (code 2)
  EXPECT_EQ(float_to_e2m1(1.25f), 2);   // 1 | 1.5 -> 1
  EXPECT_EQ(float_to_e2m1(1.75f), 4);   // 1.5 | 2 -> 2
  EXPECT_EQ(float_to_e2m1(2.5f), 4);    // 2 | 3 -> 2
  EXPECT_EQ(float_to_e2m1(3.5f), 6);    // 3 | 4 -> 4
  EXPECT_EQ(float_to_e2m1(5.0f), 6);    // 4 | 6 -> 4
  EXPECT_EQ(float_to_e2m1(-5.0f), 14);
  EXPECT_EQ(float_to_e2m1(-2.5f), 12);
  EXPECT_EQ(float_to_e2m1(std::nextafter(5.0f, 6.0f)), 7);
  EXPECT_EQ(float_to_e2m1(std::nextafter(0.25f, 1.0f)), 1);
  EXPECT_EQ(float_to_e2m1(-0.1f), 8);   // -0
  EXPECT_EQ(float_to_e2m1(-0.0f), 8);
  EXPECT_EQ(float_to_e2m1(6.0f), 7);
  EXPECT_EQ(float_to_e2m1(-6.0f), 15);
  EXPECT_EQ(float_to_e2m1(std::numeric_limits<float>::quiet_NaN()), 0);  // NaN's sign is ignored
  EXPECT_EQ(float_to_e2m1(from_bits(0xFFC00000)), 0);
}

// A block holding a NaN gets the scale -0.0 (exponent 256, as the reference's bit trick); its zero
// elements then divide 0 / -0 = NaN, whose sign differs between x86 (negative) and GPUs (positive).
// The encoders ignore that sign, so the qdq value is +0 * -0 = -0 everywhere.
TEST(QuantFp4Ue8m0, NanBlockIsIndependentOfTheNanSign) {
  float x[32] = {};
  x[3] = std::numeric_limits<float>::quiet_NaN();
  x[7] = 1.5f;
  float y[32];
  fp4_ue8m0_qdq(x, y, 32);
  EXPECT_EQ(bits(y[0]), 0x80000000u);  // 0 / -0 -> NaN -> code 0 -> +0 * -0
  EXPECT_EQ(bits(y[7]), 0x00000000u);  // 1.5 / -0 = -inf -> clamp -6 -> code 15 -> -6 * -0 = +0
}

TEST(QuantE2M1, AllBf16InRangeMatchNearestSearch) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const float x = bf16_to_float(static_cast<uint16_t>(b));
    if (!(std::fabs(x) <= 6.0f)) continue;
    ASSERT_EQ(float_to_e2m1(x), e2m1_encode_ref(x)) << std::hexfloat << x;
  }
  std::mt19937_64 rng(test_seed() + 2);
  std::uniform_real_distribution<float> u(-6.0f, 6.0f);
  for (int i = 0; i < 100000; ++i) {
    const float x = u(rng);
    ASSERT_EQ(float_to_e2m1(x), e2m1_encode_ref(x)) << std::hexfloat << x;
  }
}

// ---- scale exponent -------------------------------------------------------------------------------

TEST(QuantScale, BitTrickEqualsCeilLog2ForBf16Amax) {
  const float inv448 = 1.0f / 448.0f, inv6 = 1.0f / 6.0f;
  for (uint32_t b = 1; b < 0x7F80; ++b) {
    const float amax = bf16_to_float(static_cast<uint16_t>(b));
    const double l448 = std::ceil(std::log2(static_cast<double>(amax) / 448.0));
    const double l6 = std::ceil(std::log2(static_cast<double>(amax) / 6.0));
    if (amax >= 1e-4f) {
      ASSERT_EQ(round_scale_exponent(amax, inv448) - 127, l448) << amax;
    }
    if (amax >= 6.0f * 0x1p-126f) {
      ASSERT_EQ(round_scale_exponent(amax, inv6) - 127, l6) << amax;
    }
  }
  // the floors themselves
  EXPECT_EQ(round_scale_exponent(1e-4f, inv448), 127 - 22);
  EXPECT_EQ(round_scale_exponent(6.0f * 0x1p-126f, inv6), 1);
  EXPECT_EQ(round_scale_exponent(448.0f, inv448), 127);  // 448 * fp32(1/448) == 1 exactly
  EXPECT_EQ(round_scale_exponent(6.0f, inv6), 127);
  // subnormal product: exponent field 0, mantissa != 0 -> 2^-126
  EXPECT_EQ(round_scale_exponent(0x1p-130f, 1.0f), 1);
}

// ---- quantizers: hand vectors from the reference formulas -----------------------------------------

TEST(QuantFp8Ue8m0, HandVector) {
  std::vector<float> x(32, 0.0f), y(32);
  x[0] = 1000.0f;   // amax 1000: 1000*fp32(1/448) = 2.23 -> s = 4; 250 -> e4m3 256 -> 1024
  x[1] = 1.0f;      // 0.25 exact
  x[2] = 0.3f;      // bf16 0.30078125; /4 = 0.0751953125 = 9.625 * 2^-7 -> 10 * 2^-7 -> 0.3125
  x[3] = -0.001f;   // bf16 -0.00099945...; /4 is below half of 2^-9 -> -0
  x[4] = -448.0f;   // /4 = -112 exact
  x[5] = 9.0f;      // /4 = 2.25: between 2.25 (code) exactly representable -> 9
  x[6] = 8.5f;      // /4 = 2.125: tie 2 (even) / 2.25 -> 2 -> 8
  x[7] = 8.75f;     // bf16 8.75; /4 = 2.1875 -> 2.25 -> 9 (nearest, not a tie)
  std::vector<uint8_t> codes(32), sc(1);
  fp8_ue8m0_quant(x.data(), 32, 32, codes.data(), sc.data());
  fp8_ue8m0_qdq(x.data(), y.data(), 32, 32);
  EXPECT_EQ(sc[0], 127 + 2);
  EXPECT_EQ(codes[0], 0x78);  // 256 = 2^8: exp field 15, mantissa 0
  EXPECT_EQ(y[0], 1024.0f);
  EXPECT_EQ(y[1], 1.0f);
  EXPECT_EQ(y[2], 0.3125f);
  EXPECT_EQ(codes[3], 0x80);
  EXPECT_EQ(bits(y[3]), 0x80000000u);
  EXPECT_EQ(y[4], -448.0f);
  EXPECT_EQ(y[5], 9.0f);
  EXPECT_EQ(y[6], 8.0f);
  EXPECT_EQ(y[7], 9.0f);
  for (int i = 8; i < 32; ++i) EXPECT_EQ(bits(y[i]), 0u);
}

TEST(QuantFp8Ue8m0, FloorAndExactMax) {
  std::vector<float> x(64, 0.0f), y(64);
  std::vector<uint8_t> codes(64), sc(2);
  x[0] = 448.0f;   // block 0: amax 448 -> s = 1 -> exact
  x[1] = 0.1f;     // bf16 0.10009765625 -> e4m3 in [2^-4, 2^-3): step 2^-7 -> 12.8125 -> 13 * 2^-7
  x[32] = -0.0f;   // block 1: all zero -> amax floor 1e-4 -> s = 2^-22
  fp8_ue8m0_quant(x.data(), 64, 32, codes.data(), sc.data());
  fp8_ue8m0_qdq(x.data(), y.data(), 64, 32);
  EXPECT_EQ(sc[0], 127);
  EXPECT_EQ(sc[1], 127 - 22);
  EXPECT_EQ(y[0], 448.0f);
  EXPECT_EQ(y[1], 13 * 0x1p-7f);
  EXPECT_EQ(bits(y[32]), 0x80000000u);
  EXPECT_EQ(codes[32], 0x80);
}

TEST(QuantFp4E4m3, HandVector) {
  // amax 5.5625 (bf16): 5.5625 / 6 = 0.92708 -> e4m3 step 2^-4 in [0.5, 1): 14.83 -> 15 -> s = 0.9375
  std::vector<float> x(16, 0.0f), y(16);
  x[0] = 5.5625f;    // /s = 5.933 -> 6 -> 5.625
  x[1] = 1.0f;       // 1.0667 -> 1 -> 0.9375
  x[2] = 2.0f;       // 2.1333 -> 2 -> 1.875
  x[3] = -0.5f;      // -0.5333 -> -0.5 -> -0.46875
  x[4] = 0.234375f;  // exactly 0.25: tie -> 0
  x[5] = 0.703125f;  // exactly 0.75: tie -> 1 -> 0.9375
  x[6] = 2.34375f;   // exactly 2.5: tie -> 2 -> 1.875
  x[7] = -3.28125f;  // exactly -3.5: tie -> -4 -> -3.75
  x[8] = 4.6875f;    // exactly 5: tie -> 4 -> 3.75
  x[9] = -0.01f;     // -> -0
  std::vector<uint8_t> packed(8), sc(1);
  fp4_e4m3_quant(x.data(), 16, packed.data(), sc.data());
  fp4_e4m3_qdq(x.data(), y.data(), 16);
  EXPECT_EQ(sc[0], 0x37);  // 0.9375 = 1.875 * 2^-1: exp field 6, mantissa 7
  EXPECT_EQ(e4m3_to_float(sc[0]), 0.9375f);
  const float want[10] = {5.625f, 0.9375f, 1.875f, -0.46875f, 0.0f, 0.9375f, 1.875f, -3.75f, 3.75f, -0.0f};
  for (int i = 0; i < 10; ++i) EXPECT_EQ(bits(y[i]), bits(want[i])) << i;
  EXPECT_EQ(packed[0], 0x7 | (0x2 << 4));   // codes 7 (6.0) low, 2 (1.0) high
  EXPECT_EQ(packed[1], 0x4 | (0x9 << 4));   // 2.0, -0.5
  EXPECT_EQ(packed[2], 0x0 | (0x2 << 4));
  EXPECT_EQ(packed[3], 0x4 | (0xE << 4));   // 2.0, -4.0
  EXPECT_EQ(packed[4], 0x6 | (0x8 << 4));   // 4.0, -0
}

TEST(QuantFp4E4m3, ZeroBlockUsesFloor) {
  std::vector<float> x(32, 0.0f), y(32);
  x[17] = -0.0f;
  std::vector<uint8_t> packed(16), sc(2);
  fp4_e4m3_quant(x.data(), 32, packed.data(), sc.data());
  fp4_e4m3_qdq(x.data(), y.data(), 32);
  EXPECT_EQ(sc[0], 0x01);  // amax floor 6*2^-9, /6 = 2^-9: smallest e4m3 subnormal
  EXPECT_EQ(sc[1], 0x01);
  EXPECT_EQ(packed[8], 0x80);
  EXPECT_EQ(bits(y[17]), 0x80000000u);
  // large amax saturates the scale at 448: 3000 / 6 = 500 -> 448; 3000 / 448 = 6.7 -> clamp 6 -> 2688
  x.assign(32, 0.0f);
  x[0] = 3008.0f;  // a bf16 value
  fp4_e4m3_quant(x.data(), 32, packed.data(), sc.data());
  fp4_e4m3_qdq(x.data(), y.data(), 32);
  EXPECT_EQ(sc[0], 0x7E);
  EXPECT_EQ(y[0], 2688.0f);
}

TEST(QuantFp4Ue8m0, HandVector) {
  std::vector<float> x(32, 0.0f), y(32);
  x[0] = 10.0f;   // amax 10: 10*fp32(1/6) = 1.67 -> s = 2; 5 -> tie -> 4 -> 8
  x[1] = 7.0f;    // 3.5 -> tie -> 4 -> 8
  x[2] = -2.5f;   // -1.25 -> tie -> -1 -> -2
  x[3] = 1.5f;    // 0.75 -> tie -> 1 -> 2
  x[4] = 0.5f;    // 0.25 -> tie -> 0 -> 0
  x[5] = 11.0f;   // 5.5 -> 6 -> 12
  x[31] = -0.3f;  // -0.15 -> -0
  std::vector<uint8_t> packed(16), sc(1);
  fp4_ue8m0_quant(x.data(), 32, packed.data(), sc.data());
  fp4_ue8m0_qdq(x.data(), y.data(), 32);
  EXPECT_EQ(sc[0], 128);
  const float want[6] = {8, 8, -2, 2, 0, 12};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(y[i], want[i]) << i;
  EXPECT_EQ(bits(y[31]), 0x80000000u);
  EXPECT_EQ(packed[0], 0x6 | (0x6 << 4));
  EXPECT_EQ(packed[1], 0xA | (0x2 << 4));
  EXPECT_EQ(packed[2], 0x0 | (0x7 << 4));
  EXPECT_EQ(packed[15], 0x0 | (0x8 << 4));
}

TEST(QuantFp4Ue8m0, ZeroBlockUsesFloor) {
  std::vector<float> x(32, 0.0f), y(32);
  std::vector<uint8_t> packed(16), sc(1);
  fp4_ue8m0_quant(x.data(), 32, packed.data(), sc.data());
  EXPECT_EQ(sc[0], 1);  // 6*2^-126 * fp32(1/6) rounds to exactly 2^-126
  // values below the floor: amax is floored to 6*2^-126, so s = 2^-126 and x/s is exact
  x[0] = 3 * 0x1p-126f;
  x[1] = 0x1p-127f;
  fp4_ue8m0_qdq(x.data(), y.data(), 32);
  EXPECT_EQ(y[0], 3 * 0x1p-126f);
  EXPECT_EQ(y[1], 0x1p-127f);
}

// ---- quantizers: properties on random data --------------------------------------------------------

// Blocks with varied magnitudes: log-uniform block scale, some outliers, zero blocks, negative zeros.
std::vector<float> random_blocks(std::mt19937_64& rng, int n, int block) {
  std::vector<float> x(n);
  std::uniform_real_distribution<float> log_scale(-30.0f, 30.0f), u(-1.0f, 1.0f);
  std::uniform_int_distribution<int> kind(0, 9);
  for (int b = 0; b < n / block; ++b) {
    const int k = kind(rng);
    const float scale = std::exp2(log_scale(rng));
    for (int i = 0; i < block; ++i) {
      float v = u(rng) * scale;
      if (k == 0) v = 0.0f;
      if (k == 1) v = (i & 1) ? -0.0f : 0.0f;
      if (k == 2 && i == 3) v *= 1000.0f;               // outlier
      if (k == 3) v = static_cast<float>(static_cast<int>(u(rng) * 16)) * 0.25f;  // grid-ish values, ties
      x[b * block + i] = round_bf16(v);
    }
  }
  return x;
}

// For a power-of-two scale s: amax * inv <= s and s is the smallest such power of two (or the floor).
void expect_minimal_pow2_scale(float amax, float s, float max_v, float amax_floor) {
  ASSERT_GT(s, 0.0f);
  int e = 0;
  ASSERT_EQ(std::frexp(s, &e), 0.5f) << "scale not a power of two: " << s;
  const double a = std::max(static_cast<double>(amax), static_cast<double>(amax_floor));
  EXPECT_LE(a / s, max_v * (1 + 1e-6));
  EXPECT_GT(a / (s / 2), max_v * (1 - 1e-6));
}

TEST(QuantFp8Ue8m0, RandomProperties) {
  std::mt19937_64 rng(test_seed() + 3);
  const int n = 32 * 256;
  const std::vector<float> x = random_blocks(rng, n, 32);
  std::vector<uint8_t> codes(n), sc(n / 32);
  std::vector<float> deq(n), y(n), alias = x;
  fp8_ue8m0_quant(x.data(), n, 32, codes.data(), sc.data());
  fp8_ue8m0_dequant(codes.data(), sc.data(), n, 32, deq.data());
  fp8_ue8m0_qdq(x.data(), y.data(), n, 32);
  fp8_ue8m0_qdq(alias.data(), alias.data(), n, 32);  // in place
  for (int b = 0; b < n / 32; ++b) {
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
    const float s = e8m0_to_float(sc[b]);
    expect_minimal_pow2_scale(amax, s, 448.0f, 1e-4f);
    for (int i = 0; i < 32; ++i) {
      const int j = b * 32 + i;
      ASSERT_EQ(bits(deq[j]), bits(y[j])) << j;
      ASSERT_EQ(bits(alias[j]), bits(y[j])) << j;
      ASSERT_EQ(codes[j], float_to_e4m3(x[j] / s)) << j;  // independent of the clamp: |x/s| <= 448
      EXPECT_EQ(std::signbit(y[j]), std::signbit(x[j]));
      // half an e4m3 step: 2^-4 relative in the normal range, 2^-10 * s in the subnormal one
      EXPECT_LE(std::fabs(static_cast<double>(y[j]) - x[j]), std::fabs(x[j]) * 0x1p-4 + s * 0x1p-10) << j;
    }
  }
}

TEST(QuantFp4Ue8m0, RandomProperties) {
  std::mt19937_64 rng(test_seed() + 4);
  const int n = 32 * 256;
  const std::vector<float> x = random_blocks(rng, n, 32);
  std::vector<uint8_t> packed(n / 2), sc(n / 32);
  std::vector<float> deq(n), y(n), alias = x;
  fp4_ue8m0_quant(x.data(), n, packed.data(), sc.data());
  fp4_ue8m0_dequant(packed.data(), sc.data(), n, deq.data());
  fp4_ue8m0_qdq(x.data(), y.data(), n);
  fp4_ue8m0_qdq(alias.data(), alias.data(), n);
  for (int b = 0; b < n / 32; ++b) {
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
    const float s = e8m0_to_float(sc[b]);
    expect_minimal_pow2_scale(amax, s, 6.0f, 6.0f * 0x1p-126f);
    for (int i = 0; i < 32; ++i) {
      const int j = b * 32 + i;
      ASSERT_EQ(bits(deq[j]), bits(y[j])) << j;
      ASSERT_EQ(bits(alias[j]), bits(y[j])) << j;
      const uint8_t code = (j & 1) ? packed[j / 2] >> 4 : packed[j / 2] & 15;  // even element low
      ASSERT_EQ(code, e2m1_encode_ref(x[j] / s)) << j;
      EXPECT_LE(std::fabs(static_cast<double>(y[j]) - x[j]), std::fabs(x[j]) * 0.25 + s * 0.25) << j;
    }
  }
}

TEST(QuantFp4E4m3, RandomProperties) {
  std::mt19937_64 rng(test_seed() + 5);
  const int n = 16 * 512;
  std::vector<float> x = random_blocks(rng, n, 16);
  for (float& v : x) v = round_bf16(std::max(-1e30f, std::min(1e30f, v)));
  std::vector<uint8_t> packed(n / 2), sc(n / 16);
  std::vector<float> deq(n), y(n), alias = x;
  fp4_e4m3_quant(x.data(), n, packed.data(), sc.data());
  fp4_e4m3_dequant(packed.data(), sc.data(), n, deq.data());
  fp4_e4m3_qdq(x.data(), y.data(), n);
  fp4_e4m3_qdq(alias.data(), alias.data(), n);
  for (int b = 0; b < n / 16; ++b) {
    float amax = 0;
    for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(x[b * 16 + i]));
    amax = std::max(amax, 6.0f * 0x1p-9f);
    ASSERT_EQ(sc[b], e4m3_encode_ref(std::min(amax / 6.0f, 448.0f))) << b;
    const float s = e4m3_to_float(sc[b]);
    for (int i = 0; i < 16; ++i) {
      const int j = b * 16 + i;
      ASSERT_EQ(bits(deq[j]), bits(y[j])) << j;
      ASSERT_EQ(bits(alias[j]), bits(y[j])) << j;
      const float v = std::max(-6.0f, std::min(6.0f, x[j] / s));
      const uint8_t code = (j & 1) ? packed[j / 2] >> 4 : packed[j / 2] & 15;
      ASSERT_EQ(code, e2m1_encode_ref(v)) << j;
      // rounding error plus the clamp: a scale rounded down (saturated at 448, or coarse in the e4m3
      // subnormal range) leaves |x| / s above 6.
      const double clamp_err = std::max(0.0, std::fabs(static_cast<double>(x[j])) - 6.0 * s);
      EXPECT_LE(std::fabs(static_cast<double>(y[j]) - x[j]), std::fabs(x[j]) * 0.25 + s * 0.25 + clamp_err) << j;
    }
  }
}

TEST(QuantQuantizers, InputIsRoundedToBf16First) {
  // The reference takes bf16 input: a float between bf16 values must quantize like its bf16 rounding.
  std::mt19937_64 rng(test_seed() + 6);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  std::vector<float> x(32), xb(32), y1(32), y2(32);
  for (int t = 0; t < 200; ++t) {
    for (int i = 0; i < 32; ++i) {
      x[i] = u(rng);
      xb[i] = round_bf16(x[i]);
    }
    fp8_ue8m0_qdq(x.data(), y1.data(), 32, 32);
    fp8_ue8m0_qdq(xb.data(), y2.data(), 32, 32);
    for (int i = 0; i < 32; ++i) ASSERT_EQ(bits(y1[i]), bits(y2[i]));
    fp4_ue8m0_qdq(x.data(), y1.data(), 32);
    fp4_ue8m0_qdq(xb.data(), y2.data(), 32);
    for (int i = 0; i < 32; ++i) ASSERT_EQ(bits(y1[i]), bits(y2[i]));
    fp4_e4m3_qdq(x.data(), y1.data(), 32);
    fp4_e4m3_qdq(xb.data(), y2.data(), 32);
    for (int i = 0; i < 32; ++i) ASSERT_EQ(bits(y1[i]), bits(y2[i]));
  }
}

// ---- vectors produced by the reference itself (tests/data/quant_ref/README.md) ----------------------

std::vector<uint8_t> read_ref(const std::string& name) {
  std::ifstream f(std::string(DI_TEST_DATA) + "/quant_ref/" + name, std::ios::binary);
  EXPECT_TRUE(f.good()) << "missing " << name;
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

std::vector<float> read_bf16(const std::string& name) {
  const std::vector<uint8_t> raw = read_ref(name);
  std::vector<float> v(raw.size() / 2);
  for (size_t i = 0; i < v.size(); ++i) v[i] = bf16_to_float(static_cast<uint16_t>(raw[2 * i] | (raw[2 * i + 1] << 8)));
  return v;
}

void expect_same_floats(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(bits(got[i]), bits(want[i])) << what << " [" << i << "]";
}

TEST(QuantReference, MatchesTorchReferenceVectors) {
  const std::vector<float> x = read_bf16("x.bin");
  const int n = static_cast<int>(x.size());
  ASSERT_EQ(n, 16 * 512);
  std::vector<uint8_t> codes(n), packed(n / 2), s32(n / 32), s16(n / 16);
  std::vector<float> y(n);

  fp8_ue8m0_quant(x.data(), n, 32, codes.data(), s32.data());
  EXPECT_EQ(codes, read_ref("fp8_q.bin"));
  EXPECT_EQ(s32, read_ref("fp8_s.bin"));
  fp8_ue8m0_qdq(x.data(), y.data(), n, 32);
  expect_same_floats(y, read_bf16("fp8_y.bin"), "fp8 qdq");

  fp4_e4m3_quant(x.data(), n, packed.data(), s16.data());
  EXPECT_EQ(packed, read_ref("f4e_p.bin"));
  EXPECT_EQ(s16, read_ref("f4e_s.bin"));
  fp4_e4m3_qdq(x.data(), y.data(), n);
  expect_same_floats(y, read_bf16("f4e_y.bin"), "fp4 e4m3 qdq");

  fp4_ue8m0_quant(x.data(), n, packed.data(), s32.data());
  EXPECT_EQ(packed, read_ref("f4u_p.bin"));
  EXPECT_EQ(s32, read_ref("f4u_s.bin"));
  fp4_ue8m0_qdq(x.data(), y.data(), n);
  expect_same_floats(y, read_bf16("f4u_y.bin"), "fp4 ue8m0 qdq");
}

}  // namespace
}  // namespace di::quant
