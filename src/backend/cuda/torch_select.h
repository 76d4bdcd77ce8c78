// torch.topk's choice among tied values on the CPU, step by step, for the device (TieBreak::kTorch).
//
// cpu::torch_topk_indices fills (value, index) pairs in index order and runs libstdc++'s
// std::partial_sort (k * 64 <= n) or std::nth_element with a value-only "greater" comparator; which
// of several equal values ends in the first k depends on every move those algorithms make. These are
// the same algorithms (heap select; introselect: median-of-three pivot, unguarded Hoare partition,
// heap select past the depth limit, insertion sort of the last <= 3), written for one thread over a
// pair array, so the device picks exactly the CPU's elements. Plain C++ (usable in host unit tests);
// DI_HD marks the functions __host__ __device__ under nvcc.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define DI_HD __host__ __device__ __forceinline__
#else
#define DI_HD inline
#endif

namespace di::torch_select {

struct Pair {
  float v;
  int32_t i;
};

// The comparator: "a before b" = a.v > b.v (indices never compared).
DI_HD bool before(const Pair& a, const Pair& b) { return a.v > b.v; }

DI_HD void swap_at(Pair* f, int64_t a, int64_t b) {
  const Pair t = f[a];
  f[a] = f[b];
  f[b] = t;
}

DI_HD void push_heap(Pair* f, int64_t hole, int64_t top, Pair value) {
  int64_t parent = (hole - 1) / 2;
  while (hole > top && before(f[parent], value)) {
    f[hole] = f[parent];
    hole = parent;
    parent = (hole - 1) / 2;
  }
  f[hole] = value;
}

DI_HD void adjust_heap(Pair* f, int64_t hole, int64_t len, Pair value) {
  const int64_t top = hole;
  int64_t child = hole;
  while (child < (len - 1) / 2) {
    child = 2 * (child + 1);
    if (before(f[child], f[child - 1])) --child;
    f[hole] = f[child];
    hole = child;
  }
  if ((len & 1) == 0 && child == (len - 2) / 2) {
    child = 2 * (child + 1);
    f[hole] = f[child - 1];
    hole = child - 1;
  }
  push_heap(f, hole, top, value);
}

DI_HD void make_heap(Pair* f, int64_t len) {
  if (len < 2) return;
  for (int64_t parent = (len - 2) / 2;; --parent) {
    adjust_heap(f, parent, len, f[parent]);
    if (parent == 0) return;
  }
}

// One step of the heap select after make_heap(f, middle): element x (at position >= middle)
// replaces the heap's top when it comes before it.
DI_HD void heap_offer(Pair* f, int64_t middle, Pair x) {
  if (before(x, f[0])) adjust_heap(f, 0, middle, x);
}

// std::__heap_select(f, f + middle, f + last).
DI_HD void heap_select(Pair* f, int64_t middle, int64_t last) {
  make_heap(f, middle);
  for (int64_t i = middle; i < last; ++i)
    if (before(f[i], f[0])) {
      const Pair x = f[i];
      f[i] = f[0];
      adjust_heap(f, 0, middle, x);
    }
}

DI_HD void move_median_to_first(Pair* f, int64_t result, int64_t a, int64_t b, int64_t c) {
  if (before(f[a], f[b])) {
    if (before(f[b], f[c])) swap_at(f, result, b);
    else if (before(f[a], f[c])) swap_at(f, result, c);
    else swap_at(f, result, a);
  } else if (before(f[a], f[c])) {
    swap_at(f, result, a);
  } else if (before(f[b], f[c])) {
    swap_at(f, result, c);
  } else {
    swap_at(f, result, b);
  }
}

DI_HD int64_t unguarded_partition(Pair* f, int64_t first, int64_t last, int64_t pivot) {
  while (true) {
    while (before(f[first], f[pivot])) ++first;
    --last;
    while (before(f[pivot], f[last])) --last;
    if (!(first < last)) return first;
    swap_at(f, first, last);
    ++first;
  }
}

DI_HD void insertion_sort(Pair* f, int64_t first, int64_t last) {
  if (first == last) return;
  for (int64_t i = first + 1; i != last; ++i) {
    const Pair x = f[i];
    if (before(x, f[first])) {
      for (int64_t j = i; j > first; --j) f[j] = f[j - 1];
      f[first] = x;
    } else {
      int64_t hole = i;
      while (before(x, f[hole - 1])) {
        f[hole] = f[hole - 1];
        --hole;
      }
      f[hole] = x;
    }
  }
}

DI_HD int floor_log2(int64_t n) {
  int r = 0;
  while (n > 1) {
    n >>= 1;
    ++r;
  }
  return r;
}

// std::nth_element(f, f + nth, f + n).
DI_HD void nth_element(Pair* f, int64_t nth, int64_t n) {
  if (n == 0 || nth == n) return;
  int64_t first = 0, last = n;
  int depth = 2 * floor_log2(n);
  while (last - first > 3) {
    if (depth == 0) {
      heap_select(f + first, nth + 1 - first, last - first);
      swap_at(f, first, nth);
      return;
    }
    --depth;
    const int64_t mid = first + (last - first) / 2;
    move_median_to_first(f, first, first + 1, mid, last - 1);
    const int64_t cut = unguarded_partition(f, first + 1, last, first);
    if (cut <= nth) first = cut;
    else last = cut;
  }
  insertion_sort(f, first, last);
}

// True when torch_topk_indices takes the partial_sort (heap) branch.
DI_HD bool uses_heap(int64_t n, int64_t k) { return k * 64 <= n; }

// cpu::torch_topk_indices on f[0, n) holding (values[j], j): the selected pairs end in f[0, k).
DI_HD void select(Pair* f, int64_t n, int64_t k) {
  if (k <= 0) return;
  if (uses_heap(n, k)) heap_select(f, k, n);
  else nth_element(f, k - 1, n);
}

}  // namespace di::torch_select
