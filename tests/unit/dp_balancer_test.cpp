// DP request balancing (src/parallel/dp_balancer.h): requests spread by outstanding work.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "core/error.h"
#include "parallel/dp_balancer.h"
#include "test_util.h"

namespace di {
namespace {

using parallel::DpBalancer;
using parallel::DpRequest;
using parallel::DpTicket;

TEST(DpBalancer, SpreadsRequestsByLoad) {
  std::mt19937_64 rng(testing_util::fresh_seed("SpreadsRequestsByLoad"));
  for (int n_ranks : {1, 2, 3, 4, 8}) {
    DpBalancer b(n_ranks);
    int64_t biggest = 0;
    for (int i = 0; i < 200; ++i) {
      DpRequest req{static_cast<int64_t>(1 + rng() % 2000), static_cast<int64_t>(1 + rng() % 500), {}};
      biggest = std::max(biggest, req.prompt_tokens + req.max_new_tokens);
      b.assign(req);
      // Greedy least-loaded: the spread never exceeds the largest single request.
      auto [lo, hi] = std::minmax_element(b.load().begin(), b.load().end());
      ASSERT_LE(*hi - *lo, biggest);
    }
    for (int r = 0; r < n_ranks; ++r) EXPECT_GT(b.requests()[r], 200 / n_ranks / 3);
  }
}

TEST(DpBalancer, ABusyRankGetsNothingUntilOthersCatchUp) {
  DpBalancer b(3);
  DpTicket big = b.assign({10000, 0, {}});
  ASSERT_EQ(big.rank, 0);
  for (int i = 0; i < 40; ++i) EXPECT_NE(b.assign({100, 100, {}}).rank, 0);  // 40 x 200 = 8000 < 10000 spread on 1, 2
  b.release(big);  // rank 0 finished: it is now the least loaded
  EXPECT_EQ(b.load()[0], 0);
  EXPECT_EQ(b.assign({100, 100, {}}).rank, 0);
}

TEST(DpBalancer, PrefixHitsAttractWithinTheLoadTheySave) {
  DpBalancer b(2);
  b.assign({300, 0, {}});  // rank 0: 300
  // 1000-token prompt, 900 cached on rank 0: rank 0 costs 300 + 100, rank 1 costs 1000.
  EXPECT_EQ(b.assign({1000, 0, {900, 0}}).rank, 0);
  // 200 cached on rank 0 now saves less than rank 0's extra load: rank 1.
  EXPECT_EQ(b.assign({1000, 0, {200, 0}}).rank, 1);
}

TEST(DpBalancer, ProgressAndDeterminism) {
  std::mt19937_64 rng(testing_util::fresh_seed("ProgressAndDeterminism"));
  std::vector<DpRequest> reqs;
  for (int i = 0; i < 50; ++i) reqs.push_back({static_cast<int64_t>(rng() % 100), static_cast<int64_t>(rng() % 100), {}});
  DpBalancer a(4), c(4);
  for (const DpRequest& r : reqs) ASSERT_EQ(a.assign(r).rank, c.assign(r).rank);
  DpTicket t = a.assign({500, 10, {}});
  const int64_t before = a.load()[t.rank];
  a.progress(t, 500);
  EXPECT_EQ(a.load()[t.rank], before - 500);
  a.release(t);
  EXPECT_EQ(a.load()[t.rank], before - 510);
  EXPECT_THROW(DpBalancer(0), Error);
  EXPECT_THROW(a.assign({10, 1, {1, 2}}), Error);
}

}  // namespace
}  // namespace di
