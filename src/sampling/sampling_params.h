// What one request asks of the sampler and the stop checker. Defaults sample the model's own
// distribution (temperature 1, every filter off) until a stop or the context limit.
// The semantics follow the OpenAI API where it defines them (presence/frequency penalties, stop,
// logprobs) and the HF/vLLM convention otherwise (repetition_penalty, top_k, min_p).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace di {

// The most top logprobs a request may ask for (OpenAI's top_logprobs limit).
inline constexpr int32_t kMaxLogprobs = 20;

struct SamplingParams {
  float temperature = 1.0f;         // >= 0, finite; 0 = greedy (argmax, lowest id among ties)
  int32_t top_k = 0;                // >= 0; keep the k most likely tokens; 0 = off
  float top_p = 1.0f;               // (0, 1]; keep the smallest most-likely set with mass >= top_p
  float min_p = 0.0f;               // [0, 1]; drop tokens with p < min_p * p(most likely)
  float repetition_penalty = 1.0f;  // > 0, finite; tokens seen in prompt or output: logit / r if > 0, * r if < 0
  float presence_penalty = 0.0f;    // [-2, 2]; minus this once for every token present in the output
  float frequency_penalty = 0.0f;   // [-2, 2]; minus this times the token's count in the output
  std::optional<int32_t> max_tokens;  // >= 1; absent: until the context is full
  std::vector<std::string> stop;      // non-empty, valid UTF-8; the output ends before the first match
  std::vector<int32_t> stop_token_ids;  // ids in [0, vocab); the end-of-sequence id is added unless ignore_eos
  bool ignore_eos = false;
  bool include_stop_str_in_output = false;  // keep the matched stop string / stop token's text
  int32_t logprobs = -1;  // -1: none; 0: the sampled token's logprob; N <= kMaxLogprobs: also the top N
  std::optional<uint64_t> seed;  // absent: the engine assigns one; sampling is a function of (seed, logits)
};

// Throws di::Error naming the field, its value and the allowed range. vocab_size bounds stop_token_ids.
void validate_sampling(const SamplingParams& p, int64_t vocab_size);

}  // namespace di
