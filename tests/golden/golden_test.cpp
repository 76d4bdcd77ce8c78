// End to end against DeepSeek's official V4.1 reference (tests/data/golden_dev, see its README):
// every prompt is prefilled and then fed its forced tokens one per step, with DSpark drafts after
// each step, exactly as the golden files were made. The README's criteria (relative L2 <= 0.02 per
// row; same argmax where the reference's top-1 margin >= 0.05; same draft ids under the same rule)
// are applied to every row on which the reference is reproducible: where a second official run
// whose fp32 GEMMs were summed in another order (tests/data/golden_dev_f64) agrees with the golden
// row to 0.005, on that row and every earlier row of the prompt. Past that point the reference
// itself has diverged from its own golden file (chaotic amplification of ulp differences through
// FP8/FP4 re-quantization and tied top-k), so no implementation can be held to it; those rows are
// reported, not checked. tests/golden/layer_golden_test.cpp checks every layer and step instead.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "model/model.h"
#include "runtime/score_run.h"
#include "logit_compare.h"

namespace di {
namespace {

const std::string kCase = std::string(DI_TEST_DATA) + "/golden_dev";
const std::string kSecondRun = std::string(DI_TEST_DATA) + "/golden_dev_f64";
constexpr double kMaxRelL2 = 0.02;
constexpr double kReproducible = 0.005;
constexpr float kMargin = 0.05f;

std::vector<float> read_f32(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  EXPECT_TRUE(f) << path;
  std::vector<float> v(f ? static_cast<size_t>(f.tellg()) / 4 : 0);
  f.seekg(0);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
  return v;
}

nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(std::ifstream(path)); }

// Number of leading rows [rows, width] on which the two official runs agree.
int64_t reproducible_rows(const std::vector<float>& golden, const std::vector<float>& second, int64_t width) {
  int64_t r = 0;
  while ((r + 1) * width <= static_cast<int64_t>(golden.size()) &&
         rel_l2(second.data() + r * width, golden.data() + r * width, width) <= kReproducible)
    ++r;
  return r;
}

TEST(Golden, ReproducibleRowsMeetTheReferenceCriteria) {
  std::unique_ptr<Backend> backend = make_cpu_backend();
  std::unique_ptr<Model> model = Model::load(kCase + "/model", *backend);
  nlohmann::json info = read_json(kCase + "/golden.json");
  const int64_t vocab = info["vocab_size"], block = info["block_size"];
  double worst_checked = 0, worst_all = 0, worst_draft_checked = 0;
  int64_t rows_checked = 0, rows_all = 0, drafts_checked = 0;
  for (size_t p = 0; p < info["prompts"].size(); ++p) {
    const auto& pr = info["prompts"][p];
    std::vector<int32_t> prompt = pr["prompt_ids"], forced = pr["forced_ids"];
    ScoreResult r = run_score(*model, prompt, forced, 0, true);
    auto file = [&](const std::string& dir, const char* key) { return dir + "/" + pr[key].get<std::string>(); };
    std::vector<float> g = read_f32(file(kCase, "logits_file")), g2 = read_f32(file(kSecondRun, "logits_file"));
    ASSERT_EQ(r.logits.size(), g.size());
    int64_t stable = reproducible_rows(g, g2, vocab);
    for (int64_t row = 0; row * vocab < static_cast<int64_t>(g.size()); ++row) {
      double e = rel_l2(r.logits.data() + row * vocab, g.data() + row * vocab, vocab);
      worst_all = std::max(worst_all, e);
      ++rows_all;
      if (row >= stable) continue;
      ++rows_checked;
      worst_checked = std::max(worst_checked, e);
      EXPECT_LE(e, kMaxRelL2) << "prompt " << p << " row " << row;
      auto [arg, margin] = top1(g.data() + row * vocab, vocab);
      if (margin >= kMargin) {
        EXPECT_EQ(top1(r.logits.data() + row * vocab, vocab).first, arg) << "prompt " << p << " row " << row;
      }
    }
    // Drafts of step k follow logits row k + 1; check the steps whose draft logits are reproducible.
    std::vector<float> gd = read_f32(file(kCase, "draft_logits_file")), gd2 = read_f32(file(kSecondRun, "draft_logits_file"));
    std::vector<std::vector<int32_t>> gi = read_json(file(kCase, "draft_ids_file"));
    int64_t stable_steps = std::min(stable - 1, reproducible_rows(gd, gd2, block * vocab));
    for (int64_t k = 0; k < stable_steps; ++k) {
      ++drafts_checked;
      EXPECT_EQ(r.draft_ids[k][0], gi[k][0]) << "prompt " << p << " step " << k;
      for (int64_t i = 0; i < block; ++i) {
        if (r.draft_ids[k][i] != gi[k][i]) break;  // row i is conditioned on the previous draft
        double e = rel_l2(r.draft_logits.data() + (k * block + i) * vocab, gd.data() + (k * block + i) * vocab, vocab);
        worst_draft_checked = std::max(worst_draft_checked, e);
        EXPECT_LE(e, kMaxRelL2) << "prompt " << p << " step " << k << " draft row " << i;
        if (top1(gd.data() + (k * block + i) * vocab, vocab).second < kMargin) break;
        EXPECT_EQ(r.draft_ids[k][i + 1], gi[k][i + 1]) << "prompt " << p << " step " << k << " draft " << i;
      }
    }
  }
  std::printf("[golden] %lld of %lld logits rows reproducible by the reference itself and checked: worst relative "
              "L2 %.6f (all rows: %.6f); %lld draft steps checked: worst %.6f\n",
              static_cast<long long>(rows_checked), static_cast<long long>(rows_all), worst_checked, worst_all,
              static_cast<long long>(drafts_checked), worst_draft_checked);
  EXPECT_GT(rows_checked, 0);
}

}  // namespace
}  // namespace di
