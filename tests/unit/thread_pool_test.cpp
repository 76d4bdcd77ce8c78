// parallel_for: every index runs exactly once, region after region, also when regions are tiny and
// follow each other faster than the workers wake (a stale worker once counted a new region's tasks,
// so the caller waited forever).
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "core/thread_pool.h"

namespace di {
namespace {

TEST(ThreadPool, BackToBackRegionsRunEveryIndexOnce) {
  std::vector<std::atomic<int>> hits(64);
  for (int region = 0; region < 200000; ++region) {
    const int64_t n = region % 2 ? 64 : 2;  // 2 tasks, then 8: a stale worker could take a task of the next region
    for (int64_t i = 0; i < n; ++i) hits[i].store(0);
    parallel_for(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
    }, 1);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "region " << region << " index " << i;
  }
}

TEST(ThreadPool, RegionsFromSeveralThreadsTakeTurns) {
  std::atomic<int64_t> total{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 3; ++t)
    callers.emplace_back([&] {
      for (int r = 0; r < 2000; ++r)
        parallel_for(40, [&](int64_t b, int64_t e) { total.fetch_add(e - b); }, 1);
    });
  for (auto& c : callers) c.join();
  EXPECT_EQ(total.load(), 3 * 2000 * 40);
}

}  // namespace
}  // namespace di
