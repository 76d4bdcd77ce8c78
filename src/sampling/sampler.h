// Token sampling for one request, on the host, over one fp32 logits row.
//
// Processing order: logit mask -> repetition penalty -> presence/frequency penalties ->
// temperature -> top-k -> top-p -> min-p -> draw. Temperature 0 is greedy: the argmax of the masked,
// penalised logits, lowest id among ties (top-k/top-p/min-p do not matter then).
//
// Determinism: the draw for output token i uses counter_uniform(seed, i) (counter_rng.h) and
// inverse-CDF sampling over the kept tokens in id order, so the token is a function of
// (params, seed, i, logits, token history, mask) only: the same request with the same seed gives
// the same tokens whatever else runs, provided its logits are the same (batch invariance is the
// forward pass's business). i is output.size(), so re-sampling after a rollback repeats the draw.
//
// Logprobs are those of the raw model distribution, log_softmax(logits), before the mask,
// penalties and temperature (vLLM's default logprobs mode); the top list may
// therefore name tokens the mask forbids.
//
// NaN or +inf logits are a di::Error (never sampled around), as is a row in which no token is
// allowed (everything masked or -inf).
//
// Cost: O(vocab) per call; top-k is a heap or nth_element selection and top-p a weighted selection
// over integer rank keys, so nothing sorts the vocabulary. Scratch lives per thread (sized to the
// vocabulary once), so calls allocate nothing but the top-logprob list, and a sampler may be used
// from any thread.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "sampling/sampling_params.h"

namespace di {

// Allowed-token bitmask: token id is allowed when bit (id % 32) of word id / 32 is set. The layout
// structured-output libraries produce (a packed 32-bit bitmask), so a grammar's mask plugs in as is.
inline int64_t mask_words(int64_t vocab_size) { return (vocab_size + 31) / 32; }
inline bool mask_allows(std::span<const uint32_t> mask, int32_t id) { return (mask[id >> 5] >> (id & 31)) & 1u; }
inline void mask_set(std::span<uint32_t> mask, int32_t id, bool allowed) {
  if (allowed) mask[id >> 5] |= 1u << (id & 31);
  else mask[id >> 5] &= ~(1u << (id & 31));
}

// One entry of a top-logprobs list (the public API's TokenLogprob has the same two fields).
struct TopLogprob {
  int32_t id;
  float logprob;
};

struct SampledToken {
  int32_t id = -1;
  float logprob = 0;              // log_softmax(raw logits)[id]; filled when params.logprobs >= 0
  std::vector<TopLogprob> top;  // the params.logprobs most likely raw tokens, most likely first, ties by lower id
};

class RequestSampler {
 public:
  // Validates params (di::Error naming the field). A seed is required unless temperature is 0: the
  // engine assigns one to requests that did not ask for one. The prompt (ids in [0, vocab)) feeds
  // the repetition penalty; its distinct tokens are collected once here.
  RequestSampler(const SamplingParams& params, int64_t vocab_size, std::span<const int32_t> prompt = {});

  // Samples output token number output.size(). logits: [vocab] f32 raw model output. output: the
  // tokens generated so far. allowed: empty (no mask) or mask_words(vocab) words.
  SampledToken sample(std::span<const float> logits, std::span<const int32_t> output,
                      std::span<const uint32_t> allowed = {}) const;

  // The distribution sample() draws from, into probs [vocab] (0 for tokens filtered out; one-hot
  // when greedy). For tests and for speculative-decoding verification.
  void probabilities(std::span<const float> logits, std::span<const int32_t> output,
                     std::span<const uint32_t> allowed, std::span<float> probs) const;

  const SamplingParams& params() const { return p_; }
  uint64_t seed() const { return seed_; }
  int64_t vocab_size() const { return vocab_; }

 private:
  struct Workspace;
  static Workspace& thread_workspace(int64_t vocab);  // per-thread scratch, sized to vocab
  // Fills the workspace's kept candidates (in draw order) and their weights; returns their total.
  double prepare(Workspace& ws, std::span<const float> logits, std::span<const int32_t> output,
                 std::span<const uint32_t> allowed) const;

  SamplingParams p_;
  uint64_t seed_ = 0;
  int64_t vocab_ = 0;
  std::vector<int32_t> prompt_distinct_;  // distinct prompt ids, only when repetition_penalty != 1
};

}  // namespace di
