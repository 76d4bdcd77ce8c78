// The whole V4.1 forward on the GPU: every layer and step against the official reference given the
// reference's inputs (as the CPU golden test does). `score --device cuda` against `--device cpu`
// is tests/gpu/score_cuda_vs_cpu.sh.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "backend/backend.h"
#include "layer_golden_check.h"
#include "model/model.h"

namespace di {
namespace {


TEST(CudaModel, MemoryRoundTrip) {
  std::unique_ptr<Backend> be = make_backend("cuda");
  std::vector<float> v = {1.5f, -2.25f, 3.0f, 0.125f, -7.0f, 9.5f};
  Tensor t = be->from_host_f32(v, {2, 3});
  Tensor u = be->alloc(TType::kF32, {3, 3});
  be->copy_rows(u, 1, t, 0, 2);
  std::vector<float> back = be->to_host_f32(u);
  EXPECT_EQ(std::vector<float>(back.begin() + 3, back.end()), v);
  Tensor c = be->concat_cols(t, t);
  std::vector<float> cc = be->to_host_f32(c);
  EXPECT_EQ(cc[0], 1.5f);
  EXPECT_EQ(cc[3], 1.5f);
  EXPECT_EQ(cc[6], 0.125f);
}

// copy_rows_batch (one launch) against the CPU's one copy_rows per entry: fp32 rows of 16-byte and
// odd widths, packed byte rows, copies longer than one 64 KB piece, empty entries; fresh values.
TEST(CudaModel, CopyRowsBatchMatchesCopyRows) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::unique_ptr<Backend> gpu = make_backend("cuda"), cpu = make_backend("cpu");
  struct Shape {
    TType type;
    int64_t rows, width;
  };
  const std::vector<Shape> shapes = {{TType::kF32, 700, 512}, {TType::kF32, 90, 5}, {TType::kU8, 300, 68}};
  for (const Shape& sh : shapes) {
    const int64_t bytes = sh.rows * sh.width * (sh.type == TType::kU8 ? 1 : 4);
    std::vector<int32_t> a(static_cast<size_t>((bytes + 3) / 4)), b(a.size());
    for (int32_t& v : a) v = static_cast<int32_t>(rng());
    for (int32_t& v : b) v = static_cast<int32_t>(rng());
    auto make = [&](Backend& be, const std::vector<int32_t>& words) {  // same bytes on either backend
      Tensor t = be.alloc(sh.type, {sh.rows, sh.width});
      Tensor raw = be.from_host_i32(words, {static_cast<int64_t>(words.size())});
      Tensor flat = raw;  // byte-identical view: one row of the raw words
      flat.type = sh.type;
      flat.shape = {sh.rows, sh.width};
      be.copy_rows(t, 0, flat, 0, sh.rows);
      return t;
    };
    Tensor gs = make(*gpu, a), gd = make(*gpu, b), cs = make(*cpu, a), cd = make(*cpu, b);
    // disjoint destination ranges in random order, random source rows (the source is not written)
    std::vector<Backend::RowCopy> g_copies, c_copies;
    int64_t at = 0;
    while (at < sh.rows) {
      const int64_t n = std::min<int64_t>(sh.rows - at, static_cast<int64_t>(rng() % (sh.rows / 2 + 1)));
      const int64_t s0 = static_cast<int64_t>(rng() % static_cast<uint64_t>(sh.rows - n + 1));
      g_copies.push_back({gd, at, gs, s0, n});
      c_copies.push_back({cd, at, cs, s0, n});
      at += std::max<int64_t>(n, 1);
    }
    gpu->copy_rows_batch(g_copies);
    cpu->copy_rows_batch(c_copies);
    auto words = [&](Backend& be, const Tensor& t) {
      Tensor v = t;
      v.type = TType::kI32;
      v.shape = {static_cast<int64_t>(a.size())};
      return be.to_host_i32(v);
    };
    EXPECT_EQ(words(*gpu, gd), words(*cpu, cd)) << "type " << static_cast<int>(sh.type) << " width " << sh.width;
  }
}

TEST(CudaModel, EveryLayerMatchesTheReferenceGivenItsInputs) {
  std::unique_ptr<Backend> be = make_backend("cuda");
  check_layers_against_reference(*be);
}

}  // namespace
}  // namespace di
