// CUDA GEMMs of linear / grouped_linear (first version: CUDA cores, no tensor cores).
//
// Quantized weights (kFp8Block, kFp4Expert) reproduce CpuBackend::linear bit for bit: the activation
// is quantized by the bit-exact device quantizer; each 32-wide K block's partial is summed in the
// CPU dot's order (8 strided fp32 chains, then ((0+1)+(2+3))+((4+5)+(6+7))) -- the products of
// E4M3 x E4M3 / E4M3 x E2M1 are exact in fp32, so an FMA equals the CPU's multiply-then-add -- then
// scaled (partial * act scale * weight scale) and added to the fp32 accumulator in K-block order.
//
// Layout: one warp per output feature, weights streamed once per 32-row activation tile with
// coalesced 16-byte loads (the next chunk prefetched); lanes compute block partials for all rows of
// the tile, write them to shared memory, and lane r adds row r's partials in K order.
//
// Float weights (kBf16, kF32, grouped wo_a): one warp per output feature, lanes split K in 8-element
// chunks, up to 8 rows per pass, warp-shuffle reduction. Summation order differs from the CPU's
// (fp32 for bf16 outputs: within rounding; fp64 for kF32: the fp32 result is order-independent
// except in cancellation corner cases).
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_quant.cuh"
#include "backend/cuda/dense_linear.cuh"
#include "backend/cuda/dense_scratch.cuh"

namespace di::cuda::dense {
namespace {

using dq::kFullMask;

constexpr int kWarps = 4;      // output features (warps) per CTA
constexpr int kRowTile = 32;   // activation rows per CTA of the quantized GEMM (one lane each)
constexpr int kFloatRows = 8;  // activation rows per CTA of the float GEMM (registers per lane)

__device__ __forceinline__ uint4 ldg16(const uint8_t* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }

// 4 E4M3 codes (bytes of u, low first) -> 4 floats, exact (E4M3 is a subset of f16).
__device__ __forceinline__ void e4m3x4(uint32_t u, float* out) {
  const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(u & 0xFFFFu), __NV_E4M3);
  const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(u >> 16), __NV_E4M3);
  const float2 a = __half22float2(__half2(lo)), b = __half22float2(__half2(hi));
  out[0] = a.x;
  out[1] = a.y;
  out[2] = b.x;
  out[3] = b.y;
}

__device__ __forceinline__ void e4m3x16(const uint4& v, float* out) {
  e4m3x4(v.x, out);
  e4m3x4(v.y, out + 4);
  e4m3x4(v.z, out + 8);
  e4m3x4(v.w, out + 12);
}

// 8 E2M1 codes (nibbles of u, low first) -> 8 floats.
__device__ __forceinline__ void e2m1x8(uint32_t u, float* out) {
#pragma unroll
  for (int i = 0; i < 8; ++i) out[i] = dq::e2m1_to_float_fast(u >> (4 * i));
}

// cpu::dot(a, b, 32) in the same order; every product a[i]*b[i] must be exact in fp32.
__device__ __forceinline__ float block_dot32(const float* a, const float* b) {
  float s[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) s[j] = fmaf(a[j], b[j], 0.0f);
#pragma unroll
  for (int i = 8; i < 32; i += 8)
#pragma unroll
    for (int j = 0; j < 8; ++j) s[j] = fmaf(a[i + j], b[i + j], s[j]);
  const float sum = __fadd_rn(__fadd_rn(__fadd_rn(s[0], s[1]), __fadd_rn(s[2], s[3])),
                              __fadd_rn(__fadd_rn(s[4], s[5]), __fadd_rn(s[6], s[7])));
  return __fadd_rn(sum, 0.0f);  // + the (empty) tail sum, as the CPU
}

// [S*K/32 blocks] one warp per 32-value block: x f32 -> codes e4m3 + scale f32 (e8m0 value).
// Reads 4 B and writes 1.125 B per element.
__global__ void act_quant_kernel(const float* __restrict__ x, int64_t nblocks, uint8_t* __restrict__ codes,
                                 float* __restrict__ scales) {
  const int64_t blk = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (blk >= nblocks) return;  // whole warps leave together
  const int lane = threadIdx.x & 31;
  const float v = x[blk * 32 + lane];
  const int e = dq::round_scale_exponent(dq::group_amax<32>(v, dq::kFp8AmaxFloor), dq::kFp8MaxInv);
  codes[blk * 32 + lane] = dq::fp8_code(v, dq::scale_from_exponent(e));
  if (lane == 0) scales[blk] = e8m0_to_float(dq::e8m0_byte(e));
}

// Sums the scaled block partials pw[lane][0..cnt) of this warp's tile into lane's accumulator.
__device__ __forceinline__ void add_partials(float& acc, const float (*pw)[33], int lane, int rows, int cnt) {
  __syncwarp();
  if (lane < rows)
    for (int j = 0; j < cnt; ++j) acc = __fadd_rn(acc, pw[lane][j]);
  __syncwarp();
}

// kFp8Block: W [N, K] e4m3 + E8M0 [ceil(N/32), scale_cols]. Grid (ceil(N/4), ceil(S/32)).
// Bytes per call: N*K weights + N*K/1024 scales from DRAM (re-read from L2 by each further 32-row
// tile), S*K*(1+1/8) activation codes+scales per output warp from L1/L2, 4*S*N written.
// FLOPs 2*S*N*K on CUDA cores.
__global__ void __launch_bounds__(kWarps * 32)
    fp8_linear_kernel(const uint8_t* __restrict__ xc, const float* __restrict__ xs, const uint8_t* __restrict__ w,
                      const uint8_t* __restrict__ wscale, int64_t scale_cols, int S, int N, int K,
                      float* __restrict__ y) {
  __shared__ float part[kWarps][kRowTile][33];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, half = lane & 1;
  const int o = blockIdx.x * kWarps + warp;
  if (o >= N) return;
  const int r0 = blockIdx.y * kRowTile;
  const int rows = min(kRowTile, S - r0);
  const int nb = K / 32;
  const uint8_t* wrow = w + static_cast<int64_t>(o) * K;
  const uint8_t* srow = wscale + static_cast<int64_t>(o / 32) * scale_cols;
  float(*pw)[33] = part[warp];
  float acc = 0.0f;
  // Lane pair (2m, 2m+1) holds K block kb0 + m: each loads one 16-byte half, then they swap halves.
  uint4 next = (lane >> 1) < nb ? ldg16(wrow + (lane >> 1) * 32 + half * 16) : make_uint4(0, 0, 0, 0);
  for (int kb0 = 0; kb0 < nb; kb0 += 16) {
    const int kb = kb0 + (lane >> 1);
    const bool valid = kb < nb;
    const uint4 mine = next;
    if (kb + 16 < nb) next = ldg16(wrow + (kb + 16) * 32 + half * 16);
    const float ws = valid ? e8m0_to_float(srow[kb]) : 0.0f;
    uint4 other;
    other.x = __shfl_xor_sync(kFullMask, mine.x, 1);
    other.y = __shfl_xor_sync(kFullMask, mine.y, 1);
    other.z = __shfl_xor_sync(kFullMask, mine.z, 1);
    other.w = __shfl_xor_sync(kFullMask, mine.w, 1);
    float wf[32];
    e4m3x16(half ? other : mine, wf);
    e4m3x16(half ? mine : other, wf + 16);
    if (valid) {
      // the two lanes of a pair split the rows (even / odd)
      for (int rr = half; rr < rows; rr += 2) {
        const int64_t row = r0 + rr;
        const uint8_t* xr = xc + row * K + kb * 32;
        float xf[32];
        e4m3x16(ldg16(xr), xf);
        e4m3x16(ldg16(xr + 16), xf + 16);
        const float p = block_dot32(xf, wf);
        pw[rr][lane >> 1] = __fmul_rn(__fmul_rn(p, __ldg(xs + row * nb + kb)), ws);
      }
    }
    add_partials(acc, pw, lane, rows, min(16, nb - kb0));
  }
  if (lane < rows) y[static_cast<int64_t>(r0 + lane) * N + o] = dq::round_bf16(acc);
}

// kFp4Expert: W [N, K/2] E2M1 pairs (even column low nibble) + E8M0 [N, scale_cols].
// Grid (ceil(N/4), ceil(S/32)). Bytes per call: N*K/2 weights + N*K/32 scales from DRAM (re-read
// from L2 by further row tiles), activations as fp8_linear_kernel, 4*S*N written.
__global__ void __launch_bounds__(kWarps * 32)
    fp4_linear_kernel(const uint8_t* __restrict__ xc, const float* __restrict__ xs, const uint8_t* __restrict__ w,
                      const uint8_t* __restrict__ wscale, int64_t scale_cols, int S, int N, int K,
                      float* __restrict__ y) {
  __shared__ float part[kWarps][kRowTile][33];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int o = blockIdx.x * kWarps + warp;
  if (o >= N) return;
  const int r0 = blockIdx.y * kRowTile;
  const int rows = min(kRowTile, S - r0);
  const int nb = K / 32;
  const uint8_t* wrow = w + static_cast<int64_t>(o) * (K / 2);
  const uint8_t* srow = wscale + static_cast<int64_t>(o) * scale_cols;
  float(*pw)[33] = part[warp];
  float acc = 0.0f;
  // Lane l holds K block kb0 + l: 16 bytes = 32 codes.
  uint4 next = lane < nb ? ldg16(wrow + lane * 16) : make_uint4(0, 0, 0, 0);
  for (int kb0 = 0; kb0 < nb; kb0 += 32) {
    const int kb = kb0 + lane;
    const bool valid = kb < nb;
    const uint4 mine = next;
    if (kb + 32 < nb) next = ldg16(wrow + (kb + 32) * 16);
    if (valid) {
      const float ws = e8m0_to_float(srow[kb]);
      float wf[32];
      e2m1x8(mine.x, wf);
      e2m1x8(mine.y, wf + 8);
      e2m1x8(mine.z, wf + 16);
      e2m1x8(mine.w, wf + 24);
      for (int rr = 0; rr < rows; ++rr) {
        const int64_t row = r0 + rr;
        const uint8_t* xr = xc + row * K + kb * 32;
        float xf[32];
        e4m3x16(ldg16(xr), xf);
        e4m3x16(ldg16(xr + 16), xf + 16);
        const float p = block_dot32(xf, wf);
        pw[rr][lane] = __fmul_rn(__fmul_rn(p, __ldg(xs + row * nb + kb)), ws);
      }
    }
    add_partials(acc, pw, lane, rows, min(32, nb - kb0));
  }
  if (lane < rows) y[static_cast<int64_t>(r0 + lane) * N + o] = dq::round_bf16(acc);
}

// ---- float weights ----------------------------------------------------------------------------------

enum class WKind { kBf16, kF16, kF32, kFp8Scaled };

// kVec consecutive weight values of row o at column k (kVec = 8: k % 8 == 0 and rows 16-byte aligned).
template <WKind kKind, int kVec>
__device__ __forceinline__ void load_w(const uint8_t* __restrict__ w, const uint8_t* __restrict__ wscale,
                                       int64_t scale_cols, int o, int K, int k, float* out) {
  const int64_t e0 = static_cast<int64_t>(o) * K + k;
  if constexpr (kKind == WKind::kBf16) {
    if constexpr (kVec == 8) {
      const uint4 v = ldg16(w + e0 * 2);
      const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        out[2 * i] = __uint_as_float(u[i] << 16);
        out[2 * i + 1] = __uint_as_float(u[i] & 0xFFFF0000u);
      }
    } else {
      out[0] = bf16_bits_to_float(__ldg(reinterpret_cast<const unsigned short*>(w) + e0));
    }
  } else if constexpr (kKind == WKind::kF16) {
    if constexpr (kVec == 8) {
      const uint4 v = ldg16(w + e0 * 2);
      const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        __half2_raw r;
        r.x = static_cast<unsigned short>(u[i] & 0xFFFFu);
        r.y = static_cast<unsigned short>(u[i] >> 16);
        const float2 f = __half22float2(__half2(r));
        out[2 * i] = f.x;
        out[2 * i + 1] = f.y;
      }
    } else {
      __half_raw r;
      r.x = __ldg(reinterpret_cast<const unsigned short*>(w) + e0);
      out[0] = __half2float(__half(r));
    }
  } else if constexpr (kKind == WKind::kF32) {
    const float* p = reinterpret_cast<const float*>(w) + e0;
    if constexpr (kVec == 8) {
      const float4 a = __ldg(reinterpret_cast<const float4*>(p)), b = __ldg(reinterpret_cast<const float4*>(p) + 1);
      out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
      out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
    } else {
      out[0] = __ldg(p);
    }
  } else {  // kFp8Scaled: e4m3 x the block's E8M0 scale (exact: the CPU's dequantized weight)
    const float s = e8m0_to_float(__ldg(wscale + static_cast<int64_t>(o / 32) * scale_cols + k / 32));
    if constexpr (kVec == 8) {
      const uint2 v = __ldg(reinterpret_cast<const uint2*>(w + e0));
      e4m3x4(v.x, out);
      e4m3x4(v.y, out + 4);
#pragma unroll
      for (int i = 0; i < 8; ++i) out[i] = __fmul_rn(out[i], s);
    } else {
      out[0] = __fmul_rn(e4m3_to_float(__ldg(w + e0)), s);
    }
  }
}

template <int kVec>
__device__ __forceinline__ void load_x(const float* __restrict__ p, float* out) {
  if constexpr (kVec == 8) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(p)), b = __ldg(reinterpret_cast<const float4*>(p) + 1);
    out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
    out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
  } else {
    out[0] = __ldg(p);
  }
}

template <typename Acc>
__device__ __forceinline__ Acc warp_sum(Acc v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

// y[S, N] = x W^T with float weights; Acc = float (bf16 out) or double (fp32 out). For grouped
// projections, output o reads the x columns [(o / rows_per_group) * K, +K) of a row of x_stride.
// Grid (ceil(N/4), ceil(S/8)). Bytes per call: N*K*sizeof(w) from DRAM (re-read from L2 by each
// further 8-row tile), S*K*4 activations per output warp from L1/L2, 4*S*N written.
template <typename Acc, WKind kKind, int kVec>
__global__ void __launch_bounds__(kWarps * 32)
    float_linear_kernel(const float* __restrict__ x, int64_t x_stride, int rows_per_group, const uint8_t* __restrict__ w,
                        const uint8_t* __restrict__ wscale, int64_t scale_cols, int S, int N, int K, bool bf16_out,
                        float* __restrict__ y) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int o = blockIdx.x * kWarps + warp;
  if (o >= N) return;
  const int r0 = blockIdx.y * kFloatRows;
  const int rows = min(kFloatRows, S - r0);
  const float* xb = x + static_cast<int64_t>(r0) * x_stride + static_cast<int64_t>(o / rows_per_group) * K;
  Acc acc[kFloatRows];
#pragma unroll
  for (int r = 0; r < kFloatRows; ++r) acc[r] = Acc(0);
  for (int k = lane * kVec; k < K; k += 32 * kVec) {
    float wv[kVec];
    load_w<kKind, kVec>(w, wscale, scale_cols, o, K, k, wv);
#pragma unroll
    for (int r = 0; r < kFloatRows; ++r) {
      if (r < rows) {
        float xv[kVec];
        load_x<kVec>(xb + r * x_stride + k, xv);
#pragma unroll
        for (int i = 0; i < kVec; ++i) acc[r] = fma(static_cast<Acc>(xv[i]), static_cast<Acc>(wv[i]), acc[r]);
      }
    }
  }
  Acc mine = Acc(0);
#pragma unroll
  for (int r = 0; r < kFloatRows; ++r) {
    const Acc t = warp_sum(acc[r]);
    if (lane == r) mine = t;
  }
  if (lane < rows) {
    const float f = static_cast<float>(mine);  // fp64 -> fp32 rounds to nearest
    y[static_cast<int64_t>(r0 + lane) * N + o] = bf16_out ? dq::round_bf16(f) : f;
  }
}

template <typename Acc, WKind kKind>
void launch_float(const float* x, int64_t x_stride, int rows_per_group, const Weight& w, int64_t S, bool bf16_out,
                  float* y) {
  const int N = static_cast<int>(w.rows), K = static_cast<int>(w.cols);
  const dim3 grid(static_cast<unsigned>(blocks_for(N, kWarps)), static_cast<unsigned>(blocks_for(S, kFloatRows)));
  const uint8_t* sc = w.scale ? wscale(w) : nullptr;
  // 8-wide vector loads need 16-byte aligned rows of x and W: K % 8 == 0 (x_stride too).
  if (K % 8 == 0 && x_stride % 8 == 0)
    float_linear_kernel<Acc, kKind, 8><<<grid, kWarps * 32>>>(x, x_stride, rows_per_group, wdata(w), sc, w.scale_cols,
                                                              static_cast<int>(S), N, K, bf16_out, y);
  else
    float_linear_kernel<Acc, kKind, 1><<<grid, kWarps * 32>>>(x, x_stride, rows_per_group, wdata(w), sc, w.scale_cols,
                                                              static_cast<int>(S), N, K, bf16_out, y);
  DI_CUDA_LAUNCH_CHECK();
}

void check_grid(int64_t S, int64_t N, int64_t K) {
  DI_CHECK_MSG(S <= 65535LL * kFloatRows && N < (1LL << 31) / 2 && K < (1LL << 31) / 4, "linear: shape too large");
}

}  // namespace

void quantized_linear(const float* x, int64_t S, const Weight& w, float* y) {
  DI_CHECK(w.mode == WeightMode::kFp8Block || w.mode == WeightMode::kFp4Expert);
  const int64_t K = w.cols, N = w.rows;
  DI_CHECK_MSG(K % 32 == 0, "FP8 linear needs K divisible by 32");
  check_grid(S, N, K);
  if (S == 0 || N == 0) return;
  const int64_t nb = K / 32;
  // workspace: codes [S, K] e4m3, then scales [S, K/32] f32
  Scratch ws(static_cast<size_t>(S * K + S * nb * 4));
  uint8_t* codes = ws.as<uint8_t>();
  float* scales = reinterpret_cast<float*>(codes + S * K);
  if (S * nb > 0) {
    act_quant_kernel<<<blocks_for(S * nb * 32, 256), 256>>>(x, S * nb, codes, scales);
    DI_CUDA_LAUNCH_CHECK();
  }
  const dim3 grid(static_cast<unsigned>(blocks_for(N, kWarps)), static_cast<unsigned>(blocks_for(S, kRowTile)));
  if (w.mode == WeightMode::kFp8Block)
    fp8_linear_kernel<<<grid, kWarps * 32>>>(codes, scales, wdata(w), wscale(w), w.scale_cols, static_cast<int>(S),
                                             static_cast<int>(N), static_cast<int>(K), y);
  else
    fp4_linear_kernel<<<grid, kWarps * 32>>>(codes, scales, wdata(w), wscale(w), w.scale_cols, static_cast<int>(S),
                                             static_cast<int>(N), static_cast<int>(K), y);
  DI_CUDA_LAUNCH_CHECK();
}

void float_linear(const float* x, int64_t S, const Weight& w, bool bf16_out, float* y) {
  check_grid(S, w.rows, w.cols);
  if (S == 0 || w.rows == 0) return;
  const int64_t K = w.cols;
  const int rpg = static_cast<int>(std::max<int64_t>(w.rows, 1));  // one group
  switch (w.dtype) {
    case DType::kBF16:
      bf16_out ? launch_float<float, WKind::kBf16>(x, K, rpg, w, S, true, y)
               : launch_float<double, WKind::kBf16>(x, K, rpg, w, S, false, y);
      return;
    case DType::kF16:
      bf16_out ? launch_float<float, WKind::kF16>(x, K, rpg, w, S, true, y)
               : launch_float<double, WKind::kF16>(x, K, rpg, w, S, false, y);
      return;
    case DType::kF32:
      bf16_out ? launch_float<float, WKind::kF32>(x, K, rpg, w, S, true, y)
               : launch_float<double, WKind::kF32>(x, K, rpg, w, S, false, y);
      return;
    default:
      throw Error(std::string("cuda linear: unsupported weight dtype ") + dtype_name(w.dtype) +
                  " (expected BF16, F16 or F32)");
  }
}

void grouped_linear(const float* x, int64_t S, const Weight& w, int groups, float* y) {
  DI_CHECK(w.mode == WeightMode::kFp8Block && groups > 0 && w.rows % groups == 0);
  check_grid(S, w.rows, w.cols * groups);
  if (S == 0 || w.rows == 0) return;
  const int rpg = static_cast<int>(w.rows / groups);
  DI_CHECK(rpg > 0);
  launch_float<float, WKind::kFp8Scaled>(x, w.cols * groups, rpg, w, S, true, y);
}

}  // namespace di::cuda::dense
