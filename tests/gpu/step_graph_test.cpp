// A decode step captured as a CUDA graph (device::StepGraph, what `deepinfer bench --graph` times) computes what
// the same step issued kernel by kernel computes, bit for bit: the side stream's branches, its events and the
// PDL edges survive the capture. A capture that would wait for the device fails alone.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/device_tools.h"
#include "core/error.h"
#include "gpu_test_util.h"
#include "model/model.h"

namespace di {
namespace {

std::vector<int32_t> random_prompt(std::mt19937_64& rng, int vocab) {
  std::vector<int32_t> ids(5 + rng() % 40);
  for (int32_t& t : ids) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
  ids[0] = 0;
  return ids;
}

// The golden_dev model on the CUDA backend and a fresh seed (printed) per test.
class StepGraph : public testing::Test {
 protected:
  void SetUp() override {
    const uint64_t seed = gputest::fresh_seed();
    std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
    rng.seed(seed);
    be = make_backend("cuda");
    model = Model::load(std::string(DI_TEST_DATA) + "/golden_dev/model", *be);
  }
  std::mt19937_64 rng;
  std::unique_ptr<Backend> be;
  std::unique_ptr<Model> model;
};

TEST_F(StepGraph, ReplayedDecodeStepEqualsThePlainStep) {
  const int vocab = model->config().vocab_size;
  for (int batch : {1, 3}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    // two copies of each sequence: one steps plainly, the other through the graph
    std::vector<SequenceState> plain, graphed;
    std::vector<int32_t> next;
    for (int b = 0; b < batch; ++b) {
      const std::vector<int32_t> prompt = random_prompt(rng, vocab);
      plain.push_back(model->new_sequence());
      graphed.push_back(model->new_sequence());
      model->forward(plain.back(), prompt);
      model->forward(graphed.back(), prompt);
      next.push_back(static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab)));
    }
    std::vector<BatchEntry> a(batch), g(batch);
    for (int b = 0; b < batch; ++b) {
      a[b] = {&plain[b], {next[b]}, {}};
      g[b] = {&graphed[b], {next[b]}, {}};
      g[b].options.borrow_logits = true;  // read in place after each replay
    }
    const std::vector<ForwardResult> want = model->forward_batch(a);
    std::vector<ForwardResult> got;
    device::StepGraph graph([&] { got = model->forward_batch(g); });
    EXPECT_GT(graph.nodes(), 0);
    for (int replay = 0; replay < 2; ++replay) {
      graph.replay();
      for (int b = 0; b < batch; ++b) {
        ASSERT_EQ(got[b].borrowed_logits.size(), want[b].logits.size());
        EXPECT_EQ(0, std::memcmp(got[b].borrowed_logits.data(), want[b].logits.data(), want[b].logits.size() * 4))
            << "replay " << replay << ", sequence " << b;
      }
    }
  }
}

// Steps issued as a chain of per-layer-group graphs, updated in place from step to step, against plain steps.
TEST_F(StepGraph, PipelinedStepsEqualPlainSteps) {
  const int vocab = model->config().vocab_size;
  const std::vector<int32_t> prompt = random_prompt(rng, vocab);
  SequenceState plain = model->new_sequence(), piped = model->new_sequence();
  model->forward(plain, prompt);
  model->forward(piped, prompt);
  device::GraphPipeline pipe;
  ForwardHooks cuts;
  cuts.at_layer = [&](int l) {
    if (l > 0) pipe.cut();  // one graph per layer
  };
  for (int step = 0; step < 4; ++step) {
    const int32_t id = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
    std::vector<BatchEntry> a{{&plain, {id}, {}}}, g{{&piped, {id}, {}}};
    g[0].options.borrow_logits = true;  // written when the last graph runs
    const std::vector<ForwardResult> want = model->forward_batch(a);
    pipe.begin();
    const std::vector<ForwardResult> got = model->forward_batch(g, &cuts);
    pipe.finish();
    ASSERT_EQ(got[0].borrowed_logits.size(), want[0].logits.size());
    EXPECT_EQ(0, std::memcmp(got[0].borrowed_logits.data(), want[0].logits.data(), want[0].logits.size() * 4))
        << "step " << step;
  }
  EXPECT_EQ(pipe.instantiations() + pipe.updates(), 4 * model->config().n_layers);
}

TEST_F(StepGraph, ACaptureThatWaitsForTheDeviceFailsAlone) {
  Tensor t = be->from_host_f32({1.5f, -2.0f, 3.25f}, {1, 3});
  try {
    device::StepGraph graph([&] { be->to_host_f32(be->concat_cols(t, t)); });
    FAIL() << "a read-back inside the capture did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("read-back"), std::string::npos) << e.what();
  }
  const std::vector<float> both = {1.5f, -2.0f, 3.25f, 1.5f, -2.0f, 3.25f};
  EXPECT_EQ(be->to_host_f32(be->concat_cols(t, t)), both);  // the backend still works
}

}  // namespace
}  // namespace di
