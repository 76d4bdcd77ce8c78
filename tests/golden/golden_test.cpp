// The CPU backend against DeepSeek's official V4.1 reference (tests/data/golden_dev, see its
// README): every prompt's prefill row and decode rows, every step's DSpark drafts; criteria: relative
// L2 <= 0.02 per row, same argmax where the reference's top-1 margin >= 0.05, same draft ids under
// the same rule. Prints the worst relative error seen.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "model/model.h"
#include "runtime/score_run.h"

namespace di {
namespace {

const std::string kCase = std::string(DI_TEST_DATA) + "/golden_dev";
constexpr double kMaxRelL2 = 0.02;
constexpr float kMargin = 0.05f;

std::vector<float> read_f32(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  EXPECT_TRUE(f) << path;
  std::vector<float> v(static_cast<size_t>(f.tellg()) / 4);
  f.seekg(0);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
  return v;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}

double rel_l2(const float* a, const float* ref, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    num += (double(a[i]) - ref[i]) * (double(a[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// top-1 index and top-1 minus top-2 margin
std::pair<int64_t, float> top1(const float* v, int64_t n) {
  int64_t best = std::max_element(v, v + n) - v;
  float second = -INFINITY;
  for (int64_t i = 0; i < n; ++i)
    if (i != best) second = std::max(second, v[i]);
  return {best, v[best] - second};
}

struct Worst {
  double logits = 0, draft_logits = 0, confidence = 0;
};

// Compares rows [n_rows, width] and the argmax rule; returns the worst relative error.
double compare_rows(const std::vector<float>& ours, const std::vector<float>& ref, int64_t width, const std::string& what) {
  EXPECT_EQ(ours.size(), ref.size()) << what;
  double worst = 0;
  for (int64_t r = 0; r * width < static_cast<int64_t>(std::min(ours.size(), ref.size())); ++r) {
    const float* a = ours.data() + r * width;
    const float* b = ref.data() + r * width;
    double e = rel_l2(a, b, width);
    worst = std::max(worst, e);
    EXPECT_LE(e, kMaxRelL2) << what << " row " << r;
    if (width > 1) {
      auto [ref_arg, margin] = top1(b, width);
      if (margin >= kMargin) {
        EXPECT_EQ(top1(a, width).first, ref_arg) << what << " row " << r << " margin " << margin;
      }
    }
  }
  return worst;
}

class Golden : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    backend_ = make_cpu_backend();
    model_ = Model::load(kCase + "/model", *backend_);
    info_ = read_json(kCase + "/golden.json");
  }
  static void TearDownTestSuite() {
    model_.reset();
    backend_.reset();
    std::printf("[golden] worst relative L2: logits %.5f, draft logits %.5f, confidence %.5f\n", worst_.logits,
                worst_.draft_logits, worst_.confidence);
  }
  static std::unique_ptr<Backend> backend_;
  static std::unique_ptr<Model> model_;
  static nlohmann::json info_;
  static Worst worst_;
};
std::unique_ptr<Backend> Golden::backend_;
std::unique_ptr<Model> Golden::model_;
nlohmann::json Golden::info_;
Worst Golden::worst_;

TEST_F(Golden, LogitsAndDraftsMatchReference) {
  int64_t vocab = info_["vocab_size"], block = info_["block_size"];
  for (size_t p = 0; p < info_["prompts"].size(); ++p) {
    const auto& pr = info_["prompts"][p];
    std::vector<int32_t> prompt = pr["prompt_ids"], forced = pr["forced_ids"];
    ScoreResult r = run_score(*model_, prompt, forced, 0, true);
    std::string tag = "prompt " + std::to_string(p);
    worst_.logits = std::max(worst_.logits, compare_rows(r.logits, read_f32(kCase + "/" + pr["logits_file"].get<std::string>()), vocab, tag + " logits"));
    worst_.draft_logits = std::max(worst_.draft_logits, compare_rows(r.draft_logits, read_f32(kCase + "/" + pr["draft_logits_file"].get<std::string>()), vocab, tag + " draft logits"));
    worst_.confidence = std::max(worst_.confidence, compare_rows(r.confidence, read_f32(kCase + "/" + pr["confidence_file"].get<std::string>()), block * static_cast<int64_t>(forced.size()), tag + " confidence"));
    // draft ids: position by position while the reference drafter's margin allows
    std::vector<std::vector<int32_t>> ref_ids = read_json(kCase + "/" + pr["draft_ids_file"].get<std::string>());
    std::vector<float> ref_dl = read_f32(kCase + "/" + pr["draft_logits_file"].get<std::string>());
    ASSERT_EQ(r.draft_ids.size(), ref_ids.size()) << tag;
    for (size_t k = 0; k < ref_ids.size(); ++k) {
      EXPECT_EQ(r.draft_ids[k][0], ref_ids[k][0]) << tag << " step " << k << " anchor";
      for (int64_t i = 0; i < block; ++i) {
        if (top1(ref_dl.data() + (k * block + i) * vocab, vocab).second < kMargin) break;
        EXPECT_EQ(r.draft_ids[k][i + 1], ref_ids[k][i + 1]) << tag << " step " << k << " draft " << i;
        if (r.draft_ids[k][i + 1] != ref_ids[k][i + 1]) break;
      }
    }
  }
}

}  // namespace
}  // namespace di
