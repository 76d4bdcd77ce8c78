// Per-call device scratch for the CUDA ops: stream-ordered (cudaMallocAsync / cudaFreeAsync on the
// default stream), so freeing it never synchronizes the device the way cudaFree does. The default
// memory pool keeps freed memory (release threshold = max), so steady-state calls allocate nothing.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_common.cuh"

namespace di::cuda {

inline void keep_pool_memory() {
  static const bool done = [] {
    int dev = 0;
    DI_CUDA_CHECK(cudaGetDevice(&dev));
    cudaMemPool_t pool{};
    DI_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, dev));
    uint64_t threshold = UINT64_MAX;
    DI_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
    return true;
  }();
  (void)done;
}

class Scratch {
 public:
  explicit Scratch(size_t bytes) {
    if (bytes == 0) return;
    keep_pool_memory();
    cudaError_t err = cudaMallocAsync(&p_, bytes, 0);
    if (err != cudaSuccess)
      throw Error("GPU out of memory allocating " + std::to_string(bytes) + " scratch bytes: " + cudaGetErrorString(err));
  }
  Scratch() = default;
  Scratch(Scratch&& o) noexcept : p_(o.p_) { o.p_ = nullptr; }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  Scratch& operator=(Scratch&& o) noexcept {
    std::swap(p_, o.p_);
    return *this;
  }
  ~Scratch() {
    if (p_) DI_CUDA_CHECK(cudaFreeAsync(p_, 0));
  }
  template <typename T>
  T* as() const { return static_cast<T*>(p_); }

 private:
  void* p_ = nullptr;
};

// A small host vector copied to the device on the default stream (pageable source: the copy is
// staged before cudaMemcpyAsync returns, so `v` may die right after).
template <typename T>
Scratch upload(const std::vector<T>& v) {
  Scratch s(v.size() * sizeof(T));
  if (!v.empty()) DI_CUDA_CHECK(cudaMemcpyAsync(s.as<T>(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice, 0));
  return s;
}

}  // namespace di::cuda
