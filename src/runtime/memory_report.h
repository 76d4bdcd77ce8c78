// Memory in use by category, for logs, `inspect --device` and `bench`: weights (what the backend
// prepared), caches (the sequences' KV state), workspace (the other tensors: activations and
// per-forward scratch), and for a GPU what the device reports in use beyond those (CUDA context,
// the stream-ordered scratch pool of the CUDA ops, allocator rounding).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/profiling_backend.h"
#include "model/sequence_state.h"

namespace di {

struct MemoryReport {
  int64_t weights = 0;         // prepared weights
  int64_t caches = 0;          // window rings, compressor tails; the global-KV page pool's storage
  int64_t workspace = 0;       // live tensors other than caches, now
  int64_t workspace_peak = 0;  // peak live tensors (since the backend's last reset_peak) minus caches
  bool has_device = false;
  int64_t device_used = 0, device_total = 0;  // cudaMemGetInfo
  int64_t device_other = 0;                   // device_used - weights - live tensors
};

MemoryReport memory_report(ProfilingBackend& backend, const std::vector<const SequenceState*>& states);

// "weights 104.2 GB, caches 6.1 GB, workspace 0.2 GB (peak 8.3 GB); device 121.0 of 150.1 GB in use
// (9.1 GB context, scratch pool and allocator slack)"
std::string format_memory_report(const MemoryReport& r);

std::string format_bytes(double bytes);  // "1.23 GB", "4.56 MB", "789 B"

}  // namespace di
