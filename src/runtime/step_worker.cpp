#include "runtime/step_worker.h"

#include "core/error.h"

namespace di {

StepWorker::StepWorker() : thread_([this] { loop(); }) {}

StepWorker::~StepWorker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void StepWorker::launch(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    DI_CHECK(!has_job_ && !running_);
    job_ = std::move(job);
    has_job_ = true;
  }
  cv_.notify_all();
}

void StepWorker::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !has_job_ && !running_; });
}

bool StepWorker::busy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return has_job_ || running_;
}

void StepWorker::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || has_job_; });
    if (stop_) return;
    std::function<void()> job = std::move(job_);
    has_job_ = false;
    running_ = true;
    lock.unlock();
    job();  // the job catches its own errors (run_step reports them in StepOutput)
    lock.lock();
    running_ = false;
    cv_.notify_all();
  }
}

}  // namespace di
