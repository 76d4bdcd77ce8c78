#include "cli/progress.h"

#include <unistd.h>

#include <cstdio>

namespace di::cli {

Progress::Progress(const Engine& engine, int64_t total)
    : engine_(engine),
      total_(total),
      tokens_at_start_(engine.stats().generated_tokens),
      tty_(isatty(STDERR_FILENO) != 0),
      start_(std::chrono::steady_clock::now()),
      thread_([this] { run(); }) {}

Progress::~Progress() { stop(); }

void Progress::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
  draw(true);
}

void Progress::run() {
  const auto period = tty_ ? std::chrono::duration_cast<std::chrono::milliseconds>(kTtyPeriod)
                           : std::chrono::duration_cast<std::chrono::milliseconds>(kPlainPeriod);
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, period, [this] { return stopping_; })) draw(false);
}

void Progress::draw(bool last) {
  if (!tty_ && last) return;  // the summary line follows
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const int64_t tokens = engine_.stats().generated_tokens - tokens_at_start_;
  const int64_t done = done_.load(std::memory_order_relaxed);
  constexpr int kWidth = 30;
  const int filled = total_ > 0 ? static_cast<int>(kWidth * done / total_) : kWidth;
  char bar[kWidth + 1];
  for (int i = 0; i < kWidth; ++i) bar[i] = i < filled ? '#' : '.';
  bar[kWidth] = '\0';
  std::fprintf(stderr, "%s[%s] %lld/%lld requests, %lld tokens, %.1f tok/s, %.1f s%s", tty_ ? "\r" : "", bar,
               static_cast<long long>(done), static_cast<long long>(total_), static_cast<long long>(tokens),
               seconds > 0 ? tokens / seconds : 0.0, seconds, tty_ ? (last ? "\033[K\n" : "\033[K") : "\n");
  std::fflush(stderr);
}

}  // namespace di::cli
