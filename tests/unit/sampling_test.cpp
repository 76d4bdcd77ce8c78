// Sampler: each processing step against a direct computation on random logits, penalty semantics,
// masks, greedy ties, errors, the counter RNG's determinism, the draw distribution (chi-square) and
// raw logprobs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "sampling/counter_rng.h"
#include "sampling/sampler.h"
#include "test_util.h"

namespace di {
namespace {

using testing_util::fresh_seed;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

std::vector<float> random_logits(std::mt19937_64& rng, int64_t vocab, float scale = 3.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> l(vocab);
  for (float& x : l) x = d(rng);
  return l;
}

std::vector<int32_t> random_ids(std::mt19937_64& rng, int64_t vocab, size_t n) {
  std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> ids(n);
  for (int32_t& x : ids) x = d(rng);
  return ids;
}

SamplingParams seeded(uint64_t seed) {
  SamplingParams p;
  p.seed = seed;
  return p;
}

// The processing pipeline written out directly: full sorts, a set, a map. Per-token arithmetic is
// the same float arithmetic as the sampler's, so a top-p / min-p boundary cannot fall between the
// two by rounding. Empty mask = no mask.
std::vector<double> reference_probs(const std::vector<float>& logits, const SamplingParams& p,
                                    const std::vector<int32_t>& prompt, const std::vector<int32_t>& output,
                                    const std::vector<uint32_t>& mask) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  std::vector<float> l = logits;
  for (int64_t i = 0; i < vocab; ++i)
    if (!mask.empty() && !((mask[i / 32] >> (i % 32)) & 1)) l[i] = kNegInf;
  std::set<int32_t> seen(prompt.begin(), prompt.end());
  seen.insert(output.begin(), output.end());
  for (int32_t id : seen) l[id] = l[id] > 0 ? l[id] / p.repetition_penalty : l[id] * p.repetition_penalty;
  std::map<int32_t, int> count;
  for (int32_t id : output) ++count[id];
  for (auto [id, c] : count) l[id] -= p.frequency_penalty * static_cast<float>(c) + p.presence_penalty;

  std::vector<double> probs(vocab, 0.0);
  if (p.temperature == 0) {
    probs[std::max_element(l.begin(), l.end()) - l.begin()] = 1;
    return probs;
  }
  std::vector<int32_t> order;
  for (int64_t i = 0; i < vocab; ++i)
    if (l[i] != kNegInf) order.push_back(static_cast<int32_t>(i));
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
  if (p.top_k > 0 && p.top_k < static_cast<int>(order.size())) order.resize(p.top_k);
  std::vector<float> w;
  for (int32_t id : order) w.push_back(std::exp((l[id] - l[order[0]]) * (1.0f / p.temperature)));
  double z = std::accumulate(w.begin(), w.end(), 0.0);
  if (p.top_p < 1) {
    double cum = 0;
    for (size_t i = 0; i < order.size(); ++i) {
      cum += w[i];
      if (cum >= p.top_p * z) {
        order.resize(i + 1);
        w.resize(i + 1);
        break;
      }
    }
  }
  for (size_t i = 0; i < order.size(); ++i)
    if (w[i] >= p.min_p * w[0]) probs[order[i]] = w[i];
  double total = std::accumulate(probs.begin(), probs.end(), 0.0);
  for (double& x : probs) x /= total;
  return probs;
}

void expect_probs_match(RequestSampler& s, const std::vector<float>& logits, const std::vector<int32_t>& prompt,
                        const std::vector<int32_t>& output, const std::vector<uint32_t>& mask) {
  std::vector<float> got(logits.size());
  s.probabilities(logits, output, mask, got);
  std::vector<double> want = reference_probs(logits, s.params(), prompt, output, mask);
  for (size_t i = 0; i < logits.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-6 + 1e-5 * want[i]) << "token " << i;
    // Filtered out on both sides; kept on both (unless its probability underflows a float).
    if (want[i] == 0) {
      ASSERT_EQ(got[i], 0.0f) << "token " << i << " should be filtered out";
    } else if (want[i] > 1e-30) {
      ASSERT_GT(got[i], 0.0f) << "token " << i << " should be kept";
    }
  }
}

TEST(Sampling, TemperatureMatchesSoftmax) {
  std::mt19937_64 rng(fresh_seed("TemperatureMatchesSoftmax"));
  for (int trial = 0; trial < 20; ++trial) {
    SamplingParams p = seeded(rng());
    p.temperature = std::uniform_real_distribution<float>(0.05f, 3.0f)(rng);
    RequestSampler s(p, 1000);
    expect_probs_match(s, random_logits(rng, 1000), {}, {}, {});
  }
}

TEST(Sampling, TopKKeepsTheKMostLikely) {
  std::mt19937_64 rng(fresh_seed("TopKKeepsTheKMostLikely"));
  for (int k : {1, 2, 7, 100, 999, 1000, 5000}) {
    SamplingParams p = seeded(rng());
    p.top_k = k;
    p.temperature = 0.7f;
    RequestSampler s(p, 1000);
    std::vector<float> logits = random_logits(rng, 1000);
    expect_probs_match(s, logits, {}, {}, {});
    std::vector<float> probs(1000);
    s.probabilities(logits, {}, {}, probs);
    EXPECT_EQ(std::count_if(probs.begin(), probs.end(), [](float x) { return x > 0; }), std::min(k, 1000));
  }
}

TEST(Sampling, TopKOneIsGreedy) {
  std::mt19937_64 rng(fresh_seed("TopKOneIsGreedy"));
  SamplingParams p = seeded(rng());
  p.top_k = 1;
  SamplingParams g;
  g.temperature = 0;
  RequestSampler s(p, 500), greedy(g, 500);
  std::vector<int32_t> output;
  for (int i = 0; i < 50; ++i) {
    std::vector<float> logits = random_logits(rng, 500);
    int32_t want = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    EXPECT_EQ(s.sample(logits, output).id, want);
    EXPECT_EQ(greedy.sample(logits, output).id, want);
    output.push_back(want);
  }
}

TEST(Sampling, TopPKeepsTheSmallestNucleus) {
  std::mt19937_64 rng(fresh_seed("TopPKeepsTheSmallestNucleus"));
  // Large, flat vocabularies make the sorted prefix grow over several chunks.
  for (int64_t vocab : {10, 1000, 20000}) {
    for (float top_p : {0.05f, 0.5f, 0.9f, 0.999f}) {
      SamplingParams p = seeded(rng());
      p.top_p = top_p;
      p.temperature = std::uniform_real_distribution<float>(0.5f, 2.0f)(rng);
      RequestSampler s(p, vocab);
      expect_probs_match(s, random_logits(rng, vocab, vocab > 1000 ? 0.5f : 3.0f), {}, {}, {});
    }
  }
}

TEST(Sampling, TopPOneIsOffAndTopKAboveVocabIsOff) {
  std::mt19937_64 rng(fresh_seed("TopPOneIsOffAndTopKAboveVocabIsOff"));
  std::vector<float> logits = random_logits(rng, 300);
  SamplingParams plain = seeded(rng());
  SamplingParams filtered = plain;
  filtered.top_p = 1.0f;
  filtered.top_k = 301;
  RequestSampler a(plain, 300), b(filtered, 300);
  std::vector<float> pa(300), pb(300);
  a.probabilities(logits, {}, {}, pa);
  b.probabilities(logits, {}, {}, pb);
  for (int i = 0; i < 300; ++i) {
    EXPECT_NEAR(pa[i], pb[i], 1e-7);
    EXPECT_GT(pa[i], 0);
  }
}

TEST(Sampling, MinPDropsUnlikelyTokens) {
  std::mt19937_64 rng(fresh_seed("MinPDropsUnlikelyTokens"));
  for (float min_p : {0.001f, 0.05f, 0.3f, 1.0f}) {
    SamplingParams p = seeded(rng());
    p.min_p = min_p;
    RequestSampler s(p, 2000);
    std::vector<float> logits = random_logits(rng, 2000);
    expect_probs_match(s, logits, {}, {}, {});
    // Direct: kept iff exp(l - max) >= min_p.
    std::vector<float> probs(2000);
    s.probabilities(logits, {}, {}, probs);
    float mx = *std::max_element(logits.begin(), logits.end());
    for (int i = 0; i < 2000; ++i) {
      float r = std::exp(logits[i] - mx);
      if (std::abs(r - min_p) > 1e-5f * min_p) {
        EXPECT_EQ(probs[i] > 0, r >= min_p) << i;
      }
    }
  }
}

TEST(Sampling, RepetitionPenaltySemantics) {
  // Logits [2, -1, 0.5, -3, 1]; prompt has token 0 twice, output has 1 and 4. Penalty 2: positives
  // halve, negatives double, unseen tokens keep their logits. Greedy at every step reads the result.
  SamplingParams p;
  p.temperature = 1;
  p.seed = 1;
  p.repetition_penalty = 2;
  std::vector<float> logits = {2, -1, 0.5f, -3, 1};
  std::vector<int32_t> prompt = {0, 0}, output = {1, 4};
  RequestSampler s(p, 5, prompt);
  std::vector<float> probs(5);
  s.probabilities(logits, output, {}, probs);
  std::vector<double> want = {1, -2, 0.5, -3, 0.5};  // processed logits
  double z = 0;
  for (double w : want) z += std::exp(w);
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(probs[i], std::exp(want[i]) / z, 1e-6) << i;

  // Random check against the reference, penalties < 1 and > 1.
  std::mt19937_64 rng(fresh_seed("RepetitionPenaltySemantics"));
  for (float rep : {0.5f, 1.3f, 3.0f}) {
    SamplingParams q = seeded(rng());
    q.repetition_penalty = rep;
    std::vector<int32_t> pr = random_ids(rng, 400, 300), out = random_ids(rng, 400, 50);
    RequestSampler r(q, 400, pr);
    expect_probs_match(r, random_logits(rng, 400), pr, out, {});
  }
}

TEST(Sampling, PresenceAndFrequencyPenaltiesCountTheOutputOnly) {
  // Token 2 appears 3 times in the output, token 0 once, token 1 only in the prompt.
  SamplingParams p;
  p.seed = 1;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  std::vector<float> logits = {1, 1, 1, 1};
  std::vector<int32_t> prompt = {1, 1, 1}, output = {2, 0, 2, 2};
  RequestSampler s(p, 4, prompt);
  std::vector<float> probs(4);
  s.probabilities(logits, output, {}, probs);
  std::vector<double> want = {1 - 0.5 - 0.25, 1, 1 - 0.5 - 0.75, 1};
  double z = 0;
  for (double w : want) z += std::exp(w);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(probs[i], std::exp(want[i]) / z, 1e-6) << i;

  std::mt19937_64 rng(fresh_seed("PresenceAndFrequencyPenaltiesCountTheOutputOnly"));
  for (int trial = 0; trial < 5; ++trial) {
    SamplingParams q = seeded(rng());
    q.presence_penalty = std::uniform_real_distribution<float>(-2, 2)(rng);
    q.frequency_penalty = std::uniform_real_distribution<float>(-2, 2)(rng);
    std::vector<int32_t> pr = random_ids(rng, 300, 100), out = random_ids(rng, 300, 200);
    RequestSampler r(q, 300, pr);
    expect_probs_match(r, random_logits(rng, 300), pr, out, {});
  }
}

std::vector<uint32_t> random_mask(std::mt19937_64& rng, int64_t vocab, double keep) {
  std::vector<uint32_t> mask(mask_words(vocab), 0);
  std::bernoulli_distribution b(keep);
  for (int64_t i = 0; i < vocab; ++i) mask_set(mask, static_cast<int32_t>(i), b(rng));
  return mask;
}

TEST(Sampling, EveryStepTogetherMatchesTheReference) {
  std::mt19937_64 rng(fresh_seed("EveryStepTogetherMatchesTheReference"));
  for (int trial = 0; trial < 30; ++trial) {
    const int64_t vocab = std::uniform_int_distribution<int64_t>(1, 3000)(rng);
    SamplingParams p = seeded(rng());
    std::uniform_real_distribution<float> u(0, 1);
    p.temperature = u(rng) < 0.15f ? 0.0f : 0.1f + 2 * u(rng);
    p.top_k = u(rng) < 0.5f ? 0 : std::uniform_int_distribution<int>(1, 200)(rng);
    p.top_p = u(rng) < 0.5f ? 1.0f : 0.05f + 0.95f * u(rng);
    p.min_p = u(rng) < 0.5f ? 0.0f : 0.2f * u(rng);
    p.repetition_penalty = u(rng) < 0.5f ? 1.0f : 0.5f + 1.5f * u(rng);
    p.presence_penalty = u(rng) < 0.5f ? 0.0f : 4 * u(rng) - 2;
    p.frequency_penalty = u(rng) < 0.5f ? 0.0f : 4 * u(rng) - 2;
    std::vector<int32_t> prompt = random_ids(rng, vocab, 50), output = random_ids(rng, vocab, 30);
    std::vector<uint32_t> mask = u(rng) < 0.5f ? std::vector<uint32_t>{} : random_mask(rng, vocab, 0.5);
    if (!mask.empty()) mask_set(mask, 0, true);  // never all masked
    RequestSampler s(p, vocab, prompt);
    SCOPED_TRACE("trial " + std::to_string(trial) + " vocab " + std::to_string(vocab));
    expect_probs_match(s, random_logits(rng, vocab), prompt, output, mask);
  }
}

TEST(Sampling, GreedyTakesTheLowestIdAmongTies) {
  SamplingParams p;
  p.temperature = 0;
  RequestSampler s(p, 6);
  EXPECT_EQ(s.sample(std::vector<float>{1, 3, 2, 3, 3, -1}, {}).id, 1);
  std::vector<uint32_t> mask(1, 0);
  mask_set(mask, 3, true);
  mask_set(mask, 5, true);
  EXPECT_EQ(s.sample(std::vector<float>{1, 3, 2, 3, 3, -1}, {}, mask).id, 3);
  EXPECT_EQ(s.sample(std::vector<float>{0, 0, 0, 0, 0, 0}, {}).id, 0);
}

TEST(Sampling, SampledTokenIsAlwaysAllowed) {
  std::mt19937_64 rng(fresh_seed("SampledTokenIsAlwaysAllowed"));
  for (int trial = 0; trial < 20; ++trial) {
    const int64_t vocab = std::uniform_int_distribution<int64_t>(1, 700)(rng);
    SamplingParams p = seeded(rng());
    p.temperature = trial % 4 == 0 ? 0.0f : 1.5f;
    p.top_k = trial % 3 == 0 ? 5 : 0;
    RequestSampler s(p, vocab);
    std::vector<uint32_t> mask = random_mask(rng, vocab, 0.02);
    mask_set(mask, static_cast<int32_t>(rng() % vocab), true);
    std::vector<float> logits = random_logits(rng, vocab, 10.0f);
    std::vector<int32_t> output = random_ids(rng, vocab, 100);
    for (int i = 0; i < 100; ++i) {
      int32_t id = s.sample(logits, std::span(output).first(i), mask).id;
      ASSERT_TRUE(mask_allows(mask, id)) << "token " << id;
    }
  }
}

TEST(Sampling, NothingAllowedIsAnError) {
  std::mt19937_64 rng(fresh_seed("NothingAllowedIsAnError"));
  std::vector<float> logits = random_logits(rng, 100);
  std::vector<uint32_t> none(mask_words(100), 0);
  for (float t : {0.0f, 1.0f}) {
    SamplingParams p = seeded(1);
    p.temperature = t;
    RequestSampler s(p, 100);
    try {
      s.sample(logits, {}, none);
      ADD_FAILURE() << "expected an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("no token is allowed"), std::string::npos) << e.what();
    }
    // The only allowed token has logit -inf: still nothing to sample.
    std::vector<uint32_t> one(mask_words(100), 0);
    mask_set(one, 42, true);
    std::vector<float> l2 = logits;
    l2[42] = kNegInf;
    EXPECT_THROW(s.sample(l2, {}, one), Error);
    // The sampler is still usable afterwards (its scratch was left clean).
    EXPECT_NO_THROW(s.sample(logits, {}));
  }
}

TEST(Sampling, NaNAndPlusInfinityLogitsAreErrors) {
  std::mt19937_64 rng(fresh_seed("NaNAndPlusInfinityLogitsAreErrors"));
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    for (float t : {0.0f, 0.8f}) {
      SamplingParams p = seeded(3);
      p.temperature = t;
      RequestSampler s(p, 64);
      std::vector<float> logits = random_logits(rng, 64);
      logits[37] = bad;
      try {
        s.sample(logits, {});
        ADD_FAILURE() << "expected an error";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("token id 37"), std::string::npos) << e.what();
      }
    }
  }
  // -inf alone is fine (a model may mask tokens itself).
  SamplingParams p = seeded(3);
  RequestSampler s(p, 4);
  EXPECT_EQ(s.sample(std::vector<float>{kNegInf, kNegInf, 0.0f, kNegInf}, {}).id, 2);
}

// Logits for step i of a generation: a fixed function of (stream, i).
std::vector<float> step_logits(uint64_t stream, size_t i, int64_t vocab) {
  std::mt19937_64 rng(stream * 1000003 + i);
  return random_logits(rng, vocab, 1.0f);
}

TEST(Sampling, SameSeedSameTokensWhateverElseRuns) {
  std::mt19937_64 rng(fresh_seed("SameSeedSameTokensWhateverElseRuns"));
  const int64_t vocab = 1000;
  const uint64_t stream = rng();
  SamplingParams p = seeded(rng());
  p.top_p = 0.95f;
  p.repetition_penalty = 1.1f;

  auto generate_alone = [&](const SamplingParams& params) {
    RequestSampler s(params, vocab);
    std::vector<int32_t> out;
    for (size_t i = 0; i < 60; ++i) out.push_back(s.sample(step_logits(stream, i, vocab), out).id);
    return out;
  };
  std::vector<int32_t> alone = generate_alone(p);

  // The same request interleaved with others (random params, random order of calls), plus a
  // re-sample of the last step after a simulated rollback.
  RequestSampler s(p, vocab);
  std::vector<RequestSampler> others;
  for (int k = 0; k < 4; ++k) {
    SamplingParams q = seeded(rng());
    q.top_k = static_cast<int>(rng() % 50);
    others.emplace_back(q, vocab);
  }
  std::vector<int32_t> out;
  std::vector<std::vector<int32_t>> other_out(others.size());
  while (out.size() < 60) {
    size_t who = rng() % (others.size() + 1);
    if (who == others.size()) {
      int32_t id = s.sample(step_logits(stream, out.size(), vocab), out).id;
      if (rng() % 4 == 0) {  // a rollback re-samples the same index
        EXPECT_EQ(s.sample(step_logits(stream, out.size(), vocab), out).id, id);
      }
      out.push_back(id);
    } else {
      auto& o = other_out[who];
      o.push_back(others[who].sample(random_logits(rng, vocab), o).id);
    }
  }
  EXPECT_EQ(out, alone);

  SamplingParams other_seed = p;
  other_seed.seed = *p.seed + 1;
  EXPECT_NE(generate_alone(other_seed), alone);
}

// Chi-square over draws on a small vocabulary. With df <= 7, P(chi2 > 80) < 1e-13 for a correct
// sampler, so the test does not flake; a sampler off by a few percent on one token exceeds it.
double chi_square(const std::vector<float>& probs, const std::vector<int64_t>& counts, int64_t n) {
  double chi = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] == 0) {
      EXPECT_EQ(counts[i], 0) << "filtered token " << i << " was drawn";
      continue;
    }
    double e = probs[i] * static_cast<double>(n);
    chi += (counts[i] - e) * (counts[i] - e) / e;
  }
  return chi;
}

TEST(Sampling, DrawsFollowTheProcessedDistribution) {
  std::mt19937_64 rng(fresh_seed("DrawsFollowTheProcessedDistribution"));
  const int64_t vocab = 8, n = 200000;
  std::vector<int32_t> history(n, 0);  // only its length matters without penalties
  for (int variant = 0; variant < 3; ++variant) {
    SamplingParams p = seeded(rng());
    p.temperature = 0.8f;
    if (variant == 1) p.top_k = 5;
    if (variant == 2) p.top_p = 0.8f;
    std::vector<float> logits = random_logits(rng, vocab, 1.0f);
    RequestSampler s(p, vocab);
    std::vector<float> probs(vocab);
    s.probabilities(logits, {}, {}, probs);
    // Along one request's token indices...
    std::vector<int64_t> counts(vocab, 0);
    for (int64_t i = 0; i < n; ++i) ++counts[s.sample(logits, std::span(history).first(i)).id];
    EXPECT_LT(chi_square(probs, counts, n), 80.0) << "variant " << variant;
    // ...and across seeds at one index.
    std::fill(counts.begin(), counts.end(), 0);
    for (int64_t i = 0; i < n; ++i) {
      SamplingParams q = p;
      q.seed = *p.seed + static_cast<uint64_t>(i);
      ++counts[RequestSampler(q, vocab).sample(logits, {}).id];
    }
    EXPECT_LT(chi_square(probs, counts, n), 80.0) << "variant " << variant << " across seeds";
  }
}

TEST(Sampling, LogprobsAreTheRawLogSoftmax) {
  std::mt19937_64 rng(fresh_seed("LogprobsAreTheRawLogSoftmax"));
  const int64_t vocab = 5000;
  std::vector<float> logits = random_logits(rng, vocab);
  logits[17] = logits[18] = 40;  // a tie at the top: the lower id first
  double mx = *std::max_element(logits.begin(), logits.end()), z = 0;
  for (float l : logits) z += std::exp(l - mx);
  auto log_softmax = [&](int32_t id) { return logits[id] - mx - std::log(z); };

  SamplingParams p = seeded(rng());
  p.temperature = 0.3f;  // processing must not change the reported logprobs
  p.repetition_penalty = 1.7f;
  p.logprobs = 5;
  std::vector<uint32_t> mask = random_mask(rng, vocab, 0.5);
  RequestSampler s(p, vocab, std::vector<int32_t>{17});
  SampledToken t = s.sample(logits, {}, mask);
  EXPECT_NEAR(t.logprob, log_softmax(t.id), 1e-4);
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  ASSERT_EQ(t.top.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(t.top[i].id, order[i]);
    EXPECT_NEAR(t.top[i].logprob, log_softmax(order[i]), 1e-4);
  }

  p.logprobs = 0;
  SampledToken only = RequestSampler(p, vocab).sample(logits, {});
  EXPECT_TRUE(only.top.empty());
  EXPECT_NEAR(only.logprob, log_softmax(only.id), 1e-4);
  p.logprobs = -1;
  EXPECT_TRUE(RequestSampler(p, vocab).sample(logits, {}).top.empty());
}

void expect_field_error(const SamplingParams& p, const std::string& field) {
  try {
    validate_sampling(p, 1000);
    ADD_FAILURE() << "expected an error naming " << field;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
  }
}

TEST(Sampling, ValidationNamesTheField) {
  EXPECT_NO_THROW(validate_sampling(SamplingParams{}, 1000));
  auto with = [](auto set) {
    SamplingParams p;
    set(p);
    return p;
  };
  expect_field_error(with([](SamplingParams& p) { p.temperature = -0.1f; }), "temperature");
  expect_field_error(with([](SamplingParams& p) { p.temperature = NAN; }), "temperature");
  expect_field_error(with([](SamplingParams& p) { p.top_k = -1; }), "top_k");
  expect_field_error(with([](SamplingParams& p) { p.top_p = 0; }), "top_p");
  expect_field_error(with([](SamplingParams& p) { p.top_p = 1.01f; }), "top_p");
  expect_field_error(with([](SamplingParams& p) { p.min_p = -0.5f; }), "min_p");
  expect_field_error(with([](SamplingParams& p) { p.repetition_penalty = 0; }), "repetition_penalty");
  expect_field_error(with([](SamplingParams& p) { p.presence_penalty = 2.5f; }), "presence_penalty");
  expect_field_error(with([](SamplingParams& p) { p.frequency_penalty = -3; }), "frequency_penalty");
  expect_field_error(with([](SamplingParams& p) { p.max_tokens = 0; }), "max_tokens");
  expect_field_error(with([](SamplingParams& p) { p.stop = {"ok", ""}; }), "stop[1]");
  expect_field_error(with([](SamplingParams& p) { p.stop = {"\xff"}; }), "stop[0]");
  expect_field_error(with([](SamplingParams& p) { p.stop_token_ids = {5, 1000}; }), "stop_token_ids[1]");
  expect_field_error(with([](SamplingParams& p) { p.logprobs = 21; }), "logprobs");
  expect_field_error(with([](SamplingParams& p) { p.logprobs = -2; }), "logprobs");
  // A sampled request needs the engine to assign a seed; greedy does not.
  try {
    RequestSampler s(SamplingParams{}, 10);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("seed"), std::string::npos) << e.what();
  }
  SamplingParams g;
  g.temperature = 0;
  EXPECT_NO_THROW(RequestSampler(g, 10));
  EXPECT_THROW(RequestSampler(seeded(1), 10, std::vector<int32_t>{3, 10}), Error);
}

TEST(CounterRng, UniformsAreInRangeAndIndependentOfCallOrder) {
  const uint64_t seed = fresh_seed("UniformsAreInRangeAndIndependentOfCallOrder");
  double sum = 0;
  std::set<uint64_t> seen;
  for (uint64_t i = 0; i < 100000; ++i) {
    double u = counter_uniform(seed, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    seen.insert(counter_bits(seed, i));
  }
  EXPECT_EQ(seen.size(), 100000u);  // a bijection of the counter for a fixed key: no repeats
  EXPECT_NEAR(sum / 100000, 0.5, 0.01);  // sd of the mean is 0.0009
  EXPECT_EQ(counter_uniform(seed, 12345), counter_uniform(seed, 12345));
  EXPECT_NE(counter_bits(seed, 7, 0), counter_bits(seed, 7, 1));
  EXPECT_NE(counter_bits(seed, 7), counter_bits(seed + 1, 7));
}

}  // namespace
}  // namespace di
