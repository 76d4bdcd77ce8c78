// The tiny V4.1 model of tests/data/golden_dev (7 layers, window 16, ratios 0 0 2 2 1 1 1, Engram,
// DSpark) for the model-level runtime tests, and small helpers around it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "backend/backend.h"
#include "model/model.h"

namespace di::testing_util {

inline std::unique_ptr<Model> load_tiny_model(Backend& backend, bool reference_decode_quirks,
                                              int64_t kv_page_tokens = 64) {
  ModelOptions o;
  o.reference_decode_quirks = reference_decode_quirks;
  o.kv_page_tokens = kv_page_tokens;
  return Model::load(std::string(DI_TEST_DATA) + "/golden_dev/model", backend, o);
}

// A test suite sharing one CPU backend and the tiny model (reference_decode_quirks off).
class TinyModelSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    backend_ = make_cpu_backend();
    model_ = load_tiny_model(*backend_, false);
  }
  static void TearDownTestSuite() {
    model_.reset();
    backend_.reset();
  }
  static inline std::unique_ptr<Backend> backend_;
  static inline std::unique_ptr<Model> model_;
};

inline std::vector<int32_t> random_ids(std::mt19937_64& rng, int64_t n, int vocab) {
  std::vector<int32_t> ids(n);
  for (int32_t& id : ids) id = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
  return ids;
}

inline std::vector<int32_t> slice(const std::vector<int32_t>& v, int64_t begin, int64_t end) {
  return std::vector<int32_t>(v.begin() + begin, v.begin() + end);
}

// Largest |a - b| / max(1, max |b|) over two logits vectors (a relative max error).
inline double max_rel_error(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0, scale = 1;
  for (float v : b) scale = std::max(scale, static_cast<double>(std::abs(v)));
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]) / scale);
  return worst;
}

}  // namespace di::testing_util
