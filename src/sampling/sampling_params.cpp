#include "sampling/sampling_params.h"

#include <cmath>
#include <cstdio>
#include <string>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace di {

namespace {

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

[[noreturn]] void fail(const std::string& field, const std::string& value, const std::string& expected) {
  throw Error("sampling parameter " + field + ": expected " + expected + ", got " + value);
}

}  // namespace

void validate_sampling(const SamplingParams& p, int64_t vocab_size) {
  if (!(std::isfinite(p.temperature) && p.temperature >= 0)) fail("temperature", num(p.temperature), "a finite number >= 0");
  if (p.top_k < 0) fail("top_k", std::to_string(p.top_k), "an integer >= 0 (0 = off)");
  if (!(p.top_p > 0 && p.top_p <= 1)) fail("top_p", num(p.top_p), "a number in (0, 1]");
  if (!(p.min_p >= 0 && p.min_p <= 1)) fail("min_p", num(p.min_p), "a number in [0, 1]");
  if (!(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0))
    fail("repetition_penalty", num(p.repetition_penalty), "a finite number > 0 (1 = off)");
  if (!(p.presence_penalty >= -2 && p.presence_penalty <= 2))
    fail("presence_penalty", num(p.presence_penalty), "a number in [-2, 2]");
  if (!(p.frequency_penalty >= -2 && p.frequency_penalty <= 2))
    fail("frequency_penalty", num(p.frequency_penalty), "a number in [-2, 2]");
  if (p.max_tokens && *p.max_tokens < 1) fail("max_tokens", std::to_string(*p.max_tokens), "an integer >= 1");
  for (size_t i = 0; i < p.stop.size(); ++i) {
    if (p.stop[i].empty()) fail("stop[" + std::to_string(i) + "]", "\"\"", "a non-empty string");
    if (utf8::first_invalid(p.stop[i]) != utf8::kValid)
      fail("stop[" + std::to_string(i) + "]", "a string with invalid bytes", "valid UTF-8");
  }
  for (size_t i = 0; i < p.stop_token_ids.size(); ++i)
    if (p.stop_token_ids[i] < 0 || p.stop_token_ids[i] >= vocab_size)
      fail("stop_token_ids[" + std::to_string(i) + "]", std::to_string(p.stop_token_ids[i]),
           "a token id in [0, " + std::to_string(vocab_size) + ")");
  if (p.logprobs < -1 || p.logprobs > kMaxLogprobs)
    fail("logprobs", std::to_string(p.logprobs),
         "an integer in [-1, " + std::to_string(kMaxLogprobs) + "] (-1 = none, 0 = the sampled token only)");
}

}  // namespace di
