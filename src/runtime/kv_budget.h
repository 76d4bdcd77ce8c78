// How much memory the engine's KV may take when the user does not say (EngineOptions
// kv_capacity_bytes / prefix_cache_bytes = 0): what the running requests could ever use (max_running
// requests of up to 128K positions), capped by the memory the device has free after the weights are
// loaded -- device memory for CUDA, available host memory for the CPU -- less a reserve for the
// forward's workspace (4 GiB, or half of what is free when that is less). Requests and the prefix cache each get at most this much, so together they stay
// within `kKvShareOfFree` x 2 of the free memory.
#pragma once

#include <cstdint>
#include <string>

namespace di {

struct KvBudget {
  int64_t free_bytes = 0;      // what the device reported free (0: unknown)
  int64_t capacity_bytes = 0;  // for running requests (and the prefix cache's default)
};

constexpr double kKvShareOfFree = 0.45;  // of the free memory, for requests; as much again for the cache
constexpr int64_t kWorkspaceReserveBytes = int64_t{4} << 30;  // activations, scratch, unpacked KV

// wanted: the most the running requests could use; device: "cpu" or "cuda". Never below
// `minimum` (one request's local state and a page, so that some request can run).
KvBudget default_kv_budget(int64_t wanted, int64_t minimum, const std::string& device);

// Free bytes: cudaMemGetInfo for "cuda", MemAvailable of /proc/meminfo (else free physical pages) for
// the CPU. 0 when unknown.
int64_t free_memory_bytes(const std::string& device);

}  // namespace di
