#include "runtime/kv_budget.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "backend/device_tools.h"

namespace di {

int64_t free_memory_bytes(const std::string& device) {
  if (device == "cuda") return device::available() ? device::mem_info().free : 0;
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    std::istringstream in(line);
    std::string key;
    int64_t kib = 0;
    if (in >> key >> kib && key == "MemAvailable:") return kib * 1024;
  }
  const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
}

KvBudget default_kv_budget(int64_t wanted, int64_t minimum, const std::string& device) {
  KvBudget b;
  b.free_bytes = free_memory_bytes(device);
  b.capacity_bytes = wanted;
  if (b.free_bytes > 0) {
    const int64_t usable = b.free_bytes - std::min(kWorkspaceReserveBytes, b.free_bytes / 2);
    b.capacity_bytes = std::min(wanted, static_cast<int64_t>(kKvShareOfFree * static_cast<double>(usable)));
  }
  b.capacity_bytes = std::max(b.capacity_bytes, minimum);
  return b;
}

}  // namespace di
