// The CUDA mHC, attention and selection ops against the CPU backend on random data (fresh seed per
// test, printed; DI_GPU_SEED replays). Tolerances, per op:
//  - hc_mixes: max |diff| <= 1e-6 (fp64 dot sums in another order: K chunks, then chunk order; the
//    mean square and everything else in the CPU's fp32 order, exp rounded once from double).
//  - hc_pre, hc_post, stream_mean: bit-exact (the same fp32 operations in the same order).
//  - hc_post_pre_norm (the fused hc_post + hc_pre + rmsnorm): bit-exact against the CPU's three ops.
//  - sparse_attention: relative L2 <= 1e-3 over the output (q and kv hold bf16 values, as the model's;
//    dot and probability sums in another order -- bf16 tensor cores when heads and dh are multiples
//    of 16, the list split over CTAs; exp differs by ulps, which can flip a bf16-rounded probability,
//    as can the running / per-split max it is taken against); a row whose list is all -1 must be
//    exactly zero. Tensor-core path: a row alone or in a small batch (finer launch tiles) gives the
//    bits it gets inside a large batch (the widest tiles): EXACT.
//  - softmax_pool: relative L2 <= 1e-6 (CPU order; exp rounded once from double vs glibc expf).
//  - index_scores: bit-exact (each dot in cpu::dot's exact order), -inf where invisible.
//  - select_candidates (both the top-k of blocks and the every-block-kept pass), topk_indices (both tie
//    modes), mask_scores: EXACT.
// Index-score inputs are drawn from a small set of bf16 values so that exact ties are frequent.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "gpu_test_util.h"

namespace di {
namespace {

using gputest::compare;
using gputest::Compare;
using gputest::OwnedWeight;
using gputest::Rng;

class AttentionOps : public gputest::GpuOpTest {};

constexpr float kInf = std::numeric_limits<float>::infinity();

// Entries whose bits differ (NaN == NaN); -inf == -inf.
int64_t bit_mismatches(const std::vector<float>& got, const std::vector<float>& want, int64_t* first = nullptr) {
  if (got.size() != want.size()) return -1;
  int64_t n = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    uint32_t a, b;
    std::memcpy(&a, &got[i], 4);
    std::memcpy(&b, &want[i], 4);
    if (a != b && !(std::isnan(got[i]) && std::isnan(want[i]))) {
      if (n == 0 && first) *first = static_cast<int64_t>(i);
      ++n;
    }
  }
  return n;
}

std::string at_str(const std::vector<float>& got, const std::vector<float>& want, int64_t i) {
  return "first mismatch [" + std::to_string(i) + "] got=" + std::to_string(got[i]) + " want=" + std::to_string(want[i]);
}

// Values drawn from a small set (frequent exact ties; sums of products stay exact in fp32).
std::vector<float> small_set_values(Rng& rng, int64_t n, const std::vector<float>& set) {
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = set[static_cast<size_t>(rng.uniform_int(0, static_cast<int64_t>(set.size()) - 1))];
  return v;
}

std::vector<float> uniform_values(Rng& rng, int64_t n, float lo, float hi) {
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = rng.uniform(lo, hi);
  return v;
}

// The mask as floats (1 or -inf) through mask_scores on a tensor of ones: U8 tensors have no
// download, and this also exercises mask_scores.
std::vector<float> mask_as_floats(Backend& be, const Tensor& mask) {
  Tensor ones = be.from_host_f32(std::vector<float>(static_cast<size_t>(mask.numel()), 1.0f), mask.shape);
  be.mask_scores(ones, mask);
  return be.to_host_f32(ones);
}

// ---- mHC ------------------------------------------------------------------------------------------

void check_hc_mixes(AttentionOps& t, Rng& rng, int hc, int64_t d, int64_t rows, bool bf16_fn, float norm_eps,
                    int iters) {
  SCOPED_TRACE("hc=" + std::to_string(hc) + " D=" + std::to_string(d) + " rows=" + std::to_string(rows) +
               (bf16_fn ? " fn=BF16" : " fn=F32") + " " + t.seed_note());
  const int mix = (2 + hc) * hc;
  const int64_t n = hc * d;
  gputest::TensorPair x = gputest::random_tensor_pair(rng, *t.cpu, *t.gpu, {rows, n});
  const float fn_sd = 1.5f / std::sqrt(static_cast<float>(n));  // mixes of order 1
  OwnedWeight fn = bf16_fn ? gputest::random_bf16_weight(rng, mix, n, *t.gpu, fn_sd, WeightMode::kF32)
                           : gputest::random_f32_weight(rng, mix, n, *t.gpu, fn_sd);
  OwnedWeight scale = gputest::random_f32_weight(rng, 1, 3, *t.gpu, 0.3f, 1.0f);
  OwnedWeight base = gputest::random_f32_weight(rng, 1, mix, *t.gpu, 0.5f);
  Tensor mc = t.cpu->hc_mixes(x.cpu, hc, fn.w, scale.w, base.w, norm_eps, iters, 1e-6f);
  Tensor mg = t.gpu->hc_mixes(x.gpu, hc, fn.w, scale.w, base.w, norm_eps, iters, 1e-6f);
  ASSERT_EQ(mg.shape, (std::vector<int64_t>{rows, mix}));
  Compare c = compare(t.gpu->to_host_f32(mg), t.cpu->to_host_f32(mc));
  EXPECT_LE(c.max_abs, 1e-6) << c.str();
  std::printf("[ hc_mixes ] hc=%d D=%lld rows=%lld: %s\n", hc, static_cast<long long>(d), static_cast<long long>(rows),
              c.str().c_str());
}

TEST_F(AttentionOps, HcMixes) {
  Rng& r = rng();
  check_hc_mixes(*this, r, 4, 257, 1, false, 1e-20f, 20);
  check_hc_mixes(*this, r, 4, 1031, 5, false, 1e-6f, 20);
  check_hc_mixes(*this, r, 4, 96, 33, true, 1e-20f, 20);
  check_hc_mixes(*this, r, 2, 77, 5, false, 1e-6f, 3);
  check_hc_mixes(*this, r, 4, 5120, 2, false, 1e-20f, 20);  // the model's width
  // K chunking of the dot products: 80 chunks at batch 1, 4 at batch 64, one chunk past 264 rows.
  check_hc_mixes(*this, r, 4, 5120, 1, false, 1e-20f, 20);
  check_hc_mixes(*this, r, 4, 5120, 64, true, 1e-20f, 20);
  check_hc_mixes(*this, r, 4, 96, 300, false, 1e-6f, 20);
  check_hc_mixes(*this, r, 8, 130, 3, false, 1e-6f, 5);  // hc 8: 80 mixes, 64 comb elements
  // The finish kernel per hc: comb elements in one warp slot (hc <= 5) or two (hc 6..8, the second
  // partly spare); hc 1 a single element; one Sinkhorn iteration (column normalisation only).
  check_hc_mixes(*this, r, 1, 512, 3, false, 1e-6f, 20);
  check_hc_mixes(*this, r, 3, 100, 4, false, 1e-6f, 1);
  check_hc_mixes(*this, r, 5, 200, 2, false, 1e-6f, 20);
  check_hc_mixes(*this, r, 6, 300, 3, true, 1e-6f, 20);
  check_hc_mixes(*this, r, 7, 100, 2, false, 1e-6f, 20);
  // More chunks than one pass of the finish kernel's loads covers (16 per thread: 160 chunks at hc 4,
  // 48 at hc 8): 187 and 64 chunks.
  check_hc_mixes(*this, r, 4, 12000, 1, false, 1e-6f, 20);
  check_hc_mixes(*this, r, 8, 2048, 1, false, 1e-6f, 20);
}

TEST_F(AttentionOps, HcPrePostStreamMean) {
  Rng& r = rng();
  for (auto [hc, d, rows] : std::vector<std::tuple<int, int64_t, int64_t>>{{4, 257, 1}, {4, 96, 5}, {2, 33, 33}, {4, 512, 33}}) {
    SCOPED_TRACE("hc=" + std::to_string(hc) + " D=" + std::to_string(d) + " rows=" + std::to_string(rows) + " " +
                 seed_note());
    const int mw = (2 + hc) * hc;
    gputest::TensorPair x = gputest::random_tensor_pair(r, *cpu, *gpu, {rows, hc * d});
    gputest::TensorPair y = gputest::random_tensor_pair(r, *cpu, *gpu, {rows, d});
    std::vector<float> mixv = uniform_values(r, rows * mw, -0.2f, 1.3f);
    Tensor mix_c = cpu->from_host_f32(mixv, {rows, mw}), mix_g = gpu->from_host_f32(mixv, {rows, mw});
    int64_t first = 0;

    std::vector<float> pc = cpu->to_host_f32(cpu->hc_pre(x.cpu, mix_c, hc));
    std::vector<float> pg = gpu->to_host_f32(gpu->hc_pre(x.gpu, mix_g, hc));
    ASSERT_EQ(pg.size(), static_cast<size_t>(rows * d));
    EXPECT_EQ(bit_mismatches(pg, pc, &first), 0) << "hc_pre " << at_str(pg, pc, first);

    std::vector<float> qc = cpu->to_host_f32(cpu->hc_post(y.cpu, x.cpu, mix_c, hc));
    std::vector<float> qg = gpu->to_host_f32(gpu->hc_post(y.gpu, x.gpu, mix_g, hc));
    ASSERT_EQ(qg.size(), static_cast<size_t>(rows * hc * d));
    EXPECT_EQ(bit_mismatches(qg, qc, &first), 0) << "hc_post " << at_str(qg, qc, first);

    std::vector<float> sc = cpu->to_host_f32(cpu->stream_mean(x.cpu, hc));
    std::vector<float> sg = gpu->to_host_f32(gpu->stream_mean(x.gpu, hc));
    ASSERT_EQ(sg.size(), static_cast<size_t>(rows * d));
    EXPECT_EQ(bit_mismatches(sg, sc, &first), 0) << "stream_mean " << at_str(sg, sc, first);
  }
}

// The fused op against the CPU's hc_post, hc_pre, rmsnorm, with different post and pre mixes; widths
// past one load batch (4 x 256) and past 24 x 256, tails, one row and many, every norm weight type.
TEST_F(AttentionOps, HcPostPreNormFusedExact) {
  Rng& r = rng();
  for (auto [hc, d, rows, dt] : std::vector<std::tuple<int, int64_t, int64_t, DType>>{
           {4, 5120, 1, DType::kBF16}, {4, 5120, 64, DType::kBF16}, {4, 257, 3, DType::kF32}, {2, 33, 5, DType::kBF16},
           {8, 1000, 2, DType::kBF16}, {4, 6200, 2, DType::kF32}, {1, 96, 300, DType::kBF16},
           {4, 1030, 7, DType::kBF16}, {4, 9000, 2, DType::kBF16}, {2, 5, 3, DType::kF32}}) {
    SCOPED_TRACE("hc=" + std::to_string(hc) + " D=" + std::to_string(d) + " rows=" + std::to_string(rows) + " " +
                 dtype_name(dt) + " " + seed_note());
    const int mw = (2 + hc) * hc;
    gputest::TensorPair res = gputest::random_tensor_pair(r, *cpu, *gpu, {rows, hc * d});
    gputest::TensorPair y = gputest::random_tensor_pair(r, *cpu, *gpu, {rows, d});
    const std::vector<float> post_v = uniform_values(r, rows * mw, -0.2f, 1.3f);
    const std::vector<float> pre_v = uniform_values(r, rows * mw, 0.0f, 1.0f);
    Tensor post_c = cpu->from_host_f32(post_v, {rows, mw}), post_g = gpu->from_host_f32(post_v, {rows, mw});
    Tensor pre_c = cpu->from_host_f32(pre_v, {rows, mw}), pre_g = gpu->from_host_f32(pre_v, {rows, mw});
    OwnedWeight w = dt == DType::kBF16 ? gputest::random_bf16_weight(r, 1, d, *gpu, 0.3f, WeightMode::kBf16, 1.0f)
                                       : gputest::random_f32_weight(r, 1, d, *gpu, 0.3f, 1.0f);
    Tensor hc_c = cpu->hc_post(y.cpu, res.cpu, post_c, hc);
    Tensor x_c = cpu->rmsnorm(cpu->hc_pre(hc_c, pre_c, hc), w.w, 1e-6f);
    auto [hc_g, x_g] = gpu->hc_post_pre_norm(y.gpu, res.gpu, post_g, pre_g, hc, w.w, 1e-6f);
    const std::vector<float> hg = gpu->to_host_f32(hc_g), hcpu = cpu->to_host_f32(hc_c);
    const std::vector<float> xg = gpu->to_host_f32(x_g), xcpu = cpu->to_host_f32(x_c);
    ASSERT_EQ(hg.size(), static_cast<size_t>(rows * hc * d));
    ASSERT_EQ(xg.size(), static_cast<size_t>(rows * d));
    int64_t first = 0;
    EXPECT_EQ(bit_mismatches(hg, hcpu, &first), 0) << "streams " << at_str(hg, hcpu, first);
    EXPECT_EQ(bit_mismatches(xg, xcpu, &first), 0) << "normed input " << at_str(xg, xcpu, first);
  }
}

// ---- sparse attention -----------------------------------------------------------------------------

struct AttnCase {
  int64_t rows;
  int heads;
  int64_t dh, n_kv, len;
};

// Index lists [rows, len] into n_kv keys: random rows (repeats allowed), ~15% -1, a whole 64-block of
// -1 per row (when len > 64; maybe past the end), and the last row all -1 when `last_none`.
std::vector<int32_t> random_index_lists(Rng& rng, int64_t rows, int64_t len, int64_t n_kv, bool last_none) {
  std::vector<int32_t> idx(static_cast<size_t>(rows * len));
  for (int64_t r = 0; r < rows; ++r) {
    const bool all_none = last_none && r == rows - 1;
    const int64_t dead_block = rng.uniform_int(0, (len - 1) / 64 + 1);
    for (int64_t j = 0; j < len; ++j) {
      int32_t id = static_cast<int32_t>(rng.uniform_int(0, n_kv - 1));
      if (all_none || rng.uniform(0, 1) < 0.15f || (j / 64 == dead_block && len > 64)) id = -1;
      idx[r * len + j] = id;
    }
  }
  return idx;
}

void check_sparse_attention(AttentionOps& t, Rng& rng, const AttnCase& c) {
  SCOPED_TRACE("rows=" + std::to_string(c.rows) + " heads=" + std::to_string(c.heads) + " dh=" + std::to_string(c.dh) +
               " kv=" + std::to_string(c.n_kv) + " L=" + std::to_string(c.len) + " " + t.seed_note());
  // q: rows alternate between soft and peaky score distributions.
  std::vector<float> qv = gputest::random_bf16_values(rng, c.rows * c.heads * c.dh);
  for (int64_t r = 0; r < c.rows; ++r)
    if (r % 2 == 1)
      for (int64_t i = 0; i < c.heads * c.dh; ++i) qv[r * c.heads * c.dh + i] = quant::round_bf16(3.0f * qv[r * c.heads * c.dh + i]);
  gputest::TensorPair kv = gputest::random_tensor_pair(rng, *t.cpu, *t.gpu, {c.n_kv, c.dh});
  // the last row of a multi-row case all -1: its output is then exactly 0 (only the sink in the
  // denominator)
  const std::vector<int32_t> idx = random_index_lists(rng, c.rows, c.len, c.n_kv, c.rows > 1);
  OwnedWeight sink = gputest::random_f32_weight(rng, 1, c.heads, *t.gpu, 1.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.dh));
  Tensor qc = t.cpu->from_host_f32(qv, {c.rows, c.heads * c.dh}), qg = t.gpu->from_host_f32(qv, {c.rows, c.heads * c.dh});
  Tensor ic = t.cpu->from_host_i32(idx, {c.rows, c.len}), ig = t.gpu->from_host_i32(idx, {c.rows, c.len});
  std::vector<float> want = t.cpu->to_host_f32(t.cpu->sparse_attention(qc, c.heads, kv.cpu, ic, sink.w, scale));
  std::vector<float> got = t.gpu->to_host_f32(t.gpu->sparse_attention(qg, c.heads, kv.gpu, ig, sink.w, scale));
  ASSERT_EQ(got.size(), want.size());
  Compare cmp = compare(got, want);
  EXPECT_LE(cmp.rel_l2, 1e-3) << cmp.str();
  EXPECT_FALSE(cmp.nan_mismatch) << cmp.str();
  if (c.rows > 1) {
    const int64_t w = c.heads * c.dh, r = c.rows - 1;
    for (int64_t i = 0; i < w; ++i) ASSERT_EQ(got[r * w + i], 0.0f) << "all -1 row, element " << i;
  }
  // The same keys split into kv and kv_more at a random row: the same bits on each backend.
  if (c.n_kv > 1) {
    const int64_t m = rng.uniform_int(1, c.n_kv - 1);
    std::vector<float> cpu_split = t.cpu->to_host_f32(t.cpu->sparse_attention(
        qc, c.heads, row_view(kv.cpu, 0, m), ic, sink.w, scale, row_view(kv.cpu, m, c.n_kv - m)));
    std::vector<float> gpu_split = t.gpu->to_host_f32(t.gpu->sparse_attention(
        qg, c.heads, row_view(kv.gpu, 0, m), ig, sink.w, scale, row_view(kv.gpu, m, c.n_kv - m)));
    int64_t first = 0;
    EXPECT_EQ(bit_mismatches(cpu_split, want, &first), 0) << "cpu, kv split at " << m << ": " << at_str(cpu_split, want, first);
    EXPECT_EQ(bit_mismatches(gpu_split, got, &first), 0) << "gpu, kv split at " << m << ": " << at_str(gpu_split, got, first);
    // kv_more as packed cache rows (the page pool's compressed KV, FP4; window KV, FP8): the same
    // bits as those rows unpacked, on each backend
    for (RowFormat fmt : {RowFormat::kFp4E4m3, RowFormat::kFp8Ue8m0}) {
      if (c.dh % (fmt == RowFormat::kFp4E4m3 ? 16 : 32) != 0) continue;
      std::vector<int64_t> slots(static_cast<size_t>(c.n_kv - m));
      for (size_t i = 0; i < slots.size(); ++i) slots[i] = static_cast<int64_t>(slots.size() - 1 - i);  // reversed
      const int64_t rb = packed_row_bytes(fmt, c.dh);
      for (Backend* be : {t.cpu.get(), t.gpu.get()}) {
        const bool on_gpu = be == t.gpu.get();
        Tensor more = copy_tensor(*be, row_view(on_gpu ? kv.gpu : kv.cpu, m, c.n_kv - m));
        be->qdq(more, fmt);
        Tensor packed = be->zeros(TType::kU8, {c.n_kv - m, rb});
        be->pack_rows(more, fmt, packed, slots);
        Tensor unpacked = be->unpack_rows(packed, fmt, c.dh, slots);  // = more
        const Tensor& q = on_gpu ? qg : qc;
        const Tensor& ix = on_gpu ? ig : ic;
        const Tensor head = row_view(on_gpu ? kv.gpu : kv.cpu, 0, m);
        // ids into kv_more follow the packed rows' order: row i of `unpacked` is packed row slots[i]
        std::vector<int32_t> remapped(idx);
        for (int32_t& v : remapped)
          if (v >= m) v = static_cast<int32_t>(m + slots[static_cast<size_t>(v - m)]);
        std::vector<float> f = be->to_host_f32(be->sparse_attention(q, c.heads, head, ix, sink.w, scale, unpacked));
        std::vector<float> p = be->to_host_f32(be->sparse_attention(
            q, c.heads, head, be->from_host_i32(remapped, {c.rows, c.len}), sink.w, scale, packed, fmt));
        EXPECT_EQ(bit_mismatches(p, f, &first), 0) << (on_gpu ? "gpu" : "cpu") << ", packed kv_more (format "
                                                   << static_cast<int>(fmt) << "): " << at_str(p, f, first);
      }
    }
  }
  std::printf("[ sparse_attention ] rows=%lld heads=%d dh=%lld L=%lld: %s\n", static_cast<long long>(c.rows), c.heads,
              static_cast<long long>(c.dh), static_cast<long long>(c.len), cmp.str().c_str());
}

TEST_F(AttentionOps, SparseAttention) {
  Rng& r = rng();
  for (const AttnCase& c : std::vector<AttnCase>{{1, 4, 64, 20, 70},
                                                 {5, 64, 512, 700, 150},
                                                 {33, 4, 64, 300, 200},
                                                 {33, 64, 64, 137, 129},
                                                 {5, 4, 512, 45, 64},
                                                 {1, 64, 512, 640, 640},
                                                 {5, 6, 48, 90, 77},   // odd heads, dh not a multiple of 32
                                                 {5, 1, 64, 50, 100},   // one warp per block
                                                 {2, 64, 512, 2000, 2048},  // list split over 32 CTAs, merged
                                                 {3, 32, 48, 100, 130},     // tensor cores: half a head tile, dh 48
                                                 {2, 80, 64, 100, 100},     // two head tiles (64 + 16)
                                                 {3, 16, 272, 150, 160},    // scores staged in 256 + 16 columns
                                                 // one row: small launches (16-head score tiles, 4 key
                                                 // parts per block, dh split over CTAs), partial last
                                                 // blocks
                                                 {1, 16, 64, 150, 100},
                                                 {1, 48, 192, 300, 130},
                                                 {1, 32, 512, 200, 200},
                                                 {1, 64, 512, 800, 600},
                                                 {5, 48, 512, 600, 520},  // 2 key parts (132 SMs)
                                                 // many rows: the merged values kernel (no partials),
                                                 // 128 and (dh 192) 64 dims per CTA on 132 SMs
                                                 {40, 64, 512, 700, 640},
                                                 {90, 64, 192, 300, 200}})
    check_sparse_attention(*this, r, c);
}

// The tensor-core path tiles a small launch finer (score CTAs of 16 or 32 heads instead of 64, then
// 2 or 4 CTAs per key block, the values' dh split over CTAs) and must give the bits of the widest
// tiling: rows alone and in a batch of 5 against the same rows inside a batch of ~600 (row x 64 heads
// x 64-key block) CTAs, which takes the widest tiles (64 heads, 32 for 32 heads, 16 for 16; whole key
// blocks and dims) on a GPU of up to 300 SMs. On 132 SMs one row takes 4 key parts, and 5 rows 2 at
// 64 heads x 600 keys, 48 x 520 and 16 x 1700. Odd shapes: 48 and 80 heads (partly filled tiles), dh
// 192 and 48, lists not a multiple of 64. The big batches of dh 512 take the merged values kernel
// (each CTA walks a row's whole list, no partials) and the small ones values + combine_splits: the
// same bits.
TEST_F(AttentionOps, SparseAttentionLaunchShapesExact) {
  Rng& r = rng();
  struct Case {
    int heads;
    int64_t dh, n_kv, len;
  };
  for (const Case& c : std::vector<Case>{
           {48, 192, 300, 130}, {64, 512, 800, 600}, {32, 512, 200, 200}, {64, 48, 100, 70}, {80, 64, 100, 100},
           {48, 512, 600, 520}, {16, 128, 2000, 1700}}) {
    const int64_t nblk = (c.len + 63) / 64, big = (600 + nblk - 1) / nblk, w = c.heads * c.dh;
    SCOPED_TRACE("heads=" + std::to_string(c.heads) + " dh=" + std::to_string(c.dh) + " L=" + std::to_string(c.len) +
                 " batch=" + std::to_string(big) + " " + seed_note());
    std::vector<float> qv = gputest::random_bf16_values(r, big * w);  // [big, heads * dh], odd rows peaky
    for (int64_t row = 1; row < big; row += 2)
      for (int64_t i = 0; i < w; ++i) qv[row * w + i] = quant::round_bf16(3.0f * qv[row * w + i]);
    const Tensor kv = gpu->from_host_f32(gputest::random_bf16_values(r, c.n_kv * c.dh), {c.n_kv, c.dh});
    const std::vector<int32_t> idx = random_index_lists(r, big, c.len, c.n_kv, true);
    OwnedWeight sink = gputest::random_f32_weight(r, 1, c.heads, *gpu, 1.0f);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.dh));
    // rows [first, first + m) of the batch as a batch of their own
    auto run = [&](int64_t first, int64_t m) {
      const std::vector<float> q(qv.begin() + first * w, qv.begin() + (first + m) * w);
      const std::vector<int32_t> ix(idx.begin() + first * c.len, idx.begin() + (first + m) * c.len);
      return gpu->to_host_f32(gpu->sparse_attention(gpu->from_host_f32(q, {m, w}), c.heads, kv,
                                                    gpu->from_host_i32(ix, {m, c.len}), sink.w, scale));
    };
    const std::vector<float> all = run(0, big);
    ASSERT_EQ(static_cast<int64_t>(all.size()), big * w);
    const std::vector<std::pair<int64_t, int64_t>> subsets = {{0, 1}, {1, 1}, {big / 2, 1}, {big - 1, 1}, {2, 5}};
    for (auto [first, m] : subsets) {
      const std::vector<float> got = run(first, m);
      const std::vector<float> want(all.begin() + first * w, all.begin() + (first + m) * w);
      int64_t at = 0;
      EXPECT_EQ(bit_mismatches(got, want, &at), 0)
          << "rows " << first << " .. +" << m << " alone vs in the batch of " << big << ": " << at_str(got, want, at);
    }
  }
}

// ---- paged row ids ------------------------------------------------------------------------------------

TEST_F(AttentionOps, MapPagedRowsExact) {
  Rng& r = rng();
  const int64_t rows = 37, len = 300, per_page = 32;
  std::vector<int64_t> start;
  std::vector<int32_t> table;
  std::vector<int32_t> idx(static_cast<size_t>(rows * len));
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t pages = r.uniform_int(1, 12);
    start.push_back(static_cast<int64_t>(table.size()));
    for (int64_t p = 0; p < pages; ++p) table.push_back(static_cast<int32_t>(r.uniform_int(0, 5000)));
    for (int64_t j = 0; j < len; ++j)
      idx[i * len + j] = r.uniform(0, 1) < 0.2f ? -1 : static_cast<int32_t>(r.uniform_int(0, pages * per_page - 1));
  }
  Tensor c = cpu->from_host_i32(idx, {rows, len}), g = gpu->from_host_i32(idx, {rows, len});
  cpu->map_paged_rows(c, start, table, per_page, 777);
  gpu->map_paged_rows(g, start, table, per_page, 777);
  EXPECT_EQ(gpu->to_host_i32(g), cpu->to_host_i32(c)) << seed_note();
}

// head ++ mapped ids in one launch (the attention's index lists) == the CPU's copy, map and concat;
// ids unchanged. Widths as at decode (window 128 ++ top-k 512), small ones, a row view of the ids (a
// part of the batched indexer's list), and a batch without pages (nothing to map).
TEST_F(AttentionOps, ConcatPagedRowsExact) {
  Rng& r = rng();
  const int64_t per_page = 64;
  for (auto [rows, a, b, view] : {std::tuple<int64_t, int64_t, int64_t, bool>{1, 128, 512, false},
                                  {37, 128, 512, false}, {9, 5, 1, false}, {6, 3, 70, true}}) {
    SCOPED_TRACE("rows=" + std::to_string(rows) + " a=" + std::to_string(a) + " b=" + std::to_string(b));
    const int64_t id_rows = view ? rows + 4 : rows;
    std::vector<int64_t> start;
    std::vector<int32_t> table;
    std::vector<int32_t> head(static_cast<size_t>(rows * a)), ids(static_cast<size_t>(id_rows * b));
    for (int32_t& v : head) v = r.uniform(0, 1) < 0.1f ? -1 : static_cast<int32_t>(r.uniform_int(0, 100000));
    for (int64_t i = 0; i < id_rows; ++i) {
      const int64_t pages = r.uniform_int(1, 12);
      if (!view || (i >= 2 && i < 2 + rows)) start.push_back(static_cast<int64_t>(table.size()));
      for (int64_t p = 0; p < pages; ++p) table.push_back(static_cast<int32_t>(r.uniform_int(0, 5000)));
      for (int64_t j = 0; j < b; ++j)
        ids[i * b + j] = r.uniform(0, 1) < 0.2f ? -1 : static_cast<int32_t>(r.uniform_int(0, pages * per_page - 1));
    }
    const Tensor hc = cpu->from_host_i32(head, {rows, a}), hg = gpu->from_host_i32(head, {rows, a});
    const Tensor ic_all = cpu->from_host_i32(ids, {id_rows, b}), ig_all = gpu->from_host_i32(ids, {id_rows, b});
    const Tensor ic = view ? row_view(ic_all, 2, rows) : ic_all, ig = view ? row_view(ig_all, 2, rows) : ig_all;
    const Tensor want = cpu->concat_paged_rows(hc, ic, start, table, per_page, 777);
    const Tensor got = gpu->concat_paged_rows(hg, ig, start, table, per_page, 777);
    ASSERT_EQ(got.shape, (std::vector<int64_t>{rows, a + b}));
    EXPECT_EQ(gpu->to_host_i32(got), cpu->to_host_i32(want)) << seed_note();
    EXPECT_EQ(gpu->to_host_i32(ig_all), ids) << "the ids must not change, " << seed_note();
    if (!view) {  // no pages: the plain concatenation (every id must be -1 then; none is mapped)
      std::vector<int32_t> none(static_cast<size_t>(rows * b), -1);
      const Tensor n_c = cpu->from_host_i32(none, {rows, b}), n_g = gpu->from_host_i32(none, {rows, b});
      const std::vector<int64_t> zeros(static_cast<size_t>(rows), 0);
      EXPECT_EQ(gpu->to_host_i32(gpu->concat_paged_rows(hg, n_g, zeros, {}, per_page, 777)),
                cpu->to_host_i32(cpu->concat_paged_rows(hc, n_c, zeros, {}, per_page, 777)))
          << seed_note();
    }
  }
}

// ---- softmax pooling ------------------------------------------------------------------------------

TEST_F(AttentionOps, SoftmaxPool) {
  Rng& r = rng();
  for (auto [g, ratio, d] : std::vector<std::tuple<int64_t, int, int64_t>>{{1, 4, 64}, {5, 4, 512}, {33, 2, 65}, {3, 128, 512}}) {
    SCOPED_TRACE("groups=" + std::to_string(g) + " ratio=" + std::to_string(ratio) + " d=" + std::to_string(d) + " " +
                 seed_note());
    std::vector<float> kvv = uniform_values(r, g * ratio * d, -2.0f, 2.0f);
    std::vector<float> sv = uniform_values(r, g * ratio * d, -6.0f, 6.0f);
    Tensor kc = cpu->from_host_f32(kvv, {g * ratio, d}), kg = gpu->from_host_f32(kvv, {g * ratio, d});
    Tensor sc = cpu->from_host_f32(sv, {g * ratio, d}), sg = gpu->from_host_f32(sv, {g * ratio, d});
    std::vector<float> want = cpu->to_host_f32(cpu->softmax_pool(kc, sc, ratio));
    std::vector<float> got = gpu->to_host_f32(gpu->softmax_pool(kg, sg, ratio));
    ASSERT_EQ(got.size(), static_cast<size_t>(g * d));
    Compare c = compare(got, want);
    EXPECT_LE(c.rel_l2, 1e-6) << c.str();
  }
}

// ---- index scores and selection -------------------------------------------------------------------

const std::vector<float> kQkSet = {-1.0f, -0.5f, 0.0f, 0.25f, 0.5f, 1.0f, 1.5f, 2.0f};
const std::vector<float> kWeightSet = {-0.25f, 0.125f, 0.25f, 0.5f, 1.0f};

struct IndexInputs {
  Tensor q_c, q_g, k_c, k_g, w_c, w_g;
  std::vector<int64_t> visible;
};

// tie_heavy: q, keys and weights from small sets (exact fp32 sums, many exactly equal scores);
// otherwise bf16 normal values (general fp32 sums).
IndexInputs index_inputs(AttentionOps& t, Rng& rng, int64_t rows, int heads, int64_t hd, int64_t t_len,
                         bool tie_heavy) {
  IndexInputs in;
  std::vector<float> q = tie_heavy ? small_set_values(rng, rows * heads * hd, kQkSet)
                                   : gputest::random_bf16_values(rng, rows * heads * hd);
  std::vector<float> k = tie_heavy ? small_set_values(rng, t_len * hd, kQkSet) : gputest::random_bf16_values(rng, t_len * hd);
  std::vector<float> w = tie_heavy ? small_set_values(rng, rows * heads, kWeightSet)
                                   : gputest::random_bf16_values(rng, rows * heads, 0.1f);
  in.q_c = t.cpu->from_host_f32(q, {rows, heads * hd});
  in.q_g = t.gpu->from_host_f32(q, {rows, heads * hd});
  in.k_c = t.cpu->from_host_f32(k, {t_len, hd});
  in.k_g = t.gpu->from_host_f32(k, {t_len, hd});
  in.w_c = t.cpu->from_host_f32(w, {rows, heads});
  in.w_g = t.gpu->from_host_f32(w, {rows, heads});
  in.visible.resize(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    // mostly inside the row, sometimes 0, the full width or past it
    int64_t pick = r == 0 ? 9 : rng.uniform_int(0, 9);  // row 0 always sees something
    in.visible[r] = pick == 0 ? 0 : pick == 1 ? t_len : pick == 2 ? t_len + 3 : rng.uniform_int(1, t_len);
  }
  return in;
}

TEST_F(AttentionOps, IndexScores) {
  Rng& r = rng();
  struct Case {
    int64_t rows;
    int heads;
    int64_t hd, t_len;
    bool ties;
  };
  for (const Case& c : std::vector<Case>{{1, 4, 64, 20, true},
                                         {5, 64, 128, 700, true},
                                         {33, 4, 128, 333, true},
                                         {3, 32, 128, 300, false},  // the model's indexer: keys in registers
                                         {5, 64, 64, 129, false},
                                         {33, 4, 512, 77, false},
                                         {5, 3, 60, 200, false}}) {  // hd not a multiple of 8
    SCOPED_TRACE("rows=" + std::to_string(c.rows) + " heads=" + std::to_string(c.heads) + " hd=" + std::to_string(c.hd) +
                 " T=" + std::to_string(c.t_len) + (c.ties ? " tie-heavy " : " normal ") + seed_note());
    IndexInputs in = index_inputs(*this, r, c.rows, c.heads, c.hd, c.t_len, c.ties);
    std::vector<float> want = cpu->to_host_f32(cpu->index_scores(in.q_c, c.heads, in.k_c, in.w_c, in.visible, {}));
    std::vector<float> got = gpu->to_host_f32(gpu->index_scores(in.q_g, c.heads, in.k_g, in.w_g, in.visible, {}));
    ASSERT_EQ(got.size(), want.size());
    int64_t first = 0;
    EXPECT_EQ(bit_mismatches(got, want, &first), 0) << at_str(got, want, first);
  }
}

// Several sequences' keys in one tensor (the batched indexer): each row reads keys from its own
// offset; bit-identical to the CPU.
TEST_F(AttentionOps, IndexScoresWithKeyOffsets) {
  Rng& r = rng();
  for (auto [rows, heads, hd, t_len] : std::vector<std::tuple<int64_t, int, int64_t, int64_t>>{
           // hd 128: 8, 4 and 1 threads a key by how many CTAs of 128 keys there are against the SMs
           {1, 4, 64, 50}, {2, 32, 128, 900}, {5, 32, 128, 1800}, {9, 32, 128, 900}, {37, 4, 60, 333},
           {40, 32, 128, 2000}}) {
    SCOPED_TRACE("rows=" + std::to_string(rows) + " heads=" + std::to_string(heads) + " hd=" + std::to_string(hd) +
                 " keys=" + std::to_string(t_len) + " " + seed_note());
    IndexInputs in = index_inputs(*this, r, rows, heads, hd, t_len, false);
    std::vector<int64_t> offsets(static_cast<size_t>(rows));
    for (int64_t i = 0; i < rows; ++i) {
      offsets[i] = r.uniform_int(0, t_len - 1);
      in.visible[i] = i % 5 == 4 ? 0 : r.uniform_int(1, t_len - offsets[i]);  // sometimes nothing visible
    }
    std::vector<float> want = cpu->to_host_f32(cpu->index_scores(in.q_c, heads, in.k_c, in.w_c, in.visible, offsets));
    std::vector<float> got = gpu->to_host_f32(gpu->index_scores(in.q_g, heads, in.k_g, in.w_g, in.visible, offsets));
    ASSERT_EQ(got.size(), want.size());
    ASSERT_EQ(static_cast<int64_t>(want.size()), rows * index_width(in.visible));
    int64_t first = 0;
    EXPECT_EQ(bit_mismatches(got, want, &first), 0) << at_str(got, want, first);
  }
}

// The batched indexer's pool-row list built on the device from page tables: exactly the CPU's rows.
TEST_F(AttentionOps, PagedRowList) {
  Rng& r = rng();
  for (int64_t per_page : {1, 7, 64}) {
    SCOPED_TRACE("rows_per_page=" + std::to_string(per_page) + " " + seed_note());
    std::vector<int64_t> lengths, table_start;
    std::vector<int32_t> table;
    for (int p = 0; p < 9; ++p) {
      const int64_t n = p == 3 ? 0 : r.uniform_int(1, 40 * per_page);  // one part without rows
      lengths.push_back(n);
      table_start.push_back(static_cast<int64_t>(table.size()));
      for (int64_t g = 0; g < (n + per_page - 1) / per_page + r.uniform_int(0, 2); ++g)
        table.push_back(static_cast<int32_t>(r.uniform_int(0, 5000)));
    }
    const std::vector<int32_t> want = cpu->to_host_i32(cpu->paged_row_list(lengths, table_start, table, per_page));
    const std::vector<int32_t> got = gpu->to_host_i32(gpu->paged_row_list(lengths, table_start, table, per_page));
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], want[i]) << "row " << i;
  }
}

// The batched indexer's keys read packed from the page pool by slot (FP4 + UE8M0, 68-byte rows at
// hd 128: the fused kernel; other shapes and formats unpack first): bit-identical to the CPU, which
// unpacks and scores.
TEST_F(AttentionOps, IndexScoresFromPackedPool) {
  Rng& r = rng();
  struct Case {
    int64_t rows;
    int heads;
    int64_t hd, keys;
    RowFormat fmt;
  };
  for (const Case& c : std::vector<Case>{{9, 32, 128, 900, RowFormat::kFp4Ue8m0},
                                         {1, 32, 128, 4000, RowFormat::kFp4Ue8m0},  // 8 threads a key
                                         {2, 32, 128, 4000, RowFormat::kFp4Ue8m0},  // 4 threads a key
                                         {64, 64, 128, 1500, RowFormat::kFp4Ue8m0},
                                         {5, 4, 64, 130, RowFormat::kFp4Ue8m0},
                                         {3, 64, 128, 200, RowFormat::kFp8Ue8m0}}) {
    SCOPED_TRACE("rows=" + std::to_string(c.rows) + " heads=" + std::to_string(c.heads) + " hd=" + std::to_string(c.hd) +
                 " keys=" + std::to_string(c.keys) + " format=" + std::to_string(static_cast<int>(c.fmt)) + " " +
                 seed_note());
    IndexInputs in = index_inputs(*this, r, c.rows, c.heads, c.hd, c.keys, false);
    // key j lives in pool row slots[j] of a pool with spare rows, in shuffled order
    const int64_t pool_rows = c.keys + 37;
    std::vector<int64_t> perm(static_cast<size_t>(pool_rows));
    for (int64_t i = 0; i < pool_rows; ++i) perm[i] = i;
    for (int64_t i = pool_rows - 1; i > 0; --i) std::swap(perm[i], perm[r.uniform_int(0, i)]);
    const std::vector<int64_t> slots(perm.begin(), perm.begin() + c.keys);
    const std::vector<int32_t> slots32(slots.begin(), slots.end());
    std::vector<int64_t> offsets(static_cast<size_t>(c.rows));
    for (int64_t i = 0; i < c.rows; ++i) {
      offsets[i] = r.uniform_int(0, c.keys - 1);
      in.visible[i] = i % 5 == 4 ? 0 : r.uniform_int(1, c.keys - offsets[i]);
    }
    std::vector<float> result[2];
    for (int b = 0; b < 2; ++b) {
      Backend& be = b == 0 ? *cpu : *gpu;
      Tensor keys = copy_tensor(be, b == 0 ? in.k_c : in.k_g);
      be.qdq(keys, c.fmt);
      Tensor pool = be.zeros(TType::kU8, {pool_rows, packed_row_bytes(c.fmt, c.hd)});
      be.pack_rows(keys, c.fmt, pool, slots);
      result[b] = be.to_host_f32(be.index_scores_packed(b == 0 ? in.q_c : in.q_g, c.heads, pool, c.fmt,
                                                        be.from_host_i32(slots32, {c.keys}), b == 0 ? in.w_c : in.w_g,
                                                        in.visible, offsets));
    }
    ASSERT_EQ(result[1].size(), result[0].size());
    ASSERT_EQ(static_cast<int64_t>(result[0].size()), c.rows * index_width(in.visible));
    int64_t first = 0;
    EXPECT_EQ(bit_mismatches(result[1], result[0], &first), 0) << at_str(result[1], result[0], first);
  }
}

// Scores for the selection tests: the CPU's index scores of tie-heavy inputs (identical bits on
// both backends' inputs), uploaded to each backend.
struct ScoreRows {
  std::vector<float> host;
  Tensor c, g;
  std::vector<int64_t> visible;
};

ScoreRows tie_scores(AttentionOps& t, Rng& rng, int64_t rows, int64_t t_len) {
  IndexInputs in = index_inputs(t, rng, rows, 4, 64, t_len, true);
  ScoreRows s;
  s.host = t.cpu->to_host_f32(t.cpu->index_scores(in.q_c, 4, in.k_c, in.w_c, in.visible, {}));
  s.c = t.cpu->from_host_f32(s.host, {rows, t_len});
  s.g = t.gpu->from_host_f32(s.host, {rows, t_len});
  s.visible = in.visible;
  return s;
}

const char* tie_name(TieBreak t) { return t == TieBreak::kTorch ? "kTorch" : "kLowestIndex"; }

TEST_F(AttentionOps, SelectCandidatesAndMaskScores) {
  Rng& r = rng();
  struct Case {
    int64_t rows, t_len;
    int topk_blocks, block_size;
    bool dead_blocks;  // some whole blocks -inf (never marked, unless the row's newest)
  };
  // topk_blocks >= the blocks a row reaches: the device's one-pass mask (every reachable block kept)
  for (const Case& c : std::vector<Case>{{1, 20, 3, 4, false},
                                         {5, 700, 16, 8, false},
                                         {33, 333, 7, 4, false},
                                         {5, 129, 100, 8, false},
                                         {33, 500, 1, 3, false},
                                         {7, 301, 64, 8, true},
                                         {7, 301, 16, 8, true}}) {
    ScoreRows s = tie_scores(*this, r, c.rows, c.t_len);
    if (c.dead_blocks) {
      for (int64_t row = 0; row < c.rows; ++row)
        for (int64_t b = 0; b * c.block_size < c.t_len; ++b)
          if (r.uniform_int(0, 2) == 0)
            for (int64_t p = b * c.block_size; p < std::min<int64_t>(c.t_len, (b + 1) * c.block_size); ++p)
              s.host[row * c.t_len + p] = -kInf;
      s.c = cpu->from_host_f32(s.host, {c.rows, c.t_len});
      s.g = gpu->from_host_f32(s.host, {c.rows, c.t_len});
    }
    for (TieBreak ties : {TieBreak::kLowestIndex, TieBreak::kTorch}) {
      SCOPED_TRACE("rows=" + std::to_string(c.rows) + " T=" + std::to_string(c.t_len) + " topk_blocks=" +
                   std::to_string(c.topk_blocks) + " block=" + std::to_string(c.block_size) +
                   (c.dead_blocks ? " dead blocks " : " ") + tie_name(ties) + " " + seed_note());
      Tensor mc = cpu->select_candidates(s.c, s.visible, c.topk_blocks, c.block_size, ties);
      Tensor mg = gpu->select_candidates(s.g, s.visible, c.topk_blocks, c.block_size, ties);
      ASSERT_EQ(mg.shape, mc.shape);
      std::vector<float> fc = mask_as_floats(*cpu, mc), fg = mask_as_floats(*gpu, mg);
      int64_t first = 0;
      EXPECT_EQ(bit_mismatches(fg, fc, &first), 0) << "mask " << at_str(fg, fc, first);
      int64_t kept = std::count(fc.begin(), fc.end(), 1.0f);
      EXPECT_GT(kept, 0) << "nothing selected: the case tests nothing";

      // mask_scores with that mask on a copy of the scores
      Tensor sc = cpu->from_host_f32(s.host, {c.rows, c.t_len}), sg = gpu->from_host_f32(s.host, {c.rows, c.t_len});
      cpu->mask_scores(sc, mc);
      gpu->mask_scores(sg, mg);
      std::vector<float> a = cpu->to_host_f32(sc), b = gpu->to_host_f32(sg);
      EXPECT_EQ(bit_mismatches(b, a, &first), 0) << "mask_scores " << at_str(b, a, first);
    }
  }
}

void check_topk(AttentionOps& t, const std::vector<float>& host, int64_t rows, int64_t width,
                const std::vector<int64_t>& visible, int k, int offset, TieBreak ties) {
  SCOPED_TRACE("rows=" + std::to_string(rows) + " width=" + std::to_string(width) + " k=" + std::to_string(k) +
               " offset=" + std::to_string(offset) + " " + tie_name(ties) + " " + t.seed_note());
  Tensor sc = t.cpu->from_host_f32(host, {rows, width}), sg = t.gpu->from_host_f32(host, {rows, width});
  std::vector<int32_t> want = t.cpu->to_host_i32(t.cpu->topk_indices(sc, k, visible, offset, ties));
  std::vector<int32_t> got = t.gpu->to_host_i32(t.gpu->topk_indices(sg, k, visible, offset, ties));
  ASSERT_EQ(got.size(), want.size());
  int64_t i = gputest::first_mismatch(got, want);
  EXPECT_EQ(i, -1) << "first mismatch [" << i << "] (row " << (i >= 0 ? i / std::max(k, 1) : -1) << ") got "
                   << (i >= 0 ? got[i] : 0) << " want " << (i >= 0 ? want[i] : 0);
}

TEST_F(AttentionOps, TopkIndicesTieHeavy) {
  Rng& r = rng();
  struct Case {
    int64_t rows, t_len;
    int k;
    bool masked;  // scores restricted to candidate blocks first (mostly -inf rows)
  };
  for (const Case& c : std::vector<Case>{{1, 20, 8, false},
                                         {5, 700, 64, false},
                                         {33, 333, 17, true},
                                         {5, 129, 129, false},
                                         {33, 520, 200, true},
                                         {5, 64, 1, false}}) {
    ScoreRows s = tie_scores(*this, r, c.rows, c.t_len);
    std::vector<float> host = s.host;
    if (c.masked) {
      Tensor m = cpu->select_candidates(s.c, s.visible, 5, 8, TieBreak::kLowestIndex);
      cpu->mask_scores(s.c, m);
      host = cpu->to_host_f32(s.c);
    }
    for (TieBreak ties : {TieBreak::kLowestIndex, TieBreak::kTorch})
      check_topk(*this, host, c.rows, c.t_len, s.visible, c.k, 17, ties);
  }
}

// Wide rows (the device's two-stage path: chunks of 8192+ positions, then the candidates), values
// from a small set with a share of -inf.
TEST_F(AttentionOps, TopkIndicesWideRows) {
  Rng& r = rng();
  const std::vector<float> set = {-kInf, -2.0f, -0.5f, 0.0f, 0.125f, 0.75f, 1.0f, 3.0f};
  struct Case {
    int64_t rows, width;
    int k;
  };
  for (const Case& c : std::vector<Case>{{3, 50001, 512}, {2, 40000, 2048}, {1, 300001, 512}, {2, 30000, 3000}}) {
    std::vector<float> host = small_set_values(r, c.rows * c.width, set);
    // one row with only a few finite values: the -inf ties decide most of the selection
    for (int64_t i = 0; i < c.width; ++i)
      if (r.uniform_int(0, 99) != 0) host[i] = -kInf;
    std::vector<int64_t> visible(static_cast<size_t>(c.rows));
    for (int64_t row = 0; row < c.rows; ++row) visible[row] = row == 0 ? c.width : r.uniform_int(c.k, c.width);
    check_topk(*this, host, c.rows, c.width, visible, c.k, 0, TieBreak::kLowestIndex);
    if (c.width <= 50001) check_topk(*this, host, c.rows, c.width, visible, c.k, 3, TieBreak::kTorch);
  }
}

}  // namespace
}  // namespace di
