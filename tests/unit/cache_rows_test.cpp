// pack_rows_to / unpack_caches (a batch's window rings in one call) equal pack_rows / unpack_rows
// cache by cache, on the CPU backend (tests/gpu checks the CUDA ones against these).
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "backend/backend.h"
#include "test_util.h"

namespace di {
namespace {

TEST(CacheRows, PackToManyCachesEqualsPackingEachCache) {
  std::mt19937_64 rng(testing_util::fresh_seed("CacheRows"));
  std::unique_ptr<Backend> be = make_cpu_backend();
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  const int64_t dim = 64, ring = 8, rows = 20, rb = packed_row_bytes(RowFormat::kFp8Ue8m0, dim);
  std::vector<float> xv(rows * dim);
  for (float& v : xv) v = u(rng);
  Tensor x = be->from_host_f32(xv, {rows, dim});
  std::vector<Tensor> many, one;
  for (int i = 0; i < 2; ++i) {
    many.push_back(be->zeros(TType::kU8, {ring, rb}));
    one.push_back(be->zeros(TType::kU8, {ring, rb}));
  }
  // rows 0-7 -> cache 0 slots 7..0, rows 8-11 skipped, rows 12-19 -> cache 1 slots 0..7
  std::vector<int32_t> cache_of(rows, -1);
  std::vector<int64_t> slots(rows, 0);
  for (int64_t r = 0; r < 8; ++r) cache_of[r] = 0, slots[r] = 7 - r;
  for (int64_t r = 12; r < 20; ++r) cache_of[r] = 1, slots[r] = r - 12;
  be->pack_rows_to(x, RowFormat::kFp8Ue8m0, many, cache_of, slots);
  be->pack_rows(row_view(x, 0, 8), RowFormat::kFp8Ue8m0, one[0], {7, 6, 5, 4, 3, 2, 1, 0});
  be->pack_rows(row_view(x, 12, 8), RowFormat::kFp8Ue8m0, one[1], {0, 1, 2, 3, 4, 5, 6, 7});
  for (int i = 0; i < 2; ++i) EXPECT_EQ(std::memcmp(many[i].u8(), one[i].u8(), ring * rb), 0) << "cache " << i;

  Tensor all = be->alloc(TType::kF32, {1 + 2 * ring, dim});
  be->unpack_caches(many, RowFormat::kFp8Ue8m0, all, 1);
  std::vector<float> got = be->to_host_f32(all);
  for (int i = 0; i < 2; ++i) {
    std::vector<float> want = be->to_host_f32(be->unpack_rows(one[i], RowFormat::kFp8Ue8m0, dim, {0, 1, 2, 3, 4, 5, 6, 7}));
    EXPECT_EQ(std::memcmp(got.data() + (1 + i * ring) * dim, want.data(), want.size() * sizeof(float)), 0) << "cache " << i;
  }
}

}  // namespace
}  // namespace di
