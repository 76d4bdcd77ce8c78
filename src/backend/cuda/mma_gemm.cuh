// Warp tiles of the quantized GEMMs (dense decode linear, grouped MoE experts) on the FP8 tensor
// cores, one MMA per 32-wide K block whose partial is scaled by the activation and weight E8M0 scales
// and added to an fp32 accumulator on the CUDA cores (the structure of the reference's fp8_gemm /
// fp4_gemm and of CpuBackend::linear):
//  - exact (the default): mma.sync m16n8k32 e4m3, which sm_90 runs as operand conversions and two
//    f16 HMMAs: the block sums of the exact products in fp32, so results equal the CPU's to rounding.
//  - fast (kFast, MXFP4 weights only: EngineOptions::fast_fp4_gemm): wgmma m64nNk32 e4m3 (wgmma.cuh),
//    native on sm_90 -- no conversions and no zero adds, which bound the grouped MoE kernel (~60 instead
//    of ~105 instructions per K block, bench/RESULTS.md). The FP8 tensor core truncates a block's
//    products to 13 fractional bits below the largest and its sum to 14 significant bits (as in
//    DeepGEMM's FP8 GEMMs, which add 4 blocks per sum), so a block partial differs from the exact one
//    by up to ~2^-13 relative.
//
// Swap-AB: the weight is the MMA's A operand (output features x 32 K, from registers), the
// activation its B operand (8 NT tokens x 32 K, from shared memory), so one weight byte serves up
// to 8 * NT tokens. A warp owns 32 output features (two m16 tiles; for wgmma, its two 16-row slices
// of the CTA's two m64 MMAs; one FP8 scale row block) and the CTA's four warps (one warpgroup) share
// the activation, staged in shared memory (and quantized there for small batches); each warp streams
// its weight rows through a two-stage register pipeline.
//
// K permutation: lane (g = lane / 4, q = lane % 4) feeds the MMA with the physical K bytes
// [8q, 8q + 8) of its rows (first 4 bytes in fragment register 0 / 1, logical k 4q.., the next 4 in
// 2 / 3, logical k 16 + 4q..). The sum over a K block does not depend on which MMA k slot a byte
// occupies, as long as weight and activation use the same assignment, so every lane reads 8
// contiguous bytes of a weight row (one 8-byte load; 4 lanes cover a row's 32-byte sector); the
// activation is staged in that logical order (b_word_offset).
//
// MXFP4 weights (E2M1, per-row-per-32 E8M0 scales) are widened to E4M3 in registers (every E2M1
// value is exact in E4M3). They are stored tiled and re-encoded (fp4_layout.cuh): a lane's 4 rows of
// a K block are one 16-byte load, its scales of 4 blocks another, and a row's word gives its 8 codes
// as E4M3 bytes in a few logic ops (fp4_lo / fp4_hi).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/attn_common.cuh"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_quant.cuh"
#include "backend/cuda/split_fixup.h"
#include "backend/cuda/wgmma.cuh"

namespace di::cuda::mma {

inline constexpr int kWarps = 4;                      // warps per CTA
inline constexpr int kThreads = kWarps * 32;
inline constexpr int kWarpRows = 32;                  // output features per warp
inline constexpr int kCtaRows = kWarps * kWarpRows;   // output features per CTA
inline constexpr int kMaxNt = 8;                      // n8 token tiles per warp
inline constexpr int kTokTile = 8 * kMaxNt;           // tokens per CTA pass
// CTAs per SM the GEMM kernels are compiled for (register cap 65536 / (128 x this)): the weight
// stream needs bytes in flight, i.e. resident warps, more than it needs registers for addresses.
template <int NT>
inline constexpr int kMinCtas = NT <= 2 ? 3 : 2;

enum class WFmt { kFp8Block, kFp4Row };

// Weight stream: read once per launch, so it bypasses L1. Predicated (zeros when `on` is false), not
// under a branch: a branch per load made each one a round trip of its own (cuda_common.cuh).
__device__ __forceinline__ uint2 ld_stream8_if(bool on, const uint8_t* p) {
  uint2 v = make_uint2(0u, 0u);
  asm volatile("{\n .reg .pred q;\n setp.ne.u32 q, %2, 0;\n @q ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%3];\n}"
      : "+r"(v.x), "+r"(v.y)
      : "r"(static_cast<unsigned>(on)), "l"(p));
  return v;
}

// The MXFP4 stream keeps its branch per load: predicated (asm volatile, which pins the loads' order)
// the grouped MoE kernel got slower at every batch (33.6 -> 37.2 us at batch 1, 168 -> 193 at batch 8,
// H100, bench/RESULTS.md).
__device__ __forceinline__ uint4 ld_stream16(const uint8_t* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// Asynchronous global -> shared copies (Ampere cp.async): the activation chunk's loads are all in
// flight at once and waited for once, instead of one load -> store round trip per element.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// A tiled MXFP4 word (fp4_layout.cuh) -> the E4M3 bytes of its first / last four codes, each 2^-6
// times the code's value (E2M1 magnitude bits e1 e0 m0 at E4M3 bits 4 3 2: exact for every code,
// subnormals included). They run for every weight word, so their op count is the MoE kernel's.
__device__ __forceinline__ uint32_t fp4_lo(uint32_t w) { return w & 0x9C9C9C9Cu; }
__device__ __forceinline__ uint32_t fp4_hi(uint32_t w) { return ((w << 2) & 0x8C8C8C8Cu) | ((w >> 2) & 0x10101010u); }
inline constexpr float kFp4CodeScale = 64.0f;  // the activation scales of MXFP4 tiles absorb the 2^-6

// The E8M0 scale in byte b of a packed word (b is a constant after unrolling), as a float: byte << 23,
// a shift and a mask instead of the byte extraction and the two compare-selects of e8m0_to_float (the
// MXFP4 tile converts four scales per K block, and ncu found the grouped MoE kernel bound by its
// integer pipe; dropping the max for byte 0 cut its time at batch 64 by ~5%: bench/RESULTS.md).
// Byte 0 (2^-127) reads as 0 -- its block's values are below 6 x 2^-127, flushed as an FTZ product
// would be -- and byte 0xFF (NaN in E8M0) as +inf: the output is non-finite either way.
__device__ __forceinline__ float e8m0_byte_to_float(uint32_t w, int b) {
  return __uint_as_float((b < 3 ? w << (23 - 8 * b) : w >> 1) & 0x7f800000u);
}

// d = A (16x32 e4m3) x B (32x8 e4m3), fresh fp32 accumulators. sm_90 lowers it to two f16 HMMAs, so
// the block sum is exact in fp32 (the fast wgmma path keeps ~14 bits of it: see the header).
__device__ __forceinline__ void mma_e4m3(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %11, %12, %13};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f), "f"(0.0f), "f"(0.0f), "f"(0.0f));
}

// d += A (16x16, row) x B (16x8, col) of f16 / bf16 values, fp32 accumulators.
#define DI_MMA_16816(T)                                                                                        \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." T "." T                                                \
               ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"                          \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                                \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))
__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  DI_MMA_16816("f16");
}
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  DI_MMA_16816("bf16");
}
#undef DI_MMA_16816

// The lane's 4 weight rows of a 32-row warp tile, 16 mt + 8 h + g past row0 (row 0 for rows past N,
// whose results are dropped): ok[mt][h] = row < N, wr[mt][h] = w + row * row_bytes + lane_offset.
__device__ __forceinline__ void warp_rows(const uint8_t* w, int row0, int N, int64_t row_bytes, int lane_offset,
                                          const uint8_t* (&wr)[2][2], bool (&ok)[2][2]) {
  const int g = (threadIdx.x & 31) >> 2;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = row0 + 16 * mt + 8 * h + g;
      ok[mt][h] = r < N;
      wr[mt][h] = w + static_cast<int64_t>(ok[mt][h] ? r : 0) * row_bytes + lane_offset;
    }
}

// Per token-tile width: K blocks of activation staged in shared memory at a time, and K blocks of
// weight per register pipeline stage (two stages: the next one loads while this one computes). The
// staged codes: for mma.sync, token rows in physical K order (row stride = 32 mod 128 bytes, so a
// warp's 8-byte B-fragment reads are conflict-free); for wgmma, kBlockBytes per K block in its B
// layout (b_word_offset).
template <int NT>
struct TileShape {
  static constexpr int kChunk = NT <= 2 ? 64 : (NT == 4 ? 32 : 16);
  static constexpr int kRows = 8 * NT;
  static constexpr int kCodeStride = kChunk * 32 + 32;
  static constexpr int kBlockBytes = 32 * kRows;  // [NT groups][2 K halves][8 tokens][16 bytes]
  static constexpr int kScaleStride = kChunk + 1;
};
// wgmma B layout, within one staged K block: the byte offset of physical K word pw (bytes 4 pw ..
// 4 pw + 3, pw < 8) of token t. Logical word pw / 2 + 4 (pw % 2) (the K permutation above): half
// pw % 2, bytes 4 (pw / 2) of the token's 16-byte core-matrix row; 8-token groups 256 bytes apart.
__device__ __forceinline__ int b_word_offset(int t, int pw) {
  return (t >> 3) * 256 + (pw & 1) * 128 + (t & 7) * 16 + (pw >> 1) * 4;
}
inline constexpr uint32_t kBHalfBytes = 128;   // wgmma descriptor LBO: the K block's two 16-byte halves
inline constexpr uint32_t kBGroupBytes = 256;  // SBO: 8-token groups
template <WFmt F, int NT>
inline constexpr int kStageBlocks = F == WFmt::kFp8Block ? (NT <= 2 ? 4 : 2) : (NT <= 2 ? 8 : 4);

// The tile's activation: pre-quantized E4M3 codes [*, K] and scales [*, K/32] (xc, xs), or fp32 rows
// (x) that the tile quantizes itself while staging (bit-exact with dense::quantize_activation).
struct ActSource {
  const uint8_t* xc;
  const float* xs;
  const float* x;
  // fp32 rows only: RMSNorm them first (linear_rope with a norm), with rmsnorm_kernel's arithmetic -- the
  // row's sum of squares in cpu::sum_squares' order, then bf16(w * (x * scale)) -- over all K columns
  // (the row is read whole for the sum even when this CTA's K range is a split of it)
  const uint8_t* norm_w = nullptr;  // [K] weight, nullptr: no norm
  attn::WType norm_type = attn::WType::kBf16;
  float eps = 0.0f;
};

// One CTA's fp32 accumulators over K blocks [kb0, kb1) for tokens 0 .. count-1 (count <= 8 NT;
// act_row(i) = the activation row of token i). Every thread of the CTA must call it (it stages the
// activation chunk by chunk with __syncthreads). Per warp: acc[mt][nt][i] is output feature
// row0 + 16 mt + g (+8 for i >= 2) and token nt*8 + 2q + (i & 1). w: FP8 codes, row-major [N, K],
// with E8M0 scales [ceil(N/32), scale_cols] at wscale; or MXFP4 in the tiled layout of
// fp4_layout.cuh (data at w, scales at wscale; scale_cols unused). row0 is a multiple of 32.
//
// Latency: the weight words and their E8M0 scales of the next U K blocks load while the current U
// compute (nothing in the compute loop waits on global memory); a chunk's activation is staged with
// cp.async (one wait per chunk) or, for fp32 rows, quantized from loads issued 8 blocks at a time.
// kWg: each K block is one wgmma per 64-row slice into fresh accumulators, waited for before its
// scaled add (the per-block scales forbid accumulating across blocks in the tensor core); all N = 8 NT
// columns are multiplied, those of padding groups past `count` hold stale values and are dropped.
template <WFmt F, int NT, bool kFast, class ActRow>
__device__ __forceinline__ void cta_tile(const uint8_t* __restrict__ w, const uint8_t* __restrict__ wscale,
                                         int64_t scale_cols, int N, int K, int row0, int kb0, int kb1,
                                         const ActSource& src, int count, const ActRow& act_row,
                                         float (&acc)[2][NT][4]) {
  using Shape = TileShape<NT>;
  constexpr int C = Shape::kChunk, S = Shape::kCodeStride, BB = Shape::kBlockBytes, SS = Shape::kScaleStride;
  constexpr int U = kStageBlocks<F, NT>;
  constexpr bool kFp8 = F == WFmt::kFp8Block;
  constexpr bool kWg = kFast && !kFp8;  // wgmma block sums (MXFP4 only)
  constexpr int W = kFp8 ? 2 : 1;  // 32-bit weight words per (block, row) per lane
  // scale registers per stage, U either way: FP8 one byte per block (the warp's 32-row block), one per
  // register; FP4 the U bytes of each of the lane's 4 rows, packed 4 to a register
  constexpr int SW = U;
  static_assert(kFp8 || U % 4 == 0, "FP4 stages hold whole scale words");
  // staged codes: kWg [chunk block][wgmma B layout] (b_word_offset), else [token][chunk block][32]
  __shared__ alignas(kWg ? 128 : 16) uint8_t sx[kWg ? C * BB : Shape::kRows * S];
  __shared__ float ss[Shape::kRows * SS];
  __shared__ int32_t srow[Shape::kRows];  // activation row of each tile token, -1 for padding
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3, warp = threadIdx.x >> 5;
  const int nt_active = (count + 7) / 8, rows_pad = 8 * nt_active, nb = K / 32;
  // FP8: row-major rows; the warp's 32-row scale block (block 0 for a warp past N, whose results are
  // dropped). FP4: the warp's 32-row tile (fp4_layout.cuh; tile 0 past N), this lane's 16 bytes.
  const int tile = row0 < N ? row0 / 32 : 0;
  const uint8_t* wr[2][2];
  bool ok[2][2];
  warp_rows(w, row0, N, K, 8 * q, wr, ok);
  const uint8_t* w4 = w + (static_cast<int64_t>(tile) * nb * 32 + lane) * 16;
  const uint8_t* s8 = wscale + static_cast<int64_t>(tile) * scale_cols;
  const uint8_t* s4 = wscale + (static_cast<int64_t>(tile) * ((nb + 3) / 4) * 8 + g) * 16;
  // weight words and scales of K blocks kb .. kb+U-1 (zero past kb1 / N); FP8 predicated, MXFP4 branched
  auto load = [&](uint32_t (&a)[U][2][2][W], uint32_t (&sc)[SW], int kb) {
    if constexpr (kFp8) {
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const uint2 v = ld_stream8_if(kb + u < kb1 && ok[mt][h], wr[mt][h] + (kb + u) * 32);
            a[u][mt][h][0] = v.x;  // row 16 mt + 8 h + g, bytes 8q .. 8q+3 of the block
            a[u][mt][h][W - 1] = v.y;  // bytes 8q+4 .. 8q+7
          }
#pragma unroll
      for (int u = 0; u < U; ++u) sc[u] = ldg1_if(kb + u < kb1, s8 + kb + u);
    } else {
#pragma unroll
      for (int u = 0; u < U; ++u) {  // word 2 mt + h: row 16 mt + 8 h + g, bytes 4q .. 4q+3
        const uint4 v = kb + u < kb1 ? ld_stream16(w4 + static_cast<int64_t>(kb + u) * 512) : make_uint4(0u, 0u, 0u, 0u);
        a[u][0][0][0] = v.x, a[u][0][1][0] = v.y, a[u][1][0][0] = v.z, a[u][1][1][0] = v.w;
      }
#pragma unroll
      for (int j = 0; j < U / 4; ++j) {  // stages start 4-aligned (plan_split), so whole scale groups
        const int k = kb + 4 * j;
        const uint4 v = k < kb1 ? __ldg(reinterpret_cast<const uint4*>(s4 + (k / 4) * 128)) : make_uint4(0u, 0u, 0u, 0u);
        sc[0 * (U / 4) + j] = v.x, sc[1 * (U / 4) + j] = v.y, sc[2 * (U / 4) + j] = v.z, sc[3 * (U / 4) + j] = v.w;
      }
    }
  };
  if (threadIdx.x < rows_pad) srow[threadIdx.x] = threadIdx.x < count ? act_row(threadIdx.x) : -1;
  uint32_t cur[U][2][2][W], nxt[U][2][2][W] = {};
  uint32_t cur_s[SW], nxt_s[SW] = {};
  float d[2][NT][4] = {};  // kWg: one K block's partials, [mt] = the m64 MMA of rows 16 mt + 8 h + g
  load(cur, cur_s, kb0);  // in flight while the first activation chunk is staged (and normalized)
  __shared__ float sinv[Shape::kRows];  // the rows' RMSNorm scales (src.norm_w)
  if (src.x && src.norm_w)
    for (int r = 0; r < count; ++r) {  // the same row for every thread: act_row, not srow (not yet visible)
      const float inv = rms_scale(block_sum_squares_exact128(src.x + static_cast<int64_t>(act_row(r)) * K, K), K,
                                  src.eps);
      if (threadIdx.x == 0) sinv[r] = inv;  // read after the chunk loop's first barrier
    }
  for (int kc = kb0; kc < kb1; kc += C) {
    const int nkc = min(C, kb1 - kc);
    __syncthreads();  // the previous chunk's readers are done (and srow is written)
    // padding tokens: zero codes and scales
    for (int i = threadIdx.x; i < (rows_pad - count) * nkc * 2; i += kThreads) {  // 16-byte pieces
      const int r = count + i / (2 * nkc), c16 = i % (2 * nkc);
      // kWg: block c16 / 2's core-matrix row of K half c16 % 2 (b_word_offset of word c16 % 2)
      const int at = kWg ? c16 / 2 * BB + b_word_offset(r, c16 % 2) : r * S + c16 * 16;
      *reinterpret_cast<uint4*>(sx + at) = make_uint4(0u, 0u, 0u, 0u);
    }
    for (int i = threadIdx.x; i < (rows_pad - count) * nkc; i += kThreads) ss[(count + i / nkc) * SS + i % nkc] = 0.0f;
    if (src.x) {  // quantize fp32 rows: one warp per 32-value block, 8 blocks' loads in flight
      constexpr int kBatch = 8;
      const int blocks = count * nkc;
      for (int b0 = warp; b0 < blocks; b0 += kWarps * kBatch) {
        float v[kBatch], nw[kBatch];  // the norm weights load with x (one round trip per batch, not per block)
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
          const int b = min(b0 + j * kWarps, blocks - 1), r = b / nkc, c = b - r * nkc;  // clamped loads
          v[j] = src.x[static_cast<int64_t>(srow[r]) * K + (kc + c) * 32 + lane];
          // (norm_w is the same for the whole kernel: no per-load branch, and no load without a norm)
          nw[j] = src.norm_w ? attn::weight_elem(src.norm_w, src.norm_type, (kc + c) * 32 + lane) : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
          const int b = b0 + j * kWarps;
          if (b >= blocks) break;  // warp-uniform
          const int r = b / nkc, c = b - r * nkc;
          float xv = v[j];
          if (src.norm_w) xv = dq::rms_normed(xv, nw[j], sinv[r]);  // rmsnorm_kernel's element
          const int e = dq::round_scale_exponent(dq::group_amax<32>(xv, dq::kFp8AmaxFloor), dq::kFp8MaxInv);
          const int at = kWg ? c * BB + b_word_offset(r, lane >> 2) + (lane & 3) : r * S + c * 32 + lane;
          sx[at] = dq::fp8_code(xv, dq::scale_from_exponent(e));
          if (lane == 0) ss[r * SS + c] = e8m0_to_float(dq::e8m0_byte(e)) * (kFp8 ? 1.0f : kFp4CodeScale);
        }
      }
    } else {
      if constexpr (kWg) {
        for (int i = threadIdx.x; i < count * nkc * 8; i += kThreads) {  // 4-byte words: the K permutation
          const int r = i / (8 * nkc), c = i % (8 * nkc) / 8, pw = i % 8;
          cp_async4(sx + c * BB + b_word_offset(r, pw),
                    src.xc + static_cast<int64_t>(srow[r]) * K + (kc + c) * 32 + pw * 4);
        }
      } else {
        for (int i = threadIdx.x; i < count * nkc * 2; i += kThreads) {
          const int r = i / (2 * nkc), c = i - r * 2 * nkc;
          cp_async16(sx + r * S + c * 16, src.xc + static_cast<int64_t>(srow[r]) * K + kc * 32 + c * 16);
        }
      }
      for (int i = threadIdx.x; i < count * nkc; i += kThreads) {
        const int r = i / nkc, c = i - r * nkc;
        cp_async4(ss + r * SS + c, src.xs + static_cast<int64_t>(srow[r]) * nb + kc + c);
      }
      cp_async_wait_all();
      if constexpr (!kFp8)  // each thread its own copies: they are complete and visible to it
        for (int i = threadIdx.x; i < count * nkc; i += kThreads) {
          const int r = i / nkc, c = i - r * nkc;
          ss[r * SS + c] *= kFp4CodeScale;
        }
    }
    if constexpr (kWg) wg::fence_async_smem();  // the staged codes are read by wgmma (the async proxy)
    __syncthreads();
    for (int kb = kc; kb < kc + nkc; kb += U) {
      if (kb + U < kb1) load(nxt, nxt_s, kb + U);
      // this lane's activation codes (mma.sync) and scales of the stage's first block (per block, per
      // token tile: constant offsets)
      const uint8_t* xs_lane = sx + g * S + (kb - kc) * 32 + 8 * q;
      const float* ss_lane = ss + 2 * q * SS + (kb - kc);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int k = kb + u;
        if (k >= kc + nkc) break;
        float ws[2][2];  // [mt][h]: the scale of rows 16 mt + 8 h + g
        if constexpr (kFp8) {
          const float s = e8m0_to_float(static_cast<uint8_t>(cur_s[u]));  // one 32-row block per warp
          ws[0][0] = ws[0][1] = ws[1][0] = ws[1][1] = s;
        } else {
#pragma unroll
          for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h)
              ws[mt][h] = e8m0_byte_to_float(cur_s[(mt * 2 + h) * (U / 4) + u / 4], u % 4);
        }
        uint32_t a[2][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          if constexpr (kFp8) {
            a[mt][0] = cur[u][mt][0][0];
            a[mt][1] = cur[u][mt][1][0];
            a[mt][2] = cur[u][mt][0][W - 1];
            a[mt][3] = cur[u][mt][1][W - 1];
          } else {  // 8 codes of the lane's row: the first 4 feed register 0 / 1, the last 4 register 2 / 3
            a[mt][0] = fp4_lo(cur[u][mt][0][0]);
            a[mt][1] = fp4_lo(cur[u][mt][1][0]);
            a[mt][2] = fp4_hi(cur[u][mt][0][0]);
            a[mt][3] = fp4_hi(cur[u][mt][1][0]);
          }
        }
        // acc += partial p[mt][i] * (act scale * weight scale) for token tile nt: both powers of two, so
        // this is the CPU's (partial * xs) * ws unless an intermediate leaves the normal range
        const auto scale_add = [&](int nt, int mt, const float (&p)[4], float s0, float s1) {
          acc[mt][nt][0] = fmaf(p[0], s0 * ws[mt][0], acc[mt][nt][0]);
          acc[mt][nt][1] = fmaf(p[1], s1 * ws[mt][0], acc[mt][nt][1]);
          acc[mt][nt][2] = fmaf(p[2], s0 * ws[mt][1], acc[mt][nt][2]);
          acc[mt][nt][3] = fmaf(p[3], s1 * ws[mt][1], acc[mt][nt][3]);
        };
        if constexpr (!kWg) {  // one mma.sync per (m16, n8) tile: exact block sums
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            if (nt >= nt_active) break;
            const uint2 b = *reinterpret_cast<const uint2*>(xs_lane + nt * 8 * S + u * 32);
            const float s0 = ss_lane[nt * 8 * SS + u], s1 = ss_lane[nt * 8 * SS + SS + u];
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
              float p[4];
              mma_e4m3(p, a[mt], b.x, b.y);
              scale_add(nt, mt, p, s0, s1);
            }
          }
        } else {  // one wgmma per 64-row slice, all 8 NT tokens
          const uint64_t bdesc = wg::desc(sx + (k - kc) * BB, kBHalfBytes, kBGroupBytes);
          wg::fence();  // a[] and d[] were written / read by this thread since the last wgmma
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) wg::mma_e4m3<8 * NT>(d[mt], a[mt], bdesc);
          wg::commit();
          wg::wait<0>();
#pragma unroll
          for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
              for (int i = 0; i < 4; ++i) wg::pin(d[mt][nt][i]);
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            if (nt >= nt_active) break;
            const float s0 = ss_lane[nt * 8 * SS + u], s1 = ss_lane[nt * 8 * SS + SS + u];
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) scale_add(nt, mt, d[mt][nt], s0, s1);
          }
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int j = 0; j < W; ++j) cur[u][mt][h][j] = nxt[u][mt][h][j];
#pragma unroll
      for (int j = 0; j < SW; ++j) cur_s[j] = nxt_s[j];
    }
  }
}

// sum_{sp < splits} p[sp * split_stride] in split order, kInFlight loads in flight (L2: other CTAs
// wrote them).
template <int kInFlight = 8>
__device__ __forceinline__ float sum_splits(const float* p, int64_t split_stride, int splits) {
  float s = 0.0f;
  for (int sp0 = 0; sp0 < splits; sp0 += kInFlight) {
    float v[kInFlight];
#pragma unroll
    for (int j = 0; j < kInFlight; ++j)
      v[j] = __ldcg(p + static_cast<int64_t>(min(sp0 + j, splits - 1)) * split_stride);  // see kFixupLoads
#pragma unroll
    for (int j = 0; j < kInFlight; ++j)
      if (sp0 + j < splits) s += v[j];
  }
  return s;
}

// The split fix-up: the last CTA of a tile sums its rows x tokens outputs over the splits, the outputs
// spread over all of the CTA's threads (a narrow projection's 32 rows leave most threads without a
// row of their own), kFixupLoads partials in flight per thread: 4 outputs x 8 splits, 2 x 16 or
// 1 x 32 by how many outputs a thread has. A round is one L2 round trip.
// The split sums load their partials unconditionally (a clamped split / token index; the extra
// values are not added): a load written as `in range ? load : 0` compiles to a branch per load, and
// each branch's join waited for its load, so the loads of a sum ran one L2 round trip after another
// (an H100 probe: 80 splits summed in ~14 us by 16 or 256 CTAs alike, ~1 us with clamped loads).
inline constexpr int kFixupLoads = 32;
__host__ __device__ inline int fixup_outputs_per_load(int64_t per_thread) {
  return per_thread >= 4 ? 4 : per_thread >= 2 ? 2 : 1;
}
__host__ __device__ inline int64_t fixup_rounds(int64_t outputs, int threads, int64_t splits) {
  const int64_t per_thread = (outputs + threads - 1) / threads;
  const int g = fixup_outputs_per_load(per_thread);
  return (per_thread + g - 1) / g * ((splits + kFixupLoads / g - 1) / (kFixupLoads / g));
}

// Whether a launch's K splits are summed by each tile's last CTA (split_last_arrival + fixup_rows)
// rather than by a reduce_splits launch: while the fix-up is a few rounds of L2 latency, the last CTA
// adds the sums faster than a second launch starts and drains; past that its serial rounds cost
// more. DEEPINFER_FIXUP_ROUNDS sets the limit (default 8; 0 = always reduce_splits).
inline bool fixup_in_kernel(int64_t tile_outputs, int threads, int64_t splits) {
  return fixup_rounds(tile_outputs, threads, splits) <= fixup_max_rounds();
}

// G outputs at y[at[0 .. valid)], each the sum of its splits' partials (split stride `stride`) in
// split order from zero (as reduce_splits does: the same bits); the loads are independent, only each
// output's adds are ordered.
template <int G>
__device__ __forceinline__ void fixup_outputs(const float* partial, float* y, const int64_t (&at)[G], int valid,
                                              int64_t stride, int splits, bool bf16_out) {
  constexpr int J = kFixupLoads / G;
  float s[G] = {};
  for (int sp0 = 0; sp0 < splits; sp0 += J) {
    float v[G][J];
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
      for (int j = 0; j < J; ++j)
        v[g][j] = __ldcg(partial + min(sp0 + j, splits - 1) * stride + at[g]);  // at[g] = 0 past `valid`
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
      for (int j = 0; j < J; ++j)
        if (sp0 + j < splits) s[g] += v[g][j];
  }
#pragma unroll
  for (int g = 0; g < G; ++g)
    if (g < valid) y[at[g]] = bf16_out ? dq::round_bf16(s[g]) : s[g];
}

// The last CTA's fix-up of a tile: rows [row0, row0 + tile_rows) (clipped to N) x tokens
// [t0, t0 + count) of y [M, N], from the splits' partials [splits][M, N]. Output o of the tile is
// token o / rows, row o % rows (consecutive threads read consecutive rows); thread t takes outputs
// t, t + threads, ...
template <int G>
__device__ __forceinline__ void fixup_tile(const float* partial, float* y, int row0, int rows, int t0, int outputs,
                                           int M, int N, int splits, bool bf16_out) {
  const int64_t stride = static_cast<int64_t>(M) * N;
  const int threads = static_cast<int>(blockDim.x);
  for (int o0 = static_cast<int>(threadIdx.x); o0 < outputs; o0 += G * threads) {
    int64_t at[G];
    int valid = 0;
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const int o = o0 + g * threads;
      at[g] = o < outputs ? static_cast<int64_t>(t0 + o / rows) * N + row0 + o % rows : 0;
      valid += o < outputs;
    }
    fixup_outputs<G>(partial, y, at, valid, stride, splits, bf16_out);
  }
}

// One thread per row of a full-width tile (tile_rows == threads), kFixupTokens tokens x 8 splits in
// flight: the same loads and additions as fixup_tile<4> where a thread has 8 outputs, in the form the
// quantized linears measured fastest with (fixup_tile cost them 1-3 us more per call at batch 8 on
// an H100, bench/RESULTS.md).
inline constexpr int kFixupTokens = 4;
__device__ __forceinline__ void fixup_row_per_thread(const float* partial, float* y, int row0, int t0, int count, int M,
                                                     int N, int splits, bool bf16_out) {
  const int r = row0 + static_cast<int>(threadIdx.x);
  if (r >= N) return;
  const int64_t stride = static_cast<int64_t>(M) * N;
  for (int tb = 0; tb < count; tb += kFixupTokens) {
    float s[kFixupTokens] = {};
    for (int sp0 = 0; sp0 < splits; sp0 += 8) {
      float v[kFixupTokens][8];
#pragma unroll
      for (int k = 0; k < kFixupTokens; ++k)
#pragma unroll
        for (int j = 0; j < 8; ++j)
          v[k][j] = __ldcg(partial + min(sp0 + j, splits - 1) * stride +
                           static_cast<int64_t>(t0 + min(tb + k, count - 1)) * N + r);
#pragma unroll
      for (int k = 0; k < kFixupTokens; ++k)
#pragma unroll
        for (int j = 0; j < 8; ++j)
          if (sp0 + j < splits) s[k] += v[k][j];
    }
#pragma unroll
    for (int k = 0; k < kFixupTokens; ++k)
      if (tb + k < count) {
        const int64_t at = static_cast<int64_t>(t0 + tb + k) * N + r;
        y[at] = bf16_out ? dq::round_bf16(s[k]) : s[k];
      }
  }
}

// The last CTA's fix-up of a tile of tile_rows rows: a thread per row when the tile's rows fill the
// CTA's threads and a thread has >= 4 outputs, else the outputs spread over the threads (fixup_tile).
__device__ __forceinline__ void fixup_rows(const float* partial, float* y, int row0, int tile_rows, int t0, int count,
                                           int M, int N, int splits, bool bf16_out) {
  const int rows = min(tile_rows, N - row0), outputs = rows * count;
  if (outputs <= 0) return;
  if (rows == static_cast<int>(blockDim.x) && count >= kFixupTokens)  // the rounds of fixup_tile<4>
    return fixup_row_per_thread(partial, y, row0, t0, count, M, N, splits, bf16_out);
  switch (fixup_outputs_per_load((outputs + blockDim.x - 1) / blockDim.x)) {
    case 4: return fixup_tile<4>(partial, y, row0, rows, t0, outputs, M, N, splits, bf16_out);
    case 2: return fixup_tile<2>(partial, y, row0, rows, t0, outputs, M, N, splits, bf16_out);
    default: return fixup_tile<1>(partial, y, row0, rows, t0, outputs, M, N, splits, bf16_out);
  }
}

// sum += part for every accumulator: the in-CTA K splits of the batch-invariant mode, added in split
// order to a sum that starts at zero -- the same additions as sum_splits over split CTAs' partials.
template <int NT>
__device__ __forceinline__ void add_split(float (&sum)[2][NT][4], const float (&part)[2][NT][4]) {
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) sum[mt][nt][i] = __fadd_rn(sum[mt][nt][i], part[mt][nt][i]);
}

// Visits every accumulator of the warp in every lane (for warp shuffles between them): f(row, token
// index in the tile, value, in) with in = row < N and token < count. Row r's lane is 4 (r % 8) + the
// token's pair q, so rows r and r ^ 1 (row0 even) sit in lanes l and l ^ 4.
template <int NT, class F>
__device__ __forceinline__ void for_each_acc_all(const float (&acc)[2][NT][4], int row0, int N, int count, const F& f) {
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = row0 + 16 * mt + 8 * (i >> 1) + g, t = nt * 8 + 2 * q + (i & 1);
        f(r, t, acc[mt][nt][i], r < N && t < count);
      }
}

// Visits the warp's accumulators: f(row, token index in the tile, value) for rows < N, tokens < count.
template <int NT, class F>
__device__ __forceinline__ void for_each_acc(const float (&acc)[2][NT][4], int row0, int N, int count, const F& f) {
  for_each_acc_all(acc, row0, N, count, [&](int r, int t, float v, bool in) {
    if (in) f(r, t, v);
  });
}

// Split-K fix-up: the last CTA of a tile group to arrive sums the partials (cuda_common.cuh).
using ::di::cuda::split_last_arrival;

}  // namespace di::cuda::mma
