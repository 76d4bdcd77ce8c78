// CUDA backend: the mHC (hyper-connection) ops, bit-compatible with cpu_elementwise.cpp: the same
// fp32 rounding points in the same order (no FMA contraction where the CPU multiplies then adds).
#include <algorithm>

#include "backend/cuda/attn_common.cuh"
#include "backend/cuda/batch_invariance.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_quant.cuh"
#include "backend/cuda/gemm_workspace.cuh"
#include "backend/cuda/pdl_launch.cuh"

namespace di {
namespace {

using cuda::attn::WType;

constexpr int kMaxHc = 8;          // the finish kernel is instantiated for hc = 1..kMaxHc
constexpr int kDotThreads = 256;   // hc_mixes_dots: one CTA per (K chunk, row)
constexpr int kDotWarps = kDotThreads / 32;
constexpr int kDotAcc = 24;        // fp64 accumulators per thread per pass over the chunk (mix = 24 at hc 4)
constexpr int kFinThreads = 256;   // hc_mixes_finish: one per chain of the row's mean square
constexpr int kFinGroups = 16;     // hc_mixes_finish: at most this many threads share a mix's chunk sums
constexpr int kFinLoads = 16;      // hc_mixes_finish: partial loads in flight per thread
constexpr unsigned kAllLanes = 0xffffffffu;

__device__ __forceinline__ float sigmoid_ref(float x) {
  return __fdiv_rn(1.0f, __fadd_rn(1.0f, cuda::attn::exp_ref(-x)));
}

// Stage 1, grid (splits, rows). CTA (c, r): the fp64 dot products of x[r, chunk c] with the mix rows
// of fn over that chunk (products exact in fp64), summed per thread, then across the CTA in a fixed
// order, into part[r, c, mix]. fn [mix, n] is read once per row group (L2-resident across rows), x
// once per CTA. The weight type is a template parameter so that the 24 loads of an element issue
// back to back: with the type switch inside the loop they ran one L2 round trip at a time (168 -> 42
// us per call at batch 64, where a thread walks 20 elements; 14 us at batch 1, one element).
template <WType T>
__global__ void hc_mixes_dots_kernel(const float* __restrict__ x, int64_t n, int mix, int64_t chunk, int splits,
                                     const uint8_t* __restrict__ fn, double* __restrict__ part) {
  ::di::cuda::grid_dependency_wait();
  const int64_t r = blockIdx.y;
  const float* xr = x + r * n;
  const int c = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __shared__ double red[kDotWarps][kDotAcc];
  const int64_t k0 = c * chunk, k1 = min(n, k0 + chunk);
  double* out = part + (r * splits + c) * mix;
  for (int j0 = 0; j0 < mix; j0 += kDotAcc) {
    const int nj = min(kDotAcc, mix - j0);
    double acc[kDotAcc];
#pragma unroll
    for (int j = 0; j < kDotAcc; ++j) acc[j] = 0;
    for (int64_t i = k0 + threadIdx.x; i < k1; i += kDotThreads) {
      float wv[kDotAcc];
#pragma unroll
      for (int j = 0; j < kDotAcc; ++j) wv[j] = j < nj ? cuda::attn::weight_elem(fn, T, (j0 + j) * n + i) : 0.0f;
      const double xv = xr[i];
#pragma unroll
      for (int j = 0; j < kDotAcc; ++j) acc[j] += xv * static_cast<double>(wv[j]);
    }
#pragma unroll
    for (int j = 0; j < kDotAcc; ++j) {
      double v = acc[j];
      for (int o = 16; o > 0; o /= 2) v += __shfl_down_sync(0xffffffffu, v, o);
      if (lane == 0) red[warp][j] = v;
    }
    __syncthreads();
    if (threadIdx.x < nj) {
      double v = 0;
      for (int w = 0; w < kDotWarps; ++w) v += red[w][threadIdx.x];
      out[j0 + threadIdx.x] = v;
    }
    __syncthreads();
  }
}

// The finish kernel's shape at hc streams: mix = (2 + hc) hc mixes per row; the hc x hc comb elements
// in warp 0, element e in slot e / 32 of lane e % 32; the chunk partials of a mix summed by `groups`
// threads (each a fixed subset of the chunks), then across the groups.
template <int kHc>
struct FinishShape {
  static constexpr int kMix = (2 + kHc) * kHc;
  static constexpr int kComb = kHc * kHc;
  static constexpr int kSlots = (kComb + 31) / 32;
  static constexpr int kGroups = std::min(kFinGroups, kFinThreads / kMix);
};

// The comb element in slot s of warp 0's lane. Spare slots mirror the last element: every lane then
// shuffles and divides real values (no lane takes __fdiv_rn's slow path on a dummy), and stores nothing.
template <int kHc>
__device__ __forceinline__ int comb_elem(int lane, int s) {
  return min(lane + 32 * s, kHc * kHc - 1);
}

// The pre / post mix that warp 1's lane finishes (spare lanes mirror the last one and store nothing).
template <int kHc>
__device__ __forceinline__ int pre_post_mix(int lane) {
  return min(lane, 2 * kHc - 1);
}

// Comb element e, read from the slot of warp 0 that holds it; every lane of warp 0 calls it at once.
template <int kSlots>
__device__ __forceinline__ float comb_at(const float (&v)[kSlots], int e) {
  float r = __shfl_sync(kAllLanes, v[0], e % 32);
#pragma unroll
  for (int s = 1; s < kSlots; ++s) {
    const float o = __shfl_sync(kAllLanes, v[s], e % 32);
    if (e / 32 == s) r = o;
  }
  return r;
}

// v[0] + ... + v[N - 1] as a fixed tree (first half + second half): log2 N dependent adds, not N.
template <int N>
__device__ __forceinline__ double tree_sum(const double* v) {
  if constexpr (N == 1) return v[0];
  else return tree_sum<N / 2>(v) + tree_sum<N - N / 2>(v + N / 2);
}

// What a finish CTA reads before the wait, so that none of it is on the path after the wait.
template <int kHc>
struct FinishRow {
  float rs;                                  // 1 / sqrt(ss / n + eps), the CPU's fp32 order
  float scale[3];                            // pre, post, comb
  float base[FinishShape<kHc>::kSlots];      // warp 0: its slots' comb elements; warp 1: its pre / post mix
};

// hc_mixes_finish_kernel's first statement. x was written before the dots kernel that this one
// follows, and under PDL that kernel released this one only after its own wait: x is complete here,
// so the row's sum of squares runs before the wait for the dots' partials, and so do rs and the
// loads of the (never written) scale and base weights.
template <int kHc>
__device__ __forceinline__ FinishRow<kHc> row_inputs_then_wait(const float* __restrict__ x, int64_t n, float norm_eps,
                                                               const uint8_t* scale, WType scale_t,
                                                               const uint8_t* base, WType base_t) {
  const float ss = cuda::block_sum_squares_exact<kFinThreads>(x, n);
  FinishRow<kHc> row;
  row.rs = cuda::rms_scale(ss, n, norm_eps);
#pragma unroll
  for (int i = 0; i < 3; ++i) row.scale[i] = cuda::attn::weight_elem(scale, scale_t, i);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int s = 0; s < FinishShape<kHc>::kSlots; ++s) {
    row.base[s] = 0.0f;
    if (warp == 0) row.base[s] = cuda::attn::weight_elem(base, base_t, 2 * kHc + comb_elem<kHc>(lane, s));
    else if (warp == 1 && s == 0) row.base[s] = cuda::attn::weight_elem(base, base_t, pre_post_mix<kHc>(lane));
  }
  ::di::cuda::grid_dependency_wait();
  return row;
}

// Stage 2, one CTA per row, bit-compatible with the CPU except for the fp64 order of the dot sums:
//  - the chunk sums (fp64): thread (g, i) sums mix i over chunks g, g + groups, ... with all its loads
//    in flight, in a fixed tree; then each mix's groups in a fixed tree. The order depends on splits
//    and hc only (batch-invariant mode fixes splits), and no thread runs a chain of `splits` adds;
//  - warp 1: the pre / post sigmoids;
//  - warp 0: the comb's row softmax and Sinkhorn in registers, in the CPU's fp32 order: every row /
//    column sum gathers its hc operands by shuffles and adds them q = 0.. hc - 1 from 0, then + eps,
//    then one __fdiv_rn per element (no shared memory or barrier between the 2 iters - 1 steps).
template <int kHc>
__global__ void __launch_bounds__(kFinThreads)
    hc_mixes_finish_kernel(const double* __restrict__ part, const float* __restrict__ x, int64_t n, float norm_eps,
                           int splits, const uint8_t* scale, WType scale_t, const uint8_t* base, WType base_t,
                           int sinkhorn_iters, float hc_eps, float* __restrict__ out) {
  const FinishRow<kHc> row = row_inputs_then_wait<kHc>(x + blockIdx.x * n, n, norm_eps, scale, scale_t, base, base_t);
  using Shape = FinishShape<kHc>;
  constexpr int kMix = Shape::kMix, kGroups = Shape::kGroups, kSlots = Shape::kSlots;
  const int64_t r = blockIdx.x;
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  __shared__ double group_sum[kGroups][kMix];  // [group, mix]
  if (t < kGroups * kMix) {
    const int g = t / kMix;
    const double* p = part + r * splits * kMix + t;  // part [rows, splits, mix]: chunk g, mix t % mix
    double acc = 0;
    for (int c0 = g; c0 < splits; c0 += kFinLoads * kGroups) {
      double v[kFinLoads];
#pragma unroll
      for (int q = 0; q < kFinLoads; ++q) {
        const int c = c0 + q * kGroups;
        v[q] = p[static_cast<int64_t>(min(c, splits - 1) - g) * kMix];  // clamped loads: cuda_common.cuh
        if (c >= splits) v[q] = 0.0;
      }
      acc += tree_sum<kFinLoads>(v);
    }
    group_sum[g][t % kMix] = acc;
  }
  __syncthreads();
  // The CPU's m[i]: the row's dot sum for mix i rounded to fp32, times rs.
  auto mix_value = [&](int i) {
    double v[kGroups];
#pragma unroll
    for (int g = 0; g < kGroups; ++g) v[g] = group_sum[g][i];
    return __fmul_rn(static_cast<float>(tree_sum<kGroups>(v)), row.rs);
  };
  float* o = out + r * kMix;
  if (warp == 1) {
    const int i = pre_post_mix<kHc>(lane);
    const float m = mix_value(i);
    if (lane < kHc) o[i] = __fadd_rn(sigmoid_ref(__fadd_rn(__fmul_rn(m, row.scale[0]), row.base[0])), hc_eps);
    else if (lane < 2 * kHc) o[i] = __fmul_rn(2.0f, sigmoid_ref(__fadd_rn(__fmul_rn(m, row.scale[1]), row.base[0])));
  }
  if (warp != 0) return;
  float v[kSlots];      // this lane's comb elements
  int row0[kSlots];     // their rows' first elements (j hc)
  int col[kSlots];      // their columns (k)
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int e = comb_elem<kHc>(lane, s);
    row0[s] = e / kHc * kHc;
    col[s] = e % kHc;
    v[s] = __fadd_rn(__fmul_rn(mix_value(2 * kHc + e), row.scale[2]), row.base[s]);
  }
  // softmax over each row, + eps: the row max in q order, then the sum of the row's exps (each lane
  // computes its own exp once; the row's lanes computed theirs against the same max).
  float ex[kSlots];
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    float mx = comb_at(v, row0[s]);
#pragma unroll
    for (int q = 1; q < kHc; ++q) mx = cuda::attn::std_max(mx, comb_at(v, row0[s] + q));
    ex[s] = cuda::attn::exp_ref(__fsub_rn(v[s], mx));
  }
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    float sum = 0;
#pragma unroll
    for (int q = 0; q < kHc; ++q) sum = __fadd_rn(sum, comb_at(ex, row0[s] + q));
    v[s] = __fadd_rn(__fdiv_rn(ex[s], sum), hc_eps);
  }
  // v /= (sum of the elements operand(s, q), q ascending) + eps; every operand is gathered before any
  // slot changes.
  auto norm = [&](auto operand) {
    float d[kSlots];
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      float sum = 0;
#pragma unroll
      for (int q = 0; q < kHc; ++q) sum = __fadd_rn(sum, comb_at(v, operand(s, q)));
      d[s] = __fadd_rn(sum, hc_eps);
    }
#pragma unroll
    for (int s = 0; s < kSlots; ++s) v[s] = __fdiv_rn(v[s], d[s]);
  };
  auto col_norm = [&] { norm([&](int s, int q) { return q * kHc + col[s]; }); };
  auto row_norm = [&] { norm([&](int s, int q) { return row0[s] + q; }); };
  col_norm();
  for (int it = 0; it + 1 < sinkhorn_iters; ++it) {
    row_norm();
    col_norm();
  }
#pragma unroll
  for (int s = 0; s < kSlots; ++s)
    if (lane + 32 * s < Shape::kComb) o[2 * kHc + lane + 32 * s] = v[s];
}

using FinishKernel = void (*)(const double*, const float*, int64_t, float, int, const uint8_t*, WType,
                              const uint8_t*, WType, int, float, float*);
constexpr FinishKernel kFinishKernels[kMaxHc] = {
    hc_mixes_finish_kernel<1>, hc_mixes_finish_kernel<2>, hc_mixes_finish_kernel<3>, hc_mixes_finish_kernel<4>,
    hc_mixes_finish_kernel<5>, hc_mixes_finish_kernel<6>, hc_mixes_finish_kernel<7>, hc_mixes_finish_kernel<8>};

// out[r, i] = bf16(sum_k pre[k] x[r, k, i]): reads hc x D, writes D per row.
__global__ void hc_pre_kernel(const float* __restrict__ x, const float* __restrict__ mix, int64_t mw, int hc,
                              int64_t d, int64_t total, float* __restrict__ y) {
  ::di::cuda::grid_dependency_wait();
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / d, i = e % d;
    const float* pre = mix + r * mw;
    float acc = 0;
    for (int k = 0; k < hc; ++k) acc = __fadd_rn(acc, __fmul_rn(pre[k], x[(r * hc + k) * d + i]));
    y[e] = cuda::round_bf16(acc);
  }
}

// out[r, k, i] = bf16(post[k] y[r, i] + sum_j comb[j, k] res[r, j, i]): reads (hc + 1) x D, writes hc x D.
__global__ void hc_post_kernel(const float* __restrict__ y, const float* __restrict__ res, const float* __restrict__ mix,
                               int64_t mw, int hc, int64_t d, int64_t total, float* __restrict__ out) {
  ::di::cuda::grid_dependency_wait();
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = e % d, rk = e / d, r = rk / hc;
    const int k = static_cast<int>(rk % hc);
    const float* post = mix + r * mw + hc;
    const float* comb = mix + r * mw + 2 * hc;
    float acc = 0;
    for (int j = 0; j < hc; ++j) acc = __fadd_rn(acc, __fmul_rn(comb[j * hc + k], res[(r * hc + j) * d + i]));
    out[e] = cuda::round_bf16(__fadd_rn(__fmul_rn(post[k], y[r * d + i]), acc));
  }
}

// hc_post, then the next site's collapse and RMSNorm (hc_post_kernel, hc_pre_kernel and rmsnorm_kernel
// in one launch, the same fp32 operations in the same order), grid (D / 256 position blocks, rows):
//   out[r, k, i] = bf16(post[k] y[r, i] + sum_j comb[j, k] res[r, j, i])
//   x[i] = bf16(sum_k pre[k] out[r, k, i]),  xn[r, i] = bf16(w[i] (x[i] inv)),  inv from x's mean square.
// Each CTA writes its positions' out and x (x into xn); the row's last CTA to finish (counter) sums
// x^2 in cpu::sum_squares's order (thread t: chain t) and normalises the row in place. At batch 1 the
// three kernels were ~11 us of launches and latency per site; one CTA per row doing all of it was
// slower still (a 200 KB row through one SM).
constexpr int kPpnThreads = 256;

template <WType T>
__global__ void __launch_bounds__(kPpnThreads)
    hc_post_pre_norm_kernel(const float* __restrict__ y, const float* __restrict__ res,
                            const float* __restrict__ post_mix, int64_t post_mw, const float* __restrict__ pre_mix,
                            int64_t pre_mw, int hc, int64_t d, const uint8_t* __restrict__ w, float eps,
                            unsigned* __restrict__ counters, float* __restrict__ out, float* __restrict__ xn) {
  ::di::cuda::grid_dependency_wait();
  const int64_t r = blockIdx.y, i = static_cast<int64_t>(blockIdx.x) * kPpnThreads + threadIdx.x;
  __shared__ float post[kMaxHc], pre[kMaxHc], comb[kMaxHc * kMaxHc];
  if (threadIdx.x < hc) {
    post[threadIdx.x] = post_mix[r * post_mw + hc + threadIdx.x];
    pre[threadIdx.x] = pre_mix[r * pre_mw + threadIdx.x];
  }
  if (threadIdx.x < hc * hc) comb[threadIdx.x] = post_mix[r * post_mw + 2 * hc + threadIdx.x];
  float* xr = xn + r * d;
  const bool in = i < d;
  const int64_t ic = min(i, d - 1);  // clamped loads (cuda_common.cuh): values past d or hc go unused
  const float yv = y[r * d + ic];
  float rv[kMaxHc];
#pragma unroll
  for (int j = 0; j < kMaxHc; ++j) rv[j] = res[(r * hc + min(j, hc - 1)) * d + ic];
  __syncthreads();  // the mixes
  if (in) {
    float x = 0.0f;
    for (int k = 0; k < hc; ++k) {
      float acc = 0.0f;
#pragma unroll
      for (int j = 0; j < kMaxHc; ++j)
        if (j < hc) acc = __fadd_rn(acc, __fmul_rn(comb[j * hc + k], rv[j]));
      const float o = cuda::round_bf16(__fadd_rn(__fmul_rn(post[k], yv), acc));
      out[(r * hc + k) * d + i] = o;
      x = __fadd_rn(x, __fmul_rn(pre[k], o));
    }
    xr[i] = cuda::round_bf16(x);
  }
  if (!cuda::split_last_arrival(counters + r, static_cast<int>(gridDim.x))) return;
  // the row's x, kHeld values per thread at a time with their loads in flight together (one at a
  // time, the 20 dependent L2 round trips of a 5120-wide row took ~10 us)
  constexpr int kHeld = 24;
  constexpr int64_t kSpan = kHeld * kPpnThreads;
  float ss = 0.0f;  // chain threadIdx.x of cpu::sum_squares(x, d)
  float xv[kHeld], wv[kHeld];
  for (int64_t p0 = threadIdx.x; p0 - threadIdx.x < d; p0 += kSpan) {  // the same trip count in every thread
#pragma unroll
    for (int k = 0; k < kHeld; ++k) {
      const int64_t p = min(p0 + k * kPpnThreads, d - 1);  // clamped loads: cuda_common.cuh
      xv[k] = __ldcg(xr + p);
      wv[k] = cuda::attn::weight_elem(w, T, p);
    }
#pragma unroll
    for (int k = 0; k < kHeld; ++k)
      if (p0 + k * kPpnThreads < d) ss = __fadd_rn(ss, __fmul_rn(xv[k], xv[k]));
  }
  const float dot = cuda::block_chains_total<kPpnThreads>(ss);
  const float inv = cuda::rms_scale(dot, d, eps);
  if (d <= kSpan) {  // one trip: the registers hold the thread's whole share of the row
#pragma unroll
    for (int k = 0; k < kHeld; ++k) {
      const int64_t p = threadIdx.x + k * kPpnThreads;
      if (p < d) xr[p] = cuda::dq::rms_normed(xv[k], wv[k], inv);
    }
    return;
  }
#pragma unroll 4
  for (int64_t p = threadIdx.x; p < d; p += kPpnThreads)
    xr[p] = cuda::dq::rms_normed(__ldcg(xr + p), cuda::attn::weight_elem(w, T, p), inv);
}

// out[r, i] = bf16((sum_k x[r, k, i]) / hc).
__global__ void stream_mean_kernel(const float* __restrict__ x, int hc, int64_t d, int64_t total, float* __restrict__ y) {
  ::di::cuda::grid_dependency_wait();
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / d, i = e % d;
    float acc = 0;
    for (int k = 0; k < hc; ++k) acc = __fadd_rn(acc, x[(r * hc + k) * d + i]);
    y[e] = cuda::round_bf16(__fdiv_rn(acc, static_cast<float>(hc)));
  }
}

constexpr int kElemThreads = 256;
int elem_blocks(int64_t total) {
  return static_cast<int>(std::min<int64_t>(cuda::blocks_for(total, kElemThreads), 65536));
}

void check_hc(int hc, const char* op) {
  if (hc < 1 || hc > kMaxHc)
    throw Error(std::string("cuda op ") + op + ": hc = " + std::to_string(hc) + ", expected 1.." +
                std::to_string(kMaxHc));
}

}  // namespace

Tensor CudaBackend::hc_mixes(const Tensor& x, int hc, const Weight& fn, const Weight& scale, const Weight& base,
                             float norm_eps, int sinkhorn_iters, float hc_eps) {
  check_hc(hc, "hc_mixes");
  const int64_t s = x.rows(), n = x.row_size();
  const int mix = (2 + hc) * hc;
  DI_CHECK(x.type == TType::kF32);
  DI_CHECK(fn.rows == mix && fn.cols == n);
  DI_CHECK(scale.rows * scale.cols >= 3 && base.rows * base.cols >= mix);
  const WType fn_t = cuda::attn::weight_type(fn, "hc_mixes", "fn");
  const WType sc_t = cuda::attn::weight_type(scale, "hc_mixes", "scale");
  const WType bs_t = cuda::attn::weight_type(base, "hc_mixes", "base");
  Tensor out = alloc(TType::kF32, {s, mix});
  if (s == 0) return out;
  DI_CHECK(n > 0 && s <= 65535);
  // K chunks per row: enough CTAs for about two waves of the 132 SMs, at least 256 elements each
  // (batch-invariant mode: the count of one row, at every row count; batch_invariance.cuh).
  const int splits = cuda::bi::hc_mixes_splits(batch_invariant_, s, n);
  const int64_t chunk = (n + splits - 1) / splits;
  Tensor part = alloc(TType::kF32, {s, splits * mix * 2});  // fp64 chunk sums
  const dim3 grid(splits, static_cast<unsigned>(s));
  double* partials = reinterpret_cast<double*>(part.f32());
  auto* dots = fn_t == WType::kBf16  ? hc_mixes_dots_kernel<WType::kBf16>
               : fn_t == WType::kF16 ? hc_mixes_dots_kernel<WType::kF16>
                                     : hc_mixes_dots_kernel<WType::kF32>;
  ::di::cuda::launch(dots, grid, kDotThreads, 0, x.f32(), n, mix, chunk, splits, cuda::wdata(fn), partials);
  ::di::cuda::launch(kFinishKernels[hc - 1], static_cast<unsigned>(s), kFinThreads, 0,
                     reinterpret_cast<const double*>(part.f32()), x.f32(), n, norm_eps, splits, cuda::wdata(scale),
                     sc_t, cuda::wdata(base), bs_t, sinkhorn_iters, hc_eps, out.f32());
  return out;
}

Tensor CudaBackend::hc_pre(const Tensor& x, const Tensor& mix, int hc) {
  check_hc(hc, "hc_pre");
  const int64_t s = x.rows(), d = x.row_size() / hc, mw = mix.row_size();
  DI_CHECK(x.row_size() == hc * d && mix.rows() == s && mw >= hc);
  Tensor y = alloc(TType::kF32, {s, d});
  const int64_t total = s * d;
  if (total == 0) return y;
  ::di::cuda::launch(hc_pre_kernel, elem_blocks(total), kElemThreads, 0, x.f32(), mix.f32(), mw, hc, d, total, y.f32());
  return y;
}

Tensor CudaBackend::hc_post(const Tensor& y, const Tensor& residual, const Tensor& mix, int hc) {
  check_hc(hc, "hc_post");
  const int64_t s = y.rows(), d = y.row_size(), mw = mix.row_size();
  DI_CHECK(residual.rows() == s && residual.row_size() == hc * d && mix.rows() == s && mw >= (2 + hc) * hc);
  Tensor out = alloc(TType::kF32, {s, hc * d});
  const int64_t total = s * hc * d;
  if (total == 0) return out;
  ::di::cuda::launch(hc_post_kernel, elem_blocks(total), kElemThreads, 0, y.f32(), residual.f32(), mix.f32(), mw, hc, d,
                     total, out.f32());
  return out;
}

std::pair<Tensor, Tensor> CudaBackend::hc_post_pre_norm(const Tensor& y, const Tensor& residual, const Tensor& post_mix,
                                                        const Tensor& pre_mix, int hc, const Weight& norm, float eps) {
  check_hc(hc, "hc_post_pre_norm");
  const int64_t s = y.rows(), d = y.row_size();
  DI_CHECK(residual.rows() == s && residual.row_size() == hc * d);
  DI_CHECK(post_mix.rows() == s && post_mix.row_size() >= (2 + hc) * hc && pre_mix.rows() == s &&
           pre_mix.row_size() >= hc);
  if (norm.rows * norm.cols != d)
    throw Error("cuda op hc_post_pre_norm: norm weight has " + std::to_string(norm.rows * norm.cols) +
                " values, expected " + std::to_string(d));
  const WType w_t = cuda::attn::weight_type(norm, "hc_post_pre_norm", "norm");
  Tensor out = alloc(TType::kF32, {s, hc * d});
  Tensor xn = alloc(TType::kF32, {s, d});
  if (s == 0 || d == 0) return {out, xn};
  DI_CHECK_MSG(s <= 65535, "hc_post_pre_norm: too many rows");
  auto* kernel = w_t == WType::kBf16  ? hc_post_pre_norm_kernel<WType::kBf16>
                 : w_t == WType::kF16 ? hc_post_pre_norm_kernel<WType::kF16>
                                      : hc_post_pre_norm_kernel<WType::kF32>;
  unsigned* counters = cuda::workspace_as<unsigned>(cuda::Ws::kCounters, static_cast<size_t>(s));  // kept zero
  const dim3 grid(static_cast<unsigned>(cuda::blocks_for(d, kPpnThreads)), static_cast<unsigned>(s));
  ::di::cuda::launch(kernel, grid, kPpnThreads, 0, y.f32(), residual.f32(), post_mix.f32(), post_mix.row_size(),
                     pre_mix.f32(), pre_mix.row_size(), hc, d, cuda::wdata(norm), eps, counters, out.f32(), xn.f32());
  return {out, xn};
}

Tensor CudaBackend::stream_mean(const Tensor& x, int hc) {
  check_hc(hc, "stream_mean");
  const int64_t s = x.rows(), d = x.row_size() / hc;
  DI_CHECK(x.row_size() == hc * d);
  Tensor y = alloc(TType::kF32, {s, d});
  const int64_t total = s * d;
  if (total == 0) return y;
  ::di::cuda::launch(stream_mean_kernel, elem_blocks(total), kElemThreads, 0, x.f32(), hc, d, total, y.f32());
  return y;
}

}  // namespace di
