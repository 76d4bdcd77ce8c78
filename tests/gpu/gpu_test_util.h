// Shared helpers for the GPU op tests (tests/gpu/*_ops_test.cpp): a seeded RNG (fresh seed from the
// clock, printed; DI_GPU_SEED=<n> replays one), random bf16-valued F32 activations, random FP8 /
// FP4 / BF16 / F32 weights that own their host bytes, the two backends, and comparisons.
//
// Typical use:
//   class DenseOps : public GpuOpTest {};  // one fixture name per suite
//   TEST_F(DenseOps, Linear) { Rng& r = rng(); ... }  // `cpu`, `gpu` backends; seed printed in SetUp
//   std::vector<float> xv = random_bf16_values(rng, 7 * 256);
//   OwnedWeight w = random_fp8_weight(rng, 384, 256, *gpu);   // prepared on the GPU backend
//   Tensor yc = cpu->linear(cpu->from_host_f32(xv, {7, 256}), w.w);   // CPU ignores w.w.device
//   Tensor yg = gpu->linear(gpu->from_host_f32(xv, {7, 256}), w.w);
//   Compare c = compare(cpu->to_host_f32(yc), gpu->to_host_f32(yg));
//   EXPECT_LE(c.rel_l2, 1e-3) << c.str();
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/gemv_mma_switch.h"
#include "model/quant.h"

namespace di::gputest {

// Relative L2 bound of moe_experts with Backend::set_fast_fp4_gemm (the routed experts' MXFP4 GEMMs on
// the wgmma FP8 tensor cores), GPU against CPU. Those block sums keep 13 fractional bits below the
// largest product and 14 significant bits (a GEMM's relative L2 ~1e-4 - 3e-4 against the CPU's exact
// sums), and the FP8 re-quantization of h before the down projection turns each perturbation that
// crosses a rounding boundary into an FP8 ulp (1/16 - 1/8 relative): 0.05 - 0.6% measured on the H200
// (bench/RESULTS.md), more on few rows. A wrong fragment, layout or scale gives errors of order 1.
inline constexpr double kFastMoeRelL2 = 2e-2;

// ---- RNG ------------------------------------------------------------------------------------------

// A fresh seed per test from the clock (or DI_GPU_SEED), printed so a failure can be replayed.
inline uint64_t fresh_seed() {
  if (const char* env = std::getenv("DI_GPU_SEED")) return std::strtoull(env, nullptr, 10);
  static uint64_t counter = 0;
  uint64_t t = static_cast<uint64_t>(std::chrono::high_resolution_clock::now().time_since_epoch().count());
  return (t ^ (++counter * 0x9E3779B97F4A7C15ull)) % 1000000007ull;  // short enough to type
}

struct Rng {
  uint64_t seed;
  std::mt19937_64 gen;
  explicit Rng(uint64_t s) : seed(s), gen(s) {}
  float normal(float sd = 1.0f) { return std::normal_distribution<float>(0.0f, sd)(gen); }
  float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(gen); }
  int64_t uniform_int(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(gen); }  // [lo, hi]
};

// Prints "[ seed ] <label>: <seed> (replay: DI_GPU_SEED=<seed>)".
inline Rng make_rng(const std::string& label) {
  uint64_t s = fresh_seed();
  std::printf("[ seed     ] %s: %llu (replay: DI_GPU_SEED=%llu)\n", label.c_str(), static_cast<unsigned long long>(s),
              static_cast<unsigned long long>(s));
  std::fflush(stdout);
  return Rng(s);
}

// ---- activations ----------------------------------------------------------------------------------

// n values ~ N(0, sd), each rounded to bf16 (the forward's activations are bf16 values), never all zero.
inline std::vector<float> random_bf16_values(Rng& rng, int64_t n, float sd = 1.0f) {
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = quant::round_bf16(rng.normal(sd));
  if (n > 0 && std::all_of(v.begin(), v.end(), [](float x) { return x == 0.0f; })) v[0] = quant::round_bf16(sd);
  return v;
}

// The same values as an F32 tensor on each backend: {cpu tensor, gpu tensor}.
struct TensorPair {
  std::vector<float> host;
  Tensor cpu, gpu;
};

inline TensorPair random_tensor_pair(Rng& rng, Backend& cpu, Backend& gpu, const std::vector<int64_t>& shape,
                                     float sd = 1.0f) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  TensorPair p;
  p.host = random_bf16_values(rng, n, sd);
  p.cpu = cpu.from_host_f32(p.host, shape);
  p.gpu = gpu.from_host_f32(p.host, shape);
  return p;
}

// ---- weights --------------------------------------------------------------------------------------

// A Weight over host bytes this struct owns. The bytes live in shared vectors, so copies and moves
// of an OwnedWeight (and copies of `w`, e.g. inside ExpertWeights) stay valid while any copy lives.
// `w` is prepared on the backend given at creation (the CPU backend reads the host bytes and ignores
// w.device, so the same Weight serves both backends).
struct OwnedWeight {
  std::shared_ptr<std::vector<uint8_t>> data_bytes, scale_bytes;
  Weight w;
};

namespace detail {

inline OwnedWeight make_owned(WeightMode mode, DType dtype, int64_t rows, int64_t cols, std::vector<uint8_t> data,
                              std::vector<uint8_t> scale, int64_t scale_cols) {
  OwnedWeight o;
  o.data_bytes = std::make_shared<std::vector<uint8_t>>(std::move(data));
  o.w.mode = mode;
  o.w.dtype = dtype;
  o.w.rows = rows;
  o.w.cols = cols;
  o.w.data = o.data_bytes->data();
  if (!scale.empty()) {
    o.scale_bytes = std::make_shared<std::vector<uint8_t>>(std::move(scale));
    o.w.scale = o.scale_bytes->data();
    o.w.scale_cols = scale_cols;
  }
  return o;
}

inline std::vector<uint8_t> random_e8m0(Rng& rng, int64_t n, int exp_lo, int exp_hi) {
  std::vector<uint8_t> s(static_cast<size_t>(n));
  for (uint8_t& b : s) b = static_cast<uint8_t>(127 + rng.uniform_int(exp_lo, exp_hi));
  return s;
}

// E4M3 codes of N(0, 64) values (realistic spread of codes, never NaN).
inline std::vector<uint8_t> random_e4m3(Rng& rng, int64_t n) {
  std::vector<uint8_t> c(static_cast<size_t>(n));
  for (uint8_t& b : c) b = quant::float_to_e4m3_satfinite(rng.normal(64.0f));
  return c;
}

}  // namespace detail

// FP8 block weight (WeightMode::kFp8Block): F8_E4M3 [rows, cols] + E8M0 [ceil(rows/32), ceil(cols/32)].
// Scales 2^[exp_lo, exp_hi]; the defaults give weights of magnitude ~0.03-0.25 (codes ~N(0, 64)).
inline OwnedWeight random_fp8_weight(Rng& rng, int64_t rows, int64_t cols, Backend& prepare_on, int exp_lo = -11,
                                     int exp_hi = -8) {
  int64_t sr = (rows + 31) / 32, sc = (cols + 31) / 32;
  OwnedWeight o = detail::make_owned(WeightMode::kFp8Block, DType::kF8E4M3, rows, cols, detail::random_e4m3(rng, rows * cols),
                                     detail::random_e8m0(rng, sr * sc, exp_lo, exp_hi), sc);
  prepare_on.prepare(o.w);
  return o;
}

// FP8 rows with one E8M0 scale per 32 values of each row (the Engram table layout): F8_E4M3
// [rows, cols] + E8M0 [rows, cols/32]. Mode kFp8Block, as the model binds it.
inline OwnedWeight random_fp8_row_scaled_table(Rng& rng, int64_t rows, int64_t cols, Backend& prepare_on,
                                               int exp_lo = -8, int exp_hi = -4) {
  OwnedWeight o = detail::make_owned(WeightMode::kFp8Block, DType::kF8E4M3, rows, cols, detail::random_e4m3(rng, rows * cols),
                                     detail::random_e8m0(rng, rows * (cols / 32), exp_lo, exp_hi), cols / 32);
  prepare_on.prepare(o.w);
  return o;
}

// FP4 expert weight (WeightMode::kFp4Expert): I8 [rows, cols/2] (E2M1 pairs, even column in the low
// nibble) + E8M0 [rows, cols/32]. `cols` is the logical (unpacked) width. Codes of N(0, 2) values.
inline OwnedWeight random_fp4_weight(Rng& rng, int64_t rows, int64_t cols, Backend& prepare_on, int exp_lo = -6,
                                     int exp_hi = -3) {
  std::vector<uint8_t> packed(static_cast<size_t>(rows * cols / 2));
  for (uint8_t& b : packed) {
    uint8_t lo = quant::float_to_e2m1(std::clamp(rng.normal(2.0f), -6.0f, 6.0f));
    uint8_t hi = quant::float_to_e2m1(std::clamp(rng.normal(2.0f), -6.0f, 6.0f));
    b = static_cast<uint8_t>(lo | (hi << 4));
  }
  OwnedWeight o = detail::make_owned(WeightMode::kFp4Expert, DType::kI8, rows, cols, std::move(packed),
                                     detail::random_e8m0(rng, rows * (cols / 32), exp_lo, exp_hi), cols / 32);
  prepare_on.prepare(o.w);
  return o;
}

// BF16 weight [rows, cols] of N(mean, sd) values; mode kBf16 (GEMM) or kF32 (promoted; norm weights,
// vectors: rows = 1 as the model binds 1-D tensors).
inline OwnedWeight random_bf16_weight(Rng& rng, int64_t rows, int64_t cols, Backend& prepare_on, float sd = 0.05f,
                                      WeightMode mode = WeightMode::kBf16, float mean = 0.0f) {
  std::vector<uint8_t> bytes(static_cast<size_t>(rows * cols * 2));
  for (int64_t i = 0; i < rows * cols; ++i) {
    uint16_t b = quant::float_to_bf16(mean + rng.normal(sd));
    bytes[2 * i] = static_cast<uint8_t>(b & 0xff);
    bytes[2 * i + 1] = static_cast<uint8_t>(b >> 8);
  }
  OwnedWeight o = detail::make_owned(mode, DType::kBF16, rows, cols, std::move(bytes), {}, 0);
  prepare_on.prepare(o.w);
  return o;
}

// F32 weight [rows, cols] of N(mean, sd) values (full fp32 precision, not bf16-rounded); mode kF32.
inline OwnedWeight random_f32_weight(Rng& rng, int64_t rows, int64_t cols, Backend& prepare_on, float sd = 0.05f,
                                     float mean = 0.0f) {
  std::vector<uint8_t> bytes(static_cast<size_t>(rows * cols * 4));
  for (int64_t i = 0; i < rows * cols; ++i) {
    float v = mean + rng.normal(sd);
    std::memcpy(bytes.data() + 4 * i, &v, 4);
  }
  OwnedWeight o = detail::make_owned(WeightMode::kF32, DType::kF32, rows, cols, std::move(bytes), {}, 0);
  prepare_on.prepare(o.w);
  return o;
}

// ---- comparisons ----------------------------------------------------------------------------------

// Size of one bf16 ulp at magnitude |x| (8 significant bits); the smallest normal's ulp near zero.
inline double bf16_ulp(double x) {
  double a = std::fabs(x);
  if (!(a >= 1.1754943508222875e-38)) return std::ldexp(1.0, -133);
  int e = 0;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  return std::ldexp(1.0, e - 8);
}

struct Compare {
  int64_t n = 0;
  double max_abs = 0;       // max |got - want|
  double rel_l2 = 0;        // ||got - want|| / ||want||
  double max_ulp = 0;       // max |got - want| / bf16_ulp(max(|got|, |want|))
  int64_t worst = -1;       // index of the largest |diff| (-1: none differs)
  int64_t mismatches = 0;   // entries that differ at all (bitwise, NaN == NaN)
  bool nan_mismatch = false;
  float worst_got = 0, worst_want = 0;
  std::string str() const {
    std::ostringstream os;
    os << "n=" << n << " max_abs=" << max_abs << " rel_l2=" << rel_l2 << " max_bf16_ulp=" << max_ulp
       << " mismatches=" << mismatches;
    if (worst >= 0) os << " worst[" << worst << "] got=" << worst_got << " want=" << worst_want;
    if (nan_mismatch) os << " NaN MISMATCH";
    return os.str();
  }
};

// Compares `got` (device result) with `want` (CPU reference). A NaN on one side only makes every
// metric infinite.
inline Compare compare(const std::vector<float>& got, const std::vector<float>& want) {
  Compare c;
  if (got.size() != want.size()) {
    c.nan_mismatch = true;
    c.max_abs = c.rel_l2 = c.max_ulp = INFINITY;
    return c;
  }
  c.n = static_cast<int64_t>(got.size());
  double num = 0, den = 0;
  for (int64_t i = 0; i < c.n; ++i) {
    double g = got[i], w = want[i];
    bool gn = std::isnan(g), wn = std::isnan(w);
    if (gn || wn) {
      if (gn != wn) {
        c.nan_mismatch = true;
        ++c.mismatches;
        c.worst = i, c.worst_got = got[i], c.worst_want = want[i];
      }
      continue;
    }
    if (std::isinf(g) || std::isinf(w)) {  // infinities: equal only as the same infinity
      if (g != w) {
        c.nan_mismatch = true;
        ++c.mismatches;
        c.worst = i, c.worst_got = got[i], c.worst_want = want[i];
      }
      continue;
    }
    double d = std::fabs(g - w);
    if (d != 0 || std::signbit(g) != std::signbit(w)) ++c.mismatches;
    num += d * d;
    den += w * w;
    if (d > c.max_abs) {
      c.max_abs = d;
      if (!c.nan_mismatch) c.worst = i, c.worst_got = got[i], c.worst_want = want[i];
    }
    if (d > 0) c.max_ulp = std::max(c.max_ulp, d / bf16_ulp(std::max(std::fabs(g), std::fabs(w))));
  }
  c.rel_l2 = num == 0 ? 0.0 : std::sqrt(num / std::max(den, 1e-300));
  if (c.nan_mismatch) c.max_abs = c.rel_l2 = c.max_ulp = INFINITY;
  return c;
}

// Relative L2 of one row range [r0, r1) of [rows, cols] data.
inline double rel_l2_rows(const std::vector<float>& got, const std::vector<float>& want, int64_t cols, int64_t r0,
                          int64_t r1) {
  std::vector<float> g(got.begin() + r0 * cols, got.begin() + r1 * cols);
  std::vector<float> w(want.begin() + r0 * cols, want.begin() + r1 * cols);
  return compare(g, w).rel_l2;
}

// Index of the first differing entry, or -1.
inline int64_t first_mismatch(const std::vector<int32_t>& got, const std::vector<int32_t>& want) {
  if (got.size() != want.size()) return 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i]) return static_cast<int64_t>(i);
  return -1;
}

// A second GPU backend built with one switch set (the CUDA backend reads its switches when constructed):
// a switch's path against the default one in the same process.
inline std::unique_ptr<Backend> backend_with(const char* name, const char* value) {
  const char* dev = std::getenv("DI_GPU_TEST_BACKEND");
  setenv(name, value, 1);
  std::unique_ptr<Backend> b = make_backend(dev ? dev : "cuda");
  unsetenv(name);
  return b;
}

// Runs `body` with the tensor-core GEMV (fp8_gemv_mma.cu, opt-in) off, then on for every row count it takes.
template <class F>
void with_and_without_gemv_mma(F body) {
  const int saved = cuda::dense::gemv_mma_max_rows();
  for (int rows : {0, 8}) {
    SCOPED_TRACE(rows ? "tensor-core GEMV on" : "tensor-core GEMV off");
    cuda::dense::set_gemv_mma_max_rows(rows);
    body();
  }
  cuda::dense::set_gemv_mma_max_rows(saved);
}

// ---- fixture --------------------------------------------------------------------------------------

// `cpu` and `gpu` backends and a seeded `rng` (seed printed with the test's name). Without a CUDA
// device the test fails (these tests exist to run on the GPU machine); DI_GPU_TEST_BACKEND=cpu
// makes `gpu` a second CPU backend, to check a test's own logic on a machine without a GPU.
class GpuOpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    rng_ = std::make_unique<Rng>(make_rng(std::string(info->test_suite_name()) + "." + info->name()));
    cpu = make_cpu_backend();
    // DI_GPU_TEST_BACKEND=cpu runs the tests CPU against CPU (checks the tests themselves, no GPU).
    const char* dev = std::getenv("DI_GPU_TEST_BACKEND");
    try {
      gpu = make_backend(dev ? dev : "cuda");
    } catch (const std::exception& e) {
      FAIL() << "no CUDA backend: " << e.what();
    }
  }

 public:  // so helper functions given the fixture can reach them
  Rng& rng() { return *rng_; }
  std::string seed_note() const { return "seed " + std::to_string(rng_->seed); }

  std::unique_ptr<Backend> cpu, gpu;
  std::unique_ptr<Rng> rng_;
};

}  // namespace di::gputest
