// The routed experts as grouped launches with device-side routing lists (no host round trip, so a
// MoE layer can be captured in a CUDA graph):
//  1. route_lists: per-expert counts, offsets and the ascending list of active experts from the
//     router's [S, k] ids; entries sorted by (expert, token), as the CPU lists them. For a small batch
//     route_fused does the router's selection, these lists and the input's FP8 quantizer in one launch.
//  2. one grouped GEMM for gate and up (w1, w3) of every active expert (MXFP4 widened to E4M3 in
//     registers, mma_gemm.cuh), reading the once-quantized input rows through the entry -> token list;
//  3. SwiGLU x routing weight, quantized to FP8 for the down projection, in one kernel;
//  4. one grouped GEMM for the down projection (w2);
//  5. combine: per token, its entries in expert-id order, then + the shared expert, bf16.
// Grid z spans min(E, S*k) expert slots (the most that can be active); CTAs of inactive slots exit.
// Batch-invariant mode: the K split is the one-row plan at every S (batch_invariance.cuh), run inside
// each CTA when split CTAs would not fit in one wave.
#include <algorithm>
#include <string>
#include <type_traits>

#include "backend/cuda/batch_invariance.cuh"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_quant.cuh"
#include "backend/cuda/dense_linear.cuh"
#include "backend/cuda/fp4_layout.cuh"
#include "backend/cuda/gemm_workspace.cuh"
#include "backend/cuda/mma_gemm.cuh"
#include "backend/cuda/moe_elem.cuh"
#include "backend/cuda/moe_kernels.cuh"
#include "backend/cuda/moe_select.cuh"
#include "backend/cuda/pdl_launch.cuh"
#include "core/env_switch.h"

namespace di::cuda::moe {
namespace {

constexpr int kListThreads = 1024;
// route_fused_fits: S x E at most, one score per thread. Measured (H100, 8 layers, bench/RESULTS.md):
// decode batch 1 -1.7%, batch 2 -1%, but batches 8 and 10 (3 - 4 scores per thread) +3%: there the
// serial scores and the one CTA's quantizing cost more than the two launches saved.
constexpr int kFusedScores = kListThreads;
constexpr int kElemThreads = 256;
// 32-expert chunks of the most experts route_lists takes (48 KB of counts and offsets)
constexpr int kMaxScanChunks = 48 * 1024 / 8 / 32;

// The lists of n = S*k entries by one CTA (every thread calls; ids outside [0, E) are skipped);
// sm: 2 E ints of shared memory (counts, offsets). Work: n atomics, an E-long scan, then n / 32 warp
// steps placing the entries.
__device__ __forceinline__ void build_route_lists(const int32_t* __restrict__ experts, int n, int k, int n_exp,
                                                  const RouteLists& l, int32_t* sm) {
  int32_t* cnt = sm;           // [E]
  int32_t* off = sm + n_exp;   // [E]
  for (int e = threadIdx.x; e < n_exp; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int32_t e = experts[i];
    if (e >= 0 && e < n_exp) atomicAdd(&cnt[e], 1);
    else l.pos_of[i] = -1;
  }
  __syncthreads();
  // exclusive scans of the counts and of the "active" flags: each warp scans 32-expert chunks, warp 0
  // the chunks' totals, then each chunk's experts add the totals before them (one warp scanning all
  // 384 experts in turn was ~1 us of dependent steps)
  __shared__ int32_t chunk_cnt[kMaxScanChunks], chunk_act[kMaxScanChunks];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  const int chunks = (n_exp + 31) / 32;
  auto chunk_scan = [&](int c, int& v, int& f, int& iv, int& jf) {  // inclusive scans within chunk c
    const int e = 32 * c + lane;
    v = e < n_exp ? cnt[e] : 0;
    f = v > 0 ? 1 : 0;
    iv = v, jf = f;
    for (int o = 1; o < 32; o <<= 1) {
      const int a = __shfl_up_sync(0xffffffffu, iv, o), b = __shfl_up_sync(0xffffffffu, jf, o);
      if (lane >= o) iv += a, jf += b;
    }
  };
  for (int c = warp; c < chunks; c += n_warps) {
    int v, f, iv, jf;
    chunk_scan(c, v, f, iv, jf);
    if (lane == 31) chunk_cnt[c] = iv, chunk_act[c] = jf;
  }
  __syncthreads();
  if (warp == 0) {  // chunk totals -> exclusive prefixes, in place, 32 chunks at a time
    int run = 0, run_active = 0;
    for (int c0 = 0; c0 < chunks; c0 += 32) {
      const int c = c0 + lane;
      const int v = c < chunks ? chunk_cnt[c] : 0, f = c < chunks ? chunk_act[c] : 0;
      int iv = v, jf = f;
      for (int o = 1; o < 32; o <<= 1) {
        const int a = __shfl_up_sync(0xffffffffu, iv, o), b = __shfl_up_sync(0xffffffffu, jf, o);
        if (lane >= o) iv += a, jf += b;
      }
      if (c < chunks) chunk_cnt[c] = run + iv - v, chunk_act[c] = run_active + jf - f;
      run += __shfl_sync(0xffffffffu, iv, 31);
      run_active += __shfl_sync(0xffffffffu, jf, 31);
    }
    if (lane == 0) {
      l.offsets[n_exp] = run;
      *l.n_active = run_active;
    }
  }
  __syncthreads();
  for (int c = warp; c < chunks; c += n_warps) {
    int v, f, iv, jf;
    chunk_scan(c, v, f, iv, jf);
    const int e = 32 * c + lane;
    if (e < n_exp) {
      off[e] = chunk_cnt[c] + iv - v;
      l.offsets[e] = chunk_cnt[c] + iv - v;
      if (f) l.active[chunk_act[c] + jf - f] = e;
    }
  }
  __syncthreads();
  // The entries in index order, 32 at a time, by warp 0: an entry's position is its expert's next free
  // one (off[e]) plus its rank among the chunk's lanes of the same expert; then the group's last lane
  // advances off[e]. The same (expert, index) order as one thread per expert scanning every entry
  // (n steps each: 21 us per call at batch 64), in n / 32 steps.
  if (warp == 0) {
    for (int i0 = 0; i0 < n; i0 += 32) {
      const int i = i0 + lane;
      const int32_t e = i < n ? experts[i] : -1;
      const bool ok = e >= 0 && e < n_exp;
      const unsigned group = __match_any_sync(0xffffffffu, ok ? e : -1);
      if (ok) {
        const int p = off[e] + __popc(group & ((1u << lane) - 1u));
        l.tok_of[p] = i / k;
        l.slot_of[p] = i;
        l.pos_of[i] = p;
      }
      __syncwarp();  // every lane has read off[] before the groups advance it
      if (ok && lane == 31 - __clz(group)) off[e] += __popc(group);
      __syncwarp();
    }
  }
  __syncthreads();
  // per token: the positions of its entries in expert-id order (insertion sort of k <= 32), -1 last
  for (int t = threadIdx.x; t < n / k; t += blockDim.x) {
    int32_t ids[kMaxTopK], pos[kMaxTopK];
    int m = 0;
    for (int j = 0; j < k; ++j) {
      const int32_t p = l.pos_of[t * k + j];
      if (p < 0) continue;
      const int32_t e = experts[t * k + j];
      int at = m++;
      while (at > 0 && ids[at - 1] > e) {
        ids[at] = ids[at - 1];
        pos[at] = pos[at - 1];
        --at;
      }
      ids[at] = e;
      pos[at] = p;
    }
    for (int j = 0; j < k; ++j) l.order[t * k + j] = j < m ? pos[j] : -1;
  }
}

__global__ void __launch_bounds__(kListThreads)
    route_lists_kernel(const int32_t* __restrict__ experts, int n, int k, int n_exp, RouteLists l) {
  ::di::cuda::grid_dependency_wait();
  extern __shared__ int32_t sm[];
  build_route_lists(experts, n, k, n_exp, l, sm);
}

// router_select + route_lists + quantize_activation for a small batch in one CTA (three launches on
// the decode step's chain): the (row, expert) scores by the threads in turn (~1 us each: fp64 exp),
// the activation's 32-value blocks by warps with 8 blocks' loads in flight, then warp r picks row r's
// experts, then the lists. The same device code as the three kernels, so the same bits. sm: 2 E
// ints, then 2 S E floats.
__global__ void __launch_bounds__(kListThreads)
    route_fused_kernel(const float* __restrict__ logits, const uint8_t* __restrict__ bias, ElemType bias_type, int s,
                       int n_exp, int top_k, float route_scale, float gate_temp, float* __restrict__ weights,
                       int32_t* __restrict__ experts, RouteLists l, const float* __restrict__ x, int d,
                       uint8_t* __restrict__ xc, float* __restrict__ xs) {
  ::di::cuda::grid_dependency_wait();
  extern __shared__ int32_t sm[];
  float* sc = reinterpret_cast<float*>(sm + 2 * n_exp);  // [S, E]
  float* biased = sc + s * n_exp;                        // [S, E]
  constexpr int kBatch = 8, kWarps = kListThreads / 32;
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  for (int i = t; i < s * n_exp; i += kListThreads) {
    const float lg = logits[i], bs = load_elem(bias, bias_type, i % n_exp);
    sc[i] = route_score(lg, gate_temp);
    biased[i] = sc[i] + bs;
  }
  // the activation's blocks by the warps that hold no score when there are such (S x E < 1024 - 32),
  // so that both phases run at once
  const int score_warps = (s * n_exp + 31) / 32;
  const int q_warps = score_warps < kWarps ? kWarps - score_warps : kWarps, qwarp = warp - (kWarps - q_warps);
  const int blocks = s * d / 32;
  for (int b0 = qwarp; qwarp >= 0 && b0 < blocks; b0 += q_warps * kBatch) {
    float v[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int b = b0 + j * q_warps;
      v[j] = b < blocks ? x[static_cast<int64_t>(b) * 32 + lane] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int b = b0 + j * q_warps;
      if (b >= blocks) break;  // warp-uniform
      float scale;
      xc[static_cast<int64_t>(b) * 32 + lane] = dq::act_quant_lane(v[j], scale);
      if (lane == 0) xs[b] = scale;
    }
  }
  __syncthreads();
  for (int r = warp; r < s; r += kWarps)
    pick_top_k(sc + r * n_exp, biased + r * n_exp, n_exp, top_k, route_scale, weights + r * top_k,
               experts + r * top_k);
  __syncthreads();  // the CTA's global writes of the ids are visible to all its threads
  build_route_lists(experts, s * top_k, top_k, n_exp, l, sm);
}

// Grouped MXFP4 GEMM: for matrix `mat` (grid x = mats * row_ctas), expert slot blockIdx.z and K split
// blockIdx.y, y[p, :] = bf16(a[p] W_e^T) for the entries p of expert e = active[slot]; a[p] = row
// act_row_of[p] (or p) of the quantized activation. Bytes: each active expert's weights once (plus
// one re-read per further 64 entries), activations from L2, partials as quantized_linear.
// kInlineSplits (grid.y = 1): each CTA runs the plan's `inline_splits` K ranges itself and adds them
// in split order from zero (mma::add_split), the bits the split CTAs' fix-up gives.
struct GroupedMat {
  const uint8_t* const* w;  // [E] device pointers: tiled E2M1 data, then E8M0 scales (fp4_layout.cuh)
  float* y;                 // [n, N]
};

template <int NT, bool kInlineSplits, bool kFast>
__global__ void __launch_bounds__(mma::kThreads, mma::kMinCtas<NT>)
    grouped_fp4_kernel(const uint8_t* __restrict__ xc, const float* __restrict__ xs, const int32_t* __restrict__ act_row_of,
                       RouteLists l, GroupedMat m0, GroupedMat m1, int row_ctas, int N, int K, int n_rows,
                       int kb_per_split, int inline_splits, float* __restrict__ partial,
                       unsigned* __restrict__ counters) {
  ::di::cuda::grid_dependency_wait();
  using namespace mma;
  const int slot = blockIdx.z;
  if (slot >= *l.n_active) return;  // the whole CTA (and its split siblings) leave
  const int e = l.active[slot];
  const int mat = blockIdx.x / row_ctas, rc = blockIdx.x % row_ctas;
  const GroupedMat m = mat ? m1 : m0;
  const uint8_t* w = m.w[e];
  const uint8_t* wsc = w + fp4::data_bytes(N, K);
  const int p0 = l.offsets[e], n_e = l.offsets[e + 1] - p0;
  const int warp = threadIdx.x >> 5, row0 = rc * kCtaRows + warp * kWarpRows;
  const int nb = K / 32, split = blockIdx.y, splits = gridDim.y;
  const int kb0 = split * kb_per_split, kb1 = min(nb, kb0 + kb_per_split);
  float* part = partial + static_cast<int64_t>(mat * splits + split) * n_rows * N;
  const ActSource src{xc, xs, nullptr};
  for (int c0 = 0; c0 < n_e; c0 += 8 * NT) {
    const int count = min(8 * NT, n_e - c0), pc = p0 + c0;
    const auto act_row = [&](int i) { return act_row_of ? __ldg(act_row_of + pc + i) : pc + i; };
    float acc[2][NT][4] = {};
    if constexpr (kInlineSplits) {
      for (int sp = 0; sp < inline_splits; ++sp) {
        float sum_part[2][NT][4] = {};
        const int ikb0 = sp * kb_per_split, ikb1 = min(nb, ikb0 + kb_per_split);
        cta_tile<WFmt::kFp4Row, NT, kFast>(w, wsc, nb, N, K, row0, ikb0, ikb1, src, count, act_row, sum_part);
        add_split(acc, sum_part);
      }
      for_each_acc(acc, row0, N, count,
                   [&](int r, int t, float v) { m.y[static_cast<int64_t>(pc + t) * N + r] = dq::round_bf16(v); });
      continue;
    }
    cta_tile<WFmt::kFp4Row, NT, kFast>(w, wsc, nb, N, K, row0, kb0, kb1, src, count, act_row, acc);
    if (splits == 1)
      for_each_acc(acc, row0, N, count,
                   [&](int r, int t, float v) { m.y[static_cast<int64_t>(pc + t) * N + r] = dq::round_bf16(v); });
    else
      for_each_acc(acc, row0, N, count,
                   [&](int r, int t, float v) { part[static_cast<int64_t>(pc + t) * N + r] = v; });
  }
  if (splits == 1) return;
  if (!split_last_arrival(counters + (static_cast<int64_t>(mat) * row_ctas + rc) * gridDim.z + slot, splits)) return;
  const int r = rc * kCtaRows + threadIdx.x;
  if (r >= N) return;
  const float* base = partial + static_cast<int64_t>(mat * splits) * n_rows * N + r;
  for (int p = p0; p < p0 + n_e; ++p)
    m.y[static_cast<int64_t>(p) * N + r] =
        dq::round_bf16(sum_splits(base + static_cast<int64_t>(p) * N, static_cast<int64_t>(n_rows) * N, splits));
}

// One warp per 32 columns of an entry p < offsets[E]: h = bf16(route_w[slot] * silu(min(g, limit)) *
// clamp(u, +-limit)) (the CPU's expression order; no clamps when limit <= 0), then the FP8 quantizer
// of the down projection's input. Reads 8 B, writes 1.125 B per element.
__global__ void swiglu_quant_kernel(const float* __restrict__ gate, const float* __restrict__ up, RouteLists l,
                                    int n_exp, const float* __restrict__ route_w, int n_rows, int inter, float limit,
                                    uint8_t* __restrict__ codes, float* __restrict__ scales) {
  ::di::cuda::grid_dependency_wait();
  const int64_t blk = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int nbk = inter / 32;
  const int64_t p = blk / nbk;
  if (p >= n_rows || p >= l.offsets[n_exp]) return;  // whole warps
  const int lane = threadIdx.x & 31;
  const int64_t t = p * inter + (blk % nbk) * 32 + lane;
  const float h = dq::round_bf16(__fmul_rn(route_w[l.slot_of[p]], swiglu_value(gate[t], up[t], limit)));
  float scale;
  codes[t] = dq::act_quant_lane(h, scale);
  if (lane == 0) scales[blk] = scale;
}

// out[t, c] = bf16(sum of down[p, c] over t's entries in expert-id order (from 0), + shared[t, c]).
__global__ void combine_kernel(const float* __restrict__ down, const int32_t* __restrict__ order, int k,
                               const float* __restrict__ shared, int64_t s, int64_t d, float* __restrict__ out) {
  ::di::cuda::grid_dependency_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= s * d) return;
  const int64_t t = i / d, c = i % d;
  float acc = 0.0f;
  for (int j = 0; j < k; ++j) {
    const int32_t p = order[t * k + j];
    if (p < 0) break;
    acc = __fadd_rn(acc, down[static_cast<int64_t>(p) * d + c]);
  }
  out[i] = dq::round_bf16(__fadd_rn(acc, shared[i]));
}

// CTAs of grouped_fp4_kernel<NT> resident on the whole GPU (for the split planning).
template <int NT, bool kFast>
int64_t grouped_capacity() {
  static const int64_t resident = [] {
    int v = 0;
    DI_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, grouped_fp4_kernel<NT, false, kFast>, mma::kThreads, 0));
    return static_cast<int64_t>(std::max(v, 1)) * sm_count();
  }();
  return resident;
}

template <int NT, bool kFast>
void launch_grouped(const GroupedArgs& a, const GroupedMat& m0, const GroupedMat& m1, int mats, int slots,
                    const GroupedSplitMode& mode) {
  const int64_t tiles = static_cast<int64_t>(mats) * a.row_ctas, capacity = grouped_capacity<NT, kFast>();
  const dense::SplitPlan plan = bi::grouped_k_split(mode.invariant, tiles, slots, mode.one_row_slots, a.K / 32, NT,
                                                    capacity, grouped_capacity<1, kFast>());
  const int64_t partial_bytes = static_cast<int64_t>(mats) * plan.splits * a.n_rows * a.N * 4;
  if (!bi::splits_on_ctas(mode.invariant, tiles * slots, plan.splits, capacity, partial_bytes)) {
    const dim3 grid(static_cast<unsigned>(tiles), 1u, static_cast<unsigned>(slots));
    ::di::cuda::launch(grouped_fp4_kernel<NT, true, kFast>, grid, mma::kThreads, 0, a.xc, a.xs, a.act_row_of, a.lists, m0, m1,
                       a.row_ctas, a.N, a.K, a.n_rows, plan.kb_per_split, plan.splits, nullptr, nullptr);
    return;
  }
  float* partial = nullptr;
  unsigned* counters = nullptr;
  if (plan.splits > 1) {
    partial = workspace_as<float>(Ws::kPartial, static_cast<size_t>(mats) * plan.splits * a.n_rows * a.N);
    counters = workspace_as<unsigned>(Ws::kCounters, static_cast<size_t>(mats) * a.row_ctas * slots);
  }
  const dim3 grid(static_cast<unsigned>(mats * a.row_ctas), static_cast<unsigned>(plan.splits), static_cast<unsigned>(slots));
  ::di::cuda::launch(grouped_fp4_kernel<NT, false, kFast>, grid, mma::kThreads, 0, a.xc, a.xs, a.act_row_of, a.lists, m0, m1,
                     a.row_ctas, a.N, a.K, a.n_rows, plan.kb_per_split, 1, partial, counters);
}

}  // namespace

void route_lists(const int32_t* experts, int64_t s, int k, int64_t n_exp, const RouteLists& l) {
  DI_CHECK_MSG(k >= 1 && k <= kMaxTopK, "moe_experts: top_k out of range");
  const size_t smem = static_cast<size_t>(2 * n_exp) * sizeof(int32_t);
  DI_CHECK_MSG(smem <= 48 * 1024 && s * k < (1LL << 31), "moe_experts: too many experts or entries");
  ::di::cuda::launch(route_lists_kernel, 1, kListThreads, smem, experts, static_cast<int>(s * k), k,
                     static_cast<int>(n_exp), l);
}

namespace {
bool fused_shape(int64_t s, int64_t n_exp) { return s >= 1 && s * n_exp <= kFusedScores && n_exp <= kMaxRouted; }
}  // namespace

bool route_fused_fits(int64_t s, int64_t n_exp) {
  // DEEPINFER_FUSED_ROUTING=0: the three launches (to measure what fusing gains)
  static const bool on = env_switch_on("DEEPINFER_FUSED_ROUTING");
  return on && fused_shape(s, n_exp);
}

void route_fused(const float* logits, const uint8_t* bias, DType bias_dtype, int64_t s, int64_t n_exp, int top_k,
                 float route_scale, float gate_temp, float* weights, int32_t* experts, const RouteLists& l,
                 const float* x, int64_t d, uint8_t* xc, float* xs) {
  DI_CHECK_MSG(fused_shape(s, n_exp) && d % 32 == 0,
               "moe_route: fused routing takes S x E <= " + std::to_string(kFusedScores) + " and d % 32 == 0, got S = " +
                   std::to_string(s) + ", E = " + std::to_string(n_exp) + ", d = " + std::to_string(d));
  DI_CHECK_MSG(top_k >= 1 && top_k <= kMaxTopK && top_k <= n_exp, "moe_route: top_k out of range");
  const ElemType bt = elem_type(bias_dtype, "moe_route bias");
  const size_t smem =  // counts and offsets; scores and biased scores
      static_cast<size_t>(2 * n_exp) * sizeof(int32_t) + static_cast<size_t>(2 * s * n_exp) * sizeof(float);
  ::di::cuda::launch(route_fused_kernel, 1, kListThreads, smem, logits, bias, bt, static_cast<int>(s),
                     static_cast<int>(n_exp), top_k, route_scale, gate_temp, weights, experts, l, x,
                     static_cast<int>(d), xc, xs);
}

void grouped_fp4_gemm(const GroupedArgs& a, const uint8_t* const* w0, float* y0, const uint8_t* const* w1, float* y1,
                      int slots, int nt, const GroupedSplitMode& mode) {
  const int mats = w1 ? 2 : 1;
  const GroupedMat m0{w0, y0}, m1{w1 ? w1 : w0, w1 ? y1 : y0};
  const auto launch = [&](auto fast) {
    switch (nt) {
      case 1: return launch_grouped<1, fast()>(a, m0, m1, mats, slots, mode);
      case 2: return launch_grouped<2, fast()>(a, m0, m1, mats, slots, mode);
      case 4: return launch_grouped<4, fast()>(a, m0, m1, mats, slots, mode);
      default: return launch_grouped<8, fast()>(a, m0, m1, mats, slots, mode);
    }
  };
  if (mode.fast) launch(std::true_type{});
  else launch(std::false_type{});
}

void swiglu_quant(const float* gate, const float* up, const RouteLists& l, int64_t n_exp, const float* route_w,
                  int64_t n_rows, int64_t inter, float limit, uint8_t* codes, float* scales) {
  DI_CHECK_MSG(inter % 32 == 0, "moe_experts: the expert width must be divisible by 32");
  const int64_t warps = n_rows * (inter / 32);
  if (warps == 0) return;
  ::di::cuda::launch(swiglu_quant_kernel, blocks_for(warps * 32, kElemThreads), kElemThreads, 0, gate, up, l,
                     static_cast<int>(n_exp), route_w, static_cast<int>(n_rows), static_cast<int>(inter), limit, codes,
                     scales);
}

void combine(const float* down, const int32_t* order, int k, const float* shared, int64_t s, int64_t d, float* out) {
  if (s * d == 0) return;
  ::di::cuda::launch(combine_kernel, blocks_for(s * d, kElemThreads), kElemThreads, 0, down, order, k, shared, s, d,
                     out);
}

}  // namespace di::cuda::moe
