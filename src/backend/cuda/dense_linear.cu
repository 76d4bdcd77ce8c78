// CUDA GEMMs of linear / grouped_linear.
//
// Quantized weights (kFp8Block, kFp4Expert): the activation is quantized by the bit-exact device
// quantizer (one small launch, into the persistent workspace), then one GEMM launch on the FP8
// tensor cores (mma_gemm.cuh): each 32-wide K block's partial is scaled by the activation and weight
// scales and added to an fp32 accumulator, as CpuBackend::linear does, but the block partial is
// summed by the tensor core and K may be split across CTAs (the partials of the splits are added in
// split order by the last CTA to finish, so results are deterministic). Equal to the CPU's result to
// fp32 rounding before the bf16 output rounding (tests/gpu/dense_ops_test.cpp states the bound).
// FP8 weights at one or two rows take the CUDA-core GEMV instead (fp8_gemv.cu), outside the
// batch-invariant mode.
//
// Layout: a CTA owns 128 output features x one K range x up to 64 tokens; grid (ceil(N/128),
// splits, ceil(M/64)). Weight bytes are read once per launch for M <= 64 (once per 64 tokens above).
// In the batch-invariant mode the split count is the one-row plan at every M (batch_invariance.cuh);
// where those splits would not fit in one wave, each CTA runs them itself (grid.y = 1), same sums.
//
// Float weights (kBf16, kF32, grouped wo_a): one warp per output feature, lanes split K in 8-element
// chunks, up to 8 rows per pass, warp-shuffle reduction. Summation order differs from the CPU's
// (fp32 for bf16 outputs: within rounding; fp64 for kF32: the fp32 result is order-independent
// except in cancellation corner cases).
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>

#include "backend/cuda/batch_invariance.cuh"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_quant.cuh"
#include "backend/cuda/dense_linear.cuh"
#include "backend/cuda/dense_scratch.cuh"
#include "backend/cuda/gemm_workspace.cuh"
#include "backend/cuda/mma_gemm.cuh"
#include "backend/cuda/pdl_launch.cuh"
#include "backend/cuda/rope_math.cuh"

namespace di::cuda::mma {
namespace {
int64_t fixup_rounds_from_env() {
  const char* v = std::getenv("DEEPINFER_FIXUP_ROUNDS");
  return v && *v ? std::max<int64_t>(0, std::atoll(v)) : int64_t{8};
}
std::atomic<int64_t> g_fixup_max_rounds{fixup_rounds_from_env()};
}  // namespace

int64_t fixup_max_rounds() { return g_fixup_max_rounds.load(std::memory_order_relaxed); }
void set_fixup_max_rounds(int64_t n) { g_fixup_max_rounds.store(std::max<int64_t>(0, n), std::memory_order_relaxed); }

}  // namespace di::cuda::mma

namespace di::cuda::dense {
namespace {

using dq::kFullMask;

constexpr int kWarps = 4;      // output features (warps) per CTA of the float GEMM
constexpr int kFloatRows = 8;  // activation rows per CTA of the float GEMM (registers per lane)

__device__ __forceinline__ uint4 ldg16(const uint8_t* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }

// [S*K/32 blocks] one warp per 32-value block: x f32 -> codes e4m3 + scale f32 (e8m0 value).
// Reads 4 B and writes 1.125 B per element.
__global__ void act_quant_kernel(const float* __restrict__ x, int64_t nblocks, uint8_t* __restrict__ codes,
                                 float* __restrict__ scales) {
  ::di::cuda::grid_dependency_wait();
  const int64_t blk = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (blk >= nblocks) return;  // whole warps leave together
  const int lane = threadIdx.x & 31;
  float scale;
  codes[blk * 32 + lane] = dq::act_quant_lane(x[blk * 32 + lane], scale);
  if (lane == 0) scales[blk] = scale;
}

// rmsnorm_kernel then act_quant_kernel in one launch (q_norm before wq_b, past 2 rows): one CTA of 256
// threads per row, rmsnorm_kernel's arithmetic, then each warp's 32 consecutive values quantized as
// act_quant_kernel does. normed: the normalized rows too (nullptr: not written). n % 32 == 0.
__global__ void __launch_bounds__(256)
    rmsnorm_quant_kernel(const float* __restrict__ x, int64_t n, const uint8_t* __restrict__ w, attn::WType wt,
                         float eps, float* __restrict__ normed, uint8_t* __restrict__ codes, float* __restrict__ scales) {
  ::di::cuda::grid_dependency_wait();
  const int64_t row = blockIdx.x;
  const float* xr = x + row * n;
  // This thread's first kHeld elements and weights load before the sum (clamped loads: cuda_common.cuh).
  constexpr int kHeld = 8;  // rows up to 2048 wide (q_norm: 1280) need no second pass
  float xv[kHeld], wv[kHeld];
#pragma unroll
  for (int k = 0; k < kHeld; ++k) {
    const int64_t i = min(static_cast<int64_t>(threadIdx.x + k * 256), n - 1);
    xv[k] = xr[i];
    wv[k] = attn::weight_elem(w, wt, i);
  }
  const float inv = rms_scale(block_sum_squares_exact<256>(xr, n), n, eps);
  const auto emit = [&](int64_t i, float xi, float wi) {
    dq::norm_quant_elem(row * n + i, xi, wi, inv, normed, codes, scales);
  };
#pragma unroll
  for (int k = 0; k < kHeld; ++k)  // whole warps take each step (n % 32 == 0)
    if (threadIdx.x + k * 256 < n) emit(threadIdx.x + k * 256, xv[k], wv[k]);
  for (int64_t i = threadIdx.x + kHeld * 256; i < n; i += 256) emit(i, xr[i], attn::weight_elem(w, wt, i));
}

// The tile's bf16 outputs, rotated by RoPE where rope.rope.freqs is set (linear_rope: the queries'
// projection). Rows are output features, so a pair's partner row r ^ 1 is lane ^ 4's value of the
// same accumulator (for_each_acc_all). Every lane calls it.
template <int NT>
__device__ __forceinline__ void store_tile(const float (&acc)[2][NT][4], int row0, int N, int t0, int count,
                                           const RopeArgs& rope, float* __restrict__ y) {
  mma::for_each_acc_all(acc, row0, N, count, [&](int r, int t, float a, bool in) {
    float v = dq::round_bf16(a);
    if (rope.rope.freqs) {
      const float other = __shfl_xor_sync(kFullMask, v, 4);
      if (in) v = rope_value(v, other, r, rope.pos[t0 + t], rope.rope);
    }
    if (in) y[static_cast<int64_t>(t0 + t) * N + r] = v;
  });
}

// y[M, N] = bf16(x W^T) for FP8 block / MXFP4 weights. The activation comes quantized (xc / xs) or,
// for one or two rows, as fp32 x that each CTA quantizes while staging it (no second launch; past two
// rows the redundant quantizing costs more than the launch: op_bench, bench/RESULTS.md).
// Bytes per launch: the weight and its scales once (M <= 64), the activation per 128 output
// features (L2), 4*M*N written, plus 8*splits*M*N of partial sums (L2) when K is split. The split
// partials are summed in split order by the last CTA of a row block (`fixup`, small M*splits) or by
// reduce_splits_kernel. kInlineSplits (batch-invariant mode, grid.y = 1): the CTA itself runs the
// `inline_splits` K ranges of the plan, each into fresh accumulators, and adds them in split order
// from zero, as mma::sum_splits adds the partials of split CTAs: the same result bits.
// kFast: MXFP4 block sums on wgmma (mma_gemm.cuh); FP8 weights always take the exact mma.sync.
template <mma::WFmt F, int NT, bool kInlineSplits, bool kFast>
__global__ void __launch_bounds__(mma::kThreads, mma::kMinCtas<NT>)
    quantized_linear_kernel(mma::ActSource src, int M, const uint8_t* __restrict__ w,
                            const uint8_t* __restrict__ wscale, int64_t scale_cols, int N, int K, int kb_per_split,
                            int inline_splits, bool fixup, float* __restrict__ partial,
                            unsigned* __restrict__ counters, float* __restrict__ y, RopeArgs rope) {
  ::di::cuda::grid_dependency_wait();
  using namespace mma;
  const int warp = threadIdx.x >> 5;
  const int row0 = blockIdx.x * kCtaRows + warp * kWarpRows;
  const int t0 = blockIdx.z * kTokTile;
  const int count = min(kTokTile, M - t0);
  const int nb = K / 32, split = blockIdx.y, splits = gridDim.y;
  float acc[2][NT][4] = {};
  if constexpr (kInlineSplits) {
    for (int sp = 0; sp < inline_splits; ++sp) {
      float part[2][NT][4] = {};
      const int kb0 = sp * kb_per_split, kb1 = min(nb, kb0 + kb_per_split);
      cta_tile<F, NT, kFast>(w, wscale, scale_cols, N, K, row0, kb0, kb1, src, count, [&](int i) { return t0 + i; },
                             part);
      add_split(acc, part);
    }
    store_tile(acc, row0, N, t0, count, rope, y);
    return;
  }
  const int kb0 = split * kb_per_split, kb1 = min(nb, kb0 + kb_per_split);
  cta_tile<F, NT, kFast>(w, wscale, scale_cols, N, K, row0, kb0, kb1, src, count, [&](int i) { return t0 + i; }, acc);
  if (splits == 1) {
    store_tile(acc, row0, N, t0, count, rope, y);
    return;
  }
  for_each_acc(acc, row0, N, count, [&](int r, int t, float v) {
    partial[(static_cast<int64_t>(split) * M + t0 + t) * N + r] = v;
  });
  if (!fixup || !split_last_arrival(counters + blockIdx.z * gridDim.x + blockIdx.x, splits)) return;
  fixup_rows(partial, y, blockIdx.x * kCtaRows, kCtaRows, t0, count, M, N, splits, true);
}

// y[i] = sum over splits of partial[sp][i] (bf16-rounded when bf16_out), i < M*N, in split order.
__global__ void reduce_splits_kernel(const float* __restrict__ partial, int splits, int64_t mn, bool bf16_out,
                                     float* __restrict__ y) {
  ::di::cuda::grid_dependency_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= mn) return;
  const float v = mma::sum_splits<mma::kFixupLoads>(partial + i, mn, splits);
  y[i] = bf16_out ? dq::round_bf16(v) : v;
}

// CTAs of one instantiation resident per SM (for the split planning): the kernel that runs (the fast
// MXFP4 tiles use other registers and shared memory than the exact ones).
template <mma::WFmt F, int NT, bool kFast>
int resident_ctas() {
  static const int n = [] {
    int v = 0;
    DI_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, quantized_linear_kernel<F, NT, false, kFast>, mma::kThreads, 0));
    return std::max(v, 1);
  }();
  return n;
}

// x [M, K] quantized once into the workspace (RMSNorm first when norm.w is set, writing norm.normed when
// that is set): E4M3 codes [M, K] and their scales [M, K / 32].
mma::ActSource quantize_prologue(const float* x, int64_t M, int64_t K, const NormArgs& norm) {
  uint8_t* codes = workspace_as<uint8_t>(Ws::kActCodes, static_cast<size_t>(M * K));
  float* scales = workspace_as<float>(Ws::kActScales, static_cast<size_t>(M * (K / 32)));
  if (norm.w)
    ::di::cuda::launch(rmsnorm_quant_kernel, static_cast<unsigned>(M), 256, 0, x, K, norm.w, norm.type, norm.eps,
                       norm.normed, codes, scales);
  else
    quantize_activation(x, M, K, codes, scales);
  return mma::ActSource{codes, scales, nullptr};
}

// Returns whether `rope` (if set) was applied in the epilogue: not when K is split across CTAs (their
// partials are summed after the tiles), where the caller rotates the output itself.
template <mma::WFmt F, int NT, bool kFast>
bool launch_quantized(const float* x, int64_t M, const Weight& w, float* y, bool invariant, const RopeArgs& rope,
                      const NormArgs& norm) {
  const int64_t K = w.cols, N = w.rows, nb = K / 32;
  mma::ActSource src{nullptr, nullptr, x};
  if (M > 2 || norm.normed) {  // quantize once in a prologue: each CTA quantizing its K range costs more past 2 rows
    src = quantize_prologue(x, M, K, norm);
  } else if (norm.w) {  // each CTA normalizes the rows while staging them
    src.norm_w = norm.w;
    src.norm_type = norm.type;
    src.eps = norm.eps;
  }
  const int64_t row_ctas = (N + mma::kCtaRows - 1) / mma::kCtaRows, chunks = (M + mma::kTokTile - 1) / mma::kTokTile;
  const int64_t capacity = resident_ctas<F, NT, kFast>() * sm_count();
  const SplitPlan plan =
      bi::linear_k_split(invariant, row_ctas, chunks, nb, NT, capacity, resident_ctas<F, 1, kFast>() * sm_count());
  if (!bi::splits_on_ctas(invariant, row_ctas * chunks, plan.splits, capacity, plan.splits * M * N * 4)) {
    const dim3 grid(static_cast<unsigned>(row_ctas), 1u, static_cast<unsigned>(chunks));
    ::di::cuda::launch(quantized_linear_kernel<F, NT, true, kFast>, grid, mma::kThreads, 0, src, static_cast<int>(M), wdata(w),
                       wscale(w), w.scale_cols, static_cast<int>(N), static_cast<int>(K), plan.kb_per_split,
                       plan.splits, false, nullptr, nullptr, y, rope);
    return true;
  }
  const int64_t tile_outputs = std::min<int64_t>(M, mma::kTokTile) * std::min<int64_t>(N, mma::kCtaRows);
  const bool fixup = mma::fixup_in_kernel(tile_outputs, mma::kThreads, plan.splits);
  float* partial = nullptr;
  unsigned* counters = nullptr;
  if (plan.splits > 1) {
    partial = workspace_as<float>(Ws::kPartial, static_cast<size_t>(plan.splits * M * N));
    if (fixup) counters = workspace_as<unsigned>(Ws::kCounters, static_cast<size_t>(row_ctas * chunks));
  }
  const dim3 grid(static_cast<unsigned>(row_ctas), static_cast<unsigned>(plan.splits), static_cast<unsigned>(chunks));
  ::di::cuda::launch(quantized_linear_kernel<F, NT, false, kFast>, grid, mma::kThreads, 0, src, static_cast<int>(M), wdata(w),
                     wscale(w), w.scale_cols, static_cast<int>(N), static_cast<int>(K), plan.kb_per_split, 1, fixup,
                     partial, counters, y, plan.splits == 1 ? rope : RopeArgs{});
  if (plan.splits > 1 && !fixup) {
    reduce_splits(partial, plan.splits, M * N, true, y);
  }
  return plan.splits == 1;
}

template <mma::WFmt F, bool kFast>
bool launch_quantized_nt(int nt, const float* x, int64_t M, const Weight& w, float* y, bool invariant,
                         const RopeArgs& rope, const NormArgs& norm) {
  switch (nt) {
    case 1: return launch_quantized<F, 1, kFast>(x, M, w, y, invariant, rope, norm);
    case 2: return launch_quantized<F, 2, kFast>(x, M, w, y, invariant, rope, norm);
    case 4: return launch_quantized<F, 4, kFast>(x, M, w, y, invariant, rope, norm);
    default: return launch_quantized<F, 8, kFast>(x, M, w, y, invariant, rope, norm);
  }
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
      dq::e4m3x4(v.x, out);
      dq::e4m3x4(v.y, out + 4);
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
// A warp computes kFeat output features for up to 8 rows: each activation value it loads serves
// kFeat features (the activations are re-read from L1/L2 once per warp, not once per feature: at
// 64 rows the fp32 head re-read 169 GB of them one feature per warp). Lanes split K in kVec chunks,
// warp-shuffle reduction: a feature's summation order does not depend on kFeat or on the row count.
// Grid (ceil(S/8), ceil(N/(4 kFeat))): the 8-row tiles of one set of features are neighbours in
// launch order, so the weight rows come from DRAM once and from L2 for the other tiles.
template <typename Acc, WKind kKind, int kVec, int kFeat>
__global__ void __launch_bounds__(kWarps * 32)
    float_linear_kernel(const float* __restrict__ x, int64_t x_stride, int rows_per_group, const uint8_t* __restrict__ w,
                        const uint8_t* __restrict__ wscale, int64_t scale_cols, int S, int N, int K, bool bf16_out,
                        float* __restrict__ y) {
  ::di::cuda::grid_dependency_wait();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int o0 = (blockIdx.y * kWarps + warp) * kFeat;
  if (o0 >= N) return;
  const int nf = min(kFeat, N - o0);  // features of this warp (the group of o0: rows_per_group % kFeat == 0)
  const int r0 = blockIdx.x * kFloatRows;
  const int rows = min(kFloatRows, S - r0);
  const float* xb = x + static_cast<int64_t>(r0) * x_stride + static_cast<int64_t>(o0 / rows_per_group) * K;
  Acc acc[kFloatRows][kFeat];
#pragma unroll
  for (int r = 0; r < kFloatRows; ++r)
#pragma unroll
    for (int f = 0; f < kFeat; ++f) acc[r][f] = Acc(0);
  // One feature per warp (one row, fp32 sums): four steps' loads in flight, not a round trip per 256
  // weights (wo_a at one row 45 -> 39 us in ncu). Not for fp64 sums: the head at one row ran at half
  // its speed (registers).
  constexpr int kUnroll = kFeat == 1 && sizeof(Acc) == 4 ? 4 : 1;
#pragma unroll kUnroll
  for (int k = lane * kVec; k < K; k += 32 * kVec) {
    Acc wa[kFeat][kVec];  // converted once for all rows
#pragma unroll
    for (int f = 0; f < kFeat; ++f) {
      float wv[kVec];
      if (f < nf) load_w<kKind, kVec>(w, wscale, scale_cols, o0 + f, K, k, wv);
      else
#pragma unroll
        for (int i = 0; i < kVec; ++i) wv[i] = 0.0f;
#pragma unroll
      for (int i = 0; i < kVec; ++i) wa[f][i] = static_cast<Acc>(wv[i]);
    }
#pragma unroll
    for (int r = 0; r < kFloatRows; ++r) {
      if (r < rows) {
        float xv[kVec];
        load_x<kVec>(xb + r * x_stride + k, xv);
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          const Acc xa = static_cast<Acc>(xv[i]);  // converted once for all features
#pragma unroll
          for (int f = 0; f < kFeat; ++f) acc[r][f] = fma(xa, wa[f][i], acc[r][f]);
        }
      }
    }
  }
#pragma unroll
  for (int f = 0; f < kFeat; ++f) {
    Acc mine = Acc(0);
#pragma unroll
    for (int r = 0; r < kFloatRows; ++r) {
      const Acc t = warp_sum(acc[r][f]);
      if (lane == r) mine = t;
    }
    if (f < nf && lane < rows) {
      const float v = static_cast<float>(mine);  // fp64 -> fp32 rounds to nearest
      y[static_cast<int64_t>(r0 + lane) * N + o0 + f] = bf16_out ? dq::round_bf16(v) : v;
    }
  }
}

template <typename Acc, WKind kKind, int kFeat>
void launch_float_feat(const float* x, int64_t x_stride, int rows_per_group, const Weight& w, int64_t S, bool bf16_out,
                       float* y) {
  const int N = static_cast<int>(w.rows), K = static_cast<int>(w.cols);
  const dim3 grid(static_cast<unsigned>(blocks_for(S, kFloatRows)), static_cast<unsigned>(blocks_for(N, kWarps * kFeat)));
  const uint8_t* sc = w.scale ? wscale(w) : nullptr;
  // 8-wide vector loads need 16-byte aligned rows of x and W: K % 8 == 0 (x_stride too).
  if (K % 8 == 0 && x_stride % 8 == 0)
    ::di::cuda::launch(float_linear_kernel<Acc, kKind, 8, kFeat>, grid, kWarps * 32, 0, x, x_stride, rows_per_group,
                       wdata(w), sc, w.scale_cols, static_cast<int>(S), N, K, bf16_out, y);
  else
    ::di::cuda::launch(float_linear_kernel<Acc, kKind, 1, kFeat>, grid, kWarps * 32, 0, x, x_stride, rows_per_group,
                       wdata(w), sc, w.scale_cols, static_cast<int>(S), N, K, bf16_out, y);
}

// Four features per warp past one row (a warp's x loads then serve four features) where the
// groups allow it; one row reads x once per feature either way and keeps more warps in flight.
template <typename Acc, WKind kKind>
void launch_float(const float* x, int64_t x_stride, int rows_per_group, const Weight& w, int64_t S, bool bf16_out,
                  float* y) {
  if (S > 1 && rows_per_group % 4 == 0)
    launch_float_feat<Acc, kKind, 4>(x, x_stride, rows_per_group, w, S, bf16_out, y);
  else
    launch_float_feat<Acc, kKind, 1>(x, x_stride, rows_per_group, w, S, bf16_out, y);
}

void check_grid(int64_t S, int64_t N, int64_t K) {
  DI_CHECK_MSG(S < (1LL << 31) && N <= 65535LL * kWarps && K < (1LL << 31) / 4,
               "linear: shape too large (at most " + std::to_string(65535 * kWarps) + " float-weight output features)");
}

}  // namespace

void reduce_splits(const float* partial, int splits, int64_t n, bool bf16_out, float* y) {
  if (n == 0) return;
  ::di::cuda::launch(reduce_splits_kernel, blocks_for(n, 256), 256, 0, partial, splits, n, bf16_out, y);
}

void quantize_activation(const float* x, int64_t rows, int64_t K, uint8_t* codes, float* scales) {
  DI_CHECK_MSG(K % 32 == 0, "FP8 activation quantization needs K divisible by 32");
  const int64_t nblocks = rows * (K / 32);
  if (nblocks == 0) return;
  ::di::cuda::launch(act_quant_kernel, blocks_for(nblocks * 32, 256), 256, 0, x, nblocks, codes, scales);
}

SplitPlan plan_split(int64_t tiles, int64_t nb, int nt, int64_t capacity, int waves) {
  SplitPlan p;
  // Split K until the CTAs fill `waves` waves of resident CTAs, each split keeping >= max(8, 2 nt)
  // K blocks so its weight bytes outweigh its partial sums. Measured on the H200 (bench/RESULTS.md):
  // the dense linears are fastest at one wave (a partly filled second costs more than it gives:
  // wq_b at 64 rows 60.6 -> 79.4 us at two), the grouped experts at two (a tile streams its rows
  // with about one stage in flight per warp; MoE at batch 1 214.8 -> 204.0 us).
  if (tiles < waves * capacity && nb > 1) {
    const int64_t min_kb = std::max(8, 2 * nt);
    p.splits = static_cast<int>(
        std::clamp<int64_t>(waves * capacity / tiles, 1, std::max<int64_t>(1, nb / min_kb)));
  }
  p.kb_per_split = static_cast<int>((nb + p.splits - 1) / p.splits);
  // splits start on 4-aligned K blocks, so a tile loads its MXFP4 scales as 32-bit words
  if (p.splits > 1) p.kb_per_split = (p.kb_per_split + 3) / 4 * 4;
  p.splits = static_cast<int>((nb + p.kb_per_split - 1) / p.kb_per_split);
  return p;
}

int nt_for(int64_t tokens) {
  if (tokens <= 8) return 1;
  if (tokens <= 16) return 2;
  if (tokens <= 32) return 4;
  return 8;
}

bool quantized_linear(const float* x, int64_t S, const Weight& w, float* y, bool invariant, bool fast_fp4,
                      const RopeArgs& rope, const NormArgs& norm) {
  DI_CHECK(w.mode == WeightMode::kFp8Block || w.mode == WeightMode::kFp4Expert);
  const int64_t K = w.cols, N = w.rows;
  DI_CHECK_MSG(K % 32 == 0, "FP8 linear needs K divisible by 32");
  DI_CHECK_MSG(S * K < (1LL << 31) && N < (1LL << 30) && (S + 63) / 64 <= 65535, "linear: shape too large");
  DI_CHECK(!rope.rope.freqs || (N % 2 == 0 && rope.rope.head_dim % 2 == 0 && rope.rope.rope_dim % 2 == 0 &&
                                rope.rope.rope_dim <= rope.rope.head_dim && N % rope.rope.head_dim == 0));
  if (S == 0 || N == 0) return true;
  if (!invariant && fp8_gemv_fits(S, w)) {
    const mma::ActSource src = quantize_prologue(x, S, K, norm);
    fp8_gemv(src.xc, src.xs, S, w, y, rope);
    return true;
  }
  if (w.mode == WeightMode::kFp8Block)
    return launch_quantized_nt<mma::WFmt::kFp8Block, false>(nt_for(S), x, S, w, y, invariant, rope, norm);
  if (fast_fp4) return launch_quantized_nt<mma::WFmt::kFp4Row, true>(nt_for(S), x, S, w, y, invariant, rope, norm);
  return launch_quantized_nt<mma::WFmt::kFp4Row, false>(nt_for(S), x, S, w, y, invariant, rope, norm);
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
