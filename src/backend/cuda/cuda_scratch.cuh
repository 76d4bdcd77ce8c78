// Per-call device scratch for the CUDA ops: blocks of the backend's stream-ordered cache
// (device_memory.cuh), so taking and returning one costs no driver call in steady state.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/device_memory.cuh"
#include "backend/cuda/side_stream.cuh"

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

// Small host vectors that repeat from call to call (RoPE's positions and the batch's page tables, the
// same for every layer of a step; RoPE's frequency tables, the same for every step), uploaded once and
// then reused: the last kEntries distinct ones per stream (an entry uploaded on one stream is read only
// by its kernels).
// At batch 1 the ~110 RoPE uploads of a step were ~0.3 ms of host time, near what bounds the step.
class UploadCache {
 public:
  template <typename T>
  const T* get(const std::vector<T>& v) {
    const size_t bytes = v.size() * sizeof(T);
    if (bytes == 0) return nullptr;
    std::array<Entry, kEntries>& entries = lanes_[static_cast<size_t>(stream_lane())];
    Entry* victim = &entries[0];
    for (Entry& e : entries) {
      if (e.used > 0 && e.host.size() == bytes && std::memcmp(e.host.data(), v.data(), bytes) == 0) {
        e.used = ++clock_;
        return e.dev.as<T>();
      }
      if (e.used < victim->used) victim = &e;
    }
    victim->host.assign(reinterpret_cast<const uint8_t*>(v.data()), reinterpret_cast<const uint8_t*>(v.data()) + bytes);
    victim->dev = upload(v);  // the evicted block goes back in stream order (release_block)
    victim->used = ++clock_;
    return victim->dev.as<T>();
  }

 private:
  static constexpr int kEntries = 8;
  struct Entry {
    std::vector<uint8_t> host;
    Scratch dev;
    uint64_t used = 0;  // 0: empty
  };
  std::array<std::array<Entry, kEntries>, 2> lanes_;  // [main, side stream]
  uint64_t clock_ = 0;
};

// v on the device: from `cache` where there is one, else uploaded for this call (held by `keep`, which must
// outlive the launches that read it).
template <typename T>
const T* upload_via(UploadCache* cache, const std::vector<T>& v, Scratch& keep) {
  if (cache) return cache->get(v);
  keep = upload(v);
  return keep.as<T>();
}

}  // namespace di::cuda
