// Token sampling: greedy at temperature 0, otherwise temperature -> top-k -> top-p (nucleus) over
// the fp32 logits with a seeded generator, so a seed reproduces a generation exactly.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace di {

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy
  float top_p = 1.0f;        // (0, 1]
  int top_k = 0;             // 0 = off
  uint64_t seed = 0;
};

// Throws di::Error naming the field for out-of-range values.
void validate_sampling(const SamplingParams& p);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  int32_t sample(const float* logits, int64_t vocab);

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
};

}  // namespace di
