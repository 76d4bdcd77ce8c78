// device::kernel_trace_start / stop (device_tools.h): every kernel's start and end on the GPU, from
// CUPTI's activity API (the records nsys shows, for machines without nsys). The bench takes a
// timeline of one plain decode step with it: unlike ncu's one-kernel-at-a-time replay, it shows the
// step as it runs, PDL overlap and the side stream included.
//
// libcupti is loaded at run time (dynamic_library.h): the binaries keep no link dependency on it, and a
// machine without it fails only the trace, with the reason.
#include <cuda_runtime.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/dynamic_library.h"
#include "backend/device_tools.h"
#include "core/error.h"

#if __has_include(<cupti_activity.h>)
#include <cupti_activity.h>
#define DEEPINFER_HAVE_CUPTI_HEADERS 1
#endif

namespace di::device {

#ifdef DEEPINFER_HAVE_CUPTI_HEADERS
namespace {

// The CUPTI entry points the trace uses, resolved once.
struct Cupti {
  decltype(&cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
  decltype(&cuptiActivityEnable) enable = nullptr;
  decltype(&cuptiActivityDisable) disable = nullptr;
  decltype(&cuptiActivityFlushAll) flush_all = nullptr;
  decltype(&cuptiActivityGetNextRecord) next_record = nullptr;
  std::string error;  // why it could not be loaded (empty: loaded)
};

const Cupti& cupti() {
  static const Cupti c = [] {
    Cupti r;
    void* lib = cuda::open_first_library({"libcupti.so.13", "libcupti.so", "/usr/local/cuda/lib64/libcupti.so.13",
                                          "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13",
                                          "/usr/local/cuda/lib64/libcupti.so"});
    if (!lib) {
      r.error = "libcupti.so not found (the CUDA toolkit's CUPTI; tried the loader path and /usr/local/cuda)";
      return r;
    }
    const auto sym = [&](auto& fn, const char* name) {
      if (!cuda::load_symbol(lib, fn, name) && r.error.empty()) r.error = std::string("libcupti has no ") + name;
    };
    sym(r.register_callbacks, "cuptiActivityRegisterCallbacks");
    sym(r.enable, "cuptiActivityEnable");
    sym(r.disable, "cuptiActivityDisable");
    sym(r.flush_all, "cuptiActivityFlushAll");
    sym(r.next_record, "cuptiActivityGetNextRecord");
    return r;
  }();
  return c;
}

void check(CUptiResult res, const char* what) {
  if (res != CUPTI_SUCCESS) throw Error(std::string("kernel trace: ") + what + " failed (CUPTI error " + std::to_string(res) + ")");
}

std::mutex g_mu;
std::vector<KernelRecord> g_records;  // filled by CUPTI's buffer callbacks

std::string demangle(const char* name) {
  if (!name) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string out = status == 0 && d ? d : name;
  std::free(d);
  return out;
}

constexpr size_t kBufferBytes = size_t{8} << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* rec = nullptr;
  std::vector<KernelRecord> got;
  while (cupti().next_record(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
    // the fields read here lead every CUpti_ActivityKernel version
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
    got.push_back({demangle(k->name), static_cast<int64_t>(k->start), static_cast<int64_t>(k->end), k->streamId,
                   static_cast<int64_t>(k->gridX) * k->gridY * k->gridZ});
  }
  std::free(buffer);
  std::lock_guard<std::mutex> lock(g_mu);
  g_records.insert(g_records.end(), got.begin(), got.end());
}

}  // namespace

void kernel_trace_start() {
  const Cupti& c = cupti();
  if (!c.error.empty()) throw Error("kernel trace: " + c.error);
  static const bool registered = [&] {
    check(c.register_callbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
    return true;
  }();
  (void)registered;
  DI_CUDA_CHECK(cudaDeviceSynchronize());  // only the region's kernels
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_records.clear();
  }
  check(c.enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable");
}

std::vector<KernelRecord> kernel_trace_stop() {
  const Cupti& c = cupti();
  DI_CUDA_CHECK(cudaDeviceSynchronize());
  check(c.disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityDisable");
  check(c.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
  std::lock_guard<std::mutex> lock(g_mu);
  std::vector<KernelRecord> out;
  out.swap(g_records);
  std::sort(out.begin(), out.end(), [](const KernelRecord& a, const KernelRecord& b) { return a.start_ns < b.start_ns; });
  return out;
}

#else

void kernel_trace_start() { throw Error("kernel trace: this build had no CUPTI headers (cupti_activity.h)"); }
std::vector<KernelRecord> kernel_trace_stop() { return {}; }

#endif

}  // namespace di::device
