// Kernel launches with programmatic dependent launch (PDL, sm_90): a kernel may be scheduled while the
// one before it on the stream is still finishing, and waits in `grid_dependency_wait()` until that
// one has completed and its writes are visible. At batch 1 a decode layer is ~40 short kernels, and
// each boundary otherwise costs the next kernel's launch and CTA start-up after the previous drains.
//
// The rule that makes it safe: every kernel launched through `launch` calls `grid_dependency_wait()`
// before it writes global memory or reads what the kernel just before it wrote; its first statement
// is the wait or a `*_then_wait` function (tests/unit/pdl_kernels_test checks the sources). Before
// the wait a kernel may read weights (never written) and data written two or more kernels back: each
// kernel releases its dependents only after its own wait, so those writers have completed. A kernel
// after a non-PDL launch, a copy or an event is ordered by the stream as before.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <tuple>
#include <type_traits>
#include <utility>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/launch_log.cuh"
#include "backend/cuda/side_stream.cuh"
#include "core/env_switch.h"

namespace di::cuda {

// First statement of every kernel: waits for the previous kernel of the stream (a no-op when this one
// was launched without PDL), then lets the next kernel be scheduled. The next one waits for this
// whole grid in turn, so releasing it early only overlaps its launch with this grid's last wave.
__device__ __forceinline__ void grid_dependency_wait() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// Whether launches carry the PDL attribute: yes unless DEEPINFER_PDL=0 (for measuring).
inline bool pdl_enabled() {
  static const bool on = env_switch_on("DEEPINFER_PDL");
  return on;
}

// Measuring switches of `launch`, read once; all off unless set.
//  - DEEPINFER_SMEM_CARVEOUT=P (0-100): every launch prefers P% of the SM's L1 / shared memory as shared memory
//    (unset: the driver's choice per kernel; two kernels of different carveouts do not share an SM).
//  - DEEPINFER_LANE_PRIORITY=1: main-stream launches at the greatest priority, side-stream ones at the least, so
//    that waiting CTAs of the main chain get freed SMs first.
//  - DEEPINFER_LAUNCH_LOG=FILE: every launch logged with its parameters (launch_log.cuh).
// For steps issued with everything queued ahead (held steps, step graphs), where the side stream's grids may take
// the SMs the main chain's next kernel needs.
struct LaunchSwitches {
  int carveout = -1;                          // -1: unset
  bool priorities = false;
  int main_priority = 0, side_priority = 0;   // greatest and least of the device's range
  bool log = false;
};
inline const LaunchSwitches& launch_switches() {
  static const LaunchSwitches s = [] {
    LaunchSwitches w;
    if (const char* v = std::getenv("DEEPINFER_SMEM_CARVEOUT"); v && *v) w.carveout = std::clamp(std::atoi(v), 0, 100);
    w.priorities = env_opt_in("DEEPINFER_LANE_PRIORITY");
    if (w.priorities) DI_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&w.side_priority, &w.main_priority));
    w.log = launch_log_on();
    return w;
  }();
  return s;
}

// kernel<<<grid, block, smem>>>(args...) on the current stream (side_stream.cuh), with the PDL attribute. Checks the
// launch (cudaLaunchKernelEx returns its error), so callers need no DI_CUDA_LAUNCH_CHECK after it.
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, Args&&... args) {
  const LaunchSwitches& sw = launch_switches();
  cudaLaunchAttribute attrs[3]{};
  attrs[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[0].val.programmaticStreamSerializationAllowed = pdl_enabled() ? 1 : 0;
  unsigned n = 1;
  if (sw.carveout >= 0) {
    attrs[n].id = cudaLaunchAttributePreferredSharedMemoryCarveout;
    attrs[n++].val.sharedMemCarveout = static_cast<unsigned>(sw.carveout);
  }
  if (sw.priorities) {
    attrs[n].id = cudaLaunchAttributePriority;
    attrs[n++].val.priority = stream_lane() == 0 ? sw.main_priority : sw.side_priority;
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = current_stream();
  cfg.attrs = attrs;
  cfg.numAttrs = n;
  if (sw.log) {
    const std::tuple<std::decay_t<Params>...> as_received(args...);  // the kernel's parameters as it gets them
    std::apply(
        [&](const auto&... v) {
          log_launch(reinterpret_cast<const void*>(kernel), grid, block, smem, {{&v, sizeof v}...});
        },
        as_received);
  }
  DI_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

}  // namespace di::cuda
