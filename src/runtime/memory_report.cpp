#include "runtime/memory_report.h"

#include <cstdio>
#include <set>

#include "backend/device_tools.h"

namespace di {

MemoryReport memory_report(ProfilingBackend& backend, const std::vector<const SequenceState*>& states) {
  MemoryReport r;
  const MemoryStats m = backend.memory();
  r.weights = m.weights;
  std::set<const GlobalKvPool*> pools;
  for (const SequenceState* s : states) {
    r.caches += local_state_bytes(*s);
    if (s->pool && pools.insert(s->pool.get()).second) r.caches += s->pool->capacity_pages() * s->pool->page_bytes();
  }
  r.workspace = std::max<int64_t>(0, m.tensors - r.caches);
  r.workspace_peak = std::max<int64_t>(0, m.tensors_peak - r.caches);
  if (backend.name() == "cuda") {
    const device::MemInfo info = device::mem_info();
    r.has_device = true;
    r.device_total = info.total;
    r.device_used = info.total - info.free;
    r.device_other = r.device_used - r.weights - m.tensors;
  }
  return r;
}

std::string format_bytes(double bytes) {
  char buf[32];
  if (bytes >= 1e9 || bytes <= -1e9) {
    std::snprintf(buf, sizeof buf, "%.2f GB", bytes / 1e9);
  } else if (bytes >= 1e6 || bytes <= -1e6) {
    std::snprintf(buf, sizeof buf, "%.2f MB", bytes / 1e6);
  } else if (bytes >= 1e3 || bytes <= -1e3) {
    std::snprintf(buf, sizeof buf, "%.2f KB", bytes / 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%.0f B", bytes);
  }
  return buf;
}

std::string format_memory_report(const MemoryReport& r) {
  auto b = [](int64_t v) { return format_bytes(static_cast<double>(v)); };
  std::string s = "weights " + b(r.weights) + ", caches " + b(r.caches) + ", workspace " + b(r.workspace) +
                  " (peak " + b(r.workspace_peak) + ")";
  if (r.has_device) {
    s += "; device " + b(r.device_used) + " of " + b(r.device_total) + " in use (" + b(r.device_other) +
         " CUDA context, op scratch pool, allocator slack)";
  }
  return s;
}

}  // namespace di
