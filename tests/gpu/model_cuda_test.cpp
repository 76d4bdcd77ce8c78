// The whole V4.1 forward on the GPU: every layer and step against the official reference given the
// reference's inputs (as the CPU golden test does). `score --device cuda` against `--device cpu`
// is tests/gpu/score_cuda_vs_cpu.sh.
#include <gtest/gtest.h>


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

TEST(CudaModel, EveryLayerMatchesTheReferenceGivenItsInputs) {
  std::unique_ptr<Backend> be = make_backend("cuda");
  check_layers_against_reference(*be);
}

}  // namespace
}  // namespace di
