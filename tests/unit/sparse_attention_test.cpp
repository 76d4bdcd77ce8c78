// sparse_attention's key tensors: keys split into kv and kv_more give the same bits as the keys in
// one tensor, kv_more as packed cache rows (the compressed KV read from the page pool) the same bits
// as those rows unpacked, and a -1 after a row's last entry (the batch's lists are padded to one
// width) changes nothing. map_paged_rows maps row ids through page tables. index_scores reads each
// row's keys from its own offset (the batched indexer).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "backend/backend.h"
#include "core/error.h"
#include "test_util.h"

namespace di {
namespace {

TEST(SparseAttentionKeys, SplitKeysAndTrailingPaddingGiveTheSameBits) {
  std::mt19937_64 rng(testing_util::fresh_seed("SparseAttentionKeys"));
  std::unique_ptr<Backend> be = make_cpu_backend();
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const int heads = 4;
  const int64_t dh = 64, n_kv = 300, rows = 5, len = 150;
  std::vector<float> q(rows * heads * dh), kv(n_kv * dh);
  for (float& v : q) v = 2.0f * u(rng);
  for (float& v : kv) v = u(rng);
  std::vector<int32_t> idx(rows * len), padded(rows * (len + 70), -1);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < len; ++j) {
      idx[r * len + j] = rng() % 7 == 0 ? -1 : static_cast<int32_t>(rng() % n_kv);
      padded[r * (len + 70) + j] = idx[r * len + j];
    }
  std::vector<float> sink_v(heads);
  for (float& v : sink_v) v = u(rng);
  Weight sink;
  sink.mode = WeightMode::kF32;
  sink.dtype = DType::kF32;
  sink.rows = 1;
  sink.cols = heads;
  sink.data = reinterpret_cast<const uint8_t*>(sink_v.data());
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));

  Tensor qt = be->from_host_f32(q, {rows, heads * dh}), keys = be->from_host_f32(kv, {n_kv, dh});
  Tensor it = be->from_host_i32(idx, {rows, len});
  std::vector<float> whole = be->to_host_f32(be->sparse_attention(qt, heads, keys, it, sink, scale));
  for (int64_t m : {int64_t{1}, int64_t{137}, n_kv - 1}) {
    std::vector<float> split = be->to_host_f32(
        be->sparse_attention(qt, heads, row_view(keys, 0, m), it, sink, scale, row_view(keys, m, n_kv - m)));
    ASSERT_EQ(std::memcmp(split.data(), whole.data(), whole.size() * sizeof(float)), 0) << "split at " << m;
  }
  // kv_more packed: rows quantize-dequantized to FP4, packed; attention over the packed rows equals
  // attention over their unpacked values
  const int64_t m = 100;
  Tensor more = be->from_host_f32(std::vector<float>(kv.begin() + m * dh, kv.end()), {n_kv - m, dh});
  be->qdq(more, RowFormat::kFp4E4m3);
  Tensor packed = be->zeros(TType::kU8, {n_kv - m, packed_row_bytes(RowFormat::kFp4E4m3, dh)});
  std::vector<int64_t> slots(static_cast<size_t>(n_kv - m));
  for (size_t i = 0; i < slots.size(); ++i) slots[i] = static_cast<int64_t>(i);
  be->pack_rows(more, RowFormat::kFp4E4m3, packed, slots);
  std::vector<float> from_f32 =
      be->to_host_f32(be->sparse_attention(qt, heads, row_view(keys, 0, m), it, sink, scale, more));
  std::vector<float> from_packed = be->to_host_f32(
      be->sparse_attention(qt, heads, row_view(keys, 0, m), it, sink, scale, packed, RowFormat::kFp4E4m3));
  ASSERT_EQ(std::memcmp(from_packed.data(), from_f32.data(), from_f32.size() * sizeof(float)), 0);
  std::vector<float> pad = be->to_host_f32(
      be->sparse_attention(qt, heads, keys, be->from_host_i32(padded, {rows, len + 70}), sink, scale));
  ASSERT_EQ(std::memcmp(pad.data(), whole.data(), whole.size() * sizeof(float)), 0);
}

TEST(MapPagedRows, RowIdsGoThroughEachRowsPageTable) {
  std::unique_ptr<Backend> be = make_cpu_backend();
  // two sequences: pages {5, 2} and {0, 7, 3}; 4 rows per page; base 10
  const std::vector<int32_t> table = {5, 2, 0, 7, 3};
  const std::vector<int64_t> start = {0, 2, 2};  // row 0 -> sequence 0, rows 1-2 -> sequence 1
  Tensor idx = be->from_host_i32({0, 7, -1, 3, 9, 4, 11, -1, 0}, {3, 3});
  be->map_paged_rows(idx, start, table, 4, 10);
  EXPECT_EQ(be->to_host_i32(idx), (std::vector<int32_t>{10 + 20, 10 + 8 + 3, -1, 10 + 3, 10 + 12 + 1, 10 + 28,
                                                        10 + 12 + 3, -1, 10 + 0}));
}

// index_scores with key offsets (several sequences' keys in one tensor): each row's scores are the
// bits it gets against its own sequence's keys alone; the output is max(visible) wide, -inf after
// a row's visible keys; offsets that leave the keys are rejected.
TEST(IndexScoresKeyOffsets, EachRowScoresItsOwnSequencesKeys) {
  std::mt19937_64 rng(testing_util::fresh_seed("IndexScoresKeyOffsets"));
  std::unique_ptr<Backend> be = make_cpu_backend();
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const int heads = 3;
  const int64_t hd = 32;
  const std::vector<int64_t> lens = {40, 7, 0, 25};  // keys per sequence (one has none yet)
  std::vector<std::vector<float>> keys(lens.size());
  std::vector<float> all_keys;
  std::vector<int64_t> first;  // each sequence's first key in all_keys
  for (size_t s = 0; s < lens.size(); ++s) {
    first.push_back(static_cast<int64_t>(all_keys.size()) / hd);
    for (int64_t i = 0; i < lens[s] * hd; ++i) keys[s].push_back(u(rng));
    all_keys.insert(all_keys.end(), keys[s].begin(), keys[s].end());
  }
  const int64_t rows = 9;
  std::vector<float> q(rows * heads * hd), w(rows * heads);
  for (float& v : q) v = u(rng);
  for (float& v : w) v = 0.1f * u(rng);
  std::vector<int64_t> seq(rows), visible(rows), offsets(rows);
  for (int64_t r = 0; r < rows; ++r) {
    seq[r] = r == 0 ? 0 : static_cast<int64_t>(rng() % lens.size());  // row 0 sees keys
    visible[r] = lens[seq[r]] == 0 ? 0 : 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(lens[seq[r]]));
    offsets[r] = first[seq[r]];
  }
  const int64_t width = index_width(visible);
  Tensor got = be->index_scores(be->from_host_f32(q, {rows, heads * hd}), heads,
                                be->from_host_f32(all_keys, {static_cast<int64_t>(all_keys.size()) / hd, hd}),
                                be->from_host_f32(w, {rows, heads}), visible, offsets);
  ASSERT_EQ(got.rows(), rows);
  ASSERT_EQ(got.row_size(), width);
  const std::vector<float> g = be->to_host_f32(got);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = lens[seq[r]];
    std::vector<float> qr(q.begin() + r * heads * hd, q.begin() + (r + 1) * heads * hd);
    std::vector<float> wr(w.begin() + r * heads, w.begin() + (r + 1) * heads);
    std::vector<float> alone(static_cast<size_t>(width), -INFINITY);
    if (n > 0) {
      const std::vector<float> a = be->to_host_f32(be->index_scores(
          be->from_host_f32(qr, {1, heads * hd}), heads, be->from_host_f32(keys[seq[r]], {n, hd}),
          be->from_host_f32(wr, {1, heads}), {visible[r]}, {}));
      std::copy(a.begin(), a.begin() + std::min<int64_t>(n, width), alone.begin());
    }
    for (int64_t t = 0; t < width; ++t) {
      const float want = t < visible[r] ? alone[t] : -INFINITY;
      ASSERT_EQ(std::memcmp(&g[r * width + t], &want, 4), 0) << "row " << r << " key " << t;
    }
  }
  std::vector<int64_t> bad = offsets;
  bad[0] = static_cast<int64_t>(all_keys.size()) / hd - visible[0] + 1;  // one key past the end
  EXPECT_THROW(be->index_scores(be->from_host_f32(q, {rows, heads * hd}), heads,
                                  be->from_host_f32(all_keys, {static_cast<int64_t>(all_keys.size()) / hd, hd}),
                                  be->from_host_f32(w, {rows, heads}), visible, bad),
                 Error);
}

}  // namespace
}  // namespace di
