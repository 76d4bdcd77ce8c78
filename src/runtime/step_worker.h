// A thread that runs one job at a time for the engine thread (async scheduling: the forward of step
// N runs here while the engine thread post-processes step N - 1). launch() then wait(); one job in
// flight at most.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace di {

class StepWorker {
 public:
  StepWorker();
  ~StepWorker();
  StepWorker(const StepWorker&) = delete;
  StepWorker& operator=(const StepWorker&) = delete;

  void launch(std::function<void()> job);  // DI_CHECKs that no job is in flight
  void wait();                             // until the launched job has returned
  bool busy() const;

 private:
  void loop();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> job_;
  bool has_job_ = false, running_ = false, stop_ = false;
  std::thread thread_;
};

}  // namespace di
