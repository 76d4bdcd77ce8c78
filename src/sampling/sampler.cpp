#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "core/error.h"

namespace di {

void validate_sampling(const SamplingParams& p) {
  if (!(p.temperature >= 0) || !std::isfinite(p.temperature))
    throw Error("temperature: expected a finite number >= 0, got " + std::to_string(p.temperature));
  if (!(p.top_p > 0 && p.top_p <= 1)) throw Error("top_p: expected a number in (0, 1], got " + std::to_string(p.top_p));
  if (p.top_k < 0) throw Error("top_k: expected >= 0, got " + std::to_string(p.top_k));
}

Sampler::Sampler(const SamplingParams& params) : p_(params), rng_(params.seed) { validate_sampling(params); }

int32_t Sampler::sample(const float* logits, int64_t vocab) {
  if (p_.temperature == 0) return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  // highest first; ties by id so the order is deterministic
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  int64_t n = p_.top_k > 0 ? std::min<int64_t>(p_.top_k, vocab) : vocab;
  std::vector<double> prob(n);
  double mx = logits[order[0]] / p_.temperature, sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += (prob[i] = std::exp(logits[order[i]] / p_.temperature - mx));
  double cum = 0;
  int64_t keep = n;
  for (int64_t i = 0; i < n; ++i) {
    cum += prob[i] / sum;
    if (cum >= p_.top_p) {
      keep = i + 1;
      break;
    }
  }
  double kept = std::accumulate(prob.begin(), prob.begin() + keep, 0.0);
  double u = std::uniform_real_distribution<double>(0.0, kept)(rng_);
  for (int64_t i = 0; i < keep; ++i) {
    u -= prob[i];
    if (u <= 0) return order[i];
  }
  return order[keep - 1];
}

}  // namespace di
