// The golden criteria's two measures on a logits row: relative L2 error against the reference, and
// the reference's argmax with its top-1 minus top-2 margin.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

namespace di {

inline double rel_l2(const float* a, const float* ref, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    num += (double(a[i]) - ref[i]) * (double(a[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

inline std::pair<int64_t, float> top1(const float* v, int64_t n) {
  int64_t best = std::max_element(v, v + n) - v;
  float second = -INFINITY;
  for (int64_t i = 0; i < n; ++i)
    if (i != best) second = std::max(second, v[i]);
  return {best, v[best] - second};
}

}  // namespace di
