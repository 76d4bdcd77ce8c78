// A fixed pool of worker threads for data-parallel loops on the CPU backend. One pool per process;
// parallel_for splits [0, n) into contiguous chunks, runs them on every core and waits.
#pragma once

#include <cstdint>
#include <functional>

namespace di {

// Runs fn(begin, end) over disjoint chunks covering [0, n). Serial when n is small or when called
// from inside a worker (no nested parallelism). `min_chunk` bounds the work per task.
void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_chunk = 1);

// Number of threads the pool uses (DEEPINFER_THREADS, default: hardware concurrency).
int thread_count();

}  // namespace di
