// A progress line on stderr while a batch runs: requests done / total, and generated tokens per
// second from the engine's stats. Redrawn in place on a terminal; on a pipe or file, one plain line
// every kPlainPeriod so logs stay short.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

#include "deepinfer/engine.h"

namespace di::cli {

class Progress {
 public:
  Progress(const Engine& engine, int64_t total);
  ~Progress();  // stop()

  void finished_one() { done_.fetch_add(1, std::memory_order_relaxed); }
  // Draws the final state and ends the line; later calls do nothing.
  void stop();

 private:
  static constexpr std::chrono::milliseconds kTtyPeriod{200};
  static constexpr std::chrono::seconds kPlainPeriod{10};

  void run();
  void draw(bool last);

  const Engine& engine_;
  const int64_t total_;
  const int64_t tokens_at_start_;
  const bool tty_;
  const std::chrono::steady_clock::time_point start_;
  std::atomic<int64_t> done_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace di::cli
