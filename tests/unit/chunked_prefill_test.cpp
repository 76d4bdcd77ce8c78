// Prefill, one-token decode and chunked prefill at any boundary (inside a compress group too) must
// give the same logits: the caches carry window rings, compressor tails, compressed KV and index
// keys across chunks exactly. This holds with reference_decode_quirks off; the official decode reads
// another layer's index keys at some steps and breaks bf16 score ties by the row's width, so it is
// not chunking-invariant by construction (see ModelOptions).
#include <gtest/gtest.h>

#include <chrono>
#include <random>

#include "backend/backend.h"
#include "core/error.h"
#include "model/model.h"

namespace di {
namespace {

class ChunkedPrefill : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    backend_ = make_cpu_backend();
    ModelOptions consistent;
    consistent.reference_decode_quirks = false;
    model_ = Model::load(std::string(DI_TEST_DATA) + "/golden_dev/model", *backend_, consistent);
  }
  static void TearDownTestSuite() {
    model_.reset();
    backend_.reset();
  }
  // Logits of every position when `ids` is fed in chunks of the given sizes (cycled).
  static std::vector<float> run(const std::vector<int32_t>& ids, const std::vector<int>& chunks,
                                Model* model = nullptr) {
    if (!model) model = model_.get();
    SequenceState st = model->new_sequence();
    std::vector<float> all;
    size_t pos = 0, c = 0;
    while (pos < ids.size()) {
      size_t n = std::min<size_t>(chunks[c++ % chunks.size()], ids.size() - pos);
      ForwardResult r = model->forward(st, std::vector<int32_t>(ids.begin() + pos, ids.begin() + pos + n), true);
      all.insert(all.end(), r.logits.begin(), r.logits.end());
      pos += n;
    }
    EXPECT_EQ(st.n_tokens, static_cast<int64_t>(ids.size()));
    return all;
  }
  static std::unique_ptr<Backend> backend_;
  static std::unique_ptr<Model> model_;   // reference_decode_quirks off
};
std::unique_ptr<Backend> ChunkedPrefill::backend_;
std::unique_ptr<Model> ChunkedPrefill::model_;

TEST_F(ChunkedPrefill, AnyChunkingGivesTheSameLogits) {
  uint64_t seed = std::chrono::steady_clock::now().time_since_epoch().count();
  std::mt19937_64 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  const int vocab = model_->config().vocab_size;
  // longer than the window (16), several compress groups and candidate blocks
  std::vector<int32_t> ids(45);
  ids[0] = 0;
  for (size_t i = 1; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(rng() % vocab);
  std::vector<float> whole = run(ids, {static_cast<int>(ids.size())});
  ASSERT_EQ(whole.size(), ids.size() * vocab);
  std::vector<std::vector<int>> plans = {{1}, {2}, {3}, {5, 1}, {7}, {16}, {17, 2}};
  std::vector<int> random_plan;
  for (int i = 0; i < 8; ++i) random_plan.push_back(1 + static_cast<int>(rng() % 9));
  plans.push_back(random_plan);
  for (const auto& plan : plans) {
    std::vector<float> chunked = run(ids, plan);
    ASSERT_EQ(chunked.size(), whole.size());
    for (size_t i = 0; i < whole.size(); ++i)
      ASSERT_EQ(chunked[i], whole[i]) << "plan starting " << plan[0] << ", position " << i / vocab;
  }
}

// brown-small: window 64 and top-k 64, so a query's list [window ; top-k] spans two 64-index softmax
// blocks; a first chunk shorter than the window must not shorten the window list (that moves the
// block boundary and the bf16 rounding of the probabilities; the golden model's 16 + 8 never shows it).
TEST_F(ChunkedPrefill, AnyChunkingGivesTheSameLogitsWithTwoSoftmaxBlocks) {
  ModelOptions consistent;
  consistent.reference_decode_quirks = false;
  std::unique_ptr<Model> model = Model::load(std::string(DEEPINFER_SOURCE_DIR) + "/models/brown-small", *backend_, consistent);
  uint64_t seed = std::chrono::steady_clock::now().time_since_epoch().count();
  std::mt19937_64 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  const ModelConfig& cfg = model->config();
  ASSERT_GE(cfg.window + cfg.index_topk, 128);
  std::vector<int32_t> ids(cfg.window + 40);
  ids[0] = 0;
  for (size_t i = 1; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(3 + rng() % (cfg.vocab_size - 3));
  std::vector<float> whole = run(ids, {static_cast<int>(ids.size())}, model.get());
  for (const std::vector<int>& plan : std::vector<std::vector<int>>{{1}, {7}, {32}, {static_cast<int>(cfg.window) - 1}}) {
    std::vector<float> chunked = run(ids, plan, model.get());
    ASSERT_EQ(chunked.size(), whole.size());
    for (size_t i = 0; i < whole.size(); ++i)
      ASSERT_EQ(chunked[i], whole[i]) << "chunks of " << plan[0] << ", position " << i / cfg.vocab_size;
  }
}

TEST_F(ChunkedPrefill, CachesUseThePackedDeploymentFormats) {
  const ModelConfig& cfg = model_->config();
  SequenceState st = model_->new_sequence();
  model_->forward(st, {0, 5, 9, 11, 3});
  for (const LayerSchedule& ls : cfg.layers) {
    const LayerCache& c = st.layers[ls.layer];
    EXPECT_EQ(c.window.row_size(), cfg.head_dim + cfg.head_dim / 32);  // 528 B for 512 dims
    if (ls.mode == AttnMode::kFull) {
      GlobalKvPool& pool = *st.pool;  // the rows live in the model's page pool
      EXPECT_EQ(pool.comp(ls.layer).row_size(), cfg.head_dim / 2 + cfg.head_dim / 16);  // 288 B for 512
      EXPECT_EQ(pool.index_keys(ls.layer).row_size(), cfg.index_head_dim / 2 + cfg.index_head_dim / 32);  // 68 B for 128
      EXPECT_EQ(c.n_comp, 5 / ls.ratio);
    }
  }
}

TEST_F(ChunkedPrefill, RejectsOutOfRangeTokens) {
  SequenceState st = model_->new_sequence();
  EXPECT_THROW(model_->forward(st, {0, model_->config().vocab_size}), Error);
  EXPECT_THROW(model_->forward(st, {-1}), Error);
}

}  // namespace
}  // namespace di
