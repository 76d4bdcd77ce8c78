// device_memory.cuh: the block cache and the upload staging ring, one of each per device.
#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/device_memory.cuh"
#include "backend/cuda/pdl_launch.cuh"
#include "backend/cuda/side_stream.cuh"
#include "backend/cuda/step_graph.cuh"
#include "core/env_switch.h"
#include "core/error.h"

namespace di::cuda {
namespace {

constexpr int kMaxDevices = 64;

// Powers of two up to 4 MB (at most 2x the request), then 2 MB steps.
size_t size_class(size_t bytes) {
  constexpr size_t kPow2Max = size_t{4} << 20, kStep = size_t{2} << 20;
  if (bytes <= 256) return 256;
  if (bytes <= kPow2Max) return std::bit_ceil(bytes);
  return (bytes + kStep - 1) / kStep * kStep;
}

struct BlockCache {
  std::mutex mu;
  std::unordered_map<size_t, std::vector<void*>> free;  // size class -> blocks
  bool defer = false;
  std::vector<std::pair<size_t, void*>> deferred;  // (size class, block) released while deferring
};

// Staging for uploads: two halves of pinned memory; a half is refilled only after the copies issued
// from it have run (an event recorded when the ring left it). 16 MB halves: a step's lists up to 4 MB
// stay asynchronous (larger ones go through cudaMemcpy, which waits for the device).
struct UploadRing {
  static constexpr size_t kHalf = size_t{16} << 20;
  std::mutex mu;
  uint8_t* host = nullptr;
  size_t used = 0;  // bytes of the current half
  int half = 0;
  cudaEvent_t left[2]{};
  bool pending[2]{};
};

// Never destroyed: tensors may be freed at exit, after static destructors.
template <class T>
T& per_device(int device) {
  static auto* all = new std::array<T, kMaxDevices>();
  DI_CHECK_MSG(device >= 0 && device < kMaxDevices, "CUDA device index out of range");
  return (*all)[static_cast<size_t>(device)];
}

// Uploads of at most kBytes travel as a kernel's parameters: the kernel is one more PDL launch in the
// stream, where a copy would make the next kernel wait for it without overlap (an op's few row
// lengths or pointers; a Full layer made about ten such copies per step).
template <size_t kBytes>
struct ParamBytes {
  uint4 v[kBytes / 16];
};

// A parameter read at a per-thread offset is a constant-bank load whose distinct addresses in a warp are
// served one after another, so the copy reads 16-byte words (a 1 KB pointer list: 64 such loads, not 1024
// byte loads), and bytes only for the tail or an unaligned dst.
template <size_t kBytes>
__global__ void store_param_bytes_kernel(ParamBytes<kBytes> src, uint8_t* __restrict__ dst, uint32_t bytes) {
  ::di::cuda::grid_dependency_wait();  // dst may be a block the kernels before this one still read
  const auto* b = reinterpret_cast<const uint8_t*>(src.v);
  uint32_t head = 0;
  if ((reinterpret_cast<uintptr_t>(dst) & 15) == 0) {
    head = bytes & ~15u;
    for (uint32_t i = threadIdx.x; i < head / 16; i += blockDim.x) reinterpret_cast<uint4*>(dst)[i] = src.v[i];
  }
  for (uint32_t i = head + threadIdx.x; i < bytes; i += blockDim.x) dst[i] = b[i];
}

template <size_t kBytes>
void store_param_bytes(void* dst, const void* src, size_t bytes) {
  ParamBytes<kBytes> p;
  std::memcpy(p.v, src, bytes);
  ::di::cuda::launch(store_param_bytes_kernel<kBytes>, 1, 128, 0, p, static_cast<uint8_t*>(dst),
                     static_cast<uint32_t>(bytes));
}

// DEEPINFER_PARAM_UPLOADS=0 sends every upload through the staging ring (for measuring).
bool param_uploads() {
  static const bool on = env_switch_on("DEEPINFER_PARAM_UPLOADS");
  return on;
}

// DEEPINFER_LOWEST_BLOCK=1 (measuring): a size class hands out its lowest free address instead of the block freed
// last, so that a step's addresses depend on which blocks are free rather than on the order they were freed in
// (what a CUDA graph replayed from step to step needs; bench/gpu/launch_diff.py shows what changes).
bool lowest_block_first() {
  static const bool on = env_opt_in("DEEPINFER_LOWEST_BLOCK");
  return on;
}

int current_device() {
  int d = 0;
  DI_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

}  // namespace

void* device_block(size_t bytes, int* device) {
  const size_t cls = size_class(bytes);
  *device = current_device();
  BlockCache& c = per_device<BlockCache>(*device);
  {
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.free.find(cls);
    if (it != c.free.end() && !it->second.empty()) {
      std::vector<void*>& blocks = it->second;
      auto pick = std::prev(blocks.end());  // the block freed last: likeliest still in L2
      if (lowest_block_first()) pick = std::min_element(blocks.begin(), blocks.end());
      void* p = *pick;
      *pick = blocks.back();
      blocks.pop_back();
      return p;
    }
  }
  void* p = nullptr;
  if (cudaMalloc(&p, cls) == cudaSuccess) return p;
  (void)cudaGetLastError();
  // out of memory: give every cached block back (cudaFree waits for the device) and try once more
  {
    std::lock_guard<std::mutex> lock(c.mu);
    for (auto& [size, blocks] : c.free)
      for (void* q : blocks) DI_CUDA_CHECK(cudaFree(q));
    c.free.clear();
  }
  const cudaError_t err = cudaMalloc(&p, cls);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    throw Error("GPU out of memory allocating " + std::to_string(bytes) + " bytes: " + cudaGetErrorString(err));
  }
  return p;
}

void release_block(void* p, size_t bytes, int device) {
  if (!p) return;
  BlockCache& c = per_device<BlockCache>(device);
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.defer)
    c.deferred.emplace_back(size_class(bytes), p);
  else
    c.free[size_class(bytes)].push_back(p);
}

void defer_block_releases(bool on) {
  BlockCache& c = per_device<BlockCache>(current_device());
  std::lock_guard<std::mutex> lock(c.mu);
  c.defer = on;
  if (on) return;
  for (const auto& [cls, p] : c.deferred) c.free[cls].push_back(p);
  c.deferred.clear();
}

void upload_bytes(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  if (param_uploads() && bytes <= 256) return store_param_bytes<256>(dst, src, bytes);
  if (param_uploads() && bytes <= 2048) return store_param_bytes<2048>(dst, src, bytes);
  const int lane = stream_lane();
  const cudaStream_t stream = current_stream();
  if (bytes > UploadRing::kHalf / 4) {  // large (prefill lists): the driver's own staging, waited for
    if (capturing_step())
      throw Error("step graph: an upload of " + std::to_string(bytes) + " bytes waits for the device");
    DI_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
    DI_CUDA_CHECK(cudaStreamSynchronize(stream));
    return;
  }
  // one ring per stream: a half's event then covers every copy issued from it
  UploadRing& r = per_device<std::array<UploadRing, 2>>(current_device())[static_cast<size_t>(lane)];
  std::lock_guard<std::mutex> lock(r.mu);
  if (!r.host) {
    DI_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&r.host), 2 * UploadRing::kHalf, cudaHostAllocPortable));
    for (cudaEvent_t& e : r.left) DI_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  size_t at = (r.used + 15) & ~size_t{15};
  if (at + bytes > UploadRing::kHalf) {
    if (capturing_step()) throw Error("step graph: the step's uploads overflow the staging ring");
    DI_CUDA_CHECK(cudaEventRecord(r.left[r.half], stream));
    r.pending[r.half] = true;
    r.half ^= 1;
    if (r.pending[r.half]) DI_CUDA_CHECK(cudaEventSynchronize(r.left[r.half]));  // its copies have run
    at = 0;
  }
  uint8_t* slot = r.host + static_cast<size_t>(r.half) * UploadRing::kHalf + at;
  std::memcpy(slot, src, bytes);
  DI_CUDA_CHECK(cudaMemcpyAsync(dst, slot, bytes, cudaMemcpyHostToDevice, stream));
  r.used = at + bytes;
}

void rewind_upload_rings() {
  for (UploadRing& r : per_device<std::array<UploadRing, 2>>(current_device())) {
    std::lock_guard<std::mutex> lock(r.mu);
    r.used = 0;
    r.half = 0;
    r.pending[0] = r.pending[1] = false;
  }
}

int sm_count() {
  static const int n = [] {
    int dev = 0, v = 0;
    DI_CUDA_CHECK(cudaGetDevice(&dev));
    DI_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
    return v;
  }();
  return n;
}

}  // namespace di::cuda
