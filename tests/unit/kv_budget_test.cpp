// The engine's default KV budget: what the requests could use, capped by the memory free on the device.
#include <gtest/gtest.h>

#include <random>

#include "runtime/kv_budget.h"
#include "test_util.h"

namespace di {
namespace {

TEST(KvBudget, CappedByFreeHostMemory) {
  std::mt19937_64 rng(testing_util::fresh_seed("KvBudget.CappedByFreeHostMemory"));
  const int64_t free = free_memory_bytes("cpu");
  ASSERT_GT(free, 0);  // /proc/meminfo on Linux
  // far more than the machine has: capped at the share of what is free past the workspace reserve
  const KvBudget big = default_kv_budget(int64_t{1} << 60, 1, "cpu");
  EXPECT_GT(big.free_bytes, 0);
  EXPECT_LE(big.capacity_bytes, static_cast<int64_t>(kKvShareOfFree * static_cast<double>(big.free_bytes)));
  // a small want is granted as is (the share of free memory is at least 0.45 x free / 2)
  const int64_t want = 1 + static_cast<int64_t>(rng() % (int64_t{1} << 20));
  ASSERT_GT(static_cast<double>(free) * kKvShareOfFree / 2, 2.0 * static_cast<double>(want));
  EXPECT_EQ(default_kv_budget(want, 1, "cpu").capacity_bytes, want);
  // never below the minimum (one request's local state and a page)
  EXPECT_EQ(default_kv_budget(want, want + 7, "cpu").capacity_bytes, want + 7);
  EXPECT_EQ(default_kv_budget(int64_t{1} << 60, int64_t{1} << 59, "cpu").capacity_bytes, int64_t{1} << 59);
}

}  // namespace
}  // namespace di
