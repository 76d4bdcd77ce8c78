// Device memory of the CUDA backend's tensors and per-call scratch, and the small host-to-device
// copies its ops make per call -- the host-side costs that bound a small decode step.
//
// Blocks are cached on the host by size class and reused in stream order: every op runs on the
// default stream, so a block freed on the host can go to the next op at once (its kernels queue
// behind the ones still reading it). A free-list pop / push replaces cudaMallocAsync /
// cudaFreeAsync, about a microsecond of host time each, for the hundreds of tensors of a step.
//
// Uploads of up to 2 KB are a one-CTA kernel carrying the bytes as its parameters (a PDL launch, so
// the kernels around it still overlap); larger ones go through a pinned staging ring: from pageable
// memory the driver stages the copy itself (and may wait for the stream); from pinned memory
// cudaMemcpyAsync returns at once.
#pragma once

#include <cstddef>

namespace di::cuda {

// A device block of at least `bytes` (> 0) on the current device, from the cache or the driver;
// throws di::Error when the device is out of memory (after giving the cached blocks back).
void* device_block(size_t bytes, int* device);
// Returns a block of device_block(bytes, &device) to the cache of `device`; while releases are
// deferred (side-stream work pending, side_stream.cuh) it is kept aside until they are not.
void release_block(void* p, size_t bytes, int device);
// Turns deferral on, or off (the blocks kept aside go to the cache).
void defer_block_releases(bool on);

// dst (device) <- src (host, `bytes`), ordered on the current stream (side_stream.cuh); `src` may be
// reused as soon as this returns.
void upload_bytes(void* dst, const void* src, size_t bytes);
// Starts both upload rings' halves afresh; only while the device is idle (before a graph capture).
void rewind_upload_rings();

}  // namespace di::cuda
