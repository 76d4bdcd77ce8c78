// Persistent GEMM / MoE workspace (see gemm_workspace.cuh).
#include <cuda_runtime.h>

#include <mutex>
#include <string>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/gemm_workspace.cuh"
#include "backend/cuda/side_stream.cuh"

namespace di::cuda {
namespace {

struct Buffer {
  void* p = nullptr;
  size_t bytes = 0;
};

}  // namespace

void* workspace(Ws slot, size_t bytes) {
  static std::mutex mu;
  static Buffer buffers[2][static_cast<int>(Ws::kCount)];  // [main, side stream][slot]
  std::lock_guard<std::mutex> lock(mu);
  Buffer& b = buffers[stream_lane()][static_cast<int>(slot)];
  if (bytes <= b.bytes && b.p) return b.p;
  // grow by 1.5x at least, so that slowly growing sizes reallocate rarely
  size_t want = bytes < 4096 ? 4096 : bytes;
  if (want < b.bytes + b.bytes / 2) want = b.bytes + b.bytes / 2;
  if (b.p) DI_CUDA_CHECK(cudaFree(b.p));
  b.p = nullptr;
  b.bytes = 0;
  if (cudaMalloc(&b.p, want) != cudaSuccess)
    throw Error("GPU out of memory allocating " + std::to_string(want) + " bytes of GEMM workspace");
  DI_CUDA_CHECK(cudaMemsetAsync(b.p, 0, want, current_stream()));  // counters rely on it
  b.bytes = want;
  return b.p;
}

}  // namespace di::cuda
