// Persistent device buffers of the quantized GEMMs and the grouped MoE path, reused by every call in
// stream order (one set per stream: side_stream.cuh), so a steady-state call allocates nothing and can
// be captured in a CUDA graph. A buffer only grows; growing frees the old one (cudaFree waits for the
// device, so no kernel still reads it) and happens on the first calls at a new size only.
// The split-K counters are zero at allocation and the kernels leave them zero.
#pragma once

#include <cstddef>
#include <cstdint>

namespace di::cuda {

enum class Ws : int {
  kActCodes,    // E4M3 codes of a linear's activation
  kActScales,   // their per-32 scales (f32)
  kPartial,     // split-K partial sums (f32; fp64 for the router logits)
  kCounters,    // split-K arrival counters (u32, kept zero)
  kMoeLists,    // routing lists: offsets, active experts, tokens / slots / positions per entry
  kMoeXCodes,   // the MoE input, quantized once for all experts
  kMoeXScales,
  kMoeGate,     // gate / up projections of every (token, expert) entry, sorted by expert
  kMoeUp,
  kMoeHCodes,   // SwiGLU output, quantized for the down projection
  kMoeHScales,
  kMoeDown,     // down projections per entry
  kMoeTables,   // device tables of expert weight pointers
  kHandoffCodes,   // a GEMM's output quantized for the next linear (output_projection)
  kHandoffScales,
  kCount
};

// A device buffer of at least `bytes` for `slot` of the current stream (contents kept across calls
// unless it grows).
void* workspace(Ws slot, size_t bytes);

template <typename T>
T* workspace_as(Ws slot, size_t count) {
  return static_cast<T*>(workspace(slot, count * sizeof(T)));
}

}  // namespace di::cuda
