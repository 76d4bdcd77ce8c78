#include "runtime/step_worker.h"

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

uint64_t StepWorker::enqueue(Job job) {
  uint64_t ticket;
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(job));
    ticket = ++queued_;
  }
  cv_.notify_all();
  return ticket;
}

void StepWorker::wait(uint64_t ticket) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_ >= ticket; });
}

void StepWorker::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  bool owe_notify = false;  // the previous job's completion is reported once this one has started
  auto notify = [&] {
    if (owe_notify) cv_.notify_all();
    owe_notify = false;
  };
  for (;;) {
    if (jobs_.empty()) {
      notify();
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping, nothing left
    }
    Job job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    job(notify);  // jobs catch their own errors (run_step reports them in StepOutput)
    notify();     // in case the job never called it
    lock.lock();
    ++done_;
    owe_notify = true;
  }
}

}  // namespace di
