// The CUDA dense ops (cuda_dense.cu, dense_linear.cu, cuda_quant.cuh) against the CPU backend on
// random data (fresh seed per test, printed; DI_GPU_SEED=<n> replays). Tolerances:
//  - embed, round_bf16, scale_bf16, qdq, pack_rows (cache bytes), unpack_rows: bit-exact (NaN == NaN).
//  - linear kFp8Block / kFp4Expert: per element |d| <= 1 bf16 ulp of |want| + 2^-10 * sum_k |x_k w_k|,
//    and relative L2 <= 4e-3 over the output. Both sides quantize the activation bit-exactly and
//    scale / add the 32-wide K-block partials the same way, but the GPU sums each block partial on
//    the FP8 tensor cores (whose internal accumulation keeps fewer bits than fp32, as the official
//    reference's fp8_gemm on the same hardware) and may split K across CTAs: differences are fp32
//    rounding before the bf16 output rounding. Dropping or mis-scaling one K block, a wrong row or
//    token, exceeds both bounds. Mismatch counts are printed.
//    With Backend::set_fast_fp4_gemm (MXFP4 block sums on wgmma: every product truncated to 13
//    fractional bits below the block's largest, the sum to 14 significant bits) the per-element bound
//    is 2^-8 * sum_k |x_k w_k| (32 truncations of up to 2^-13 of the largest product, + the sum's).
//  - linear kBf16 and grouped_linear (fp32 sums in another order): per element
//    |d| <= 1 bf16 ulp of |want| + 2^-20 * sum_k |x_k w_k| (the fp32 summation error allowance);
//    2^-14 on the tensor cores (below).
//  - linear kF32 (fp64 sums, rounded once): |d| <= 1e-6 |want| + 1e-12 * sum_k |x_k w_k|; with BF16
//    weights and K % 64 == 0 (bf16 tensor cores, x split into bf16 hi + lo, fp32 sums):
//    |d| <= 1e-6 |want| + 2^-14 * sum_k |x_k w_k| (the split leaves <= 2^-17 |x_k w_k| per product,
//    the fp32 sums their rounding); a wrong row, token or K chunk is off by O(|x_k w_k|).
//  - rmsnorm: within 1 bf16 ulp, and bit-exact (same sum-of-squares order as the CPU).
//  - rope: within 1 bf16 ulp, or the pair inputs x 2^-21 where the rotation nearly cancels (cos/sin: fp64 on
//    the GPU vs glibc cosf/sinf; mismatches are printed).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/split_fixup.h"
#include "core/error.h"
#include "gpu_test_util.h"
#include "model/quant.h"

namespace di {
namespace {

using gputest::compare;
using gputest::Compare;
using gputest::OwnedWeight;
using gputest::Rng;

class DenseOps : public gputest::GpuOpTest {};

// ---- data -------------------------------------------------------------------------------------------

// [rows, cols] values: N(0,1) per row scaled by 2^[-12, 12], some 32-blocks zero, some entries
// bf16-rounded (the forward's activations) and some full fp32 (the quantizers round first).
std::vector<float> random_activation(Rng& rng, int64_t rows, int64_t cols) {
  std::vector<float> v(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float scale = std::ldexp(1.0f, static_cast<int>(rng.uniform_int(-12, 12)));
    const bool round = rng.uniform_int(0, 1) == 1;
    for (int64_t c = 0; c < cols; ++c) {
      float x = rng.normal(1.0f) * scale;
      v[r * cols + c] = round ? quant::round_bf16(x) : x;
    }
    if (cols >= 64 && rng.uniform_int(0, 3) == 0) {  // a zero block (the amax floor path)
      int64_t b = rng.uniform_int(0, cols / 32 - 1);
      for (int64_t c = 0; c < 32; ++c) v[r * cols + b * 32 + c] = 0.0f;
    }
  }
  if (!v.empty()) v[0] = v[0] == 0.0f ? 1.0f : v[0];
  return v;
}

// Values for the quantizers: per 16-block magnitudes 2^[-40, 40], zero blocks, blocks with one
// large value and tiny others (E4M3 subnormals), and blocks on the E2M1 grid midpoints (ties).
std::vector<float> random_quant_rows(Rng& rng, int64_t rows, int64_t cols) {
  std::vector<float> v(static_cast<size_t>(rows * cols));
  static const float kMids[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  for (int64_t b0 = 0; b0 < rows * cols; b0 += 16) {
    const int kind = static_cast<int>(rng.uniform_int(0, 9));
    const float m = std::ldexp(1.0f, static_cast<int>(rng.uniform_int(-40, 40)));
    for (int64_t i = 0; i < 16; ++i) {
      float x = rng.normal(1.0f) * m;
      if (kind == 0) x = 0.0f;
      if (kind == 1) x = i == 0 ? 300.0f * m : rng.normal(1.0f) * m * 0x1p-14f;
      if (kind == 2) x = i == 0 ? 6.0f * m : kMids[rng.uniform_int(0, 6)] * m * (rng.uniform_int(0, 1) ? 1.0f : -1.0f);
      v[b0 + i] = kind == 3 ? x : quant::round_bf16(x);
    }
  }
  return v;
}

// FP8 block weight from uniform random E4M3 codes (no NaN codes 0x7f / 0xff), E8M0 scales 120..130.
OwnedWeight uniform_fp8_weight(Rng& rng, int64_t rows, int64_t cols, Backend& gpu) {
  std::vector<uint8_t> codes(static_cast<size_t>(rows * cols));
  for (uint8_t& c : codes) {
    do c = static_cast<uint8_t>(rng.uniform_int(0, 255));
    while ((c & 0x7f) == 0x7f);
  }
  const int64_t sc = (cols + 31) / 32;
  std::vector<uint8_t> scales(static_cast<size_t>((rows + 31) / 32 * sc));
  for (uint8_t& s : scales) s = static_cast<uint8_t>(rng.uniform_int(120, 130));
  OwnedWeight o = gputest::detail::make_owned(WeightMode::kFp8Block, DType::kF8E4M3, rows, cols, std::move(codes),
                                              std::move(scales), sc);
  gpu.prepare(o.w);
  return o;
}

// FP4 expert weight from random bytes, E8M0 scales 120..130 per row per 32.
OwnedWeight uniform_fp4_weight(Rng& rng, int64_t rows, int64_t cols, Backend& gpu) {
  std::vector<uint8_t> packed(static_cast<size_t>(rows * cols / 2));
  for (uint8_t& b : packed) b = static_cast<uint8_t>(rng.uniform_int(0, 255));
  std::vector<uint8_t> scales(static_cast<size_t>(rows * (cols / 32)));
  for (uint8_t& s : scales) s = static_cast<uint8_t>(rng.uniform_int(120, 130));
  OwnedWeight o = gputest::detail::make_owned(WeightMode::kFp4Expert, DType::kI8, rows, cols, std::move(packed),
                                              std::move(scales), cols / 32);
  gpu.prepare(o.w);
  return o;
}

// F16 weight of random finite values (|x| in ~[2^-5, 2^6]).
OwnedWeight random_f16_weight(Rng& rng, int64_t rows, int64_t cols, Backend& gpu, WeightMode mode) {
  std::vector<uint8_t> bytes(static_cast<size_t>(rows * cols * 2));
  for (int64_t i = 0; i < rows * cols; ++i) {
    uint16_t h = static_cast<uint16_t>((rng.uniform_int(0, 1) << 15) | (rng.uniform_int(10, 21) << 10) |
                                       rng.uniform_int(0, 1023));
    bytes[2 * i] = static_cast<uint8_t>(h & 0xff);
    bytes[2 * i + 1] = static_cast<uint8_t>(h >> 8);
  }
  OwnedWeight o = gputest::detail::make_owned(mode, DType::kF16, rows, cols, std::move(bytes), {}, 0);
  gpu.prepare(o.w);
  return o;
}

// Host values [rows, cols] of a float weight (BF16 / F16 / F32) or a dequantized FP8 block weight.
std::vector<float> host_weight_values(const Weight& w) {
  std::vector<float> v(static_cast<size_t>(w.rows * w.cols));
  for (int64_t o = 0; o < w.rows; ++o)
    for (int64_t k = 0; k < w.cols; ++k) {
      const int64_t i = o * w.cols + k;
      float x = 0;
      switch (w.dtype) {
        case DType::kBF16: x = quant::bf16_to_float(reinterpret_cast<const uint16_t*>(w.data)[i]); break;
        case DType::kF16: x = quant::f16_to_float(reinterpret_cast<const uint16_t*>(w.data)[i]); break;
        case DType::kF32: x = reinterpret_cast<const float*>(w.data)[i]; break;
        case DType::kF8E4M3:
          x = quant::e4m3_to_float(w.data[i]) * quant::e8m0_to_float(w.scale[(o / 32) * w.scale_cols + k / 32]);
          break;
        case DType::kI8: {  // MXFP4 expert: E2M1 pairs (even column low), one E8M0 scale per row per 32
          const uint8_t pair = w.data[(o * w.cols + k) / 2];
          x = quant::e2m1_to_float((k & 1) ? pair >> 4 : pair & 15) * quant::e8m0_to_float(w.scale[o * w.scale_cols + k / 32]);
          break;
        }
        default: ADD_FAILURE() << "unexpected dtype";
      }
      v[i] = x;
    }
  return v;
}

// sum_k |x[r, xoff(o) + k] * w[o, k]| for every output: the scale of fp32 summation error.
std::vector<double> abs_sums(const std::vector<float>& x, int64_t rows, int64_t x_stride, const std::vector<float>& w,
                             int64_t n, int64_t k, int64_t rows_per_group) {
  std::vector<double> s(static_cast<size_t>(rows * n));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < n; ++o) {
      double acc = 0;
      const float* xr = x.data() + r * x_stride + (o / rows_per_group) * k;
      for (int64_t i = 0; i < k; ++i) acc += std::fabs(static_cast<double>(xr[i]) * w[o * k + i]);
      s[r * n + o] = acc;
    }
  return s;
}

// Every element within rel * |want| (+ bf16 ulp if bf16_ulp) + abs_scale * allow[i]; returns failures.
int64_t count_outside(const std::vector<float>& got, const std::vector<float>& want, const std::vector<double>& allow,
                      bool bf16_ulp, double rel, double abs_scale, std::string* worst) {
  int64_t bad = 0;
  double worst_ratio = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double tol = (bf16_ulp ? gputest::bf16_ulp(want[i]) : 0.0) + rel * std::fabs(want[i]) + abs_scale * allow[i];
    const bool ok = d <= tol || (std::isnan(got[i]) && std::isnan(want[i]));
    if (!ok) ++bad;
    const double ratio = tol > 0 ? d / tol : (d > 0 ? INFINITY : 0);
    if (!ok || ratio > worst_ratio) {
      if (ratio >= worst_ratio || !ok) {
        worst_ratio = ratio;
        *worst = "index " + std::to_string(i) + " got " + std::to_string(got[i]) + " want " + std::to_string(want[i]) +
                 " (diff/tol " + std::to_string(ratio) + ")";
      }
    }
  }
  return bad;
}

// ---- linear -----------------------------------------------------------------------------------------

OwnedWeight make_weight(Rng& rng, WeightMode mode, DType dtype, int64_t n, int64_t k, Backend& gpu) {
  switch (mode) {
    case WeightMode::kFp8Block: return uniform_fp8_weight(rng, n, k, gpu);
    case WeightMode::kFp4Expert: return uniform_fp4_weight(rng, n, k, gpu);
    default: break;
  }
  if (dtype == DType::kF16) return random_f16_weight(rng, n, k, gpu, mode);
  if (dtype == DType::kF32) {
    OwnedWeight o = gputest::random_f32_weight(rng, n, k, gpu, 0.05f);
    o.w.mode = mode;
    return o;
  }
  return gputest::random_bf16_weight(rng, n, k, gpu, 0.05f, mode);
}

void check_linear(DenseOps& t, WeightMode mode, DType dtype, int64_t s, int64_t n, int64_t k, bool fast = false) {
  const std::string label = std::string(weight_mode_name(mode)) + "/" + dtype_name(dtype) + " S=" + std::to_string(s) +
                            " N=" + std::to_string(n) + " K=" + std::to_string(k) + (fast ? " fast" : "");
  t.gpu->set_fast_fp4_gemm(fast);
  SCOPED_TRACE(label);
  Rng& rng = t.rng();
  OwnedWeight w = make_weight(rng, mode, dtype, n, k, *t.gpu);
  std::vector<float> xv = random_activation(rng, s, k);
  Tensor yc = t.cpu->linear(t.cpu->from_host_f32(xv, {s, k}), w.w);
  Tensor yg = t.gpu->linear(t.gpu->from_host_f32(xv, {s, k}), w.w);
  ASSERT_EQ(yg.shape, (std::vector<int64_t>{s, n}));
  std::vector<float> want = t.cpu->to_host_f32(yc), got = t.gpu->to_host_f32(yg);
  const Compare c = compare(got, want);
  std::printf("[ info     ] linear %s: %s\n", label.c_str(), c.str().c_str());
  const std::vector<double> l1 = abs_sums(xv, s, k, host_weight_values(w.w), n, k, n);
  std::string worst;
  if (mode == WeightMode::kFp8Block || mode == WeightMode::kFp4Expert) {
    EXPECT_EQ(count_outside(got, want, l1, true, 0.0, fast ? 0x1p-8 : 0x1p-10, &worst), 0)
        << "worst " << worst << "; " << c.str() << ", " << t.seed_note();
    EXPECT_LE(c.rel_l2, 4e-3) << c.str() << ", " << t.seed_note();
    return;
  }
  const bool f32 = mode == WeightMode::kF32;
  const bool tensor_cores = dtype == DType::kBF16 && k % 64 == 0;  // cuda::dense::bf16_mma_fits
  const int64_t bad = f32 ? count_outside(got, want, l1, false, 1e-6, tensor_cores ? 0x1p-14 : 1e-12, &worst)
                          : count_outside(got, want, l1, true, 0.0, tensor_cores ? 0x1p-14 : 0x1p-20, &worst);
  EXPECT_EQ(bad, 0) << "worst " << worst << "; " << c.str() << ", " << t.seed_note();
}

TEST_F(DenseOps, LinearFp8Block) {
  for (int64_t s : {1, 3, 17, 130})
    for (auto [n, k] : {std::pair<int64_t, int64_t>{96, 256}, {160, 544}, {72, 1056}})
      check_linear(*this, WeightMode::kFp8Block, DType::kF8E4M3, s, n, k);
}

TEST_F(DenseOps, LinearFp4Expert) {
  for (int64_t s : {1, 3, 17, 130})
    for (auto [n, k] : {std::pair<int64_t, int64_t>{96, 256}, {160, 544}, {72, 1056}})
      check_linear(*this, WeightMode::kFp4Expert, DType::kI8, s, n, k);
}

// The fast MXFP4 GEMMs (wgmma block sums) at the shapes above, the decode token-tile widths, a split K
// and more row blocks than resident CTAs.
TEST_F(DenseOps, LinearFp4ExpertFast) {
  for (int64_t s : {1, 3, 17, 130})
    for (auto [n, k] : {std::pair<int64_t, int64_t>{96, 256}, {160, 544}, {72, 1056}})
      check_linear(*this, WeightMode::kFp4Expert, DType::kI8, s, n, k, true);
  for (int64_t s : {2, 9, 24, 64, 65}) check_linear(*this, WeightMode::kFp4Expert, DType::kI8, s, 520, 4096, true);
  check_linear(*this, WeightMode::kFp4Expert, DType::kI8, 1, 128 * 420, 2560, true);
}

// Decode batches at long K (split across CTAs), every token-tile width (1, 2, 4, 8 n8 tiles), a
// partial last tile of 64 tokens, and row counts that leave warps and CTAs partly empty.
TEST_F(DenseOps, LinearDecodeShapes) {
  gputest::with_and_without_gemv_mma([&] {
    for (int64_t s : {1, 2, 9, 24, 64, 65}) {
      check_linear(*this, WeightMode::kFp8Block, DType::kF8E4M3, s, 1000, 4096);
      check_linear(*this, WeightMode::kFp4Expert, DType::kI8, s, 520, 4096);
    }
    check_linear(*this, WeightMode::kFp8Block, DType::kF8E4M3, 3, 32768 / 16, 1280);
    // one row at the V4.1 widths and K not a multiple of 512 bytes, row counts that leave a warp's
    // 32-row tile partial
    for (auto [n, k] : {std::pair<int64_t, int64_t>{77, 8192}, {203, 2304}, {130, 1280}, {61, 480}, {9, 160}})
      check_linear(*this, WeightMode::kFp8Block, DType::kF8E4M3, 1, n, k);
    // more row blocks than resident CTAs (no K split) and K longer than one staged activation chunk
    check_linear(*this, WeightMode::kFp8Block, DType::kF8E4M3, 2, 128 * 420, 2560);
    check_linear(*this, WeightMode::kFp4Expert, DType::kI8, 1, 128 * 420, 2560);
  });
}

// The tensor-core GEMV (fp8_gemv_mma.cu, opt-in) at every row count it takes (1-8: one and two column tiles): one
// span (its second warp pair idle), an odd span count, K split over CTAs with a partial last row block, wq_b's K.
TEST_F(DenseOps, LinearGemvRowCounts) {
  gputest::with_and_without_gemv_mma([&] {
    for (int64_t s = 1; s <= 8; ++s)
      for (auto [n, k] : {std::pair<int64_t, int64_t>{9, 64}, {203, 192}, {77, 8192}, {130, 1280}})
        check_linear(*this, WeightMode::kFp8Block, DType::kF8E4M3, s, n, k);
  });
}

TEST_F(DenseOps, LinearBf16) {
  for (int64_t s : {1, 3, 17, 130})
    for (auto [n, k] : {std::pair<int64_t, int64_t>{96, 256}, {160, 544}, {33, 100}})
      check_linear(*this, WeightMode::kBf16, DType::kBF16, s, n, k);
  check_linear(*this, WeightMode::kBf16, DType::kF16, 17, 96, 264);
  check_linear(*this, WeightMode::kBf16, DType::kF32, 17, 96, 264);
}

TEST_F(DenseOps, LinearF32) {
  for (int64_t s : {1, 3, 17, 130})
    for (auto [n, k] : {std::pair<int64_t, int64_t>{96, 256}, {160, 544}, {33, 37}})
      check_linear(*this, WeightMode::kF32, DType::kF32, s, n, k);
  check_linear(*this, WeightMode::kF32, DType::kBF16, 17, 160, 1056);
  check_linear(*this, WeightMode::kF32, DType::kF16, 3, 96, 264);
}

// BF16 weights on the tensor cores: every token-tile width, a partial last 64-token tile,
// rows that leave warps and CTAs partly empty, the head's K, a narrow projection; x not bf16-valued
// (the lo half is used).
TEST_F(DenseOps, LinearBf16TensorCores) {
  for (int64_t s : {1, 2, 9, 24, 64, 65})
    for (auto [n, k] : {std::pair<int64_t, int64_t>{300, 512}, {1000, 5120}, {40, 5120}}) {  // 40: one-chunk splits
      check_linear(*this, WeightMode::kF32, DType::kBF16, s, n, k);
      check_linear(*this, WeightMode::kBf16, DType::kBF16, s, n, k);
    }
}

// The K-split partials summed by each tile's last CTA (fix-up) and by a reduce_splits launch give the
// same bits: the decode shapes of the FP8 / MXFP4 linears and of the BF16 tensor-core kernel (wo_a's
// grouped projection included), with the fix-up allowed everywhere and nowhere.
TEST_F(DenseOps, SplitFixupEqualsReduceLaunch) {
  const int64_t saved = cuda::mma::fixup_max_rounds();
  struct Case {
    WeightMode mode;
    DType dtype;
    int64_t n, k;
  };
  const Case cases[] = {{WeightMode::kFp8Block, DType::kF8E4M3, 1280, 5120},
                        {WeightMode::kFp8Block, DType::kF8E4M3, 520, 8192},
                        {WeightMode::kFp4Expert, DType::kI8, 520, 4096},
                        {WeightMode::kBf16, DType::kBF16, 1000, 5120},
                        // the indexer's / compressors' narrow projections: one-chunk splits
                        {WeightMode::kBf16, DType::kBF16, 32, 5120},
                        {WeightMode::kBf16, DType::kBF16, 200, 5120},
                        {WeightMode::kBf16, DType::kBF16, 520, 5120}};
  for (const Case& c : cases)
    for (int64_t s : {1, 3, 8, 9, 24, 64}) {
      SCOPED_TRACE(std::string(weight_mode_name(c.mode)) + " S=" + std::to_string(s) + " N=" + std::to_string(c.n) +
                   " K=" + std::to_string(c.k));
      OwnedWeight w = make_weight(rng(), c.mode, c.dtype, c.n, c.k, *gpu);
      const Tensor x = gpu->from_host_f32(random_activation(rng(), s, c.k), {s, c.k});
      cuda::mma::set_fixup_max_rounds(0);
      const std::vector<float> reduced = gpu->to_host_f32(gpu->linear(x, w.w));
      cuda::mma::set_fixup_max_rounds(1 << 20);
      const std::vector<float> fixed = gpu->to_host_f32(gpu->linear(x, w.w));
      EXPECT_EQ(std::memcmp(reduced.data(), fixed.data(), reduced.size() * sizeof(float)), 0) << seed_note();
    }
  OwnedWeight wo = uniform_fp8_weight(rng(), 8 * 256, 4096, *gpu);
  for (int64_t s : {1, 8, 24}) {
    std::vector<float> xv = random_activation(rng(), s, 8 * 4096);
    for (float& v : xv) v = quant::round_bf16(v);
    const Tensor x = gpu->from_host_f32(xv, {s, 8 * 4096});
    cuda::mma::set_fixup_max_rounds(0);
    const std::vector<float> reduced = gpu->to_host_f32(gpu->grouped_linear(x, wo.w, 8));
    cuda::mma::set_fixup_max_rounds(1 << 20);
    const std::vector<float> fixed = gpu->to_host_f32(gpu->grouped_linear(x, wo.w, 8));
    EXPECT_EQ(std::memcmp(reduced.data(), fixed.data(), reduced.size() * sizeof(float)), 0)
        << "grouped S=" << s << ", " << seed_note();
  }
  cuda::mma::set_fixup_max_rounds(saved);
}

// x is bf16-valued (the reference's einsum input), so the tensor-core path skips its lo MMAs; with
// `fp32_part`, row S / 2 keeps fp32 values in its first K / 3 columns: the chunks there (and only
// there, in that row's token tile) need the lo half.
void check_grouped_linear(DenseOps& t, int64_t s, int groups, int64_t rpg, int64_t k, bool fp32_part = false) {
  SCOPED_TRACE("grouped S=" + std::to_string(s) + " G=" + std::to_string(groups) + " R=" + std::to_string(rpg) +
               " K=" + std::to_string(k) + (fp32_part ? " with an fp32 part" : ""));
  OwnedWeight w = uniform_fp8_weight(t.rng(), groups * rpg, k, *t.gpu);
  std::vector<float> xv = random_activation(t.rng(), s, groups * k);
  for (int64_t i = 0; i < s * groups * k; ++i)
    if (!fp32_part || i / (groups * k) != s / 2 || i % (groups * k) >= k / 3) xv[i] = quant::round_bf16(xv[i]);
  Tensor yc = t.cpu->grouped_linear(t.cpu->from_host_f32(xv, {s, groups * k}), w.w, groups);
  Tensor yg = t.gpu->grouped_linear(t.gpu->from_host_f32(xv, {s, groups * k}), w.w, groups);
  ASSERT_EQ(yg.shape, (std::vector<int64_t>{s, groups * rpg}));
  std::vector<float> want = t.cpu->to_host_f32(yc), got = t.gpu->to_host_f32(yg);
  const std::vector<double> l1 = abs_sums(xv, s, groups * k, host_weight_values(w.w), groups * rpg, k, rpg);
  const bool tensor_cores = rpg % 256 == 0 && k % 64 == 0;  // cuda::dense::grouped_mma_fits
  std::string worst;
  EXPECT_EQ(count_outside(got, want, l1, true, 0.0, tensor_cores ? 0x1p-14 : 0x1p-20, &worst), 0)
      << "worst " << worst << "; " << compare(got, want).str() << ", " << t.seed_note();
  std::printf("[ info     ] %s grouped_linear S=%lld G=%d R=%lld K=%lld: %s\n", tensor_cores ? "mma " : "cuda",
              static_cast<long long>(s), groups, static_cast<long long>(rpg), static_cast<long long>(k),
              compare(got, want).str().c_str());
}

TEST_F(DenseOps, GroupedLinear) {
  gputest::with_and_without_gemv_mma([&] {
    for (int64_t s : {1, 3, 17, 130})
      for (auto [groups, rpg, k] : {std::tuple<int, int64_t, int64_t>{4, 48, 96}, {8, 16, 256}, {2, 40, 544}})
        check_grouped_linear(*this, s, groups, rpg, k);
    // the tensor-core path (R % 256 == 0): token-tile widths, a partial 64-token tile, wo_a's shape
    for (int64_t s : {1, 2, 9, 24, 65}) check_grouped_linear(*this, s, 2, 256, 512);
    check_grouped_linear(*this, 64, 8, 1024, 4096);
    // wo_a at decode sizes: 8 K splits summed by each tile's last CTA (tokens x splits <= 32)
    for (int64_t s : {1, 3}) check_grouped_linear(*this, s, 8, 1024, 4096);
    // lo MMAs skipped per chunk and token tile: fp32 values in part of one row
    for (int64_t s : {1, 9, 65}) check_grouped_linear(*this, s, 2, 256, 512, true);
    check_grouped_linear(*this, 64, 8, 1024, 4096, true);
  });
}

TEST_F(DenseOps, EmbedBitExact) {
  for (DType dt : {DType::kBF16, DType::kF32}) {
    const int64_t vocab = 1000, d = 96, n = 37;
    OwnedWeight table = dt == DType::kBF16 ? gputest::random_bf16_weight(rng(), vocab, d, *gpu, 1.0f)
                                           : gputest::random_f32_weight(rng(), vocab, d, *gpu, 1.0f);
    std::vector<int32_t> ids(n);
    for (int32_t& id : ids) id = static_cast<int32_t>(rng().uniform_int(0, vocab - 1));
    ids[0] = 0;
    ids[1] = static_cast<int32_t>(vocab - 1);
    Tensor yc = cpu->embed(cpu->from_host_i32(ids, {n}), table.w);
    Tensor yg = gpu->embed(gpu->from_host_i32(ids, {n}), table.w);
    ASSERT_EQ(yg.shape, (std::vector<int64_t>{n, d}));
    const Compare c = compare(gpu->to_host_f32(yg), cpu->to_host_f32(yc));
    EXPECT_EQ(c.mismatches, 0) << dtype_name(dt) << ": " << c.str() << ", " << seed_note();
  }
}

// An id outside the table: NaN rows, and the next copy to the host throws (the embed launch itself does
// not wait for the device); the flag is cleared, so the backend goes on working.
TEST_F(DenseOps, EmbedOutOfRangeIdFailsAtTheNextReadBack) {
  const int64_t vocab = 100, d = 64;
  OwnedWeight table = gputest::random_bf16_weight(rng(), vocab, d, *gpu, 1.0f);
  for (int32_t bad : {static_cast<int32_t>(vocab), -1}) {
    const std::vector<int32_t> ids = {3, bad, 7};
    Tensor y = gpu->embed(gpu->from_host_i32(ids, {3}), table.w);
    try {
      (void)gpu->to_host_f32(y);
      ADD_FAILURE() << "id " << bad << ": no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("out of range"), std::string::npos) << e.what();
    }
    const std::vector<int32_t> good = {static_cast<int32_t>(vocab - 1), 0};
    const std::vector<float> yc = cpu->to_host_f32(cpu->embed(cpu->from_host_i32(good, {2}), table.w));
    const std::vector<float> yg = gpu->to_host_f32(gpu->embed(gpu->from_host_i32(good, {2}), table.w));
    EXPECT_EQ(compare(yg, yc).mismatches, 0) << "after the error, id " << bad;
  }
}

TEST_F(DenseOps, RmsNorm) {
  for (int64_t s : {1, 3, 17, 130})
    for (int64_t n : {96, 100, 4096, 5127, 20480}) {  // 5127: a 7-element tail after whole load batches
      for (DType dt : {DType::kBF16, DType::kF32}) {
        SCOPED_TRACE("rmsnorm S=" + std::to_string(s) + " n=" + std::to_string(n) + " " + dtype_name(dt));
        OwnedWeight w = dt == DType::kBF16 ? gputest::random_bf16_weight(rng(), 1, n, *gpu, 0.3f, WeightMode::kBf16, 1.0f)
                                           : gputest::random_f32_weight(rng(), 1, n, *gpu, 0.3f, 1.0f);
        std::vector<float> xv = random_activation(rng(), s, n);
        Tensor yc = cpu->rmsnorm(cpu->from_host_f32(xv, {s, n}), w.w, 1e-6f);
        Tensor yg = gpu->rmsnorm(gpu->from_host_f32(xv, {s, n}), w.w, 1e-6f);
        const Compare c = compare(gpu->to_host_f32(yg), cpu->to_host_f32(yc));
        EXPECT_LE(c.max_ulp, 1.0) << c.str() << ", " << seed_note();
        EXPECT_EQ(c.mismatches, 0) << "claimed bit-exact (same sum order as the CPU): " << c.str() << ", " << seed_note();
      }
    }
}

TEST_F(DenseOps, Rope) {
  for (int64_t s : {1, 3, 17, 130})
    for (auto [heads, head_dim, rope_dim] : {std::tuple<int, int, int>{1, 512, 64}, {3, 96, 64}, {8, 128, 32}})
      for (bool inverse : {false, true}) {
        SCOPED_TRACE("rope S=" + std::to_string(s) + " heads=" + std::to_string(heads) + " inverse=" +
                     std::to_string(inverse));
        RopeTable table;
        for (int i = 0; i < rope_dim / 2; ++i)
          table.freqs.push_back(static_cast<float>(std::pow(10000.0, -2.0 * i / rope_dim)) *
                                (i % 5 == 0 ? 0.25f : 1.0f));
        std::vector<int64_t> pos(static_cast<size_t>(s));
        for (int64_t& p : pos) p = rng().uniform_int(0, 200000);
        pos[0] = s > 1 ? 0 : (1 << 20) + 3;
        std::vector<float> xv = random_activation(rng(), s, static_cast<int64_t>(heads) * head_dim);
        Tensor xc = cpu->from_host_f32(xv, {s, static_cast<int64_t>(heads) * head_dim});
        Tensor xg = gpu->from_host_f32(xv, {s, static_cast<int64_t>(heads) * head_dim});
        cpu->rope(xc, heads, head_dim, rope_dim, pos, table, inverse);
        gpu->rope(xg, heads, head_dim, rope_dim, pos, table, inverse);
        const std::vector<float> got = gpu->to_host_f32(xg), want = cpu->to_host_f32(xc);
        const Compare c = compare(got, want);
        if (c.mismatches) std::printf("[ info     ] rope mismatches (cos/sin ulps): %s\n", c.str().c_str());
        // Within 1 bf16 ulp, or, where x_a cos - x_b sin nearly cancels, within the fp32 ulps of
        // cos / sin times the pair's inputs (seed 152904259: -8.3e-7 vs -7.2e-7 from inputs ~1).
        int64_t outside = 0;
        std::string first;
        for (size_t i = 0; i < got.size(); ++i) {
          const int64_t d = static_cast<int64_t>(i) % head_dim;
          const size_t partner = d >= head_dim - rope_dim ? i ^ 1u : i;  // pairs start at even dims
          const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
          const double bound = std::max(gputest::bf16_ulp(std::fabs(want[i])),
                                        0x1p-21 * (std::fabs(xv[i]) + std::fabs(xv[partner])));
          if (err > bound && outside++ == 0) {
            char buf[96];
            std::snprintf(buf, sizeof buf, "element %zu: got %.9g want %.9g", i, got[i], want[i]);
            first = buf;
          }
        }
        EXPECT_EQ(outside, 0) << "first: " << first << "; " << c.str() << ", " << seed_note();
      }
}

TEST_F(DenseOps, RoundAndScaleBf16BitExact) {
  std::vector<float> xv = random_activation(rng(), 13, 301);
  xv[1] = INFINITY;
  xv[2] = -INFINITY;
  xv[3] = NAN;
  xv[4] = 3.3895313e38f;  // rounds up to inf in bf16
  xv[5] = 1e-40f;         // fp32 subnormal
  xv[6] = -0.0f;
  for (float factor : {1.0f, 0.0883883476f, -3.0f, 1e30f}) {
    Tensor xc = cpu->from_host_f32(xv, {13, 301}), xg = gpu->from_host_f32(xv, {13, 301});
    if (factor == 1.0f) {
      cpu->round_bf16(xc);
      gpu->round_bf16(xg);
    } else {
      cpu->scale_bf16(xc, factor);
      gpu->scale_bf16(xg, factor);
    }
    const Compare c = compare(gpu->to_host_f32(xg), cpu->to_host_f32(xc));
    EXPECT_EQ(c.mismatches, 0) << "factor " << factor << ": " << c.str() << ", " << seed_note();
  }
}

// ---- qdq / packed rows ----------------------------------------------------------------------------------

const char* format_name(RowFormat f) {
  switch (f) {
    case RowFormat::kFp8Ue8m0: return "fp8_ue8m0";
    case RowFormat::kFp4E4m3: return "fp4_e4m3";
    case RowFormat::kFp4Ue8m0: return "fp4_ue8m0";
  }
  return "?";
}

struct FormatCase {
  RowFormat f;
  int64_t dim;
};
const FormatCase kFormatCases[] = {{RowFormat::kFp8Ue8m0, 512}, {RowFormat::kFp8Ue8m0, 96},
                                   {RowFormat::kFp4E4m3, 512},  {RowFormat::kFp4E4m3, 48},
                                   {RowFormat::kFp4Ue8m0, 128}, {RowFormat::kFp4Ue8m0, 96}};

TEST_F(DenseOps, QdqBitExact) {
  for (const FormatCase& fc : kFormatCases)
    for (int64_t s : {1, 3, 17, 130}) {
      SCOPED_TRACE(std::string("qdq ") + format_name(fc.f) + " dim=" + std::to_string(fc.dim) + " S=" + std::to_string(s));
      std::vector<float> xv = random_quant_rows(rng(), s, fc.dim);
      if (s == 17) {  // non-finite values: NaN codes; compared as NaN == NaN
        xv[5] = NAN;
        xv[fc.dim + 3] = INFINITY;
        xv[2 * fc.dim + 40 % fc.dim] = -INFINITY;
      }
      Tensor xc = cpu->from_host_f32(xv, {s, fc.dim}), xg = gpu->from_host_f32(xv, {s, fc.dim});
      cpu->qdq(xc, fc.f);
      gpu->qdq(xg, fc.f);
      const Compare c = compare(gpu->to_host_f32(xg), cpu->to_host_f32(xc));
      EXPECT_EQ(c.mismatches, 0) << c.str() << ", " << seed_note();
    }
}

// The fused chains (rope_qdq, rmsnorm_rope_qdq: one launch each) against the same ops one by one on
// the GPU, bit for bit -- the separate ops are held to the CPU above. Shapes: the window keys (1 x 512,
// FP8), the compressed latents (1 x 512, FP4 E4M3), the index keys (1 x 128) and index queries (64 x
// 128, FP4 UE8M0), a fully rotated head, odd widths; rows 1 .. 130. A width that is no multiple of 32
// (144) takes the unfused path and must agree as well.
struct RopeQdqCase {
  int heads, head_dim, rope_dim;
  RowFormat f;
};
const RopeQdqCase kRopeQdqCases[] = {{1, 512, 64, RowFormat::kFp8Ue8m0}, {1, 512, 64, RowFormat::kFp4E4m3},
                                     {1, 128, 64, RowFormat::kFp4Ue8m0}, {64, 128, 64, RowFormat::kFp4Ue8m0},
                                     {3, 96, 32, RowFormat::kFp8Ue8m0},  {2, 64, 64, RowFormat::kFp4E4m3},
                                     {3, 48, 16, RowFormat::kFp4E4m3}};

RopeTable random_rope_table(Rng& rng, int rope_dim) {
  RopeTable table;
  for (int i = 0; i < rope_dim / 2; ++i)
    table.freqs.push_back(static_cast<float>(std::pow(10000.0, -2.0 * i / rope_dim)) * rng.uniform(0.25f, 1.0f));
  return table;
}

std::vector<int64_t> random_positions(Rng& rng, int64_t s) {
  std::vector<int64_t> pos(static_cast<size_t>(s));
  for (int64_t& p : pos) p = rng.uniform_int(0, 200000);
  return pos;
}

TEST_F(DenseOps, RopeQdqFusedExact) {
  for (const RopeQdqCase& rc : kRopeQdqCases)
    for (int64_t s : {1, 3, 17, 130}) {
      const int64_t n = static_cast<int64_t>(rc.heads) * rc.head_dim;
      SCOPED_TRACE(std::string("rope_qdq ") + format_name(rc.f) + " heads=" + std::to_string(rc.heads) + " dh=" +
                   std::to_string(rc.head_dim) + " rd=" + std::to_string(rc.rope_dim) + " S=" + std::to_string(s));
      const RopeTable table = random_rope_table(rng(), rc.rope_dim);
      const std::vector<int64_t> pos = random_positions(rng(), s);
      const std::vector<float> xv = random_activation(rng(), s, n);
      Tensor fused = gpu->from_host_f32(xv, {s, n}), steps = gpu->from_host_f32(xv, {s, n});
      gpu->rope_qdq(fused, rc.heads, rc.head_dim, rc.rope_dim, pos, table, rc.f);
      gpu->rope(steps, rc.heads, rc.head_dim, rc.rope_dim, pos, table, false);
      gpu->qdq(steps, rc.f);
      const Compare c = compare(gpu->to_host_f32(fused), gpu->to_host_f32(steps));
      EXPECT_EQ(c.mismatches, 0) << c.str() << ", " << seed_note();
    }
}

// linear_rope (the queries' projection: q_norm while the GEMM stages x, RoPE in its epilogue) against
// rmsnorm, linear and rope one by one on the GPU, bit for bit: FP8 and MXFP4 weights, the V4.1 query
// head (512 wide, 64 rotated; K 1280), heads that do not align with the 128-row CTA tiles (96 wide), a
// fully rotated head; every token-tile width; a K split across CTAs at one row (the rotation after the
// split sums); without the norm, with it, and with the normalized rows returned (the indexer's input).
TEST_F(DenseOps, LinearRopeFusedExact) {
  gputest::with_and_without_gemv_mma([&] {
    struct Case {
      WeightMode mode;
      DType dtype;
      int heads, head_dim, rope_dim;
      int64_t k;
    };
    const Case cases[] = {{WeightMode::kFp8Block, DType::kF8E4M3, 4, 512, 64, 1280},
                          {WeightMode::kFp8Block, DType::kF8E4M3, 3, 96, 32, 544},
                          {WeightMode::kFp4Expert, DType::kI8, 2, 64, 64, 256},
                          {WeightMode::kFp8Block, DType::kF8E4M3, 2, 128, 64, 8192}};
    for (const Case& c : cases)
      for (int64_t s : {1, 2, 3, 9, 24, 64, 65})
        for (int norm_mode = 0; norm_mode < 3; ++norm_mode) {  // none, norm, norm + normed rows
          const int64_t n = static_cast<int64_t>(c.heads) * c.head_dim;
          SCOPED_TRACE(std::string("linear_rope ") + weight_mode_name(c.mode) + " heads=" + std::to_string(c.heads) +
                       " dh=" + std::to_string(c.head_dim) + " rd=" + std::to_string(c.rope_dim) + " K=" +
                       std::to_string(c.k) + " S=" + std::to_string(s) + " norm mode " + std::to_string(norm_mode));
          OwnedWeight w = make_weight(rng(), c.mode, c.dtype, n, c.k, *gpu);
          OwnedWeight nw = gputest::random_bf16_weight(rng(), 1, c.k, *gpu, 0.1f, WeightMode::kF32, 1.0f);
          const RopeTable table = random_rope_table(rng(), c.rope_dim);
          const std::vector<int64_t> pos = random_positions(rng(), s);
          const Tensor x = gpu->from_host_f32(random_activation(rng(), s, c.k), {s, c.k});
          Tensor normed;
          Backend::InputNorm norm;
          if (norm_mode > 0) norm = {&nw.w, 1e-6f, norm_mode == 2 ? &normed : nullptr};
          const Tensor fused = gpu->linear_rope(x, w.w, c.heads, c.head_dim, c.rope_dim, pos, table, norm);
          const Tensor in = norm_mode > 0 ? gpu->rmsnorm(x, nw.w, 1e-6f) : x;
          Tensor steps = gpu->linear(in, w.w);
          gpu->rope(steps, c.heads, c.head_dim, c.rope_dim, pos, table, false);
          const Compare cmp = compare(gpu->to_host_f32(fused), gpu->to_host_f32(steps));
          EXPECT_EQ(cmp.mismatches, 0) << cmp.str() << ", " << seed_note();
          if (norm_mode == 2) {
            const Compare cn = compare(gpu->to_host_f32(normed), gpu->to_host_f32(in));
            EXPECT_EQ(cn.mismatches, 0) << "normed rows: " << cn.str() << ", " << seed_note();
          }
        }
  });
}

// inverse_rope_grouped_linear (wo_a: the attention output's inverse RoPE applied while the tensor-core
// kernel stages it) against rope then grouped_linear on the GPU, bit for bit: the V4.1 head (512 wide,
// 64 rotated) and narrower heads, rows 1 .. 8 (fused) and 9, 24 (the separate ops).
TEST_F(DenseOps, InverseRopeGroupedLinearFusedExact) {
  gputest::with_and_without_gemv_mma([&] {
    struct Case {
      int heads, head_dim, rope_dim, groups;
    };
    for (const Case& c : {Case{8, 512, 64, 2}, Case{16, 96, 32, 4}, Case{4, 128, 128, 1}})
      for (int64_t s : {1, 2, 5, 8, 9, 24}) {
        const int64_t n = static_cast<int64_t>(c.heads) * c.head_dim, k = n / c.groups;
        SCOPED_TRACE("inverse_rope_grouped_linear heads=" + std::to_string(c.heads) + " dh=" +
                     std::to_string(c.head_dim) + " rd=" + std::to_string(c.rope_dim) + " G=" +
                     std::to_string(c.groups) + " S=" + std::to_string(s));
        OwnedWeight w = uniform_fp8_weight(rng(), c.groups * 256, k, *gpu);
        const RopeTable table = random_rope_table(rng(), c.rope_dim);
        const std::vector<int64_t> pos = random_positions(rng(), s);
        std::vector<float> xv = random_activation(rng(), s, n);
        for (float& v : xv) v = quant::round_bf16(v);  // the attention's output is bf16
        const Tensor fused = gpu->inverse_rope_grouped_linear(gpu->from_host_f32(xv, {s, n}), w.w, c.groups, c.heads,
                                                              c.head_dim, c.rope_dim, pos, table);
        Tensor steps = gpu->from_host_f32(xv, {s, n});
        gpu->rope(steps, c.heads, c.head_dim, c.rope_dim, pos, table, true);
        const Tensor want = gpu->grouped_linear(steps, w.w, c.groups);
        const Compare cmp = compare(gpu->to_host_f32(fused), gpu->to_host_f32(want));
        EXPECT_EQ(cmp.mismatches, 0) << cmp.str() << ", " << seed_note();
      }
  });
}

// output_projection (wo_a's tiles quantized by the CTAs that finish them, into wo_b's GEMV) gives the two ops' bits:
// V4.1's shapes (wo_a split over K, its tiles finished by the fix-up), a small set, and a single-chunk K (no split:
// every CTA finishes its own tile); 1, 2, 3, 8 and 9 rows (9, and 3 and 8 without the tensor-core GEMV: the ops' own
// path); run twice, so that the arrival counters are seen to be left zero.
TEST_F(DenseOps, OutputProjectionCodesExact) {
  gputest::with_and_without_gemv_mma([&] {
    struct Case {
      int heads, head_dim, rope_dim, groups;
      int64_t lora, out;
    };
    for (const Case& c :
         {Case{64, 512, 64, 8, 1024, 1024}, Case{8, 512, 64, 2, 256, 768}, Case{4, 64, 32, 4, 256, 256}})
      for (int64_t s : {1, 2, 3, 8, 9})
        for (int rep = 0; rep < 2; ++rep) {
          const int64_t n = static_cast<int64_t>(c.heads) * c.head_dim, k = n / c.groups, mid = c.groups * c.lora;
          SCOPED_TRACE("output_projection heads=" + std::to_string(c.heads) + " dh=" + std::to_string(c.head_dim) +
                       " G=" + std::to_string(c.groups) + " S=" + std::to_string(s) + " rep " + std::to_string(rep));
          OwnedWeight wa = uniform_fp8_weight(rng(), mid, k, *gpu);
          OwnedWeight wb = make_weight(rng(), WeightMode::kFp8Block, DType::kF8E4M3, c.out, mid, *gpu);
          const RopeTable table = random_rope_table(rng(), c.rope_dim);
          const std::vector<int64_t> pos = random_positions(rng(), s);
          std::vector<float> xv = random_activation(rng(), s, n);
          for (float& v : xv) v = quant::round_bf16(v);  // the attention's output is bf16
          const Tensor fused = gpu->output_projection(gpu->from_host_f32(xv, {s, n}), wa.w, c.groups, c.heads,
                                                      c.head_dim, c.rope_dim, pos, table, wb.w);
          const Tensor z = gpu->inverse_rope_grouped_linear(gpu->from_host_f32(xv, {s, n}), wa.w, c.groups, c.heads,
                                                            c.head_dim, c.rope_dim, pos, table);
          const Tensor want = gpu->linear(z, wb.w);
          const Compare cmp = compare(gpu->to_host_f32(fused), gpu->to_host_f32(want));
          EXPECT_EQ(cmp.mismatches, 0) << cmp.str() << ", " << seed_note();
        }
  });
}

TEST_F(DenseOps, RmsnormRopeQdqFusedExact) {
  for (const RopeQdqCase& rc : kRopeQdqCases)
    for (DType dt : {DType::kBF16, DType::kF32})
      for (int64_t s : {1, 3, 17, 130}) {
        const int64_t n = static_cast<int64_t>(rc.heads) * rc.head_dim;
        SCOPED_TRACE(std::string("rmsnorm_rope_qdq ") + format_name(rc.f) + " heads=" + std::to_string(rc.heads) +
                     " dh=" + std::to_string(rc.head_dim) + " " + dtype_name(dt) + " S=" + std::to_string(s));
        OwnedWeight w = dt == DType::kBF16 ? gputest::random_bf16_weight(rng(), 1, n, *gpu, 0.3f, WeightMode::kBf16, 1.0f)
                                           : gputest::random_f32_weight(rng(), 1, n, *gpu, 0.3f, 1.0f);
        const RopeTable table = random_rope_table(rng(), rc.rope_dim);
        const std::vector<int64_t> pos = random_positions(rng(), s);
        const Tensor x = gpu->from_host_f32(random_activation(rng(), s, n), {s, n});
        const Tensor fused = gpu->rmsnorm_rope_qdq(x, w.w, 1e-6f, rc.heads, rc.head_dim, rc.rope_dim, pos, table, rc.f);
        Tensor steps = gpu->rmsnorm(x, w.w, 1e-6f);
        gpu->rope(steps, rc.heads, rc.head_dim, rc.rope_dim, pos, table, false);
        gpu->qdq(steps, rc.f);
        ASSERT_EQ(fused.shape, steps.shape);
        const Compare c = compare(gpu->to_host_f32(fused), gpu->to_host_f32(steps));
        EXPECT_EQ(c.mismatches, 0) << c.str() << ", " << seed_note();
      }
}

std::vector<uint8_t> device_bytes(const Tensor& t) {
  std::vector<uint8_t> v(static_cast<size_t>(t.numel()));
  if (!v.empty()) {
    EXPECT_EQ(cudaMemcpy(v.data(), t.data, v.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  }
  return v;
}

TEST_F(DenseOps, PackUnpackBitExact) {
  for (const FormatCase& fc : kFormatCases) {
    SCOPED_TRACE(std::string("pack ") + format_name(fc.f) + " dim=" + std::to_string(fc.dim));
    const int64_t cache_rows = 40, rb = packed_row_bytes(fc.f, fc.dim);
    Tensor cc = cpu->zeros(TType::kU8, {cache_rows, rb}), cg = gpu->zeros(TType::kU8, {cache_rows, rb});
    // pack 17 raw rows and 9 qdq'd rows into distinct random slots
    std::vector<int64_t> perm(cache_rows);
    for (int64_t i = 0; i < cache_rows; ++i) perm[i] = i;
    std::shuffle(perm.begin(), perm.end(), rng().gen);
    for (int pass = 0; pass < 2; ++pass) {
      const int64_t s = pass == 0 ? 17 : 9;
      std::vector<int64_t> slots(perm.begin() + (pass == 0 ? 0 : 17), perm.begin() + (pass == 0 ? 17 : 26));
      std::vector<float> xv = random_quant_rows(rng(), s, fc.dim);
      Tensor xc = cpu->from_host_f32(xv, {s, fc.dim}), xg = gpu->from_host_f32(xv, {s, fc.dim});
      if (pass == 1) {
        cpu->qdq(xc, fc.f);
        gpu->qdq(xg, fc.f);
      }
      cpu->pack_rows(xc, fc.f, cc, slots);
      gpu->pack_rows(xg, fc.f, cg, slots);
    }
    std::vector<uint8_t> want(cc.u8(), cc.u8() + cc.numel()), got = device_bytes(cg);
    int64_t first = -1;
    for (size_t i = 0; i < want.size() && first < 0; ++i)
      if (want[i] != got[i]) first = static_cast<int64_t>(i);
    EXPECT_EQ(first, -1) << "first differing byte at row " << first / rb << " offset " << first % rb << ", "
                         << seed_note();
    // unpack: any slots (repeats allowed), from the packed cache and from random bytes
    std::vector<int64_t> slots(23);
    for (int64_t& sl : slots) sl = rng().uniform_int(0, cache_rows - 1);
    for (int src = 0; src < 2; ++src) {
      if (src == 1) {
        std::vector<uint8_t> noise(static_cast<size_t>(cc.numel()));
        for (uint8_t& b : noise) b = static_cast<uint8_t>(rng().uniform_int(0, 255));
        std::memcpy(cc.u8(), noise.data(), noise.size());
        ASSERT_EQ(cudaMemcpy(cg.data, noise.data(), noise.size(), cudaMemcpyHostToDevice), cudaSuccess);
      }
      Tensor yc = cpu->unpack_rows(cc, fc.f, fc.dim, slots), yg = gpu->unpack_rows(cg, fc.f, fc.dim, slots);
      ASSERT_EQ(yg.shape, (std::vector<int64_t>{23, fc.dim}));
      const Compare c = compare(gpu->to_host_f32(yg), cpu->to_host_f32(yc));
      EXPECT_EQ(c.mismatches, 0) << (src ? "random bytes: " : "packed rows: ") << c.str() << ", " << seed_note();
    }
  }
}

// pack_rows_to / unpack_caches (a batch's window rings in one launch): the same bytes and values as
// the CPU, rows assigned to three caches at random, some rows not written. Both ways to pass the row
// addresses: as kernel parameters (at most 64 rows packed; caches of one size unpacked) and uploaded.
TEST_F(DenseOps, PackToManyCachesAndUnpackThemBitExact) {
  struct Case {
    std::vector<int64_t> rings;  // each cache's rows
    int64_t s;                   // rows packed
  };
  for (const Case& k : {Case{{11, 11, 11}, 29}, Case{{11, 40, 37}, 83}}) {
    for (const FormatCase& fc : kFormatCases) {
      SCOPED_TRACE(std::string("pack_rows_to ") + format_name(fc.f) + " dim=" + std::to_string(fc.dim) +
                   " rows=" + std::to_string(k.s) + " second ring=" + std::to_string(k.rings[1]));
      const int64_t rb = packed_row_bytes(fc.f, fc.dim), s = k.s;
      const int n_caches = static_cast<int>(k.rings.size());
      std::vector<Tensor> cc, cg;
      int64_t ring_rows = 0;
      for (int64_t ring : k.rings) {
        std::vector<uint8_t> noise(static_cast<size_t>(ring * rb));
        for (uint8_t& b : noise) b = static_cast<uint8_t>(rng().uniform_int(0, 255));
        cc.push_back(cpu->zeros(TType::kU8, {ring, rb}));
        std::memcpy(cc.back().u8(), noise.data(), noise.size());
        cg.push_back(gpu->zeros(TType::kU8, {ring, rb}));
        ASSERT_EQ(cudaMemcpy(cg.back().data, noise.data(), noise.size(), cudaMemcpyHostToDevice), cudaSuccess);
        ring_rows += ring;
      }
      std::vector<int32_t> cache_of(s);
      std::vector<int64_t> slots(s);
      std::vector<std::vector<int64_t>> free_slots(k.rings.size());
      for (size_t c = 0; c < free_slots.size(); ++c) {
        for (int64_t i = 0; i < k.rings[c]; ++i) free_slots[c].push_back(i);
        std::shuffle(free_slots[c].begin(), free_slots[c].end(), rng().gen);
      }
      for (int64_t r = 0; r < s; ++r) {  // distinct slots per cache, ~1 in 5 rows skipped
        int c = static_cast<int>(rng().uniform_int(-1, n_caches));
        if (c >= n_caches || (c >= 0 && free_slots[c].empty())) c = -1;
        cache_of[r] = c;
        if (c >= 0) {
          slots[r] = free_slots[c].back();
          free_slots[c].pop_back();
        }
      }
      std::vector<float> xv = random_quant_rows(rng(), s, fc.dim);
      Tensor xc = cpu->from_host_f32(xv, {s, fc.dim}), xg = gpu->from_host_f32(xv, {s, fc.dim});
      cpu->pack_rows_to(xc, fc.f, cc, cache_of, slots);
      gpu->pack_rows_to(xg, fc.f, cg, cache_of, slots);
      for (int i = 0; i < n_caches; ++i) {
        std::vector<uint8_t> want(cc[i].u8(), cc[i].u8() + cc[i].numel()), got = device_bytes(cg[i]);
        EXPECT_EQ(got, want) << "cache " << i << ", " << seed_note();
      }
      Tensor yc = cpu->alloc(TType::kF32, {ring_rows + 2, fc.dim}), yg = gpu->alloc(TType::kF32, {ring_rows + 2, fc.dim});
      cpu->unpack_caches(cc, fc.f, yc, 2);
      gpu->unpack_caches(cg, fc.f, yg, 2);
      std::vector<float> want = cpu->to_host_f32(yc), got = gpu->to_host_f32(yg);
      want.erase(want.begin(), want.begin() + 2 * fc.dim);  // rows 0-1 are not written
      got.erase(got.begin(), got.begin() + 2 * fc.dim);
      const Compare c = compare(got, want);
      EXPECT_EQ(c.mismatches, 0) << c.str() << ", " << seed_note();
    }
  }
}

}  // namespace
}  // namespace di
