// What one request hands back to the threads outside the engine: streamed events and the final
// result. The engine thread pushes; any thread waits. Thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>

#include "deepinfer/engine.h"

namespace di {

class RequestChannel {
 public:
  explicit RequestChannel(RequestId id, bool stream) : id_(id), stream_(stream) {}

  // Engine thread: new tokens / text (streamed requests only; ignored otherwise).
  void push(TokenEvent event);
  // Engine thread: the request is over. A streamed request gets `last` as its final event (finished
  // = true); a request that is not streamed gets one event, the whole result.
  void finish(RequestResult result, TokenEvent last);

  std::optional<TokenEvent> next_event(std::chrono::milliseconds timeout);
  RequestResult wait();
  bool finished() const;

 private:
  RequestId id_;
  bool stream_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<TokenEvent> events_;
  bool done_ = false;
  RequestResult result_;
};

}  // namespace di
