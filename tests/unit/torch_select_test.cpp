// The device's emulation of torch.topk's CPU tie choice (src/backend/cuda/torch_select.h, plain C++)
// against cpu::torch_topk_indices (libstdc++ partial_sort / nth_element) on tie-heavy rows: the same
// algorithms must select the same pairs (nth_element: in the same order; partial_sort also sorts its
// heap afterwards, which the emulation skips, so there the sets are compared).
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu/torch_topk.h"
#include "backend/cuda/torch_select.h"
#include "test_util.h"

namespace di {
namespace {

std::vector<int64_t> emulated(const std::vector<float>& v, int64_t k) {
  std::vector<torch_select::Pair> f(v.size());
  for (size_t j = 0; j < v.size(); ++j) f[j] = {v[j], static_cast<int32_t>(j)};
  torch_select::select(f.data(), static_cast<int64_t>(v.size()), k);
  std::vector<int64_t> out(k);
  for (int64_t i = 0; i < k; ++i) out[i] = f[i].i;
  if (torch_select::uses_heap(static_cast<int64_t>(v.size()), k)) std::sort(out.begin(), out.end());
  return out;
}

std::vector<int64_t> reference(const std::vector<float>& v, int64_t k) {
  std::vector<int64_t> out = cpu::torch_topk_indices(v.data(), static_cast<int64_t>(v.size()), k);
  if (torch_select::uses_heap(static_cast<int64_t>(v.size()), k)) std::sort(out.begin(), out.end());
  return out;
}

TEST(TorchSelect, MatchesLibstdcxxOnTieHeavyRows) {
  std::mt19937_64 gen(testing_util::fresh_seed("TorchSelect"));
  const float kInf = std::numeric_limits<float>::infinity();
  struct Case {
    int64_t n, k;
  };
  // both branches (k * 64 <= n: heap select), n <= 3 (insertion sort only), k = n, k = 1
  const Case cases[] = {{1, 1},    {3, 2},     {4, 4},     {20, 8},     {129, 129}, {700, 64},
                        {700, 10}, {640, 10},  {639, 10},  {5000, 512}, {40000, 2048}, {50001, 512}};
  for (const Case& c : cases)
    for (int distinct : {1, 2, 3, 8, 1000}) {
      std::uniform_int_distribution<int> pick(0, distinct - 1);
      std::vector<float> v(static_cast<size_t>(c.n));
      for (float& x : v) {
        const int p = pick(gen);
        x = p == 0 && distinct > 2 ? -kInf : static_cast<float>(p) * 0.25f;
      }
      EXPECT_EQ(emulated(v, c.k), reference(v, c.k))
          << "n=" << c.n << " k=" << c.k << " distinct=" << distinct;
    }
}

// Sorted and reverse-sorted runs with ties (the partition's worst cases for pivot choice).
TEST(TorchSelect, MatchesLibstdcxxOnSortedRuns) {
  for (int64_t n : {100, 1001, 4096})
    for (bool ascending : {true, false}) {
      std::vector<float> v(static_cast<size_t>(n));
      for (int64_t j = 0; j < n; ++j) v[j] = static_cast<float>((ascending ? j : n - j) / 3);
      for (int64_t k : {int64_t{1}, n / 7, n / 2, n})
        EXPECT_EQ(emulated(v, k), reference(v, k)) << "n=" << n << " k=" << k;
    }
}

}  // namespace
}  // namespace di
