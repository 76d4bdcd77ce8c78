// Backend::prefetch on the CUDA backend: a weight's data read into L2 ahead of the linear that streams it.
//
// Why: at decode batch 1 about half of a layer is a chain of small dependent kernels during which DRAM
// is idle, and the weight streams that follow them (wo_a, wo_b) run at 1.5-2 TB/s. Issued on the side
// stream once the chain starts, the prefetch reads those bytes during the idle gap. Plain prefetch
// instructions (LSU, fire-and-forget) rather than cp.async.bulk.prefetch.L2: a bulk prefetch holds its
// CTA until the copy engine has issued every request (the thirty-eighth session measured a 33 MB one
// resident 37 us).
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/pdl_launch.cuh"

namespace di {
namespace {

constexpr int kThreads = 256;
constexpr int kCtas = 32;         // a few SMs: the requests, not the issue, take the time
constexpr int64_t kLine = 128;    // bytes per prefetch (an L2 line)

// [bytes] of p, one prefetch per 128-byte line, lines strided over the grid's threads.
__global__ void __launch_bounds__(kThreads) l2_prefetch_kernel(const uint8_t* __restrict__ p, int64_t bytes) {
  ::di::cuda::grid_dependency_wait();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads * kLine;
  for (int64_t at = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * kLine; at < bytes; at += stride)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p + at));
}

}  // namespace

void CudaBackend::prefetch(const Weight& w) {
  const int64_t bytes = cuda::weight_data_bytes(w);
  if (bytes > 0) cuda::launch(l2_prefetch_kernel, kCtas, kThreads, 0, cuda::wdata(w), bytes);
}

}  // namespace di
