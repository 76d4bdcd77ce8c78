#include "core/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace di {
namespace {

thread_local bool tls_in_worker = false;

// One parallel region. Workers hold it through a shared_ptr, so a worker that wakes late or is still
// finishing the previous region only ever touches that region's own counters: a new region can never
// be counted (or run) by a stale worker.
struct Job {
  const std::function<void(int64_t)>* task = nullptr;
  int64_t n_tasks = 0;
  std::atomic<int64_t> next{0}, done{0};
};

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads) {
    for (int i = 0; i + 1 < n_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
  }
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs task(i) for i in [0, n_tasks) on the workers and the calling thread; returns when done.
  void run(int64_t n_tasks, const std::function<void(int64_t)>& task) {
    std::unique_lock<std::mutex> region(run_mu_);  // one parallel region at a time
    auto job = std::make_shared<Job>();
    job->task = &task;
    job->n_tasks = n_tasks;
    {
      std::lock_guard<std::mutex> g(mu_);
      job_ = job;
      ++generation_;
    }
    cv_.notify_all();
    tls_in_worker = true;  // a nested parallel_for inside a task runs serially
    drain(*job);
    tls_in_worker = false;
    std::unique_lock<std::mutex> g(mu_);
    done_cv_.wait(g, [&] { return job->done.load() == n_tasks; });
    job_.reset();
  }

 private:
  void drain(Job& job) {
    for (;;) {
      int64_t i = job.next.fetch_add(1);
      if (i >= job.n_tasks) break;
      (*job.task)(i);
      if (job.done.fetch_add(1) + 1 == job.n_tasks) {
        std::lock_guard<std::mutex> g(mu_);
        done_cv_.notify_all();
      }
    }
  }

  void worker_loop() {
    tls_in_worker = true;
    uint64_t seen = 0;
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || (generation_ != seen && job_ != nullptr); });
        if (stop_) return;
        seen = generation_;
        job = job_;
      }
      drain(*job);
    }
  }

  std::vector<std::thread> workers_;
  std::mutex mu_, run_mu_;
  std::condition_variable cv_, done_cv_;
  std::shared_ptr<Job> job_;  // the open region, or null
  uint64_t generation_ = 0;
  bool stop_ = false;
};

int configured_threads() {
  if (const char* env = std::getenv("DEEPINFER_THREADS")) {
    int n = std::atoi(env);
    if (n > 0) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

ThreadPool& pool() {
  static ThreadPool p(configured_threads());
  return p;
}

}  // namespace

int thread_count() { return pool().size(); }

void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_chunk) {
  if (n <= 0) return;
  int threads = tls_in_worker ? 1 : thread_count();
  int64_t chunk = std::max<int64_t>(min_chunk, (n + threads * 4 - 1) / (threads * 4));
  int64_t n_tasks = (n + chunk - 1) / chunk;
  if (threads == 1 || n_tasks == 1) {
    fn(0, n);
    return;
  }
  pool().run(n_tasks, [&](int64_t t) {
    int64_t b = t * chunk;
    fn(b, std::min(n, b + chunk));
  });
}

}  // namespace di
