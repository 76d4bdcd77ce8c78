// Dense linears on the bf16 tensor cores for batched rows: y[S, N] = x W^T with fp32 sums (mma.sync
// m16n8k16), for BF16 weights (the fp32 head; compressor and indexer projections) and for the FP8
// 32x32-block weights of the grouped output projection wo_a (each weight value times its block scale
// is exact in bf16). At 64 rows the CUDA-core kernels took 9.2 ms for the head (fp64 sums), whose
// weights stream in 0.31 ms, and 0.43 ms per layer for wo_a. x is split into bf16 hi + lo
// (lo = bf16(x - hi)), two MMAs per tile: the products are exact to ~2^-16 relative for any fp32 x,
// and exact for the bf16 values the model passes (lo = 0). The sums are the tensor core's fp32, not
// fp64 rounded once / the CPU's order: within a few fp32 ulps of the CPU's. A chunk whose lo is zero
// for every staged token (bf16-valued x) skips its lo MMAs, which would add exact zeros.
//
// CTA: 8 warps x 32 weight rows, 8 NT tokens. K in chunks of 64; the next chunk's weights and
// activations load while this one computes. A lane's 16 weight values of a row per chunk feed the MMA
// k slots in a fixed permutation that the staged activations follow (step_k).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <type_traits>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_quant.cuh"
#include "backend/cuda/dense_linear.cuh"
#include "backend/cuda/gemm_workspace.cuh"
#include "backend/cuda/mma_gemm.cuh"
#include "backend/cuda/pdl_launch.cuh"
#include "backend/cuda/rope_math.cuh"
#include "core/env_switch.h"

namespace di::cuda::dense {
namespace {

constexpr int kMmaWarps = 8;
constexpr int kMmaThreads = kMmaWarps * 32;
constexpr int kRowsPerCta = kMmaWarps * 32;
constexpr int kChunk = 64;            // K per pipeline step
constexpr int kXStride = kChunk + 4;  // bf16 per staged token row (8-byte aligned rows)

enum class MmaWeight { kBf16, kFp8Block };

__device__ __forceinline__ uint32_t word_of(const uint4& u, int w) {
  switch (w) {
    case 0: return u.x;
    case 1: return u.y;
    case 2: return u.z;
    default: return u.w;
  }
}

// A lane's 8 bf16 pairs (words) of a row chunk: word w holds k = kof(w), kof(w) + 1. MMA step s (k16)
// takes words 2s (slots 2q, 2q+1) and 2s + 1 (slots 2q+8, 2q+9), i.e. k [step_k(s), +4).
// BF16: the lane's two 16-byte loads at [8q, 8q + 8) and [32 + 8q, +8) (each load 64 contiguous bytes
// of the row across the 4 lanes). FP8: one 16-byte load at [16q, 16q + 16), one scale block.
template <MmaWeight F>
__device__ __forceinline__ int step_k(int q, int s) {
  if constexpr (F == MmaWeight::kBf16) return s < 2 ? 8 * q + 4 * s : 32 + 8 * q + 4 * (s - 2);
  return 16 * q + 4 * s;
}

// 4 E4M3 codes x a power-of-two scale -> 2 bf16 pairs (exact).
__device__ __forceinline__ void e4m3x4_to_bf16(uint32_t codes, float scale, uint32_t& lo, uint32_t& hi) {
  const __half2 a = __half2(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(codes & 0xFFFFu), __NV_E4M3));
  const __half2 b = __half2(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(codes >> 16), __NV_E4M3));
  const float2 fa = __half22float2(a), fb = __half22float2(b);
  const __nv_bfloat162 ba = __floats2bfloat162_rn(fa.x * scale, fa.y * scale);
  const __nv_bfloat162 bb = __floats2bfloat162_rn(fb.x * scale, fb.y * scale);
  lo = *reinterpret_cast<const uint32_t*>(&ba);
  hi = *reinterpret_cast<const uint32_t*>(&bb);
}

// The CTA's final tile of y (outputs [row0, row0 + 256) of tokens t0 .. t0 + tokens), once written by its threads,
// quantized for the next FP8 linear: each warp 32 consecutive outputs of a token, act_quant_kernel's quantizer (the
// same bits as quantize_activation over y). N % 32 == 0.
__device__ __forceinline__ void quantize_tile(const float* y, int row0, int t0, int tokens, int N,
                                              const ActCodesOut& out) {
  __syncthreads();  // the tile's y, written by every thread of the CTA
  const int lane = threadIdx.x % 32, blocks = min(kRowsPerCta, N - row0) / 32;
  for (int i = threadIdx.x / 32; i < tokens * blocks; i += kMmaWarps) {
    const int64_t at = static_cast<int64_t>(t0 + i / blocks) * N + row0 + 32 * (i % blocks) + lane;
    float scale;
    out.codes[at] = dq::act_quant_lane(__ldcg(y + at), scale);
    if (lane == 0) out.scales[at / 32] = scale;
  }
}

// x row t of the CTA's group: x + t * x_stride + group * K (group = first row / rows_per_group; a
// CTA's rows share one group). wscale: FP8 block scales [ceil(N / 32), scale_cols] (E8M0). Up to 16
// tokens two CTAs share an SM (the BF16 head at batch 1 - 8 streams 1.3 GB; at 146 registers it ran
// one CTA, 8 warps, per SM; ptxas now keeps it under 128 with a few spilled bytes).
template <int NT, MmaWeight F>
__global__ void __launch_bounds__(kMmaThreads, NT <= 2 ? 2 : 1)
    bf16_mma_kernel(const float* __restrict__ x, int64_t x_stride, int rows_per_group, int S, const uint8_t* __restrict__ w,
                    const uint8_t* __restrict__ wscale, int64_t scale_cols, int N, int K, int k_per_split,
                    bool skip_zero_lo, bool bf16_out, float* __restrict__ y, float* __restrict__ partial,
                    unsigned* __restrict__ counters, RopeArgs x_rope, ActCodesOut codes_out) {
  ::di::cuda::grid_dependency_wait();
  constexpr int kTok = 8 * NT;
  constexpr bool kFp8 = F == MmaWeight::kFp8Block;
  constexpr int kLoads = kFp8 ? 1 : 2;  // 16-byte weight loads per row per chunk
  __shared__ __align__(16) __nv_bfloat16 xs[2][2][kTok][kXStride];  // [buffer][hi, lo][token][k]
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, q = lane % 4;
  const int t0 = blockIdx.y * kTok, tokens = min(kTok, S - t0);
  const int row0 = blockIdx.x * kRowsPerCta + warp * 32;
  const int64_t x_col0 = static_cast<int64_t>(blockIdx.x * kRowsPerCta / rows_per_group) * K;  // the group's columns
  const float* xg = x + x_col0;
  const int64_t row_bytes = kFp8 ? K : 2 * static_cast<int64_t>(K);
  const uint8_t* wr[2][2];
  bool ok[2][2];
  mma::warp_rows(w, row0, N, row_bytes, 16 * q, wr, ok);
  const uint8_t* sc_row = kFp8 ? wscale + static_cast<int64_t>(row0 < N ? row0 / 32 : 0) * scale_cols : nullptr;
  // chunk k0's weight words of rows (mt, h) and (FP8) the scale of the lane's 32-block
  auto load_w = [&](uint4 (&a)[2][2][kLoads], uint32_t& sc, int k0) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int l = 0; l < kLoads; ++l)  // BF16: bytes [16q, +16) of [2 k0, +64) and of [2 k0 + 64, +64)
          // rows past N read row 0 (warp_rows) into outputs that are never stored: clamped loads
          a[mt][h][l] = __ldg(reinterpret_cast<const uint4*>(wr[mt][h] + (kFp8 ? k0 : 2 * k0 + 64 * l)));
    if constexpr (kFp8) sc = __ldg(sc_row + (k0 + 16 * q) / 32);
  };
  // tokens x 64 fp32 of chunk k0 -> bf16 hi / lo, a float4 per thread step; true when this thread
  // staged a nonzero lo
  auto stage_x = [&](int buf, int k0) {
    bool lo_nonzero = false;
    for (int i = threadIdx.x; i < kTok * (kChunk / 4); i += kMmaThreads) {
      const int t = i / (kChunk / 4), c = i % (kChunk / 4);
      // predicated, not branched (cuda_common.cuh); padding tokens stage zeros
      const uint4 u = ldg16_if(t < tokens, xg + (t0 + t) * x_stride + k0 + 4 * c);
      float4 v = make_float4(__uint_as_float(u.x), __uint_as_float(u.y), __uint_as_float(u.z), __uint_as_float(u.w));
      if (kFp8 && x_rope.rope.freqs) {  // wo_a: x's inverse RoPE on the 4 values' two pairs, which share a
        // head (4 | head_dim, rope_dim); the position and both frequencies load together, predicated
        const RowRope& rr = x_rope.rope;
        const int hc = static_cast<int>((x_col0 + k0 + 4 * c) % rr.head_dim), first = rr.head_dim - rr.rope_dim;
        const bool rot = t < tokens && hc >= first;
        const int f = rot ? (hc - first) / 2 : 0;
        const uint2 pw = ldg8_if(rot, x_rope.pos + t0 + t);
        const int64_t pos = static_cast<int64_t>(static_cast<uint64_t>(pw.y) << 32 | pw.x);
        const float f0 = __uint_as_float(ldg4_if(rot, rr.freqs + f)), f1 = __uint_as_float(ldg4_if(rot, rr.freqs + f + 1));
        if (rot) {
          rope_pair_at(v.x, v.y, pos, f0, true);
          rope_pair_at(v.z, v.w, pos, f1, true);
        }
      }
      const __nv_bfloat162 h01 = __floats2bfloat162_rn(v.x, v.y), h23 = __floats2bfloat162_rn(v.z, v.w);
      const __nv_bfloat162 l01 = __floats2bfloat162_rn(v.x - __low2float(h01), v.y - __high2float(h01));
      const __nv_bfloat162 l23 = __floats2bfloat162_rn(v.z - __low2float(h23), v.w - __high2float(h23));
      __nv_bfloat162* hi = reinterpret_cast<__nv_bfloat162*>(&xs[buf][0][t][4 * c]);
      __nv_bfloat162* lo = reinterpret_cast<__nv_bfloat162*>(&xs[buf][1][t][4 * c]);
      hi[0] = h01, hi[1] = h23, lo[0] = l01, lo[1] = l23;
      const uint32_t lo_bits = *reinterpret_cast<const uint32_t*>(&l01) | *reinterpret_cast<const uint32_t*>(&l23);
      lo_nonzero |= (lo_bits & 0x7FFF7FFFu) != 0u;  // -0 counts as zero
    }
    return lo_nonzero;
  };
  // this CTA's K range (blockIdx.z of the split)
  const int k_begin = blockIdx.z * k_per_split, k_end = min(K, k_begin + k_per_split);
  float acc[2][NT][4] = {};
  uint4 cur[2][2][kLoads], nxt[2][2][kLoads];
  uint32_t cur_sc = 0, nxt_sc = 0;
  load_w(cur, cur_sc, k_begin);
  // lo_used: the chunk's lo is nonzero somewhere in the CTA. Else its MMAs would add exact zeros
  // (bf16-valued x such as wo_a's) and are skipped when skip_zero_lo: same sums, half the MMAs
  bool lo_used = __syncthreads_or(stage_x(0, k_begin)) || !skip_zero_lo;
  const int nt_active = (tokens + 7) / 8;
  for (int k0 = k_begin, it = 0; k0 < k_end; k0 += kChunk, ++it) {
    const int buf = it & 1;
    bool next_lo = false;
    if (k0 + kChunk < k_end) {
      load_w(nxt, nxt_sc, k0 + kChunk);
      next_lo = stage_x(buf ^ 1, k0 + kChunk);
    }
    uint32_t wv[2][2][8];  // [mt][h][word]: bf16 pairs
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          if constexpr (kFp8) {
            e4m3x4_to_bf16(word_of(cur[mt][h][0], j), e8m0_to_float(static_cast<uint8_t>(cur_sc)), wv[mt][h][2 * j],
                           wv[mt][h][2 * j + 1]);
          } else {
            wv[mt][h][j] = word_of(cur[mt][h][0], j);
            wv[mt][h][4 + j] = word_of(cur[mt][h][kLoads - 1], j);
          }
        }
    // the chunk's MMAs over kParts halves of x (hi, then lo); one unrolled body per count
    auto mma_chunk = [&](auto parts) {
      constexpr int kParts = decltype(parts)::value;
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        uint32_t a[2][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          a[mt][0] = wv[mt][0][2 * s];
          a[mt][1] = wv[mt][1][2 * s];
          a[mt][2] = wv[mt][0][2 * s + 1];
          a[mt][3] = wv[mt][1][2 * s + 1];
        }
        const int kk = step_k<F>(q, s);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          if (nt >= nt_active) break;
#pragma unroll
          for (int part = 0; part < kParts; ++part) {
            const uint2 b = *reinterpret_cast<const uint2*>(&xs[buf][part][nt * 8 + g][kk]);
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) mma::mma_bf16(acc[mt][nt], a[mt], b.x, b.y);
          }
        }
      }
    };
    if (lo_used) mma_chunk(std::integral_constant<int, 2>{});
    else mma_chunk(std::integral_constant<int, 1>{});
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int l = 0; l < kLoads; ++l) cur[mt][h][l] = nxt[mt][h][l];
    cur_sc = nxt_sc;
    lo_used = __syncthreads_or(next_lo) || !skip_zero_lo;  // buffer `buf` is read; the other one is staged
  }
  mma::for_each_acc(acc, row0, N, tokens, [&](int r, int t, float v) {
    const int64_t at = static_cast<int64_t>(t0 + t) * N + r;
    if (partial) partial[blockIdx.z * static_cast<int64_t>(S) * N + at] = v;
    else y[at] = bf16_out ? round_bf16(v) : v;
  });
  if (!partial) {  // the tile is final
    if (codes_out.codes) quantize_tile(y, blockIdx.x * kRowsPerCta, t0, tokens, N, codes_out);
    return;
  }
  // counters: the tile's last split CTA sums the splits' partials (mma::fixup_rows)
  if (!counters || !split_last_arrival(counters + blockIdx.y * gridDim.x + blockIdx.x, static_cast<int>(gridDim.z)))
    return;
  mma::fixup_rows(partial, y, blockIdx.x * kRowsPerCta, kRowsPerCta, t0, tokens, S, N, static_cast<int>(gridDim.z),
                  bf16_out);
  if (codes_out.codes) quantize_tile(y, blockIdx.x * kRowsPerCta, t0, tokens, N, codes_out);
}

// DEEPINFER_SKIP_ZERO_LO=0 runs the lo MMAs of every chunk (A/B of the skip; same results)
bool skip_zero_lo() {
  static const bool on = env_switch_on("DEEPINFER_SKIP_ZERO_LO");
  return on;
}

// K splits: a CTA streams its rows' weights one 64-wide chunk at a time, so few row CTAs (wo_a: 32 of
// 256 rows) leave most SMs idle and each warp a long chain of chunks. Split K until about two CTAs
// per SM, down to one chunk per split, as long as the tile's last CTA can sum the splits in
// kPlanFixupRounds rounds (mma::fixup_rounds); else no finer than kMinSplitChunks chunks. The plan
// does not depend on DEEPINFER_FIXUP_ROUNDS, which only picks who sums (fix-up or reduce_splits:
// the same bits). The indexer's and compressors' narrow projections ([32 - 256,
// 5120]: 1-2 row CTAs) took 12-20 us each at 10 splits, 9-17 us at 26 (3 chunks); their kernels
// alone were 2-3x faster again at 1-2 chunks (ncu on an H100, bench/RESULTS.md) once the fix-up
// spread over the CTA's threads.
constexpr int64_t kMinSplitChunks = 3;
constexpr int64_t kPlanFixupRounds = 8;
// Up to this many CTAs (256 rows x 8 tokens each) one-chunk splits always, summed by the fix-up or,
// past its rounds, by reduce_splits (now that split sums load without a branch per split: batch 8 on
// an H100, the bf16 kernels 70.1 -> 65.8 us per call plus 4.9 us of reduce_splits, bench/RESULTS.md).
constexpr int64_t kNarrowCtas = 2;

template <MmaWeight F, int NT>
bool launch_nt(const float* x, int64_t x_stride, int rows_per_group, int64_t S, const Weight& w, bool bf16_out, float* y,
               const RopeArgs& x_rope, const ActCodesOut& codes_out) {
  const int64_t row_ctas = (w.rows + kRowsPerCta - 1) / kRowsPerCta, tok_ctas = (S + 8 * NT - 1) / (8 * NT);
  const int64_t ctas = row_ctas * tok_ctas, chunks = w.cols / kChunk;
  const int64_t tile_outputs = std::min<int64_t>(w.rows, kRowsPerCta) * std::min<int64_t>(S, 8 * NT);
  const int64_t coarse = std::clamp<int64_t>(264 / ctas, 1, std::max<int64_t>(1, chunks / kMinSplitChunks));
  int64_t splits = std::clamp<int64_t>(264 / ctas, 1, chunks);
  if (ctas > kNarrowCtas)
    while (splits > coarse && mma::fixup_rounds(tile_outputs, kMmaThreads, splits) > kPlanFixupRounds) --splits;
  const int64_t per_split = (chunks + splits - 1) / splits * kChunk;
  const int64_t used = (w.cols + per_split - 1) / per_split;
  float* partial = used > 1 ? workspace_as<float>(Ws::kPartial, static_cast<size_t>(used * S * w.rows)) : nullptr;
  const dim3 grid(static_cast<unsigned>(row_ctas), static_cast<unsigned>(tok_ctas), static_cast<unsigned>(used));
  const bool fixup = partial && mma::fixup_in_kernel(tile_outputs, kMmaThreads, used);
  unsigned* counters = fixup ? workspace_as<unsigned>(Ws::kCounters, static_cast<size_t>(grid.x) * grid.y) : nullptr;
  ::di::cuda::launch(bf16_mma_kernel<NT, F>, grid, kMmaThreads, 0, x, x_stride, rows_per_group, static_cast<int>(S),
                     wdata(w), F == MmaWeight::kFp8Block ? wscale(w) : nullptr, w.scale_cols, static_cast<int>(w.rows),
                     static_cast<int>(w.cols), static_cast<int>(per_split), skip_zero_lo(), bf16_out, y, partial, counters,
                     x_rope, partial && !fixup ? ActCodesOut{} : codes_out);
  if (partial && !fixup) reduce_splits(partial, static_cast<int>(used), S * w.rows, bf16_out, y);
  return !(partial && !fixup);  // whether the kernel wrote codes_out
}

template <MmaWeight F>
bool launch(const float* x, int64_t x_stride, int rows_per_group, int64_t S, const Weight& w, bool bf16_out, float* y,
            const RopeArgs& x_rope = {}, const ActCodesOut& codes_out = {}) {
  switch (nt_for(S)) {
    case 1: return launch_nt<F, 1>(x, x_stride, rows_per_group, S, w, bf16_out, y, x_rope, codes_out);
    case 2: return launch_nt<F, 2>(x, x_stride, rows_per_group, S, w, bf16_out, y, x_rope, codes_out);
    case 4: return launch_nt<F, 4>(x, x_stride, rows_per_group, S, w, bf16_out, y, x_rope, codes_out);
    default: return launch_nt<F, 8>(x, x_stride, rows_per_group, S, w, bf16_out, y, x_rope, codes_out);
  }
}

bool shapes_fit(const float* x, int64_t rows, const Weight& w) {
  return rows >= 1 && w.cols % kChunk == 0 && w.rows < (1LL << 31) && w.cols < (1LL << 31) &&
         (rows + 63) / 64 <= 65535 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(wdata(w)) % 16 == 0;
}

}  // namespace

bool bf16_mma_fits(const float* x, int64_t rows, const Weight& w) { return w.dtype == DType::kBF16 && shapes_fit(x, rows, w); }

void bf16_mma_linear(const float* x, int64_t rows, const Weight& w, bool bf16_out, float* y) {
  DI_CHECK(bf16_mma_fits(x, rows, w));
  launch<MmaWeight::kBf16>(x, w.cols, static_cast<int>(std::max<int64_t>(w.rows, 1)), rows, w, bf16_out, y);
}

bool grouped_mma_fits(const float* x, int64_t rows, const Weight& w, int groups) {
  return w.mode == WeightMode::kFp8Block && groups > 0 && w.rows % groups == 0 && (w.rows / groups) % kRowsPerCta == 0 &&
         w.scale != nullptr && shapes_fit(x, rows, w);
}

void grouped_mma_linear(const float* x, int64_t rows, const Weight& w, int groups, float* y) {
  DI_CHECK(grouped_mma_fits(x, rows, w, groups));
  if (grouped_gemv_mma_fits(x, rows, w, groups)) return grouped_gemv_mma(x, rows, w, groups, {}, y);
  launch<MmaWeight::kFp8Block>(x, w.cols * groups, static_cast<int>(w.rows / groups), rows, w, true, y);
}

bool grouped_mma_rope_fits(const float* x, int64_t rows, const Weight& w, int groups) {
  return rows <= 8 && grouped_mma_fits(x, rows, w, groups);
}

bool grouped_mma_linear_inverse_rope(const float* x, int64_t rows, const Weight& w, int groups, const RopeArgs& rope,
                                     float* y, const ActCodesOut& codes_out) {
  DI_CHECK(grouped_mma_rope_fits(x, rows, w, groups) && rope.rope.freqs && rope.rope.head_dim % 2 == 0 &&
           rope.rope.rope_dim % 2 == 0 && rope.rope.rope_dim <= rope.rope.head_dim);
  if (grouped_gemv_mma_fits(x, rows, w, groups)) {
    grouped_gemv_mma(x, rows, w, groups, rope, y, codes_out);
    return true;
  }
  return launch<MmaWeight::kFp8Block>(x, w.cols * groups, static_cast<int>(w.rows / groups), rows, w, true, y, rope,
                                      codes_out);
}

}  // namespace di::cuda::dense
