// FP8 block linears of up to 8 rows on the f16 tensor cores (mma.sync m16n8k16): the decode step's GEMVs. Opt-in
// (gemv_mma_switch.h).
//
// Against fp8_gemv.cu's CUDA-core sums, which cost a conversion to f16, one to f32 and an FMA per weight byte and
// row: here a weight byte costs half an F2FP conversion and the sums run on the tensor cores, so 2-8 rows cost
// about what one does (op_bench on an H100: wq_b 20.7 / 21.2 / 24.8 us at 1 / 2 / 8 rows, main's kernels 21.4 / 26.1 /
// 26.2; wo_a 16.7 against 23.1 at one row). At one row the FP8 linears are no faster (3x fewer instructions, the
// same time), and a pure read of wq_b's 42 MB takes 15.5 us per launch (bench/gpu/probe_stream_read.cu): both
// kernels lose ~5 us to their own structure, not to instructions or DRAM (bench/RESULTS.md, forty-second session).
//
// Layout. A warp streams a unit: 16 weight rows x 64 K (one span, two 32-wide scale blocks). Lane (g, q)
// (g = lane / 4, q = lane % 4) loads bytes [16 q, 16 q + 16) of the span of rows 2g and 2g + 1, one 16-byte
// load each; a quad's four lanes read a row's 64 contiguous bytes. The MMA's K order is permuted to fit: in
// MMA h (0..3) lane q's K slots {2q, 2q + 1, 2q + 8, 2q + 9} are its bytes 4h .. 4h + 3, and A's rows g and
// g + 8 are weight rows 2g and 2g + 1 (so a RoPE pair ends in one lane). Lanes q = 0, 1 hold the span's first
// scale block, q = 2, 3 its second; the two blocks are kept apart by B's columns: column 2t + b holds
// activation row t's values in block b and zeros elsewhere, so C's columns are per-block sums, which the
// lane scales (weight E8M0 x activation scale, exact powers of two) and adds in fp32. Products of f16 values of
// E4M3 codes are exact; the tensor core's fp32 sums are in its own order, so the result equals
// CpuBackend::linear to fp32 summation order (the dense_ops_test bound), not bit for bit.
//
// Float activations (wo_a: the attention's output, block-diagonal over 8 groups) are staged as f16 hi + lo of x over
// a power of two per 32-block (stage_floats) and take the lo MMAs only where some lo is nonzero; the inverse RoPE
// of wo_a's input and the quantization of its output for wo_b happen while staging and in the epilogue.
//
// Work. A CTA of 4 warps takes one 32-row scale block (warps 0 / 1: rows 0-15 / 16-31) and a part of K
// (warps 2, 3 take the part's odd spans); the two span halves meet in shared memory. With K split over
// `parts` CTAs, the last CTA of a row block to arrive sums the parts in order (split_last_arrival). Each lane
// keeps kGroup units' loads in flight and re-fills a unit's registers as soon as it has consumed them; the
// first group is loaded before the PDL wait (weights are never written: pdl_launch.cuh).
#include <algorithm>
#include <atomic>
#include <cstdlib>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_quant.cuh"
#include "backend/cuda/dense_linear.cuh"
#include "backend/cuda/gemm_workspace.cuh"
#include "backend/cuda/mma_gemm.cuh"
#include "backend/cuda/pdl_launch.cuh"
#include "backend/cuda/rope_math.cuh"

namespace di::cuda::dense {
namespace {

constexpr int kThreads = 128;     // 4 warps: 2 row halves x 2 span parities
constexpr int kBlockRows = 32;    // a CTA's rows: one E8M0 scale row block
constexpr int kSpan = 64;         // K per unit (two scale blocks)
constexpr int kGroup = 4;         // units in flight per warp (4 KB)
constexpr int kMaxRows = 8;       // activation rows: 2 n8 column tiles of (row, block) pairs
constexpr int kMaxPartSpans = 32; // staged activation per row: 4 KB of f16
constexpr int kPadHalves = 8;     // staged row stride padding (16 B): rows' reads fall on other banks

struct MmaGemvArgs {
  const uint8_t* xc;      // [M, K] E4M3 activation codes (FP8 activations)
  const float* xs;        // [M, K / 32] their scales
  const float* xf;        // float activations instead: row m of group g at xf + m x_stride + g K
  int64_t x_stride;
  int rows_per_group;     // weight rows per group (block-diagonal grouped linears), a multiple of 32
  RopeArgs x_rope;        // float activations: rotated back (inverse RoPE) while staged
  const uint8_t* w;       // [N, K] E4M3
  const uint8_t* wscale;  // [ceil(N / 32), scale_cols] E8M0
  int64_t scale_cols;
  int N, K, M;
  int parts, part_spans;  // part p covers spans [p part_spans, (p + 1) part_spans) of K / 64
  RopeArgs rope;          // applied to the output
  ActCodesOut codes_out;  // the output quantized for the next FP8 linear (N % 32 == 0), or none
  float* partial;         // [parts, M, N] when parts > 1
  unsigned* counters;     // [row blocks], zero between launches
  float* y;               // [M, N], bf16-valued
};

// One unit's weights in a lane: rows 2g and 2g + 1, 16 bytes each, and the span's two scale bytes.
struct Unit {
  uint4 r0, r1;
  uint32_t sc;  // scale of block 0 | block 1 << 8
};

struct LaneRows {
  const uint8_t* r0;  // the lane's 16 bytes of span 0 of row 2g (clamped to a valid row)
  const uint8_t* r1;
  const uint8_t* sc;  // the row block's scale of K block 0
};

__device__ __forceinline__ LaneRows lane_rows(const MmaGemvArgs& a, int row_block, int half) {
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int row = row_block * kBlockRows + half * 16 + 2 * g;
  // rows past N read row N - 1: their sums are dropped
  const int64_t k = a.K;
  return {a.w + min(row, a.N - 1) * k + 16 * q, a.w + min(row + 1, a.N - 1) * k + 16 * q,
          a.wscale + static_cast<int64_t>(row_block) * a.scale_cols};
}

__device__ __forceinline__ Unit load_unit(const LaneRows& lr, int span) {
  Unit u;
  u.r0 = __ldg(reinterpret_cast<const uint4*>(lr.r0 + static_cast<int64_t>(span) * kSpan));
  u.r1 = __ldg(reinterpret_cast<const uint4*>(lr.r1 + static_cast<int64_t>(span) * kSpan));
  u.sc = static_cast<uint32_t>(__ldg(lr.sc + 2 * span)) | static_cast<uint32_t>(__ldg(lr.sc + 2 * span + 1)) << 8;
  return u;
}

struct Work {
  int row_block, part, half, parity;
  int s0, s1;   // the CTA's spans
  int units;    // the warp's: spans s0 + parity, s0 + parity + 2, ... below s1
};

__device__ __forceinline__ Work work_of(const MmaGemvArgs& a) {
  Work wk;
  wk.row_block = blockIdx.x / a.parts;
  wk.part = blockIdx.x % a.parts;
  const int warp = threadIdx.x >> 5;
  wk.half = warp & 1;
  wk.parity = warp >> 1;
  wk.s0 = wk.part * a.part_spans;
  wk.s1 = min(a.K / kSpan, wk.s0 + a.part_spans);
  wk.units = max(0, (wk.s1 - wk.s0 - wk.parity + 1) / 2);
  return wk;
}

// What a warp starts with: its work and the first group of its units (ring slots). Its row pointers are taken
// again after the staging rather than kept live through it (8 registers more, one CTA fewer per SM).
struct Start {
  Work wk;
  Unit u[kGroup];
};

// The first group of the warp's units, loaded before the PDL wait.
__device__ __forceinline__ Start first_group_then_wait(const MmaGemvArgs& a) {
  Start st = {};
  st.wk = work_of(a);
  const LaneRows lr = lane_rows(a, st.wk.row_block, st.wk.half);
#pragma unroll
  for (int i = 0; i < kGroup; ++i)
    if (i < st.wk.units) st.u[i] = load_unit(lr, st.wk.s0 + st.wk.parity + 2 * i);
  ::di::cuda::grid_dependency_wait();
  return st;
}

// Two E4M3 codes (the low 16 bits) as an f16 pair, low code in the low half (exact).
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t two) {
  const __half2_raw v = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two & 0xFFFFu), __NV_E4M3);
  return static_cast<uint32_t>(v.x) | static_cast<uint32_t>(v.y) << 16;
}

// The CTA's part of the activation in shared memory: f16 codes (exact) [M][part spans x 64 + pad] and their
// scales [M][2 part spans].
__device__ __forceinline__ void stage_codes(const MmaGemvArgs& a, const Work& wk, __half* xh, float* xsc,
                                            int stride) {
  const int n = (wk.s1 - wk.s0) * kSpan, per_row = n / 8;
  for (int i = threadIdx.x; i < a.M * per_row; i += kThreads) {
    const int m = i / per_row, j = i % per_row;
    const uint2 c = __ldg(reinterpret_cast<const uint2*>(a.xc + static_cast<int64_t>(m) * a.K + wk.s0 * kSpan) + j);
    *reinterpret_cast<uint4*>(xh + m * stride + 8 * j) =
        make_uint4(e4m3x2_to_f16x2(c.x), e4m3x2_to_f16x2(c.x >> 16), e4m3x2_to_f16x2(c.y), e4m3x2_to_f16x2(c.y >> 16));
  }
  const int blocks = n / 32;  // the part's; rows of xsc hold 2 part_spans (a last part may be shorter)
  for (int i = threadIdx.x; i < a.M * blocks; i += kThreads) {
    const int m = i / blocks, b = i % blocks;
    xsc[m * 2 * a.part_spans + b] = __ldg(a.xs + static_cast<int64_t>(m) * (a.K / 32) + 2 * wk.s0 + b);
  }
}

// Float activations (the attention's output for wo_a: bf16 values) as f16 hi + lo of x / s, s a power of two per
// 32-block that puts the block's largest |x| in [2^14, 2^15): hi + lo hold 22 bits of x / s (bf16 values are
// exact in hi alone, so lo is zero) and s x (hi + lo) = x up to 2^-22 relative. Optionally x's inverse RoPE
// first, with rope_kernel's arithmetic (the same bits as rope then this). Returns whether this thread staged a
// nonzero lo. A thread takes 8 values; a block's 4 threads are consecutive lanes.
__device__ __forceinline__ bool stage_floats(const MmaGemvArgs& a, const Work& wk, __half* xh, __half* xl,
                                             float* xsc, int stride) {
  const int n = (wk.s1 - wk.s0) * kSpan, per_row = n / 8;
  const int64_t col0 = static_cast<int64_t>(wk.row_block * kBlockRows / a.rows_per_group) * a.K + wk.s0 * kSpan;
  bool lo_any = false;
  // every lane of a warp runs every round (the amax shuffles take all 32); per_row % 4 == 0, so a block's 4
  // lanes are on or off together
  for (int i0 = 0; i0 < a.M * per_row; i0 += kThreads) {
    const int i = i0 + static_cast<int>(threadIdx.x);
    const bool on = i < a.M * per_row;
    const int m = on ? i / per_row : 0, j = on ? i % per_row : 0;
    const float4* src = reinterpret_cast<const float4*>(a.xf + m * a.x_stride + col0 + 8 * j);
    const float4 p0 = on ? __ldg(src) : make_float4(0.f, 0.f, 0.f, 0.f);
    const float4 p1 = on ? __ldg(src + 1) : make_float4(0.f, 0.f, 0.f, 0.f);
    float v[8] = {p0.x, p0.y, p0.z, p0.w, p1.x, p1.y, p1.z, p1.w};
    if (on && a.x_rope.rope.freqs) {
      const int64_t pos = a.x_rope.pos[m];
#pragma unroll
      for (int p = 0; p < 4; ++p) rope_pair(v[2 * p], v[2 * p + 1], col0 + 8 * j + 2 * p, pos, a.x_rope.rope, true);
    }
    float amax = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) amax = fmaxf(amax, fabsf(v[e]));
    amax = fmaxf(amax, __shfl_xor_sync(dq::kFullMask, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(dq::kFullMask, amax, 2));
    // s = 2^(e(amax) - 14) as biased exponent bits; NaN / inf blocks stay non-finite, zero blocks zero
    const int ex = static_cast<int>(__float_as_uint(amax) >> 23) & 0xFF, sb = max(ex - 14, 1);
    const float inv = __uint_as_float(static_cast<uint32_t>(254 - sb) << 23);
    uint32_t hi[4], lo[4];
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      const float u0 = __fmul_rn(v[2 * p], inv), u1 = __fmul_rn(v[2 * p + 1], inv);
      const __half2 h = __floats2half2_rn(u0, u1);
      const __half2 l = __floats2half2_rn(__fsub_rn(u0, __low2float(h)), __fsub_rn(u1, __high2float(h)));
      hi[p] = *reinterpret_cast<const uint32_t*>(&h);
      lo[p] = *reinterpret_cast<const uint32_t*>(&l);
      lo_any |= (lo[p] & 0x7FFF7FFFu) != 0u;  // -0 counts as zero
    }
    if (!on) continue;
    *reinterpret_cast<uint4*>(xh + m * stride + 8 * j) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
    *reinterpret_cast<uint4*>(xl + m * stride + 8 * j) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
    if (j % 4 == 0) xsc[m * 2 * a.part_spans + j / 4] = __uint_as_float(static_cast<uint32_t>(sb) << 23);
  }
  return lo_any;
}

// One unit (span `rel` of the CTA's part) into acc[nt][row]: lane (g, q)'s sums of rows 2g, 2g + 1 for
// activation row 4 nt + q.
// B fragments of tile nt for span `rel`: column g is activation row 4 nt + g / 2 in block g % 2; lane q holds
// block q / 2, zeros where the column's block is the other one.
template <int NT>
__device__ __forceinline__ void load_b(const MmaGemvArgs& a, const __half* x, int rel, int stride,
                                       uint32_t (&b)[NT][8]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int m = 4 * nt + (g >> 1);
    const bool on = m < a.M && (q >> 1) == (g & 1);
    const uint4* p = reinterpret_cast<const uint4*>(x + m * stride + rel * kSpan + 16 * q);
    const uint4 v0 = on ? p[0] : make_uint4(0u, 0u, 0u, 0u), v1 = on ? p[1] : make_uint4(0u, 0u, 0u, 0u);
    b[nt][0] = v0.x, b[nt][1] = v0.y, b[nt][2] = v0.z, b[nt][3] = v0.w;
    b[nt][4] = v1.x, b[nt][5] = v1.y, b[nt][6] = v1.z, b[nt][7] = v1.w;
  }
}

// xl: the lo halves of float activations, or null.
template <int NT>
__device__ __forceinline__ void unit_mma(const MmaGemvArgs& a, const Unit& u, int rel, const __half* xh,
                                         const __half* xl, const float* xsc, int stride, float (&acc)[NT][2]) {
  const int lane = threadIdx.x & 31, q = lane & 3;
  uint32_t b[NT][8];
  load_b<NT>(a, xh, rel, stride, b);
  float c[NT][4] = {};
  const uint32_t w0[4] = {u.r0.x, u.r0.y, u.r0.z, u.r0.w}, w1[4] = {u.r1.x, u.r1.y, u.r1.z, u.r1.w};
  uint32_t af[4][4];
#pragma unroll
  for (int h = 0; h < 4; ++h) {
    af[h][0] = e4m3x2_to_f16x2(w0[h]), af[h][1] = e4m3x2_to_f16x2(w1[h]);
    af[h][2] = e4m3x2_to_f16x2(w0[h] >> 16), af[h][3] = e4m3x2_to_f16x2(w1[h] >> 16);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) mma::mma_f16(c[nt], af[h], b[nt][2 * h], b[nt][2 * h + 1]);
  }
  if (xl) {  // CTA-uniform
    load_b<NT>(a, xl, rel, stride, b);
#pragma unroll
    for (int h = 0; h < 4; ++h)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) mma::mma_f16(c[nt], af[h], b[nt][2 * h], b[nt][2 * h + 1]);
  }
  const float sw0 = e8m0_to_float(static_cast<uint8_t>(u.sc)), sw1 = e8m0_to_float(static_cast<uint8_t>(u.sc >> 8));
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int m = min(4 * nt + q, a.M - 1);  // rows past M: sums of zeros, dropped
    const float2 sx = *reinterpret_cast<const float2*>(xsc + m * 2 * a.part_spans + 2 * rel);
    const float f0 = __fmul_rn(sw0, sx.x), f1 = __fmul_rn(sw1, sx.y);
    acc[nt][0] = fmaf(c[nt][1], f1, fmaf(c[nt][0], f0, acc[nt][0]));
    acc[nt][1] = fmaf(c[nt][3], f1, fmaf(c[nt][2], f0, acc[nt][1]));
  }
}

// bf16-rounded sums of rows (row, row + 1) of activation row m, rotated, stored.
__device__ __forceinline__ void store_pair(const MmaGemvArgs& a, int row, int m, float v0, float v1) {
  float r0 = dq::round_bf16(v0), r1 = dq::round_bf16(v1);
  if (a.rope.rope.freqs && row + 1 < a.N) rope_pair(r0, r1, row, a.rope.pos[m], a.rope.rope, false);
  float* y = a.y + static_cast<int64_t>(m) * a.N;
  if (row < a.N) y[row] = r0;
  if (row + 1 < a.N) y[row + 1] = r1;
}

// The finishing CTA's outputs of its row block quantized for the next FP8 linear: warp w takes activation rows
// w, w + 4, ..., act_quant_kernel's quantizer on 32 outputs (the same bits as quantize_activation over y).
__device__ __forceinline__ void quantize_block(const MmaGemvArgs& a, int row_block) {
  __syncthreads();  // the block's y, written by the CTA's threads
  const int lane = threadIdx.x & 31;
  for (int m = threadIdx.x >> 5; m < a.M; m += kThreads / 32) {
    const int64_t at = static_cast<int64_t>(m) * a.N + row_block * kBlockRows + lane;
    float scale;
    a.codes_out.codes[at] = dq::act_quant_lane(__ldcg(a.y + at), scale);
    if (lane == 0) a.codes_out.scales[at / 32] = scale;
  }
}

// kFloatX: float activations (stage_floats), else FP8 codes (stage_codes).
template <int NT, bool kFloatX>
__global__ void __launch_bounds__(kThreads) fp8_gemv_mma_kernel(MmaGemvArgs a) {
  Start st = first_group_then_wait(a);
  const Work& wk = st.wk;
  Unit(&u)[kGroup] = st.u;
  extern __shared__ __align__(16) unsigned char smem[];
  const int stride = a.part_spans * kSpan + kPadHalves;  // halves per staged row (a multiple of 8)
  const int halves = a.M * stride;
  __half* xh = reinterpret_cast<__half*>(smem);
  __half* xl = kFloatX ? xh + halves : nullptr;
  float* xsc = reinterpret_cast<float*>(xh + (kFloatX ? 2 : 1) * halves);  // [M][2 part_spans]
  float* red = xsc + a.M * 2 * a.part_spans;                               // [2][32][M]
  if constexpr (kFloatX) {
    if (!__syncthreads_or(stage_floats(a, wk, xh, xl, xsc, stride))) xl = nullptr;  // bf16 values: no lo MMAs
  } else {
    stage_codes(a, wk, xh, xsc, stride);
    __syncthreads();
  }
  const LaneRows lr = lane_rows(a, wk.row_block, wk.half);
  float acc[NT][2] = {};
  for (int base = 0; base < wk.units; base += kGroup) {
#pragma unroll
    for (int i = 0; i < kGroup; ++i) {
      const int n = base + i;
      if (n >= wk.units) break;
      const int rel = wk.parity + 2 * n;
      unit_mma<NT>(a, u[i], rel, xh, xl, xsc, stride, acc);
      if (n + kGroup < wk.units) u[i] = load_unit(lr, wk.s0 + rel + 2 * kGroup);
    }
  }
  // the two span parities meet: red[parity][row in block][m]
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int m = 4 * nt + q, r = wk.half * 16 + 2 * g;
    if (m < a.M) {
      red[(wk.parity * kBlockRows + r) * a.M + m] = acc[nt][0];
      red[(wk.parity * kBlockRows + r + 1) * a.M + m] = acc[nt][1];
    }
  }
  __syncthreads();
  const int t = threadIdx.x, pair = t % 16, m = t / 16, r = 2 * pair;  // 16 pairs x M rows <= 128 threads
  const int row = wk.row_block * kBlockRows + r;
  float v0 = 0.0f, v1 = 0.0f;
  if (m < a.M) {
    v0 = __fadd_rn(red[r * a.M + m], red[(kBlockRows + r) * a.M + m]);
    v1 = __fadd_rn(red[(r + 1) * a.M + m], red[(kBlockRows + r + 1) * a.M + m]);
  }
  if (a.parts > 1) {
    float* part = a.partial + (static_cast<int64_t>(wk.part) * a.M + m) * a.N;
    if (m < a.M) {
      if (row < a.N) part[row] = v0;
      if (row + 1 < a.N) part[row + 1] = v1;
    }
    if (!split_last_arrival(a.counters + wk.row_block, a.parts)) return;
    v0 = 0.0f, v1 = 0.0f;  // the parts in order, from zero
    for (int p = 0; m < a.M && p < a.parts; ++p) {
      const float* pp = a.partial + (static_cast<int64_t>(p) * a.M + m) * a.N;
      if (row < a.N) v0 = __fadd_rn(v0, __ldcg(pp + row));
      if (row + 1 < a.N) v1 = __fadd_rn(v1, __ldcg(pp + row + 1));
    }
  }
  if (m < a.M) store_pair(a, row, m, v0, v1);
  if (a.codes_out.codes) quantize_block(a, wk.row_block);
}

struct Plan {
  int parts, part_spans;
};

// K parts: about `target` spans each (DEEPINFER_GEMV_MMA_SPANS, default 32: of 8, 16 and 32, 32 was fastest for
// every shape of op_bench at 1-8 rows, H100), at most kMaxPartSpans, halved while
// the CTAs would not fill two per SM and a part keeps at least 4 spans.
Plan plan_parts(int64_t row_blocks, int spans) {
  static const int target = [] {
    const char* v = std::getenv("DEEPINFER_GEMV_MMA_SPANS");
    return v && *v ? std::clamp(std::atoi(v), 2, kMaxPartSpans) : kMaxPartSpans;
  }();
  int ps = std::min(target, spans);
  while (ps > 4 && row_blocks * ((spans + ps - 1) / ps) < 2LL * sm_count()) ps = (ps + 1) / 2;
  const int parts = (spans + ps - 1) / ps;
  return {parts, (spans + parts - 1) / parts};  // balanced: no short last part
}

}  // namespace

namespace {
std::atomic<int> g_max_rows{-1};  // -1: not yet read from the environment
}  // namespace

int gemv_mma_max_rows() {
  int n = g_max_rows.load(std::memory_order_relaxed);
  if (n < 0) {
    const char* v = std::getenv("DEEPINFER_GEMV_MMA_ROWS");
    n = v && *v ? std::clamp(std::atoi(v), 0, kMaxRows) : 0;
    g_max_rows.store(n, std::memory_order_relaxed);
  }
  return n;
}

void set_gemv_mma_max_rows(int n) { g_max_rows.store(std::clamp(n, 0, kMaxRows), std::memory_order_relaxed); }

bool fp8_gemv_mma_fits(int64_t rows, const Weight& w) {
  return w.mode == WeightMode::kFp8Block && rows >= 1 && rows <= gemv_mma_max_rows() && w.cols % kSpan == 0 &&
         w.rows < (1LL << 30) && w.cols < (1LL << 30);
}

namespace {

// Plans K, fills the split buffers and launches; a's activation fields are set by the caller.
template <bool kFloatX>
void launch_mma_gemv(MmaGemvArgs a, int64_t rows, const Weight& w) {
  const int64_t row_blocks = (w.rows + kBlockRows - 1) / kBlockRows;
  const Plan p = plan_parts(row_blocks, static_cast<int>(w.cols / kSpan));
  a.w = wdata(w), a.wscale = wscale(w), a.scale_cols = w.scale_cols;
  a.N = static_cast<int>(w.rows), a.K = static_cast<int>(w.cols), a.M = static_cast<int>(rows);
  a.parts = p.parts, a.part_spans = p.part_spans;
  if (p.parts > 1) {
    a.partial = workspace_as<float>(Ws::kPartial, static_cast<size_t>(p.parts * rows * w.rows));
    a.counters = workspace_as<unsigned>(Ws::kCounters, static_cast<size_t>(row_blocks));
  }
  const int stride = p.part_spans * kSpan + kPadHalves;
  const size_t smem = static_cast<size_t>(rows) * stride * 2 * (kFloatX ? 2 : 1) +
                      static_cast<size_t>(rows) * 2 * p.part_spans * 4 + 2 * kBlockRows * static_cast<size_t>(rows) * 4;
  const dim3 grid(static_cast<unsigned>(row_blocks * p.parts));
  const auto go = [&](auto kernel) {
    if (smem > 48 * 1024) {
      static const bool set = [&] {
        DI_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 96 * 1024));
        return true;
      }();
      (void)set;
    }
    ::di::cuda::launch(kernel, grid, kThreads, smem, a);
  };
  if (rows <= 4) go(fp8_gemv_mma_kernel<1, kFloatX>);
  else go(fp8_gemv_mma_kernel<2, kFloatX>);
}

}  // namespace

void fp8_gemv_mma(const uint8_t* codes, const float* scales, int64_t rows, const Weight& w, float* y,
                  const RopeArgs& rope) {
  DI_CHECK(fp8_gemv_mma_fits(rows, w));
  MmaGemvArgs a{};
  a.xc = codes, a.xs = scales, a.rope = rope, a.y = y;
  launch_mma_gemv<false>(a, rows, w);
}

bool grouped_gemv_mma_fits(const float* x, int64_t rows, const Weight& w, int groups) {
  return fp8_gemv_mma_fits(rows, w) && groups > 0 && w.rows % groups == 0 && (w.rows / groups) % kBlockRows == 0 &&
         reinterpret_cast<uintptr_t>(x) % 16 == 0;
}

void grouped_gemv_mma(const float* x, int64_t rows, const Weight& w, int groups, const RopeArgs& x_rope, float* y,
                      const ActCodesOut& codes_out) {
  DI_CHECK(grouped_gemv_mma_fits(x, rows, w, groups) && (!codes_out.codes || w.rows % 32 == 0));
  MmaGemvArgs a{};
  a.xf = x, a.x_stride = w.cols * groups, a.rows_per_group = static_cast<int>(w.rows / groups), a.x_rope = x_rope;
  a.codes_out = codes_out, a.y = y;
  launch_mma_gemv<true>(a, rows, w);
}

}  // namespace di::cuda::dense
