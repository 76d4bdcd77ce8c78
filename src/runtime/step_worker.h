// A thread that runs the engine's step jobs in order (async scheduling: step N + 1 is queued while
// step N runs, so the worker goes from one forward to the next without waiting for the engine
// thread, which meanwhile post-processes the steps before).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace di {

class StepWorker {
 public:
  StepWorker();
  ~StepWorker();  // runs what is queued, then joins
  StepWorker(const StepWorker&) = delete;
  StepWorker& operator=(const StepWorker&) = delete;

  // A job gets `started`, to call once it is under way: when the worker finds the next job already
  // queued, it reports the previous one done only then, so the waiting engine thread does not take
  // the CPU between the two (the measured host gap) on a machine with few cores.
  using Job = std::function<void(const std::function<void()>& started)>;
  // Queues a job; returns its ticket (1, 2, ...). Jobs run one at a time in ticket order.
  uint64_t enqueue(Job job);
  // Until the job with this ticket has returned.
  void wait(uint64_t ticket);

 private:
  void loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  uint64_t queued_ = 0, done_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace di
