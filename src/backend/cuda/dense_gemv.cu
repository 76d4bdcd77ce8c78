// One activation row through an FP8 block-scaled weight (decode at batch 1): y[n] = bf16(sum_k
// xd[k] w[n, k] s[n / 32, k / 32]) on the CUDA cores, where xd is the row quantized per 32 as
// quantized_linear quantizes it, then dequantized (code x scale: exact, both factors being an E4M3
// value and a power of two). Mathematically CpuBackend::linear's sum; its order differs (16-wide
// partials instead of 32-wide), so results equal the CPU's to fp32 rounding, as the MMA kernel's do.
//
// Why not the MMA kernel at one row: a memory-bound stream needs bytes in flight, and the MMA tile
// (168 registers, 12 warps per SM, one two-stage register pipeline per warp) kept ~32 KB in flight per
// SM -- wq_b at batch 1 ran at ~1.5-1.9 TB/s. Here a warp holds R rows x J 16-byte chunks per lane in
// flight (8 per lane, 4 KB per warp) at up to 24 warps per SM, and no MMA column is wasted on the
// absent tokens.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_quant.cuh"
#include "backend/cuda/dense_linear.cuh"
#include "backend/cuda/mma_gemm.cuh"

namespace di::cuda::dense {
namespace {

constexpr int kGemvWarps = 8;
constexpr int kGemvThreads = kGemvWarps * 32;
constexpr int kGemvMinCtas = 3;

// 16 E4M3 codes (a 16-byte chunk, low byte first) dotted with 16 floats, in order.
__device__ __forceinline__ float dot16_e4m3(const uint4& w, const float4 (&x)[4]) {
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 lo = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(words[i] & 0xFFFFu), __NV_E4M3)));
    const float2 hi = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(words[i] >> 16), __NV_E4M3)));
    s = fmaf(lo.x, x[i].x, s);
    s = fmaf(lo.y, x[i].y, s);
    s = fmaf(hi.x, x[i].z, s);
    s = fmaf(hi.y, x[i].w, s);
  }
  return s;
}

// Grid-stride over groups of R rows; a warp's lanes cover K in 16-byte chunks (lane + 32 j), J chunks
// per lane per step. Shared memory: xd [4][K / 16] float4 -- float4 i of chunk c at i * K / 16 + c, so
// the lanes of a warp, on consecutive chunks, read consecutive 16 bytes (no bank conflicts); each
// chunk's 16 floats are read once for the R rows.
template <int R, int J>
__global__ void __launch_bounds__(kGemvThreads, kGemvMinCtas)
    gemv_fp8_kernel(const float* __restrict__ x, const uint8_t* __restrict__ w, const uint8_t* __restrict__ ws,
                    int64_t scale_cols, int N, int K, float* __restrict__ y) {
  extern __shared__ float xd[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  // the row quantized per 32 (one warp per block, 8 blocks' loads in flight), kept dequantized
  constexpr int kBatch = 8;
  const int nb = K / 32;
  for (int b0 = warp; b0 < nb; b0 += kGemvWarps * kBatch) {
    float v[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int b = b0 + j * kGemvWarps;
      v[j] = b < nb ? x[b * 32 + lane] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int b = b0 + j * kGemvWarps;
      if (b >= nb) break;  // warp-uniform
      const int e = dq::round_scale_exponent(dq::group_amax<32>(v[j], dq::kFp8AmaxFloor), dq::kFp8MaxInv);
      const float sx = e8m0_to_float(dq::e8m0_byte(e));
      const int k = b * 32 + lane;  // chunk k / 16, float4 (k % 16) / 4, element k % 4
      xd[(((k % 16) / 4) * (K / 16) + k / 16) * 4 + k % 4] = e4m3_to_float(dq::fp8_code(v[j], dq::scale_from_exponent(e))) * sx;
    }
  }
  __syncthreads();
  const int chunks = K / 16;
  const int groups = (N + R - 1) / R;
  for (int grp = blockIdx.x * kGemvWarps + warp; grp < groups; grp += gridDim.x * kGemvWarps) {
    const int n0 = grp * R;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
    for (int c0 = 0; c0 < chunks; c0 += 32 * J) {
      uint4 wv[R][J];
      uint8_t sb[R][J];
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int j = 0; j < J; ++j) {
          const int c = c0 + lane + 32 * j, n = n0 + r;
          const bool in = c < chunks && n < N;
          wv[r][j] = in ? mma::ld_stream16(w + static_cast<int64_t>(n) * K + 16 * c) : make_uint4(0u, 0u, 0u, 0u);
          sb[r][j] = in ? __ldg(ws + static_cast<int64_t>(n / 32) * scale_cols + c / 2) : uint8_t{0};
        }
#pragma unroll
      for (int j = 0; j < J; ++j) {
        const int c = c0 + lane + 32 * j;
        if (c >= chunks) break;
        const float4* xc = reinterpret_cast<const float4*>(xd) + c;
        const float4 xv[4] = {xc[0], xc[chunks], xc[2 * chunks], xc[3 * chunks]};
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] = fmaf(dot16_e4m3(wv[r][j], xv), e8m0_to_float(sb[r][j]), acc[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float v = acc[r];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == r && n0 + r < N) y[n0 + r] = dq::round_bf16(v);
    }
  }
}

int gemv_sms() {
  static const int n = [] {
    int v = 0;
    DI_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, 0));
    return std::max(v, 1);
  }();
  return n;
}

template <int R, int J>
void launch_gemv(const float* x, const Weight& w, float* y) {
  const int N = static_cast<int>(w.rows), K = static_cast<int>(w.cols);
  const size_t smem = static_cast<size_t>(K) * 4;
  static const bool configured = [] {
    DI_CUDA_CHECK(cudaFuncSetAttribute(gemv_fp8_kernel<R, J>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       kGemvMaxK * 4));
    return true;
  }();
  (void)configured;
  const int64_t groups = (N + R - 1) / R;
  const int64_t ctas = std::min<int64_t>((groups + kGemvWarps - 1) / kGemvWarps, int64_t{kGemvMinCtas} * gemv_sms());
  gemv_fp8_kernel<R, J><<<static_cast<unsigned>(ctas), kGemvThreads, smem>>>(x, wdata(w), wscale(w), w.scale_cols, N,
                                                                               K, y);
  DI_CUDA_LAUNCH_CHECK();
}

}  // namespace

bool gemv_fp8_fits(int64_t rows, const Weight& w) {
  return rows == 1 && w.mode == WeightMode::kFp8Block && w.cols % 32 == 0 && w.cols <= kGemvMaxK &&
         reinterpret_cast<uintptr_t>(wdata(w)) % 16 == 0;
}

void gemv_fp8(const float* x, const Weight& w, float* y) {
  DI_CHECK(gemv_fp8_fits(1, w));
  // 8 chunks of 16 bytes per lane in flight: rows x chunks per lane by K's chunks per lane
  const int64_t per_lane = (w.cols / 16 + 31) / 32;
  if (per_lane >= 8) return launch_gemv<1, 8>(x, w, y);
  if (per_lane >= 4) return launch_gemv<2, 4>(x, w, y);
  if (per_lane >= 2) return launch_gemv<4, 2>(x, w, y);
  return launch_gemv<8, 1>(x, w, y);
}

}  // namespace di::cuda::dense
