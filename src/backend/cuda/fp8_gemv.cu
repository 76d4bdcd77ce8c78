// FP8 block linears of one or two rows on the CUDA cores (the decode step at batch 1).
//
// Why not the tensor-core tiles (mma_gemm.cuh): at one row they stream their weights at 1.0-1.8 TB/s.
// ncu found those warps waiting on each K block's dependent chain (operand conversions, the emulated
// e4m3 MMA, the scale FMAs) with 2-3 warps per scheduler (bench/RESULTS.md). Here a weight byte costs
// a conversion and one FMA per row, each lane's loads are 16 contiguous bytes, and 6 CTAs of 4 warps
// fit an SM (80 registers): the bytes in flight come from many warps, not from a register pipeline.
// The first group of a CTA's weight loads is issued before the PDL wait.
//
// Layout: a half-warp owns a weight row (RPH rows in turn); lane l of the half reads the 16-byte
// chunks l, l + 16, ... of the row (K % 256 == 0), so each load instruction of a warp covers 256
// contiguous bytes of two rows. The activation comes quantized (quantize_activation, one launch: each
// CTA quantizing the whole row itself took 2-3x the GEMM's time, bench/RESULTS.md) and is staged in
// shared memory dequantized (code x its E8M0 scale, exact), fp32 [M][K]. A chunk's partial is the sum
// of its 16 exact products in fp32, times the weight block's E8M0 scale, added to the row's sum; the
// half's 16 sums meet in a shuffle tree. Equal to CpuBackend::linear to fp32 summation order (the
// dense_ops_test bound), not to the tensor-core tiles' bits: the batch-invariant mode keeps those.
// Rows 2i and 2i + 1 sit in the two halves of one warp, so RoPE's partner is a shuffle away.
#include <algorithm>
#include <atomic>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_quant.cuh"
#include "backend/cuda/dense_linear.cuh"
#include "backend/cuda/pdl_launch.cuh"
#include "backend/cuda/rope_math.cuh"
#include "core/env_switch.h"

namespace di::cuda::dense {
namespace {

using dq::kFullMask;

constexpr int kThreads = 128;          // 4 warps: 8 half-warps
constexpr int kHalves = kThreads / 16;  // rows in flight per CTA (times RPH)
constexpr int kGroup = 8;              // 16-byte weight loads in flight per lane
constexpr int kMaxRows = 2;            // activation rows
constexpr int kMaxSmem = 64 << 10;     // M x K x 4 bytes of staged activation
// CTAs per SM the registers allow (<= 80 each): 8 (64 registers) spilled and was slower (wo_b at one
// row 21.9 -> 24.7 us, op_bench on an H100)
constexpr int kMinCtas = 6;

struct GemvArgs {
  const uint8_t* xc;      // [M, K] E4M3 activation codes
  const float* xs;        // [M, K / 32] their scales
  const uint8_t* w;       // [N, K] E4M3
  const uint8_t* wscale;  // [ceil(N / 32), scale_cols] E8M0
  int64_t scale_cols;
  int N, K;
  RopeArgs rope;
  float* y;  // [M, N], bf16-valued
};

// One group of a half-warp lane's chunks: flat index f = rr * cpl + j (row rr of the lane's task,
// chunk j of the row) for f in [f0, f0 + kGroup) below RPH * cpl.
struct Group {
  uint4 w[kGroup];
  uint8_t s[kGroup];
};

template <int RPH>
__device__ __forceinline__ void load_group(const GemvArgs& a, int row_base, int cpl, int f0, Group& g) {
  const int hl = threadIdx.x & 15;
#pragma unroll
  for (int i = 0; i < kGroup; ++i) {
    const int f = f0 + i, rr = RPH == 1 ? 0 : (f >= cpl), j = f - rr * cpl, row = row_base + 2 * rr;
    const int c = hl + 16 * j;  // chunk of the row: bytes [16 c, 16 c + 16), K block c / 2
    const bool in = f < RPH * cpl && row < a.N;
    g.w[i] = in ? __ldg(reinterpret_cast<const uint4*>(a.w + static_cast<int64_t>(row) * a.K + 16 * c))
                : make_uint4(0u, 0u, 0u, 0u);
    g.s[i] = in ? __ldg(a.wscale + static_cast<int64_t>(row / 32) * a.scale_cols + c / 2) : uint8_t{0};
  }
}

// The first group of the CTA's first task, loaded before the PDL wait (weights are never written:
// pdl_launch.cuh), so it is in flight while the kernel before finishes and the activation is staged.
template <int RPH>
__device__ __forceinline__ Group first_group_then_wait(const GemvArgs& a, int tasks) {
  const int warp = threadIdx.x >> 5, half = (threadIdx.x >> 4) & 1;
  Group g;
  if (static_cast<int>(blockIdx.x) < tasks)
    load_group<RPH>(a, blockIdx.x * kHalves * RPH + warp * 2 * RPH + half, a.K / 256, 0, g);
  ::di::cuda::grid_dependency_wait();
  return g;
}

// The activation's values (code x scale, exact) in shared memory, quarter-major so that the half-warp's
// 16 lanes, reading consecutive chunks, read consecutive 16-byte words: value 16 c + 4 q + e of row m
// (chunk c, quarter q) at xv[m K + (q K / 16 + c) 4 + e]. (Chunk-major, a lane's words were 64 bytes
// apart: 8-way bank conflicts, and ncu found the kernel bound by them.) 16 codes per thread and step,
// 4 steps' loads in flight.
template <int M>
__device__ __forceinline__ void stage_activation(const GemvArgs& a, float* xv) {
  const int chunks = a.K / 16, n16 = M * chunks;  // rows are contiguous, so piece i has scale i / 2
#pragma unroll 4
  for (int i = threadIdx.x; i < n16; i += kThreads) {
    const uint4 c = __ldg(reinterpret_cast<const uint4*>(a.xc) + i);
    const float s = __ldg(a.xs + i / 2);
    const uint32_t u[4] = {c.x, c.y, c.z, c.w};
    float* row = xv + (i / chunks) * a.K + 4 * (i % chunks);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      float v[4];
      dq::e4m3x4(u[q], v);
      *reinterpret_cast<float4*>(row + q * a.K / 4) =
          make_float4(__fmul_rn(v[0], s), __fmul_rn(v[1], s), __fmul_rn(v[2], s), __fmul_rn(v[3], s));
    }
  }
}

// 16 E4M3 codes (a chunk, low byte first) times its 16 staged activation values (quarter q at x + q
// quarter_stride), summed in fp32.
__device__ __forceinline__ float chunk_dot(const uint4& w, const float* __restrict__ x, int quarter_stride) {
  const uint32_t u[4] = {w.x, w.y, w.z, w.w};
  float p = 0.0f;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const float4 xv = *reinterpret_cast<const float4*>(x + q * quarter_stride);
    float wv[4];
    dq::e4m3x4(u[q], wv);
    p = fmaf(wv[0], xv.x, p);
    p = fmaf(wv[1], xv.y, p);
    p = fmaf(wv[2], xv.z, p);
    p = fmaf(wv[3], xv.w, p);
  }
  return p;
}

// Grid: up to one wave of CTAs, each taking tasks blockIdx.x, + gridDim.x, ...; a task is kHalves * RPH
// consecutive rows (half h of warp w: rows w * 2 RPH + 2 rr + h).
template <int M, int RPH>
__global__ void __launch_bounds__(kThreads, kMinCtas) fp8_gemv_kernel(GemvArgs a, int tasks) {
  Group g = first_group_then_wait<RPH>(a, tasks);
  extern __shared__ float xv[];  // [M][K]
  stage_activation<M>(a, xv);
  __syncthreads();
  const int lane = threadIdx.x & 31, hl = lane & 15, warp = threadIdx.x >> 5, half = lane >> 4;
  const int cpl = a.K / 256, flat = RPH * cpl;  // chunks per lane per row; per task
  for (int t = blockIdx.x; t < tasks; t += gridDim.x) {
    const int row_base = t * kHalves * RPH + warp * 2 * RPH + half;
    float acc[M][RPH] = {};
    for (int f0 = 0; f0 < flat; f0 += kGroup) {
      if (f0 > 0 || t != static_cast<int>(blockIdx.x)) load_group<RPH>(a, row_base, cpl, f0, g);
#pragma unroll
      for (int i = 0; i < kGroup; ++i) {
        const int f = f0 + i, rr = RPH == 1 ? 0 : (f >= cpl), j = f - rr * cpl;
        if (f >= flat) break;
        const float ws = e8m0_to_float(g.s[i]);
        const int c = hl + 16 * j;
#pragma unroll
        for (int m = 0; m < M; ++m) {
          const float p = chunk_dot(g.w[i], xv + m * a.K + 4 * c, a.K / 4);
#pragma unroll
          for (int r = 0; r < RPH; ++r)
            if (r == rr) acc[m][r] = fmaf(p, ws, acc[m][r]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < RPH; ++r) {
      const int row = row_base + 2 * r;
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float s = acc[m][r];
#pragma unroll
        for (int o = 8; o > 0; o >>= 1) s += __shfl_xor_sync(kFullMask, s, o);  // within the half
        float v = dq::round_bf16(s);
        if (a.rope.rope.freqs) {
          const float other = __shfl_xor_sync(kFullMask, v, 16);  // row ^ 1, the other half
          if (row < a.N) v = rope_value(v, other, row, a.rope.pos[m], a.rope.rope);
        }
        if (hl == 0 && row < a.N) a.y[static_cast<int64_t>(m) * a.N + row] = v;
      }
    }
  }
}

// CTAs of fp8_gemv_kernel<M, RPH> resident per SM with `smem` bytes of activation, per K / 256 (the
// occupancy query is a host call: asked once per shape).
template <int M, int RPH>
int resident_ctas(int smem) {
  const auto kernel = fp8_gemv_kernel<M, RPH>;
  static const bool attr_set = [&] {
    DI_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem));
    return true;
  }();
  (void)attr_set;
  static std::atomic<int> known[kMaxSmem / (256 * 4) + 1] = {};
  std::atomic<int>& slot = known[smem / (M * 256 * 4)];
  int n = slot.load(std::memory_order_relaxed);
  if (n == 0) {
    DI_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, smem));
    n = std::max(n, 1);
    slot.store(n, std::memory_order_relaxed);
  }
  return n;
}

template <int M, int RPH>
void launch_gemv(const GemvArgs& a) {
  const int smem = M * a.K * 4;
  const int tasks = (a.N + kHalves * RPH - 1) / (kHalves * RPH);
  const int grid = std::min(tasks, resident_ctas<M, RPH>(smem) * sm_count());
  ::di::cuda::launch(fp8_gemv_kernel<M, RPH>, grid, kThreads, static_cast<size_t>(smem), a, tasks);
}

// Rows per half-warp: two where a row has fewer chunks per lane than a group, so more loads are in flight.
template <int M>
void launch_gemv_rows(const GemvArgs& a) {
  if (a.K / 256 < kGroup) launch_gemv<M, 2>(a);
  else launch_gemv<M, 1>(a);
}

bool cuda_core_fits(int64_t rows, const Weight& w) {
  return w.mode == WeightMode::kFp8Block && rows >= 1 && rows <= kMaxRows && w.cols % 256 == 0 &&
         rows * w.cols * 4 <= kMaxSmem && w.rows < (1LL << 30);
}

}  // namespace

bool fp8_gemv_fits(int64_t rows, const Weight& w) {
  static const bool on = env_switch_on("DEEPINFER_FP8_GEMV");
  return on && (fp8_gemv_mma_fits(rows, w) || cuda_core_fits(rows, w));
}

void fp8_gemv(const uint8_t* codes, const float* scales, int64_t rows, const Weight& w, float* y, const RopeArgs& rope) {
  DI_CHECK(fp8_gemv_fits(rows, w));
  if (fp8_gemv_mma_fits(rows, w)) return fp8_gemv_mma(codes, scales, rows, w, y, rope);
  const GemvArgs a{codes, scales, wdata(w), wscale(w), w.scale_cols, static_cast<int>(w.rows), static_cast<int>(w.cols),
                   rope, y};
  if (rows == 1) launch_gemv_rows<1>(a);
  else launch_gemv_rows<2>(a);
}

}  // namespace di::cuda::dense
