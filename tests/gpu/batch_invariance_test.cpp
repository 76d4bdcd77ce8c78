// Batch invariance of the CUDA backend (Backend::set_batch_invariant; policy and audit in
// src/backend/cuda/batch_invariance.cuh). With the mode on, each row of an op's result must equal,
// bit for bit (memcmp), the same row computed alone (M = 1), for M = 1, 3, 17, 64, 65, 200 rows
// drawn at random from a pool of 200 inputs, in random order: a row lands at different positions,
// token tiles and 64-row chunks, and the sizes cross nt = 1 / 2 / 4 / 8, one and several token
// chunks, and K splits run on separate CTAs and inside CTAs. Ops: linear (FP8 block, MXFP4, BF16,
// F32), grouped_linear, sparse_attention (also with the index lists padded by trailing -1, as a
// wider prefill chunk pads them), hc_mixes, moe_experts (grouped and listed paths), and two ops
// invariant by construction (moe_route, rmsnorm).
// The rows alone are also compared with the CPU op at the op tests' tolerances (the invariant mode
// changes split counts, not what an op computes). The default mode's accuracy is what
// dense_ops_test, attention_ops_test and moe_engram_ops_test check; it is not repeated here.
// DI_GPU_TEST_BACKEND=cpu runs this CPU against CPU (checks the test's own logic, no GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "gpu_test_util.h"
#include "model/quant.h"

namespace di {
namespace {

using gputest::compare;
using gputest::Compare;
using gputest::OwnedWeight;
using gputest::Rng;

constexpr int64_t kPool = 200;                               // input rows per case
constexpr int64_t kRowCounts[] = {1, 3, 17, 64, 65, 200};  // batch sizes checked

class BatchInvariance : public gputest::GpuOpTest {
 protected:
  void SetUp() override {
    GpuOpTest::SetUp();
    if (gpu) gpu->set_batch_invariant(true);
  }
};

// ---- the check --------------------------------------------------------------------------------------

// Rows `pick` of a row-major [*, cols] host matrix.
template <class T>
std::vector<T> gather(const std::vector<T>& m, int64_t cols, const std::vector<int64_t>& pick) {
  std::vector<T> out(pick.size() * static_cast<size_t>(cols));
  for (size_t i = 0; i < pick.size(); ++i)
    std::copy_n(m.begin() + pick[i] * cols, cols, out.begin() + static_cast<int64_t>(i) * cols);
  return out;
}

// An op over chosen pool rows: run(pick) -> its host result [pick.size(), out_cols].
using RowsRun = std::function<std::vector<float>(const std::vector<int64_t>& pick)>;

// Runs every pool row alone, then a batch of each size in kRowCounts (distinct random rows, random
// order), and expects each batched row to equal its row alone bit for bit. Returns the rows alone
// [kPool, out_cols].
std::vector<float> expect_rows_invariant(const std::string& op, Rng& rng, int64_t out_cols, const RowsRun& run) {
  const size_t row_bytes = static_cast<size_t>(out_cols) * sizeof(float);
  std::vector<float> alone(static_cast<size_t>(kPool * out_cols));
  for (int64_t r = 0; r < kPool; ++r) {
    const std::vector<float> y = run({r});
    if (static_cast<int64_t>(y.size()) != out_cols) {
      ADD_FAILURE() << op << ": one row gave " << y.size() << " values, expected " << out_cols;
      return alone;
    }
    std::memcpy(alone.data() + r * out_cols, y.data(), row_bytes);
  }
  std::vector<int64_t> order(kPool);
  for (int64_t m : kRowCounts) {
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng.gen);
    const std::vector<int64_t> pick(order.begin(), order.begin() + m);
    const std::vector<float> y = run(pick);
    if (static_cast<int64_t>(y.size()) != m * out_cols) {
      ADD_FAILURE() << op << ": M=" << m << " gave " << y.size() << " values, expected " << m * out_cols;
      continue;
    }
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < m; ++i)
      if (std::memcmp(y.data() + i * out_cols, alone.data() + pick[i] * out_cols, row_bytes) != 0) {
        if (bad++ == 0) first = i;
      }
    std::string where;
    if (first >= 0) {
      const float* got = y.data() + first * out_cols;
      const float* want = alone.data() + pick[first] * out_cols;
      int64_t c = 0;
      while (c < out_cols && std::memcmp(got + c, want + c, sizeof(float)) == 0) ++c;
      where = "; first: batch row " + std::to_string(first) + " (pool row " + std::to_string(pick[first]) + ") col " +
              std::to_string(c) + " batched=" + std::to_string(got[c]) + " alone=" + std::to_string(want[c]);
    }
    EXPECT_EQ(bad, 0) << op << ", M=" << m << ": " << bad << " rows differ from the row run alone" << where;
    std::printf("[ invariant ] %s M=%lld: %lld of %lld rows differ from alone\n", op.c_str(),
                static_cast<long long>(m), static_cast<long long>(bad), static_cast<long long>(m));
  }
  return alone;
}

// For information, not checked: how many of 65 random rows differ from the row alone in the default
// mode -- a nonzero count shows the check above can see what the invariant mode removes (zero is
// possible: not every shape changes its split with M).
void print_default_mode_rows(const std::string& op, Backend& gpu, Rng& rng, int64_t out_cols, const RowsRun& run) {
  std::vector<int64_t> pick(kPool);
  std::iota(pick.begin(), pick.end(), 0);
  std::shuffle(pick.begin(), pick.end(), rng.gen);
  pick.resize(65);
  gpu.set_batch_invariant(false);
  const std::vector<float> y = run(pick);
  int64_t differ = 0;
  for (size_t i = 0; i < pick.size(); ++i) {
    const std::vector<float> alone = run({pick[i]});
    differ += std::memcmp(y.data() + i * out_cols, alone.data(), static_cast<size_t>(out_cols) * sizeof(float)) != 0;
  }
  gpu.set_batch_invariant(true);
  std::printf("[ default   ] %s M=65: %lld of 65 rows differ from alone in the default mode (information)\n",
              op.c_str(), static_cast<long long>(differ));
}

void expect_close_to_cpu(const std::string& op, const std::vector<float>& alone, const std::vector<float>& cpu,
                         double rel_l2, double max_abs = INFINITY) {
  const Compare c = compare(alone, cpu);
  std::printf("[ vs cpu    ] %s: %s\n", op.c_str(), c.str().c_str());
  EXPECT_LE(c.rel_l2, rel_l2) << op << " (rows alone, invariant mode) vs CPU: " << c.str();
  EXPECT_LE(c.max_abs, max_abs) << op << " (rows alone, invariant mode) vs CPU: " << c.str();
  EXPECT_FALSE(c.nan_mismatch) << op << ": " << c.str();
}

// [rows, cols] activations: N(0, 1) x 2^[-8, 8] per row, bf16-rounded, now and then a zero 32-block
// (the quantizers' amax floor).
std::vector<float> random_rows(Rng& rng, int64_t rows, int64_t cols) {
  std::vector<float> v(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float scale = std::ldexp(1.0f, static_cast<int>(rng.uniform_int(-8, 8)));
    for (int64_t c = 0; c < cols; ++c) v[r * cols + c] = quant::round_bf16(rng.normal(1.0f) * scale);
    if (cols >= 64 && rng.uniform_int(0, 3) == 0) {
      const int64_t b = rng.uniform_int(0, cols / 32 - 1);
      std::fill_n(v.begin() + r * cols + b * 32, 32, 0.0f);
    }
  }
  return v;
}

// ---- dense ------------------------------------------------------------------------------------------

void check_linear(BatchInvariance& t, const std::string& op, const Weight& w, double tol) {
  Rng& rng = t.rng();
  const int64_t k = w.cols, n = w.rows;
  const std::vector<float> x = random_rows(rng, kPool, k);  // [kPool, K]
  const RowsRun run = [&](const std::vector<int64_t>& pick) {
    const int64_t m = static_cast<int64_t>(pick.size());
    return t.gpu->to_host_f32(t.gpu->linear(t.gpu->from_host_f32(gather(x, k, pick), {m, k}), w));
  };
  const std::vector<float> alone = expect_rows_invariant(op, rng, n, run);
  print_default_mode_rows(op, *t.gpu, rng, n, run);
  expect_close_to_cpu(op, alone, t.cpu->to_host_f32(t.cpu->linear(t.cpu->from_host_f32(x, {kPool, k}), w)), tol);
}

// FP8 block / MXFP4: the K split that used to follow M. [4096 x 2048]: 32 row blocks, 64 K blocks
// (several splits at M = 1; in-CTA splits for the larger batches); [300 x 1056]: a partial row
// block and 33 K blocks (uneven splits). Tolerance: dense_ops_test's relative L2.
TEST_F(BatchInvariance, LinearQuantized) {
  OwnedWeight a = gputest::random_fp8_weight(rng(), 4096, 2048, *gpu);
  check_linear(*this, "linear fp8 [4096 x 2048]", a.w, 4e-3);
  OwnedWeight b = gputest::random_fp8_weight(rng(), 300, 1056, *gpu);
  check_linear(*this, "linear fp8 [300 x 1056]", b.w, 4e-3);
  OwnedWeight c = gputest::random_fp4_weight(rng(), 1024, 2048, *gpu);
  check_linear(*this, "linear fp4 [1024 x 2048]", c.w, 4e-3);
  gpu->set_fast_fp4_gemm(true);  // wgmma block sums: the MMA's N follows the batch
  check_linear(*this, "linear fp4 fast [1024 x 2048]", c.w, 4e-3);
}

// BF16 (fp32 sums, bf16 out; K = 1000: scalar loads, K = 1024: 8-wide) and F32 (fp64 sums) weights:
// up to 8 rows per CTA, invariant by construction.
TEST_F(BatchInvariance, LinearFloat) {
  OwnedWeight a = gputest::random_bf16_weight(rng(), 300, 1000, *gpu);
  check_linear(*this, "linear bf16 [300 x 1000]", a.w, 1e-3);
  OwnedWeight b = gputest::random_bf16_weight(rng(), 256, 1024, *gpu);
  check_linear(*this, "linear bf16 [256 x 1024]", b.w, 1e-3);
  OwnedWeight c = gputest::random_f32_weight(rng(), 130, 520, *gpu);
  check_linear(*this, "linear f32 [130 x 520]", c.w, 1e-6);
}

TEST_F(BatchInvariance, GroupedLinear) {
  const int groups = 4;
  const int64_t k = 256, rpg = 96;
  OwnedWeight w = gputest::random_fp8_weight(rng(), groups * rpg, k, *gpu);  // [G*R, K]
  const std::vector<float> x = random_rows(rng(), kPool, groups * k);       // [kPool, G*K]
  const std::string op = "grouped_linear [4 x 96 x 256]";
  const int64_t n = groups * rpg;
  const std::vector<float> alone = expect_rows_invariant(op, rng(), n, [&](const std::vector<int64_t>& pick) {
    const int64_t m = static_cast<int64_t>(pick.size());
    const Tensor xs = gpu->from_host_f32(gather(x, groups * k, pick), {m, groups * k});
    return gpu->to_host_f32(gpu->grouped_linear(xs, w.w, groups));
  });
  expect_close_to_cpu(op, alone,
                      cpu->to_host_f32(cpu->grouped_linear(cpu->from_host_f32(x, {kPool, groups * k}), w.w, groups)),
                      1e-3);
}

TEST_F(BatchInvariance, RmsNorm) {
  const int64_t n = 4096;
  OwnedWeight w = gputest::random_bf16_weight(rng(), 1, n, *gpu, 0.3f, WeightMode::kBf16, 1.0f);
  const std::vector<float> x = random_rows(rng(), kPool, n);
  const std::vector<float> alone = expect_rows_invariant("rmsnorm", rng(), n, [&](const std::vector<int64_t>& pick) {
    const int64_t m = static_cast<int64_t>(pick.size());
    return gpu->to_host_f32(gpu->rmsnorm(gpu->from_host_f32(gather(x, n, pick), {m, n}), w.w, 1e-6f));
  });
  expect_close_to_cpu("rmsnorm", alone, cpu->to_host_f32(cpu->rmsnorm(cpu->from_host_f32(x, {kPool, n}), w.w, 1e-6f)),
                      0.0);
}

// ---- mHC ----------------------------------------------------------------------------------------------

// K chunks per row followed 264 / M. Tolerance: attention_ops_test's max |diff| <= 1e-6.
TEST_F(BatchInvariance, HcMixes) {
  const int hc = 4, mix = (2 + hc) * hc;
  for (int64_t d : {4096, 1031}) {
    const int64_t n = hc * d;
    const std::vector<float> x = random_rows(rng(), kPool, n);  // [kPool, hc * D]
    const float fn_sd = 1.5f / std::sqrt(static_cast<float>(n));
    OwnedWeight fn = gputest::random_f32_weight(rng(), mix, n, *gpu, fn_sd);
    OwnedWeight scale = gputest::random_f32_weight(rng(), 1, 3, *gpu, 0.3f, 1.0f);
    OwnedWeight base = gputest::random_f32_weight(rng(), 1, mix, *gpu, 0.5f);
    const std::string op = "hc_mixes hc=4 D=" + std::to_string(d);
    const RowsRun run = [&](const std::vector<int64_t>& pick) {
      const int64_t m = static_cast<int64_t>(pick.size());
      return gpu->to_host_f32(
          gpu->hc_mixes(gpu->from_host_f32(gather(x, n, pick), {m, n}), hc, fn.w, scale.w, base.w, 1e-6f, 20, 1e-6f));
    };
    const std::vector<float> alone = expect_rows_invariant(op, rng(), mix, run);
    print_default_mode_rows(op, *gpu, rng(), mix, run);
    expect_close_to_cpu(
        op, alone,
        cpu->to_host_f32(cpu->hc_mixes(cpu->from_host_f32(x, {kPool, n}), hc, fn.w, scale.w, base.w, 1e-6f, 20, 1e-6f)),
        INFINITY, 1e-6);
  }
}

// ---- sparse attention -----------------------------------------------------------------------------------

struct AttnShape {
  int heads;
  int64_t dh, n_kv, len;
};

// List splits followed 264 / (M x head groups). [64 heads x 512, L = 700]: the model's decode shape
// (L = 640) plus a partial block: 11 single-block splits, 1.45 MB of partials per row, so the 200-row
// batch runs as two row groups under the 256 MB bound. Then: 8 rows with their lists padded by
// trailing -1 (wider lists, 2 more blocks) must equal the rows alone. Tolerance: attention_ops_test's
// relative L2 <= 1e-3.
TEST_F(BatchInvariance, SparseAttention) {
  for (const AttnShape& c : {AttnShape{64, 512, 800, 700}, AttnShape{4, 64, 300, 150}}) {
    const std::string op = "sparse_attention heads=" + std::to_string(c.heads) + " dh=" + std::to_string(c.dh) +
                           " L=" + std::to_string(c.len);
    const int64_t qw = c.heads * c.dh;
    std::vector<float> q = gputest::random_bf16_values(rng(), kPool * qw);  // [kPool, heads * dh]
    for (int64_t r = 1; r < kPool; r += 2)  // every other row peaky
      for (int64_t i = 0; i < qw; ++i) q[r * qw + i] = quant::round_bf16(3.0f * q[r * qw + i]);
    const std::vector<float> kv_host = gputest::random_bf16_values(rng(), c.n_kv * c.dh);
    const Tensor kv_gpu = gpu->from_host_f32(kv_host, {c.n_kv, c.dh});
    // lists: random rows (repeats allowed), ~15% -1, a dead 64-block per row (maybe past the end);
    // pool row 7 is all -1
    std::vector<int32_t> idx(static_cast<size_t>(kPool * c.len));
    for (int64_t r = 0; r < kPool; ++r) {
      const int64_t dead = rng().uniform_int(0, (c.len - 1) / 64 + 1);
      for (int64_t j = 0; j < c.len; ++j) {
        int32_t id = static_cast<int32_t>(rng().uniform_int(0, c.n_kv - 1));
        if (r == 7 || rng().uniform(0, 1) < 0.15f || j / 64 == dead) id = -1;
        idx[r * c.len + j] = id;
      }
    }
    OwnedWeight sink = gputest::random_f32_weight(rng(), 1, c.heads, *gpu, 1.0f);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.dh));
    auto run_lists = [&](const std::vector<int64_t>& pick, const std::vector<int32_t>& lists, int64_t len) {
      const int64_t m = static_cast<int64_t>(pick.size());
      return gpu->to_host_f32(gpu->sparse_attention(gpu->from_host_f32(gather(q, qw, pick), {m, qw}), c.heads, kv_gpu,
                                                    gpu->from_host_i32(lists, {m, len}), sink.w, scale));
    };
    const RowsRun run = [&](const std::vector<int64_t>& pick) {
      return run_lists(pick, gather(idx, c.len, pick), c.len);
    };
    const std::vector<float> alone = expect_rows_invariant(op, rng(), qw, run);
    print_default_mode_rows(op, *gpu, rng(), qw, run);
    const Tensor kv_cpu = cpu->from_host_f32(kv_host, {c.n_kv, c.dh});
    expect_close_to_cpu(op, alone,
                        cpu->to_host_f32(cpu->sparse_attention(cpu->from_host_f32(q, {kPool, qw}), c.heads, kv_cpu,
                                                               cpu->from_host_i32(idx, {kPool, c.len}), sink.w, scale)),
                        1e-3);

    // the same rows with 100 trailing -1 per list
    const int64_t wide = c.len + 100;
    std::vector<int64_t> pick(8);
    for (int64_t& p : pick) p = rng().uniform_int(0, kPool - 1);
    std::vector<int32_t> padded(pick.size() * static_cast<size_t>(wide), -1);
    for (size_t i = 0; i < pick.size(); ++i)
      std::copy_n(idx.begin() + pick[i] * c.len, c.len, padded.begin() + static_cast<int64_t>(i) * wide);
    const std::vector<float> y = run_lists(pick, padded, wide);
    ASSERT_EQ(static_cast<int64_t>(y.size()), static_cast<int64_t>(pick.size()) * qw);
    int64_t bad = 0;
    for (size_t i = 0; i < pick.size(); ++i)
      bad += std::memcmp(y.data() + i * qw, alone.data() + pick[i] * qw, static_cast<size_t>(qw) * sizeof(float)) != 0;
    EXPECT_EQ(bad, 0) << op << ": " << bad << " of 8 rows change when their lists get 100 trailing -1";
    std::printf("[ invariant ] %s, lists padded to L=%lld: %lld of 8 rows differ\n", op.c_str(),
                static_cast<long long>(wide), static_cast<long long>(bad));
  }
}

// ---- MoE ------------------------------------------------------------------------------------------------

struct ExpertSet {
  std::vector<OwnedWeight> owned;  // keeps the bytes alive
  std::vector<ExpertWeights> experts;
  ExpertWeights shared;
};

// Routed experts MXFP4 [inter, D] / [D, inter] / [inter, D] (expert 0's w1 FP8 when `mixed`: the
// listed fallback path), shared expert FP8.
ExpertSet random_experts(Rng& rng, Backend& gpu, int64_t n_exp, int64_t d, int64_t inter, bool mixed) {
  ExpertSet s;
  auto add = [&](OwnedWeight w) {
    s.owned.push_back(std::move(w));
    return s.owned.back().w;
  };
  for (int64_t e = 0; e < n_exp; ++e) {
    Weight w1 = add(mixed && e == 0 ? gputest::random_fp8_weight(rng, inter, d, gpu)
                                    : gputest::random_fp4_weight(rng, inter, d, gpu));
    Weight w2 = add(gputest::random_fp4_weight(rng, d, inter, gpu));
    Weight w3 = add(gputest::random_fp4_weight(rng, inter, d, gpu));
    s.experts.push_back({w1, w2, w3});
  }
  Weight w1 = add(gputest::random_fp8_weight(rng, inter, d, gpu));
  Weight w2 = add(gputest::random_fp8_weight(rng, d, inter, gpu));
  Weight w3 = add(gputest::random_fp8_weight(rng, inter, d, gpu));
  s.shared = {w1, w2, w3};
  return s;
}

// Routing of the pool rows: k distinct experts per row, weights in [0.05, 0.6]; row 3 drops one pick
// (-1), row 5 has none.
void random_routes(Rng& rng, int64_t n_exp, int k, std::vector<int32_t>& ids, std::vector<float>& w) {
  ids.assign(static_cast<size_t>(kPool * k), -1);
  w.assign(static_cast<size_t>(kPool * k), 0.0f);
  std::vector<int32_t> perm(static_cast<size_t>(n_exp));
  for (int64_t r = 0; r < kPool; ++r) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng.gen);
    for (int j = 0; j < k; ++j) {
      ids[r * k + j] = perm[j];
      w[r * k + j] = rng.uniform(0.05f, 0.6f);
    }
  }
  ids[3 * k + 1] = -1;
  for (int j = 0; j < k; ++j) ids[5 * k + j] = -1;
}

void check_moe_experts(BatchInvariance& t, const std::string& op, int64_t n_exp, int k, int64_t d, int64_t inter,
                       bool mixed, bool fast = false) {
  Rng& rng = t.rng();
  t.gpu->set_fast_fp4_gemm(fast);
  const ExpertSet set = random_experts(rng, *t.gpu, n_exp, d, inter, mixed);
  const std::vector<float> x = random_rows(rng, kPool, d);  // [kPool, D]
  std::vector<int32_t> ids;
  std::vector<float> w;
  random_routes(rng, n_exp, k, ids, w);
  const float limit = 7.0f;
  const RowsRun run = [&](const std::vector<int64_t>& pick) {
    const int64_t m = static_cast<int64_t>(pick.size());
    const MoeRoute route{t.gpu->from_host_f32(gather(w, k, pick), {m, k}),
                         t.gpu->from_host_i32(gather(ids, k, pick), {m, k})};
    const Tensor xs = t.gpu->from_host_f32(gather(x, d, pick), {m, d});
    return t.gpu->to_host_f32(t.gpu->moe_experts(xs, route, set.experts, set.shared, limit));
  };
  const std::vector<float> alone = expect_rows_invariant(op, rng, d, run);
  print_default_mode_rows(op, *t.gpu, rng, d, run);
  const MoeRoute route{t.cpu->from_host_f32(w, {kPool, k}), t.cpu->from_host_i32(ids, {kPool, k})};
  const Tensor xc = t.cpu->from_host_f32(x, {kPool, d});
  expect_close_to_cpu(op, alone, t.cpu->to_host_f32(t.cpu->moe_experts(xc, route, set.experts, set.shared, limit)),
                      fast ? gputest::kFastMoeRelL2 : 1e-3);
}

// Grouped path: the K split followed min(E, M k) expert slots. 64 experts, top-6, D = 1024, inter 512:
// gate / up split 4 ways at M = 1, in-CTA splits once the slots fill; down split 2 ways.
// Tolerance: moe_engram_ops_test's relative L2 <= 1e-3.
TEST_F(BatchInvariance, MoeExpertsGrouped) {
  check_moe_experts(*this, "moe_experts grouped E=64 k=6 D=1024 inter=512", 64, 6, 1024, 512, false);
}

// The fast MXFP4 GEMMs (wgmma: the token tile, i.e. the MMA's N, follows the batch): still invariant.
TEST_F(BatchInvariance, MoeExpertsGroupedFast) {
  check_moe_experts(*this, "moe_experts grouped fast E=64 k=6 D=1024 inter=512", 64, 6, 1024, 512, false, true);
}

// Listed fallback (one FP8 expert projection): per-expert linear() over that expert's rows.
TEST_F(BatchInvariance, MoeExpertsListed) {
  check_moe_experts(*this, "moe_experts listed E=8 k=2 D=512 inter=256", 8, 2, 512, 256, true);
}

// Invariant by construction; a batch shares it. Weights and ids (as bits) per row.
TEST_F(BatchInvariance, MoeRoute) {
  const int64_t n_exp = 64, d = 1024;
  const int k = 6;
  OwnedWeight gate = gputest::random_bf16_weight(rng(), n_exp, d, *gpu, 0.05f, WeightMode::kF32);
  OwnedWeight bias = gputest::random_f32_weight(rng(), 1, n_exp, *gpu, 0.1f);
  const std::vector<float> x = random_rows(rng(), kPool, d);
  expect_rows_invariant("moe_route E=64 k=6", rng(), 2 * k, [&](const std::vector<int64_t>& pick) {
    const int64_t m = static_cast<int64_t>(pick.size());
    const MoeRoute r = gpu->moe_route(gpu->from_host_f32(gather(x, d, pick), {m, d}), gate.w, bias.w, k, 1.5f, 1.0f);
    const std::vector<float> wts = gpu->to_host_f32(r.weights);
    const std::vector<int32_t> ids = gpu->to_host_i32(r.experts);
    std::vector<float> out(static_cast<size_t>(m * 2 * k));
    for (int64_t i = 0; i < m; ++i) {
      std::memcpy(out.data() + i * 2 * k, wts.data() + i * k, k * sizeof(float));
      std::memcpy(out.data() + i * 2 * k + k, ids.data() + i * k, k * sizeof(int32_t));
    }
    return out;
  });
}

}  // namespace
}  // namespace di
