#include "sampling/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <string>

#include "core/error.h"
#include "sampling/counter_rng.h"

namespace di {

// Scratch reused by every sampler on a thread: sized to the vocabulary once, so a call allocates
// nothing (the top-logprob list aside). count and seen are all zero between calls.
struct RequestSampler::Workspace {
  std::vector<float> logit;    // [vocab] processed logits
  std::vector<float> weight;   // [vocab] unnormalised probability, valid for candidates
  std::vector<int32_t> cand;   // kept token ids, in draw order (id order)
  std::vector<uint64_t> keys;  // rank keys of candidates, for top-k / top-p
  std::vector<int32_t> count;  // [vocab] output occurrences (frequency/presence penalties)
  std::vector<uint8_t> seen;   // [vocab] marks (repetition penalty, prompt dedup)

  void size_to(int64_t vocab) {
    if (static_cast<int64_t>(logit.size()) == vocab) return;
    logit.assign(vocab, 0);
    weight.assign(vocab, 0);
    cand.reserve(vocab);
    keys.reserve(vocab);
    count.assign(vocab, 0);
    seen.assign(vocab, 0);
  }
};

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Throws for NaN or +inf: a broken forward pass must not turn into plausible-looking tokens.
void check_logits(std::span<const float> logits) {
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isnan(logits[i]) || logits[i] == std::numeric_limits<float>::infinity())
      throw Error("logits: " + std::string(std::isnan(logits[i]) ? "NaN" : "+inf") + " at token id " +
                  std::to_string(i) + " (expected finite values or -inf)");
  }
}

[[noreturn]] void throw_nothing_allowed() {
  throw Error("sampling: no token is allowed (every token is masked out or has logit -inf)");
}

// A 64-bit key per token whose ascending order is "most likely first, lower id first among equal
// logits": the logit mapped to an order-preserving unsigned integer, inverted, above the id. Top-k
// and top-p select and sort plain integers (no indirect comparator), and the order is total.
uint64_t rank_key(float logit, int32_t id) {
  if (logit == 0) logit = 0.0f;  // -0 and +0 are the same logit
  const uint32_t bits = std::bit_cast<uint32_t>(logit);
  const uint32_t ascending = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  return (static_cast<uint64_t>(~ascending) << 32) | static_cast<uint32_t>(id);
}

int32_t key_id(uint64_t key) { return static_cast<int32_t>(key & 0xFFFFFFFFu); }

// Top-p cutoff: the key of the last token of the shortest most-likely prefix whose weight reaches
// `target`. A weighted selection (halve the range with nth_element, keep the half that holds the
// cutoff) costs O(n) expected, so even a flat distribution is never fully sorted. Reorders keys.
uint64_t nucleus_cutoff(std::vector<uint64_t>& keys, const float* weight, double target) {
  size_t lo = 0, hi = keys.size();  // the cutoff is in [lo, hi); keys[0, lo) all precede it
  double need = target;              // weight still needed from [lo, hi)
  size_t first_probe = 256;          // model distributions are usually peaked: try a short prefix first
  while (hi - lo > 32) {
    const size_t mid = lo + std::min((hi - lo) / 2, first_probe);
    first_probe = keys.size();
    std::nth_element(keys.begin() + lo, keys.begin() + mid, keys.begin() + hi);
    double mass = 0;
    for (size_t i = lo; i < mid; ++i) mass += weight[key_id(keys[i])];
    if (mass >= need) {
      hi = mid;
    } else {
      need -= mass;
      lo = mid;
    }
  }
  std::sort(keys.begin() + lo, keys.begin() + hi);
  double mass = 0;
  for (size_t i = lo; i < hi; ++i) {
    mass += weight[key_id(keys[i])];
    if (mass >= need) return keys[i];
  }
  return keys[hi - 1];  // rounding left `need` unmet: keep the whole range
}

}  // namespace

RequestSampler::Workspace& RequestSampler::thread_workspace(int64_t vocab) {
  thread_local Workspace ws;
  ws.size_to(vocab);
  return ws;
}

RequestSampler::RequestSampler(const SamplingParams& params, int64_t vocab_size, std::span<const int32_t> prompt)
    : p_(params), vocab_(vocab_size) {
  DI_CHECK(vocab_size > 0);
  validate_sampling(p_, vocab_size);
  if (p_.temperature > 0 && !p_.seed)
    throw Error("sampling parameter seed: the engine must assign a seed before sampling at temperature > 0");
  seed_ = p_.seed.value_or(0);
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= vocab_size)
      throw Error("prompt token " + std::to_string(i) + ": id " + std::to_string(prompt[i]) + " is outside [0, " +
                  std::to_string(vocab_size) + ")");
  if (p_.repetition_penalty != 1.0f) {
    Workspace& ws = thread_workspace(vocab_);
    for (int32_t id : prompt)
      if (!ws.seen[id]) {
        ws.seen[id] = 1;
        prompt_distinct_.push_back(id);
      }
    for (int32_t id : prompt_distinct_) ws.seen[id] = 0;
  }
}

double RequestSampler::prepare(Workspace& ws, std::span<const float> logits, std::span<const int32_t> output,
                               std::span<const uint32_t> allowed) const {
  DI_CHECK_MSG(static_cast<int64_t>(logits.size()) == vocab_, "logits row is not [vocab]");
  DI_CHECK_MSG(allowed.empty() || static_cast<int64_t>(allowed.size()) == mask_words(vocab_),
               "logit mask is not mask_words(vocab) words");
  check_logits(logits);
  float* logit = ws.logit.data();
  std::copy(logits.begin(), logits.end(), logit);

  // Mask: whole words at a time; bits past the vocabulary are ignored.
  if (!allowed.empty()) {
    for (int64_t w = 0; w < mask_words(vocab_); ++w) {
      if (allowed[w] == ~0u) continue;
      int64_t end = std::min<int64_t>(vocab_, (w + 1) * 32);
      for (int64_t id = w * 32; id < end; ++id)
        if (!((allowed[w] >> (id & 31)) & 1u)) logit[id] = kNegInf;
    }
  }

  // Repetition penalty over the distinct tokens of prompt + output (HF/vLLM): shrink toward 0.
  // Output ids are checked here, where they are read (a sampler without penalties reads only the count).
  const float rep = p_.repetition_penalty;
  const bool counts = p_.presence_penalty != 0 || p_.frequency_penalty != 0;
  if (rep != 1.0f || counts)
    for (int32_t id : output) DI_CHECK_MSG(id >= 0 && id < vocab_, "output token id outside the vocabulary");
  if (rep != 1.0f) {
    auto penalise = [&](int32_t id) {
      if (ws.seen[id]) return;
      ws.seen[id] = 1;
      logit[id] = logit[id] > 0 ? logit[id] / rep : logit[id] * rep;
    };
    for (int32_t id : prompt_distinct_) penalise(id);
    for (int32_t id : output) penalise(id);
    for (int32_t id : prompt_distinct_) ws.seen[id] = 0;
    for (int32_t id : output) ws.seen[id] = 0;
  }

  // Presence / frequency penalties over the output (OpenAI): once per distinct token.
  if (counts) {
    for (int32_t id : output) ++ws.count[id];
    for (int32_t id : output) {
      if (ws.count[id] == 0) continue;
      logit[id] -= p_.frequency_penalty * static_cast<float>(ws.count[id]) + p_.presence_penalty;
      ws.count[id] = 0;
    }
  }

  std::vector<int32_t>& cand = ws.cand;
  cand.clear();
  if (p_.temperature == 0) {
    int64_t best = 0;
    for (int64_t id = 1; id < vocab_; ++id)
      if (logit[id] > logit[best]) best = id;
    if (logit[best] == kNegInf) throw_nothing_allowed();
    cand.push_back(static_cast<int32_t>(best));
    ws.weight[best] = 1;
    return 1.0;
  }

  // Candidates: the tokens not masked out, in id order, which is also the draw order.
  float max_logit = kNegInf;
  for (int64_t id = 0; id < vocab_; ++id) {
    if (logit[id] == kNegInf) continue;
    cand.push_back(static_cast<int32_t>(id));
    max_logit = std::max(max_logit, logit[id]);
  }
  if (cand.empty()) throw_nothing_allowed();

  const int64_t n = static_cast<int64_t>(cand.size());
  const bool top_k = p_.top_k > 0 && p_.top_k < n;
  const bool top_p = p_.top_p < 1.0f;
  std::vector<uint64_t>& keys = ws.keys;  // top-k / top-p: the rank keys still in the running
  keys.clear();
  uint64_t cutoff = ~uint64_t{0};          // tokens ranked after this key are filtered out
  if (top_k && p_.top_k <= 1024) {
    // One pass keeping the k best keys in a max-heap (its front is the worst kept).
    const size_t k = static_cast<size_t>(p_.top_k);
    for (int32_t id : cand) {
      const uint64_t key = rank_key(logit[id], id);
      if (keys.size() < k) {
        keys.push_back(key);
        std::push_heap(keys.begin(), keys.end());
      } else if (key < keys.front()) {
        std::pop_heap(keys.begin(), keys.end());
        keys.back() = key;
        std::push_heap(keys.begin(), keys.end());
      }
    }
    cutoff = keys.front();
  } else if (top_k || top_p) {
    for (int32_t id : cand) keys.push_back(rank_key(logit[id], id));
    if (top_k) {
      std::nth_element(keys.begin(), keys.begin() + (p_.top_k - 1), keys.end());
      keys.resize(p_.top_k);
      cutoff = keys.back();
    }
  }

  // Temperature: weight = exp((l - max) / T). l - max <= 0, so tiny temperatures underflow to 0
  // instead of overflowing; the most likely token has weight exactly 1.
  const float inv_t = 1.0f / p_.temperature;
  float* weight = ws.weight.data();
  double total = 0;
  auto set_weight = [&](int32_t id) { total += (weight[id] = std::exp((logit[id] - max_logit) * inv_t)); };
  if (top_k) {
    for (uint64_t key : keys) set_weight(key_id(key));
  } else {
    for (int32_t id : cand) set_weight(id);
  }

  if (top_p) cutoff = nucleus_cutoff(keys, weight, static_cast<double>(p_.top_p) * total);
  if (top_k) {  // at most k survivors: take them from the keys, back in id order
    cand.clear();
    for (uint64_t key : keys)
      if (key <= cutoff) cand.push_back(key_id(key));
    std::sort(cand.begin(), cand.end());
  } else if (top_p) {
    std::erase_if(cand, [&](int32_t id) { return rank_key(logit[id], id) > cutoff; });
  }

  // Min-p: relative to the most likely token, whose weight is 1 (it survives top-k and top-p).
  if (p_.min_p > 0) {
    const float min_w = p_.min_p;
    std::erase_if(cand, [&](int32_t id) { return weight[id] < min_w; });
  }

  total = 0;
  for (int32_t id : cand) total += weight[id];
  DI_CHECK(total > 0);
  return total;
}

SampledToken RequestSampler::sample(std::span<const float> logits, std::span<const int32_t> output,
                                    std::span<const uint32_t> allowed) const {
  Workspace& ws = thread_workspace(vocab_);
  const double total = prepare(ws, logits, output, allowed);
  SampledToken out;
  if (ws.cand.size() == 1) {
    out.id = ws.cand[0];
  } else {
    // Inverse CDF in draw order. acc reaches exactly `total` (same sums, same order) and target <
    // total, so the walk always ends on a token of positive weight.
    const double target = counter_uniform(seed_, output.size()) * total;
    double acc = 0;
    out.id = ws.cand.back();
    for (int32_t id : ws.cand) {
      acc += ws.weight[id];
      if (acc > target) {
        out.id = id;
        break;
      }
    }
  }

  if (p_.logprobs >= 0) {
    float max_raw = *std::max_element(logits.begin(), logits.end());
    double sum = 0;
    for (float l : logits) sum += std::exp(l - max_raw);
    const double lse = max_raw + std::log(sum);
    out.logprob = static_cast<float>(logits[out.id] - lse);
    // Top N by insertion into a short sorted list: one pass, no vocab-sized sort.
    const size_t n_top = static_cast<size_t>(p_.logprobs);
    out.top.reserve(n_top + 1);
    for (int64_t id = 0; id < vocab_ && n_top > 0; ++id) {
      float l = logits[id];
      if (out.top.size() == n_top && l <= out.top.back().logprob) continue;
      auto at = std::find_if(out.top.begin(), out.top.end(), [l](const TopLogprob& t) { return l > t.logprob; });
      out.top.insert(at, TopLogprob{static_cast<int32_t>(id), l});
      if (out.top.size() > n_top) out.top.pop_back();
    }
    for (TopLogprob& t : out.top) t.logprob = static_cast<float>(t.logprob - lse);
  }
  return out;
}

void RequestSampler::probabilities(std::span<const float> logits, std::span<const int32_t> output,
                                   std::span<const uint32_t> allowed, std::span<float> probs) const {
  DI_CHECK_MSG(static_cast<int64_t>(probs.size()) == vocab_, "probs is not [vocab]");
  Workspace& ws = thread_workspace(vocab_);
  const double total = prepare(ws, logits, output, allowed);
  std::fill(probs.begin(), probs.end(), 0.0f);
  for (int32_t id : ws.cand) probs[id] = static_cast<float>(ws.weight[id] / total);
}

}  // namespace di
