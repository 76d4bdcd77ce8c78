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

#include <utility>

#include "backend/cuda/cuda_common.cuh"
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

// kernel<<<grid, block, smem>>>(args...) on the current stream (side_stream.cuh), with the PDL attribute. Checks the
// launch (cudaLaunchKernelEx returns its error), so callers need no DI_CUDA_LAUNCH_CHECK after it.
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, Args&&... args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = pdl_enabled() ? 1 : 0;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = current_stream();
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  DI_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

}  // namespace di::cuda
