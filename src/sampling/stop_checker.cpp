#include "sampling/stop_checker.h"

#include <algorithm>

#include "core/error.h"

namespace di {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kNone: break;
  }
  return "";
}

StopChecker::StopChecker(const SamplingParams& params, int32_t eos_id, int64_t max_tokens)
    : stop_strings_(params.stop),
      stop_ids_(params.stop_token_ids),
      max_tokens_(max_tokens),
      include_stop_(params.include_stop_str_in_output) {
  DI_CHECK_MSG(max_tokens >= 1, "max_tokens must be resolved to >= 1 by the engine");
  if (eos_id >= 0 && !params.ignore_eos) stop_ids_.push_back(eos_id);
  for (const std::string& s : stop_strings_) DI_CHECK_MSG(!s.empty(), "stop strings must be validated (non-empty)");
}

StopStep StopChecker::release_all() {
  StopStep step;
  step.text = text_.substr(released_);
  released_ = text_.size();
  step.finish = finish_;
  return step;
}

StopStep StopChecker::push(int32_t id, std::string_view piece) {
  DI_CHECK_MSG(!finished(), "StopChecker::push after the request finished");
  ++n_tokens_;
  if (std::find(stop_ids_.begin(), stop_ids_.end(), id) != stop_ids_.end()) {
    if (include_stop_) text_ += piece;
    finish_ = FinishReason::kStop;
    stop_token_ = id;
    return release_all();
  }

  const size_t old_size = text_.size();
  text_ += piece;
  // The output ends at the first stop-string occurrence to complete: the smallest end position, then
  // the earliest start (the longer string). That depends on the text only, not on how it was split
  // into tokens. A new occurrence ends inside the new piece, and cannot start before released_:
  // released text was never a possible stop-string start (see the hold-back below).
  if (!piece.empty()) {
    size_t best = std::string::npos, best_end = std::string::npos;
    const std::string* best_stop = nullptr;
    for (const std::string& s : stop_strings_) {
      size_t from = std::max(released_, old_size + 1 > s.size() ? old_size + 1 - s.size() : size_t{0});
      size_t at = text_.find(s, from);
      if (at == std::string::npos) continue;
      size_t end = at + s.size();
      if (end < best_end || (end == best_end && at < best)) {
        best = at;
        best_end = end;
        best_stop = &s;
      }
    }
    if (best_stop) {
      text_.resize(best + (include_stop_ ? best_stop->size() : 0));
      finish_ = FinishReason::kStop;
      stop_string_ = *best_stop;
      return release_all();
    }
  }

  if (n_tokens_ >= max_tokens_) {
    finish_ = FinishReason::kLength;
    return release_all();
  }

  // Hold back the longest unreleased suffix that is a proper prefix of some stop string. Stop
  // strings are valid UTF-8, so such a suffix starts on a character boundary.
  size_t hold = 0;
  const size_t open = text_.size() - released_;
  for (const std::string& s : stop_strings_) {
    for (size_t k = std::min(s.size() - 1, open); k > hold; --k) {
      if (std::string_view(text_).substr(text_.size() - k) == std::string_view(s).substr(0, k)) {
        hold = k;
        break;
      }
    }
  }
  StopStep step;
  step.text = text_.substr(released_, open - hold);
  released_ = text_.size() - hold;
  return step;
}

std::string StopChecker::flush_tail(std::string_view tail) {
  DI_CHECK_MSG(finished(), "StopChecker::flush_tail before the request finished");
  if (!stop_string_.empty()) return "";
  text_ += tail;
  released_ = text_.size();
  return std::string(tail);
}

}  // namespace di
