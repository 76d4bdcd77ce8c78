#include "runtime/request_channel.h"

namespace di {

void RequestChannel::push(TokenEvent event) {
  if (!stream_) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(event));
  }
  cv_.notify_all();
}

void RequestChannel::finish(RequestResult result, TokenEvent last) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    last.id = id_;
    last.finished = true;
    last.finish_reason = result.finish_reason;
    last.error = result.error;
    if (!stream_) {
      last.token_ids = result.token_ids;
      last.text = result.text;
      last.logprobs = result.logprobs;
      last.top_logprobs = result.top_logprobs;
    }
    events_.push_back(std::move(last));
    result_ = std::move(result);
    result_.id = id_;
    done_ = true;
  }
  cv_.notify_all();
}

std::optional<TokenEvent> RequestChannel::next_event(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return std::nullopt;
  TokenEvent e = std::move(events_.front());
  events_.pop_front();
  return e;
}

RequestResult RequestChannel::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_; });
  return result_;
}

bool RequestChannel::finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

}  // namespace di
