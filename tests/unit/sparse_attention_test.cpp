// sparse_attention's key tensors: keys split into kv and kv_more (the batched attention keeps every
// sequence's compressed rows in kv_more) give the same bits as the keys in one tensor, and a -1 after
// a row's last entry (the batch's lists are padded to one width) changes nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "backend/backend.h"
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
  std::vector<float> pad = be->to_host_f32(
      be->sparse_attention(qt, heads, keys, be->from_host_i32(padded, {rows, len + 70}), sink, scale));
  ASSERT_EQ(std::memcmp(pad.data(), whole.data(), whole.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace di
