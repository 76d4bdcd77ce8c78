// MoE router logits for a BF16 gate on the FP64 tensor cores (mma.sync m8n8k4 f64, DMMA):
// logits[s, E] = x[s, D] . gate[E, D]^T, each fp32 x bf16 product exact in fp64, summed in fp64 and
// rounded to fp32 once -- the CPU's kF32 linear of the gate to within fp64 rounding, so the same fp32
// value but for rare halfway cases (as the CUDA-core kernel in moe_route_kernels.cu).
//
// Why: one warp per (expert, row) converted every x and gate value to fp64 for every product (F2F.F64
// runs at 16 / clk / SM): at batch 64, 64 x 384 x 5120 x 2 conversions made it compute-bound (74 us
// per layer on an H200). Here a CTA converts each x value of its rows and each gate value of its
// experts once, and the DMMAs multiply the fp64 tiles.
//
// Summation order, fixed by D alone (so a row's logits do not depend on the other rows of the batch):
// K is cut into splits of kSplitK; a split's partial is one DMMA accumulator chain from zero over its
// k-steps in order; the logit is ((0 + p0) + p1) + ... in split order, rounded to fp32. Every launch
// shape below computes exactly these additions, whether the splits run on separate CTAs (partials in
// the workspace, summed by the last-arriving CTA of the tile or by a reduce kernel) or inside one CTA
// (assumed, as for the FP8 GEMMs: a DMMA output element depends on its own row, column and
// accumulator only, the same at every tile position; the GPU test checks a row alone against it in
// a batch).
// Within a k-group of 32, lane q (= lane % 4) holds K [8q, 8q + 8) of its row / expert and k-step t
// takes K 8q + t for q = 0..3: the MMA sums the same products whichever k slot each occupies, and a
// lane then reads 8 contiguous values (one 16-byte gate load; two float4 x loads).
//
// CTA: 4 warps, 32 experts (8 per warp, the B operand: 8 gate values per lane per k-group, converted
// in registers straight from one 16-byte load), BM rows (the A operand, staged in shared memory as
// fp64 in fragment order, shared by the 4 warps).
#include <algorithm>
#include <cstdint>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/gemm_workspace.cuh"
#include "backend/cuda/mma_gemm.cuh"
#include "backend/cuda/moe_kernels.cuh"
#include "backend/cuda/pdl_launch.cuh"

namespace di::cuda::moe {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kTileExperts = 8 * kWarps;  // one n8 tile per warp
constexpr int kSplitK = 256;              // K per split: a 64-step DMMA chain; 20 splits at D = 5120
constexpr int kGroupK = 32;               // K per k-group (8 k-steps)
// One staged row of one k-group: lane q's 4 double2 (K 8q + 2i, 8q + 2i + 1 for i = 0..3) then one
// pad double2, so the 8 lanes of a quarter-warp (2 rows x 4 q) hit 8 different 16-byte bank groups,
// for the fragment reads and the staging stores alike: granule (20 r + 5 q + i) mod 8 differs.
constexpr int kQGranules = 5;
constexpr int kRowGranules = 4 * kQGranules;
constexpr int kSmallRows = 8;  // s <= this: the small-batch tile (one m8 tile, a whole split per chunk)

// Where the logits go: kLogits: the CTA runs every split, sums them and writes fp32 logits.
// kPartials: the CTA runs split blockIdx.z and writes its fp64 partial; router_logits_reduce_kernel
// sums them.
// kPartialsFixup: the same, then the last CTA of the tile to finish sums the tile's partials.
enum class Out : int { kLogits, kPartials, kPartialsFixup };

struct LogitsArgs {
  const float* x;        // [s, d] fp32
  const uint16_t* gate;  // [n_exp, d] bf16 bits
  float* logits;         // [s, n_exp]
  double* partial;       // [splits, s, n_exp] (kPartials, kPartialsFixup)
  unsigned* counters;    // [row tiles x expert tiles] arrival counters, zero (kPartialsFixup)
  int s, n_exp, d, splits;
  Out out;
};

// K range of this CTA: every split for kLogits, split blockIdx.z otherwise.
__device__ __forceinline__ int2 k_range(const LogitsArgs& a) {
  const int first = a.out == Out::kLogits ? 0 : static_cast<int>(blockIdx.z);
  const int end = a.out == Out::kLogits ? a.splits : first + 1;
  return make_int2(first * kSplitK, min(a.d, end * kSplitK));
}

// The warp's gate operand of one staged chunk: lane (g, q) holds expert e's K [k0 + 32j + 8q, +8) for
// each k-group j; zeros past n_exp or past k_end (D % 8 == 0, so a lane's 8 are all in or all out).
template <int G>
struct GateRegs {
  uint4 v[G];
};

template <int G>
__device__ __forceinline__ void load_gate(GateRegs<G>& r, const LogitsArgs& a, int e, int k0, int k_end) {
  const int q = threadIdx.x & 3;
#pragma unroll
  for (int j = 0; j < G; ++j) {
    const int k = k0 + kGroupK * j + 8 * q;
    r.v[j] = e < a.n_exp && k < k_end
                 ? mma::ld_stream16(reinterpret_cast<const uint8_t*>(a.gate + static_cast<int64_t>(e) * a.d + k))
                 : make_uint4(0u, 0u, 0u, 0u);
  }
}

__device__ __forceinline__ int warp_expert(const LogitsArgs& a) {
  const int lane = threadIdx.x & 31;
  return static_cast<int>(blockIdx.x) * kTileExperts + 8 * static_cast<int>(threadIdx.x >> 5) + (lane >> 2);
}

// The gate is a weight (never written), so its first chunk is read before waiting for the kernel
// that wrote x (pdl_launch.cuh): at batch 1 those loads are the kernel's critical path.
template <int G>
__device__ __forceinline__ GateRegs<G> first_gate_chunk_then_wait(const LogitsArgs& a) {
  GateRegs<G> r;
  const int2 kr = k_range(a);
  load_gate(r, a, warp_expert(a), kr.x, kr.y);
  ::di::cuda::grid_dependency_wait();
  return r;
}

// The x rows of one staged chunk, as loaded: unit u = threadIdx.x + kThreads * p is (k-group j, row r,
// lane q) with q = u % 4, r = (u / 4) % BM, j = u / (4 BM): x[row0 + r][k0 + 32j + 8q, +8).
template <int BM, int BK>
struct XChunk {
  static constexpr int kUnits = BM * (BK / kGroupK) * 4;
  static constexpr int kPerThread = kUnits / kThreads;
  static_assert(kUnits % kThreads == 0, "x units must spread evenly over the CTA");
  float4 v[kPerThread][2];
};

template <int BM, int BK>
__device__ __forceinline__ void load_x(XChunk<BM, BK>& c, const LogitsArgs& a, int row0, int k0, int k_end) {
#pragma unroll
  for (int p = 0; p < XChunk<BM, BK>::kPerThread; ++p) {
    const int u = static_cast<int>(threadIdx.x) + kThreads * p;
    const int q = u & 3, r = (u >> 2) % BM, j = (u >> 2) / BM;
    const int row = row0 + r, k = k0 + kGroupK * j + 8 * q;
    if (row < a.s && k < k_end) {
      const float4* src = reinterpret_cast<const float4*>(a.x + static_cast<int64_t>(row) * a.d + k);
      c.v[p][0] = src[0];
      c.v[p][1] = src[1];
    } else {
      c.v[p][0] = c.v[p][1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  }
}

// fp32 -> fp64 once per value, into granules (j BM + r) x 20 + 5q + i: the A fragment order.
template <int BM, int BK>
__device__ __forceinline__ void stage_x(double2* sx, const XChunk<BM, BK>& c) {
#pragma unroll
  for (int p = 0; p < XChunk<BM, BK>::kPerThread; ++p) {
    const int u = static_cast<int>(threadIdx.x) + kThreads * p;
    const int q = u & 3, r = (u >> 2) % BM, j = (u >> 2) / BM;
    double2* dst = sx + (j * BM + r) * kRowGranules + kQGranules * q;
    const float4 lo = c.v[p][0], hi = c.v[p][1];
    dst[0] = make_double2(lo.x, lo.y);
    dst[1] = make_double2(lo.z, lo.w);
    dst[2] = make_double2(hi.x, hi.y);
    dst[3] = make_double2(hi.z, hi.w);
  }
}

// Eight bf16 (low half of each word first) -> fp64, exactly.
__device__ __forceinline__ void bf16x8_to_f64(const uint4 w, double (&b)[8]) {
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    b[2 * i] = __uint_as_float(words[i] << 16);
    b[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}

// c += a . b for the 8x8x4 fp64 tile (A 8x4 row-major, B 4x8 column-major): lane (g = lane / 4,
// q = lane % 4) holds A[g][q], B[q][g], and C[g][2q], C[g][2q + 1].
__device__ __forceinline__ void dmma_8x8x4(double (&c)[2], double a, double b) {
  asm("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0, %1}, {%2}, {%3}, {%0, %1};"
      : "+d"(c[0]), "+d"(c[1])
      : "d"(a), "d"(b));
}

// The DMMAs of one staged chunk: for each k-group that starts before the split's end (k_left: K left
// in it from the chunk's start), k-steps t = 0..7 in order, every live m8 tile. Every tile shape thus
// runs the same k-steps (none on all-zero k-groups past D, which could turn a -0 partial into +0).
template <int MT, int BK>
__device__ __forceinline__ void mma_chunk(const double2* sx, const GateRegs<BK / kGroupK>& gate, int mt_live,
                                          int k_left, double (&acc)[MT][2]) {
  constexpr int BM = 8 * MT;
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int j = 0; j < BK / kGroupK; ++j) {
    if (kGroupK * j >= k_left) break;
    double b[8];
    bf16x8_to_f64(gate.v[j], b);
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // granule i: k-steps 2i, 2i + 1
      double2 av[MT];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        if (mt < mt_live) av[mt] = sx[(j * BM + 8 * mt + g) * kRowGranules + kQGranules * q + i];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        if (mt < mt_live) dmma_8x8x4(acc[mt], av[mt].x, b[2 * i]);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        if (mt < mt_live) dmma_8x8x4(acc[mt], av[mt].y, b[2 * i + 1]);
    }
  }
}

// One logit from its split partials (written by other CTAs of this or the previous kernel: L2 reads),
// added in split order from zero. The loads of up to 24 splits (D <= 6144: V4.1's 20) are in flight at
// once: the batch-1 fix-up is a chain of these round trips.
__device__ __forceinline__ float sum_splits(const double* __restrict__ partial, int64_t n_out, int splits,
                                            int64_t i) {
  constexpr int kBatch = 24;
  double t = 0.0;
  for (int j0 = 0; j0 < splits; j0 += kBatch) {
    double v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u)  // clamped, not `? load : 0` (mma_gemm.cuh, kFixupLoads)
      v[u] = __ldcg(partial + static_cast<int64_t>(min(j0 + u, splits - 1)) * n_out + i);
#pragma unroll
    for (int u = 0; u < kBatch; ++u)
      if (j0 + u < splits) t += v[u];
  }
  return static_cast<float>(t);
}

// Grid (expert tiles, row tiles, splits or 1), kThreads threads. MT m8 tiles of rows per CTA; BK K per
// staged chunk (divides kSplitK). One shared-memory buffer (40 KB at most): the next chunk's x and
// gate are in registers while the DMMAs read this one.
template <int MT, int BK>
__global__ void __launch_bounds__(kThreads) router_logits_dmma_kernel(const LogitsArgs a) {
  GateRegs<BK / kGroupK> gate = first_gate_chunk_then_wait<BK / kGroupK>(a);
  constexpr int BM = 8 * MT;
  static_assert(kSplitK % BK == 0 && BK % kGroupK == 0, "a chunk is whole k-groups inside one split");
  __shared__ double2 sx[(BK / kGroupK) * BM * kRowGranules];

  const int2 kr = k_range(a);
  const int row0 = static_cast<int>(blockIdx.y) * BM;
  const int e_lane = warp_expert(a);  // this lane's expert (B column g of the warp's n8 tile)
  const bool warp_live = (e_lane & ~7) < a.n_exp;
  const int mt_live = min(MT, (a.s - row0 + 7) / 8);

  XChunk<BM, BK> xc;
  load_x(xc, a, row0, kr.x, kr.y);
  double acc[MT][2], tot[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) acc[mt][0] = acc[mt][1] = tot[mt][0] = tot[mt][1] = 0.0;
  for (int k0 = kr.x; k0 < kr.y; k0 += BK) {
    if (k0 != kr.x) __syncthreads();  // every warp is done with the previous chunk's rows
    stage_x(sx, xc);
    const GateRegs<BK / kGroupK> cur = gate;
    if (k0 + BK < kr.y) {
      load_x(xc, a, row0, k0 + BK, kr.y);
      load_gate(gate, a, e_lane, k0 + BK, kr.y);
    }
    __syncthreads();
    if (k0 != kr.x && k0 % kSplitK == 0) {  // a split ends: tot += its chain, the next starts at zero
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int c = 0; c < 2; ++c) tot[mt][c] += acc[mt][c], acc[mt][c] = 0.0;
    }
    if (warp_live) mma_chunk<MT, BK>(sx, cur, mt_live, kr.y - k0, acc);
  }

  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int e0 = (e_lane & ~7) + 2 * q;  // C columns 2q, 2q + 1 of the warp's n8 tile
  const int64_t n_out = static_cast<int64_t>(a.s) * a.n_exp;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const int row = row0 + 8 * mt + g;
    if (!warp_live || row >= a.s) continue;
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      if (e0 + c >= a.n_exp) continue;
      const int64_t o = static_cast<int64_t>(row) * a.n_exp + e0 + c;
      if (a.out == Out::kLogits) a.logits[o] = static_cast<float>(tot[mt][c] + acc[mt][c]);
      else a.partial[blockIdx.z * n_out + o] = acc[mt][c];  // the split's chain as is
    }
  }
  if (a.out != Out::kPartialsFixup) return;
  unsigned* counter = a.counters + blockIdx.y * gridDim.x + blockIdx.x;
  if (!mma::split_last_arrival(counter, a.splits)) return;
  for (int t = threadIdx.x; t < BM * kTileExperts; t += kThreads) {
    const int row = row0 + t / kTileExperts, e = static_cast<int>(blockIdx.x) * kTileExperts + t % kTileExperts;
    if (row >= a.s || e >= a.n_exp) continue;
    const int64_t o = static_cast<int64_t>(row) * a.n_exp + e;
    a.logits[o] = sum_splits(a.partial, n_out, a.splits, o);
  }
}

// logits[i] = fp32(sum of partial[j][i] in split order from zero), one thread per logit. No launch
// bounds: with __launch_bounds__(256) ptxas held it to 32 registers, too few for 24 loads in flight.
constexpr int kReduceThreads = 256;

__global__ void router_logits_reduce_kernel(const double* __restrict__ partial, int64_t n_out, int splits,
                                            float* __restrict__ logits) {
  ::di::cuda::grid_dependency_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kReduceThreads + threadIdx.x;
  if (i < n_out) logits[i] = sum_splits(partial, n_out, splits, i);
}

// Launches the tiles of 8 MT rows x 32 experts: each CTA runs every split itself when there is one
// split or the tiles alone fill two CTAs per SM (s > ~1400 at E = 384), else one CTA per (tile, split)
// whose partials the tile's last CTA sums (`fixup`) or a reduce kernel does.
template <int MT, int BK>
void launch_tiles(LogitsArgs a, int64_t row_tiles, int64_t expert_tiles, bool fixup) {
  const int64_t s = a.s, n_exp = a.n_exp;
  const dim3 grid(static_cast<unsigned>(expert_tiles), static_cast<unsigned>(row_tiles), 1);
  if (a.splits == 1 || row_tiles * expert_tiles >= 2 * static_cast<int64_t>(sm_count())) {
    ::di::cuda::launch(router_logits_dmma_kernel<MT, BK>, grid, kThreads, 0, a);
    return;
  }
  a.out = fixup ? Out::kPartialsFixup : Out::kPartials;
  a.partial = workspace_as<double>(Ws::kPartial, static_cast<size_t>(a.splits * s * n_exp));
  if (fixup) a.counters = workspace_as<unsigned>(Ws::kCounters, static_cast<size_t>(row_tiles * expert_tiles));
  ::di::cuda::launch(router_logits_dmma_kernel<MT, BK>, dim3(grid.x, grid.y, static_cast<unsigned>(a.splits)),
                     kThreads, 0, a);
  if (fixup) return;
  const int64_t n_out = s * n_exp;
  ::di::cuda::launch(router_logits_reduce_kernel, static_cast<unsigned>(blocks_for(n_out, kReduceThreads)),
                     kReduceThreads, 0, static_cast<const double*>(a.partial), n_out, a.splits, a.logits);
}

}  // namespace

// Launch plan at V4.1's shape (E = 384: 12 expert tiles of 32; D = 5120: 20 splits of 256, so 240
// CTAs at every batch up to 64, all resident at once):
//  - s <= 8 (batch 1, 8): 8-row tiles, a CTA's whole 256-K gate slice (16 KB: 8 loads per lane) in
//    flight before the PDL wait. Batch 1 is a 3.9 MB gate read, so bytes in flight are what count
//    (the CUDA-core kernel's 48 CTAs left most SMs idle: 7.9 us). The tile's last CTA sums its 20
//    partials (at most 8 x 32 x 20 doubles).
//  - 8 < s <= 32: 32-row tiles, 2 chunks of 128 K per split; 32 < s (batch 64, 256): 64-row tiles, 4
//    chunks of 64 K per split (m8 tiles past s skipped). Few chunks per CTA, because at small row
//    counts each chunk's loads are a round trip that the DMMAs do not cover. Partials are summed by a
//    reduce kernel (a tile's last CTA would read 20 x 2048 doubles on one SM: ~2 us at batch 64).
//    Batch 256: 4 x 12 x 20 = 960 CTAs.
bool router_logits_bf16_dmma(const float* x, const uint8_t* gate, int64_t s, int64_t n_exp, int64_t d,
                             float* logits) {
  const int64_t splits = (d + kSplitK - 1) / kSplitK;
  const int64_t expert_tiles = (n_exp + kTileExperts - 1) / kTileExperts;
  if (d % 8 != 0 || reinterpret_cast<uintptr_t>(x) % 16 != 0 || reinterpret_cast<uintptr_t>(gate) % 16 != 0 ||
      d > 0x7fffffff - kSplitK || n_exp > 0x7fffffff - kTileExperts || (s + 63) / 64 > 65535 || splits > 65535)
    return false;
  const LogitsArgs a{x,
                     reinterpret_cast<const uint16_t*>(gate),
                     logits,
                     nullptr,
                     nullptr,
                     static_cast<int>(s),
                     static_cast<int>(n_exp),
                     static_cast<int>(d),
                     static_cast<int>(splits),
                     Out::kLogits};
  if (s <= kSmallRows) launch_tiles<1, kSplitK>(a, 1, expert_tiles, true);
  else if (s <= 32) launch_tiles<4, 128>(a, (s + 31) / 32, expert_tiles, false);
  else launch_tiles<8, 64>(a, (s + 63) / 64, expert_tiles, false);
  return true;
}

}  // namespace di::cuda::moe
