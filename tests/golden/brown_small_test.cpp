// The embedded default model, models/brown-small (trained on the Brown corpus by tools/train_small),
// against the PyTorch forward of tools/train_small/v41_model.py run on the same exported checkpoint
// with the engine's quantization points (RefOps): prefill logits of fixed prompts and DSpark drafts,
// written by tools/train_small/export.py into tests/data/brown_small (fp16). Golden-style criteria:
// relative L2 of every logits row <= 0.02, the same argmax where the reference's top-1 margin is at
// least 0.05; the same draft tokens up to the first draft row with a smaller margin.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "model/model.h"
#include "model/quant.h"
#include "tokenizer/engram_token_map.h"
#include "tokenizer/tokenizer.h"
#include "logit_compare.h"

namespace di {
namespace {

const std::string kModel = std::string(DEEPINFER_SOURCE_DIR) + "/models/brown-small";
const std::string kData = std::string(DI_TEST_DATA) + "/brown_small";
constexpr double kMaxRelL2 = 0.02;
constexpr float kMargin = 0.05f;

std::vector<float> read_f16(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  EXPECT_TRUE(f) << path;
  std::vector<uint16_t> h(f ? static_cast<size_t>(f.tellg()) / 2 : 0);
  f.seekg(0);
  f.read(reinterpret_cast<char*>(h.data()), static_cast<std::streamsize>(h.size() * 2));
  std::vector<float> v(h.size());
  for (size_t i = 0; i < h.size(); ++i) v[i] = quant::f16_to_float(h[i]);
  return v;
}

nlohmann::json reference() { return nlohmann::json::parse(std::ifstream(kData + "/reference.json")); }

TEST(BrownSmall, PrefillLogitsMatchTheTrainingScriptsForward) {
  std::unique_ptr<Backend> backend = make_cpu_backend();
  std::unique_ptr<Model> model = Model::load(kModel, *backend);
  nlohmann::json ref = reference();
  const int64_t vocab = ref["vocab_size"];
  ASSERT_EQ(vocab, model->config().vocab_size);
  double worst = 0;
  int64_t rows = 0, argmax_checked = 0;
  for (size_t p = 0; p < ref["prompts"].size(); ++p) {
    const auto& pr = ref["prompts"][p];
    std::vector<int32_t> ids = pr["ids"];
    std::vector<int64_t> positions = pr["positions"];
    std::vector<float> want = read_f16(kData + "/" + pr["logits_file"].get<std::string>());
    ASSERT_EQ(want.size(), positions.size() * vocab);
    SequenceState st = model->new_sequence();
    ForwardResult got = model->forward(st, ids, /*all_logits=*/true);
    ASSERT_EQ(got.logits.size(), ids.size() * vocab);
    for (size_t r = 0; r < positions.size(); ++r) {
      const float* g = got.logits.data() + positions[r] * vocab;
      const float* w = want.data() + r * vocab;
      double e = rel_l2(g, w, vocab);
      worst = std::max(worst, e);
      ++rows;
      EXPECT_LE(e, kMaxRelL2) << "prompt " << p << " position " << positions[r];
      auto [best, margin] = top1(w, vocab);
      if (margin >= kMargin) {
        ++argmax_checked;
        EXPECT_EQ(top1(g, vocab).first, best) << "prompt " << p << " position " << positions[r];
      }
    }
  }
  std::printf("brown-small prefill: %lld rows, worst relative L2 %.3e (limit %.2f), argmax checked on %lld rows\n",
              static_cast<long long>(rows), worst, kMaxRelL2, static_cast<long long>(argmax_checked));
  EXPECT_GT(rows, 20);
}

TEST(BrownSmall, DSparkDraftsMatchTheTrainingScriptsForward) {
  std::unique_ptr<Backend> backend = make_cpu_backend();
  std::unique_ptr<Model> model = Model::load(kModel, *backend);
  ASSERT_TRUE(model->has_dspark());
  nlohmann::json ref = reference();
  const int64_t vocab = ref["vocab_size"], block = ref["block_size"];
  double worst = 0;
  int64_t drafts = 0;
  for (const auto& pr : ref["prompts"]) {
    if (!pr.contains("drafts")) continue;
    std::vector<int32_t> ids = pr["ids"];
    for (const auto& d : pr["drafts"]) {
      // prefill the whole prompt, seed the draft stages with positions 0..p, draft after p + 1
      const int64_t p = d["p"];
      SequenceState st = model->new_sequence();
      ForwardResult f = model->forward(st, ids);
      Tensor seed = backend->alloc(TType::kF32, {p + 1, f.features.row_size()});
      backend->copy_rows(seed, 0, f.features, 0, p + 1);
      model->dspark_seed(st, seed);
      DraftResult got = model->dspark_draft(st, d["anchor"].get<int32_t>());
      std::vector<float> want = read_f16(kData + "/" + d["logits_file"].get<std::string>());
      ASSERT_EQ(want.size(), static_cast<size_t>(block * vocab));
      std::vector<int32_t> want_ids = d["ids"];
      bool chain = true;  // draft ids are compared while every earlier row was decisive
      for (int64_t i = 0; i < block; ++i) {
        double e = rel_l2(got.logits.data() + i * vocab, want.data() + i * vocab, vocab);
        worst = std::max(worst, e);
        EXPECT_LE(e, kMaxRelL2) << "draft at p " << p << " row " << i;
        chain = chain && top1(want.data() + i * vocab, vocab).second >= kMargin;
        if (chain) {
          EXPECT_EQ(got.ids[i + 1], want_ids[i + 1]) << "draft at p " << p << " row " << i;
        }
      }
      ++drafts;
    }
  }
  std::printf("brown-small DSpark: %lld drafts of %lld rows, worst relative L2 %.3e\n", static_cast<long long>(drafts),
              static_cast<long long>(block), worst);
  EXPECT_GT(drafts, 0);
}

TEST(BrownSmall, EngramTokenMapMatchesTheTrainingScripts) {
  // The training script hashed Engram n-grams with its own port of the token map; the engine
  // derives the map from tokenizer.json. They must agree id for id.
  std::unique_ptr<Tokenizer> tok = Tokenizer::load(kModel);
  EngramTokenMap m = build_engram_token_map(*tok);
  nlohmann::json want = nlohmann::json::parse(std::ifstream(kData + "/engram_token_map.json"));
  EXPECT_EQ(m.compressed_vocab_size, want["compressed_vocab_size"].get<int64_t>());
  EXPECT_EQ(m.token_map, want["token_map"].get<std::vector<int32_t>>());
}

}  // namespace
}  // namespace di
