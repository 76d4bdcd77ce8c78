// CUDA backend: device, memory, transfers, weight upload.
#include <algorithm>
#include <cstring>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_scratch.cuh"
#include "backend/cuda/fp4_layout.cuh"
#include "backend/cuda/pdl_launch.cuh"
#include "backend/cuda/side_stream.cuh"
#include "backend/cuda/step_graph.cuh"
#include "core/env_switch.h"

namespace di {

std::unique_ptr<Backend> make_cuda_backend() { return std::make_unique<CudaBackend>(); }

namespace {

size_t elem_size(TType t) { return t == TType::kU8 ? 1 : 4; }

std::shared_ptr<void> device_alloc(size_t bytes) {
  void* p = nullptr;
  if (bytes > 0) {
    cudaError_t err = cudaMalloc(&p, bytes);
    if (err != cudaSuccess)
      throw Error("GPU out of memory allocating " + std::to_string(bytes) + " bytes: " + cudaGetErrorString(err));
  }
  return std::shared_ptr<void>(p, [](void* q) {
    if (q) cudaFree(q);
  });
}

// Tensor memory: blocks of the stream-ordered cache (device_memory.cuh), so a steady-state op
// allocates nothing from the driver and freeing never waits for the device (cudaFree would
// synchronize after every op). Ops run on the default stream, or on the side stream between
// side_begin and side_end (side_stream.cuh says why that is safe).
std::shared_ptr<void> tensor_alloc(size_t bytes) {
  if (bytes == 0) return nullptr;
  int device = 0;
  void* p = cuda::device_block(bytes, &device);
  return std::shared_ptr<void>(p, [bytes, device](void* q) { cuda::release_block(q, bytes, device); });
}

// One piece of a copy_rows_batch: a CTA copies it, in 16-byte words when everything is aligned.
struct CopyPiece {
  uint8_t* dst;
  const uint8_t* src;
  int64_t bytes;
};
constexpr int64_t kCopyPieceBytes = 64 << 10;  // long copies spread over CTAs
constexpr int kCopyThreads = 256;

__global__ void copy_pieces_kernel(const CopyPiece* __restrict__ pieces) {
  ::di::cuda::grid_dependency_wait();
  const CopyPiece c = pieces[blockIdx.x];
  if (((reinterpret_cast<uintptr_t>(c.dst) | reinterpret_cast<uintptr_t>(c.src) | c.bytes) & 15) == 0) {
    const uint4* s = reinterpret_cast<const uint4*>(c.src);
    uint4* d = reinterpret_cast<uint4*>(c.dst);
    for (int64_t i = threadIdx.x; i < c.bytes / 16; i += kCopyThreads) d[i] = s[i];
  } else {
    for (int64_t i = threadIdx.x; i < c.bytes; i += kCopyThreads) c.dst[i] = c.src[i];
  }
}

}  // namespace

CudaBackend::CudaBackend() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) throw Error("--device cuda: no CUDA device found");
  cudaDeviceProp prop{};
  DI_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  if (prop.major != 9)
    throw Error(std::string("--device cuda: this build targets Hopper (sm_90a); found ") + prop.name + " (sm_" +
                std::to_string(prop.major) + std::to_string(prop.minor) + ")");
  rope_uploads_ = std::make_unique<cuda::UploadCache>();
  page_uploads_ = std::make_unique<cuda::UploadCache>();
  if (env_switch_on("DEEPINFER_LIST_CACHE")) list_uploads_ = std::make_unique<cuda::UploadCache>();
  fused_chains_ = env_switch_on("DEEPINFER_FUSED_CHAINS");
  output_codes_ = env_switch_on("DEEPINFER_OUTPUT_CODES");
  wide_inject_ = env_switch_on("DEEPINFER_WIDE_INJECT");
}

CudaBackend::~CudaBackend() = default;

void* CudaBackend::PinnedBuffer::reserve(size_t n) {
  if (bytes < n) {
    if (data) DI_CUDA_CHECK(cudaFreeHost(data));
    data = nullptr;
    bytes = 0;
    DI_CUDA_CHECK(cudaMallocHost(&data, n));
    bytes = n;
  }
  return data;
}

CudaBackend::PinnedBuffer::~PinnedBuffer() {
  if (data) cudaFreeHost(data);
}

int* CudaBackend::embed_bad_flag() {
  if (!embed_bad_.data) *static_cast<int*>(embed_bad_.reserve(sizeof(int))) = 0;
  return static_cast<int*>(embed_bad_.data);  // pinned memory is mapped for the device (unified addressing)
}

void CudaBackend::check_embed_ids() {
  if (!embed_bad_.data) return;
  volatile int* bad = static_cast<volatile int*>(embed_bad_.data);
  if (*bad == 0) return;
  *bad = 0;
  throw Error("embed: a token id out of range of the embedding table (its rows are NaN)");
}

void CudaBackend::side_begin() { cuda::side_begin(); }
void CudaBackend::side_end() { cuda::side_end(); }
void CudaBackend::side_join() { cuda::side_join(); }
int CudaBackend::side_mark() { return cuda::side_mark(); }
void CudaBackend::side_wait(int mark) { cuda::side_wait(mark); }

// The copies to the host run on the main stream: a tensor the side stream wrote is complete only
// after a join.
void CudaBackend::copy_to_host(void* dst, const void* src, size_t bytes) {
  if (cuda::capturing_step()) throw Error("step graph: a read-back to the host inside the captured step");
  cuda::side_join();
  if (bytes < (size_t{1} << 20)) {  // small: the pageable path's fixed cost is lower
    DI_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
  } else {
    std::lock_guard<std::mutex> lock(staging_mutex_);
    void* pinned = staging_.reserve(bytes);
    DI_CUDA_CHECK(cudaMemcpy(pinned, src, bytes, cudaMemcpyDeviceToHost));
    std::memcpy(dst, pinned, bytes);
  }
  check_embed_ids();
}

Tensor CudaBackend::alloc(TType type, const std::vector<int64_t>& shape) {
  Tensor t;
  t.type = type;
  t.shape = shape;
  t.storage = tensor_alloc(static_cast<size_t>(t.numel()) * elem_size(type));
  t.data = t.storage.get();
  return t;
}

Tensor CudaBackend::zeros(TType type, const std::vector<int64_t>& shape) {
  Tensor t = alloc(type, shape);
  if (t.numel())
    DI_CUDA_CHECK(cudaMemsetAsync(t.data, 0, static_cast<size_t>(t.numel()) * elem_size(type), cuda::current_stream()));
  return t;
}

Tensor CudaBackend::from_host_f32(const std::vector<float>& v, const std::vector<int64_t>& shape) {
  Tensor t = alloc(TType::kF32, shape);
  DI_CHECK(static_cast<int64_t>(v.size()) == t.numel());
  cuda::upload_bytes(t.data, v.data(), v.size() * 4);
  return t;
}

Tensor CudaBackend::from_host_i32(const std::vector<int32_t>& v, const std::vector<int64_t>& shape) {
  Tensor t = alloc(TType::kI32, shape);
  DI_CHECK(static_cast<int64_t>(v.size()) == t.numel());
  cuda::upload_bytes(t.data, v.data(), v.size() * 4);
  return t;
}

std::vector<float> CudaBackend::to_host_f32(const Tensor& t) {
  DI_CHECK(t.type == TType::kF32);
  std::vector<float> v(t.numel());
  if (!v.empty()) copy_to_host(v.data(), t.data, v.size() * 4);
  return v;
}

std::span<const float> CudaBackend::to_host_f32_staged(const Tensor& t) {
  DI_CHECK(t.type == TType::kF32);
  const size_t n = static_cast<size_t>(t.numel());
  if (n == 0) return {};
  auto* host = static_cast<float*>(staged_view_.reserve(n * 4));
  cuda::side_join();
  if (cuda::capturing_step()) {  // the graph's last node: the step's logits into the same pinned buffer
    DI_CUDA_CHECK(cudaMemcpyAsync(host, t.data, n * 4, cudaMemcpyDeviceToHost, cuda::current_stream()));
    return {host, n};
  }
  DI_CUDA_CHECK(cudaMemcpy(host, t.data, n * 4, cudaMemcpyDeviceToHost));
  check_embed_ids();
  return {host, n};
}

std::vector<int32_t> CudaBackend::to_host_i32(const Tensor& t) {
  DI_CHECK(t.type == TType::kI32);
  std::vector<int32_t> v(t.numel());
  if (!v.empty()) copy_to_host(v.data(), t.data, v.size() * 4);
  return v;
}

void CudaBackend::copy_rows(Tensor& dst, int64_t d0, const Tensor& src, int64_t s0, int64_t n) {
  DI_CHECK(dst.type == src.type && dst.row_size() == src.row_size());
  DI_CHECK(d0 >= 0 && s0 >= 0 && d0 + n <= dst.rows() && s0 + n <= src.rows());
  size_t rb = static_cast<size_t>(src.row_size()) * elem_size(src.type);
  // stream-ordered on the stream the kernels use; no host involvement beyond the enqueue
  if (n > 0)
    DI_CUDA_CHECK(cudaMemcpyAsync(static_cast<uint8_t*>(dst.data) + d0 * rb, static_cast<uint8_t*>(src.data) + s0 * rb,
                                  n * rb, cudaMemcpyDeviceToDevice, cuda::current_stream()));
}

void CudaBackend::copy_rows_batch(const std::vector<RowCopy>& copies) {
  std::vector<CopyPiece> pieces;
  for (const RowCopy& c : copies) {
    DI_CHECK(c.dst.type == c.src.type && c.dst.row_size() == c.src.row_size());
    DI_CHECK(c.d0 >= 0 && c.s0 >= 0 && c.n >= 0 && c.d0 + c.n <= c.dst.rows() && c.s0 + c.n <= c.src.rows());
    const int64_t rb = c.src.row_size() * static_cast<int64_t>(elem_size(c.src.type)), bytes = c.n * rb;
    auto* d = static_cast<uint8_t*>(c.dst.data) + c.d0 * rb;
    const auto* s = static_cast<const uint8_t*>(c.src.data) + c.s0 * rb;
    for (int64_t at = 0; at < bytes; at += kCopyPieceBytes)
      pieces.push_back({d + at, s + at, std::min(kCopyPieceBytes, bytes - at)});
  }
  if (pieces.empty()) return;
  const cuda::Scratch dev = cuda::upload(pieces);
  constexpr size_t kMaxGrid = 65535;
  for (size_t p0 = 0; p0 < pieces.size(); p0 += kMaxGrid) {
    const auto n = static_cast<unsigned>(std::min(kMaxGrid, pieces.size() - p0));
    ::di::cuda::launch(copy_pieces_kernel, n, kCopyThreads, 0, dev.as<CopyPiece>() + p0);
  }
}

Tensor CudaBackend::concat_cols(const Tensor& a, const Tensor& b) {
  DI_CHECK(a.type == b.type && a.type != TType::kU8 && a.rows() == b.rows());  // 4-byte elements
  int64_t ca = a.row_size(), cb = b.row_size();
  Tensor out = alloc(a.type, {a.rows(), ca + cb});
  if (a.rows() == 0) return out;
  if (ca)
    DI_CUDA_CHECK(cudaMemcpy2DAsync(out.i32(), (ca + cb) * 4, a.i32(), ca * 4, ca * 4, a.rows(), cudaMemcpyDeviceToDevice,
                                    cuda::current_stream()));
  if (cb)
    DI_CUDA_CHECK(
        cudaMemcpy2DAsync(out.i32() + ca, (ca + cb) * 4, b.i32(), cb * 4, cb * 4, b.rows(), cudaMemcpyDeviceToDevice,
                          cuda::current_stream()));
  return out;
}

namespace cuda {

int64_t weight_data_bytes(const Weight& w) {
  switch (w.mode) {
    case WeightMode::kFp8Block: return w.rows * w.cols;
    case WeightMode::kFp4Expert: return fp4::data_bytes(w.rows, w.cols);  // tiled (fp4_layout.cuh)
    default: return w.rows * w.cols * static_cast<int64_t>(dtype_size(w.dtype));
  }
}

}  // namespace cuda

void CudaBackend::prepare(Weight& w) {
  // One device allocation: data bytes, then (FP8/FP4) the E8M0 scale bytes. Copied straight from
  // the mmapped checkpoint, never staged through a second host copy; MXFP4 goes through a device
  // buffer into the tiled layout of the GEMM tiles (fp4_layout.cuh).
  if (w.mode == WeightMode::kFp4Expert) {
    DI_CHECK_MSG(w.scale != nullptr && (w.scale_rows == 0 || w.scale_rows == w.rows),
                 "MXFP4 weight without one row of E8M0 scales per weight row");
    const int64_t data = w.rows * w.cols / 2, scale = w.rows * w.scale_cols;
    std::shared_ptr<void> rowmajor = tensor_alloc(static_cast<size_t>(data + scale));
    uint8_t* staged = static_cast<uint8_t*>(rowmajor.get());
    DI_CUDA_CHECK(cudaMemcpy(staged, w.data, data, cudaMemcpyHostToDevice));
    DI_CUDA_CHECK(cudaMemcpy(staged + data, w.scale, scale, cudaMemcpyHostToDevice));
    const int64_t tiled = cuda::fp4::data_bytes(w.rows, w.cols) + cuda::fp4::scale_bytes(w.rows, w.cols);
    w.device = device_alloc(static_cast<size_t>(tiled));
    cuda::fp4::tile(staged, staged + data, w.scale_cols, w.rows, w.cols, static_cast<uint8_t*>(w.device.get()));
    weight_bytes_ += tiled;
    return;  // the staging block returns to the cache in stream order, after the tiling kernels
  }
  int64_t data = cuda::weight_data_bytes(w);
  int64_t scale = 0;
  if (w.scale) {
    int64_t scale_rows = w.scale_rows > 0 ? w.scale_rows : (w.mode == WeightMode::kFp8Block ? (w.rows + 31) / 32 : w.rows);
    scale = scale_rows * w.scale_cols;
  }
  w.device = device_alloc(static_cast<size_t>(data + scale));
  DI_CUDA_CHECK(cudaMemcpy(w.device.get(), w.data, data, cudaMemcpyHostToDevice));
  if (scale)
    DI_CUDA_CHECK(cudaMemcpy(static_cast<uint8_t*>(w.device.get()) + data, w.scale, scale, cudaMemcpyHostToDevice));
  weight_bytes_ += data + scale;
}

}  // namespace di
