// Top-k selection that picks the same elements as torch.topk on the CPU, ties included: the
// reference's index scores are bf16, so exact ties are common and which tied element wins changes
// the attended rows. torch fills (value, index) pairs in index order, then runs std::partial_sort
// when k * 64 <= n and std::nth_element otherwise, with a "greater" comparator; we do the same with
// the same standard library algorithms.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace di::cpu {

// Indices of the k selected values (in no particular order). k <= n.
inline std::vector<int64_t> torch_topk_indices(const float* values, int64_t n, int64_t k) {
  using Elem = std::pair<float, int64_t>;
  std::vector<Elem> queue(n);
  for (int64_t j = 0; j < n; ++j) queue[j] = {values[j], j};
  auto greater = [](const Elem& x, const Elem& y) { return x.first > y.first; };  // no NaNs here
  if (k * 64 <= n) {
    std::partial_sort(queue.begin(), queue.begin() + k, queue.end(), greater);
  } else if (k > 0) {
    std::nth_element(queue.begin(), queue.begin() + (k - 1), queue.end(), greater);
  }
  std::vector<int64_t> out(k);
  for (int64_t i = 0; i < k; ++i) out[i] = queue[i].second;
  return out;
}

// The k largest, ties to the lowest index (a total order, so independent of the row's width).
inline std::vector<int64_t> lowest_index_topk(const float* values, int64_t n, int64_t k) {
  std::vector<int64_t> order(n);
  for (int64_t j = 0; j < n; ++j) order[j] = j;
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int64_t a, int64_t b) {
    return values[a] > values[b] || (values[a] == values[b] && a < b);
  });
  order.resize(k);
  return order;
}

}  // namespace di::cpu
