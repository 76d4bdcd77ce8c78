// The tiled MXFP4 weight layout (fp4_layout.cuh): one permutation pass at upload.
#include <algorithm>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/fp4_layout.cuh"

namespace di::cuda::fp4 {
namespace {

// Row of tile T, lane group g, word j (2 mt + h).
__device__ __forceinline__ int64_t tile_row(int64_t t, int g, int j) { return 32 * t + 16 * (j >> 1) + 8 * (j & 1) + g; }

// 8 E2M1 codes (nibble i = code i) -> the word of fp4_layout.cuh: byte i holds code i as an E4M3
// byte of 2^-6 times its value (magnitude bits at 2-4, sign at 7) and code 4 + i in the other bits
// (m0 at 0, e0 at 1, sign at 5, e1 at 6), so mma::fp4_lo / fp4_hi recover both with a few logic ops.
__device__ __forceinline__ uint32_t encode_codes(uint32_t codes) {
  uint32_t out = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t c = (codes >> (4 * i)) & 15u, d = (codes >> (4 * i + 16)) & 15u;
    const uint32_t byte = ((c & 7u) << 2) | ((c >> 3) << 7) | (d & 3u) | (((d >> 2) & 1u) << 6) | ((d >> 3) << 5);
    out |= byte << (8 * i);
  }
  return out;
}

// One thread per 4-byte data word of the tiled layout.
__global__ void tile_data_kernel(const uint8_t* __restrict__ src, int64_t rows, int64_t cols, int64_t words,
                                 uint32_t* __restrict__ dst) {
  const int64_t nb = cols / 32;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < words;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int j = static_cast<int>(i % 4), lane = static_cast<int>(i / 4 % 32);
    const int64_t tkb = i / 128, t = tkb / nb, kb = tkb % nb;
    const int64_t r = tile_row(t, lane / 4, j);
    const uint32_t codes = r < rows ? *reinterpret_cast<const uint32_t*>(src + r * (cols / 2) + kb * 16 + 4 * (lane % 4)) : 0u;
    dst[i] = encode_codes(codes);
  }
}

// One thread per scale byte of the tiled layout.
__global__ void tile_scale_kernel(const uint8_t* __restrict__ src, int64_t scale_cols, int64_t rows, int64_t cols,
                                  int64_t n, uint8_t* __restrict__ dst) {
  const int64_t nb = cols / 32, nb4 = (nb + 3) / 4;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int b = static_cast<int>(i % 4), j = static_cast<int>(i / 4 % 4), g = static_cast<int>(i / 16 % 8);
    const int64_t tk = i / 128, t = tk / nb4, kb = 4 * (tk % nb4) + b;
    const int64_t r = tile_row(t, g, j);
    dst[i] = r < rows && kb < nb ? src[r * scale_cols + kb] : uint8_t{0};
  }
}

int grid_for(int64_t n) { return static_cast<int>(std::min<int64_t>(blocks_for(n, 256), 132 * 32)); }

}  // namespace

void tile(const uint8_t* data, const uint8_t* scales, int64_t scale_cols, int64_t rows, int64_t cols, uint8_t* dst) {
  DI_CHECK_MSG(cols % 32 == 0 && scale_cols >= cols / 32, "MXFP4 weight: columns must be a multiple of 32");
  const int64_t words = data_bytes(rows, cols) / 4, sb = scale_bytes(rows, cols);
  if (words == 0) return;
  tile_data_kernel<<<grid_for(words), 256>>>(data, rows, cols, words, reinterpret_cast<uint32_t*>(dst));
  DI_CUDA_LAUNCH_CHECK();
  tile_scale_kernel<<<grid_for(sb), 256>>>(scales, scale_cols, rows, cols, sb, dst + data_bytes(rows, cols));
  DI_CUDA_LAUNCH_CHECK();
}

}  // namespace di::cuda::fp4
