// Per-call device scratch for the CUDA ops: blocks of the backend's stream-ordered cache
// (device_memory.cuh), so taking and returning one costs no driver call in steady state.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/device_memory.cuh"

namespace di::cuda {

class Scratch {
 public:
  explicit Scratch(size_t bytes) : bytes_(bytes) {
    if (bytes > 0) p_ = device_block(bytes, &device_);
  }
  Scratch() = default;
  Scratch(Scratch&& o) noexcept : p_(o.p_), bytes_(o.bytes_), device_(o.device_) { o.p_ = nullptr; }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  Scratch& operator=(Scratch&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    std::swap(device_, o.device_);
    return *this;
  }
  ~Scratch() { release_block(p_, bytes_, device_); }
  template <typename T>
  T* as() const { return static_cast<T*>(p_); }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
  int device_ = 0;
};

// A small host vector copied to the device on the default stream (through pinned staging, so `v`
// may die right after).
template <typename T>
Scratch upload(const std::vector<T>& v) {
  Scratch s(v.size() * sizeof(T));
  upload_bytes(s.as<T>(), v.data(), v.size() * sizeof(T));
  return s;
}

}  // namespace di::cuda
