// When a request's generation ends, and which of its text may be streamed yet.
//
// Feed every generated token with the text the incremental detokenizer returned for it. The checker
// finishes the request on a stop token id (the end-of-sequence id included unless ignore_eos), on a
// stop string anywhere in the output text (also across token boundaries), or when max_tokens have
// been generated, checked in that order. Text that could still be the start of a stop string is held
// back; everything before it is released for streaming. The concatenation of all released text is
// the final output: cut before the first stop-string occurrence to complete (or after it with
// include_stop_str_in_output), without the stop token's text (unless include_stop_str_in_output).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sampling/sampling_params.h"

namespace di {

enum class FinishReason { kNone, kStop, kLength };

// "stop", "length", or "" while running (the OpenAI finish_reason strings).
const char* finish_reason_name(FinishReason r);

struct StopStep {
  std::string text;  // newly released text, safe to stream (complete UTF-8; may be empty)
  FinishReason finish = FinishReason::kNone;
};

class StopChecker {
 public:
  // params: validated. eos_id: the end-of-sequence id, -1 for none. max_tokens: the generation cap the
  // engine resolved (params.max_tokens capped by the context left), >= 1.
  StopChecker(const SamplingParams& params, int32_t eos_id, int64_t max_tokens);

  // One generated token and the detokenizer's text for it. Must not be called once finished.
  StopStep push(int32_t id, std::string_view piece);

  // After finishing by a stop id or length: the detokenizer's flush() (an incomplete UTF-8 tail
  // becomes U+FFFD). Returns the text to stream (it is not searched for stop strings). After a stop
  // string the text past the match is dropped, so this returns "".
  std::string flush_tail(std::string_view tail);

  bool finished() const { return finish_ != FinishReason::kNone; }
  FinishReason finish_reason() const { return finish_; }
  const std::string& stop_string() const { return stop_string_; }  // the matched stop string, if any
  int32_t stop_token() const { return stop_token_; }                // the matched stop id, else -1
  int64_t n_tokens() const { return n_tokens_; }
  // The output text so far (released + held back); once finished, the final output text.
  const std::string& text() const { return text_; }
  size_t held_back() const { return text_.size() - released_; }

 private:
  StopStep release_all();

  std::vector<std::string> stop_strings_;
  std::vector<int32_t> stop_ids_;
  int64_t max_tokens_;
  bool include_stop_;

  std::string text_;
  size_t released_ = 0;  // text_[0, released_) has been streamed
  int64_t n_tokens_ = 0;
  FinishReason finish_ = FinishReason::kNone;
  std::string stop_string_;
  int32_t stop_token_ = -1;
};

}  // namespace di
