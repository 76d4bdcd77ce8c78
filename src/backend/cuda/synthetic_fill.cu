// Synthetic weights generated in device memory (device_tools.h prepare_synthetic): the benchmark's
// random V4.1 checkpoint (~100 GB for a GPU's worth of real-size layers) is produced at memory speed
// by a counter-based fill kernel instead of being read from disk or staged through the host. The
// values are exactly synthetic::fill_element's, so host- and device-filled tensors agree.
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/device_memory.cuh"
#include "backend/cuda/fp4_layout.cuh"
#include "backend/device_tools.h"

namespace di::device {

namespace {

// One thread per element, grid-stride: [n_elems * spec.elem_bytes] bytes at dst.
__global__ void synthetic_fill_kernel(uint8_t* dst, int64_t n_elems, synthetic::FillSpec spec) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n_elems; i += stride)
    synthetic::fill_element(spec, static_cast<uint64_t>(i), dst + i * spec.elem_bytes);
}

void fill(uint8_t* dst, int64_t n_elems, const synthetic::FillSpec& spec) {
  if (n_elems == 0) return;
  const int threads = 256;
  const int blocks = static_cast<int>(std::min<int64_t>(cuda::blocks_for(n_elems, threads), 132 * 64));
  synthetic_fill_kernel<<<blocks, threads>>>(dst, n_elems, spec);
  DI_CUDA_LAUNCH_CHECK();
}

void* device_malloc(size_t bytes) {
  void* p = nullptr;
  if (bytes > 0) {
    cudaError_t err = cudaMalloc(&p, bytes);
    if (err != cudaSuccess)
      throw Error("GPU out of memory allocating " + std::to_string(bytes) + " bytes of synthetic weights: " +
                  cudaGetErrorString(err));
  }
  return p;
}

}  // namespace

int64_t prepare_synthetic(Weight& w, const synthetic::FillSpec& data, const synthetic::FillSpec* scale) {
  // The layout CudaBackend::prepare uploads: [data bytes | scale bytes] in one allocation; MXFP4 is
  // filled row-major into a scratch block, then tiled (fp4_layout.cuh).
  const bool fp4 = w.mode == WeightMode::kFp4Expert;
  const int64_t data_bytes = fp4 ? w.rows * w.cols / 2 : cuda::weight_data_bytes(w);
  int64_t scale_bytes = 0;
  if (scale) {
    DI_CHECK_MSG(w.scale != nullptr && w.scale_rows > 0, "synthetic weight with a scale spec but no scale tensor");
    scale_bytes = w.scale_rows * w.scale_cols;
  }
  DI_CHECK(data_bytes % data.elem_bytes == 0 && (!scale || scale->elem_bytes == 1));
  DI_CHECK_MSG(!fp4 || (scale && w.scale_rows == w.rows), "synthetic MXFP4 weight without per-row scales");
  const size_t total = static_cast<size_t>(data_bytes + scale_bytes);
  auto own = [](void* q) {
    return std::shared_ptr<void>(q, [](void* b) {
      if (b) cudaFree(b);
    });
  };
  if (!fp4) {
    uint8_t* p = static_cast<uint8_t*>(device_malloc(total));
    fill(p, data_bytes / data.elem_bytes, data);
    if (scale) fill(p + data_bytes, scale_bytes, *scale);
    w.device = own(p);
    return static_cast<int64_t>(total);
  }
  // The row-major block comes from the stream-ordered block cache and goes back to it once the tiling
  // is queued (the next weight's fill runs after the tiling in stream order): no synchronization per
  // weight (a cudaFree per MXFP4 weight took the 17-layer model's load from 1.6 to 4.5 s).
  int device = 0;
  uint8_t* p = static_cast<uint8_t*>(cuda::device_block(total, &device));
  fill(p, data_bytes / data.elem_bytes, data);
  fill(p + data_bytes, scale_bytes, *scale);
  const size_t tiled = static_cast<size_t>(cuda::fp4::data_bytes(w.rows, w.cols) + cuda::fp4::scale_bytes(w.rows, w.cols));
  uint8_t* t = static_cast<uint8_t*>(device_malloc(tiled));
  cuda::fp4::tile(p, p + data_bytes, w.scale_cols, w.rows, w.cols, t);
  cuda::release_block(p, total, device);
  w.device = own(t);
  return static_cast<int64_t>(tiled);
}

}  // namespace di::device
