// CUDA backend: the mHC (hyper-connection) ops, bit-compatible with cpu_elementwise.cpp: the same
// fp32 rounding points in the same order (no FMA contraction where the CPU multiplies then adds).
#include <algorithm>

#include "backend/cuda/attn_common.cuh"
#include "backend/cuda/batch_invariance.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/pdl_launch.cuh"

namespace di {
namespace {

using cuda::attn::WType;

constexpr int kMaxHc = 8;          // comb is hc x hc in shared memory
constexpr int kDotThreads = 256;   // hc_mixes_dots: one CTA per (K chunk, row)
constexpr int kDotWarps = kDotThreads / 32;
constexpr int kDotAcc = 24;        // fp64 accumulators per thread per pass over the chunk (mix = 24 at hc 4)
constexpr int kFinThreads = 256;   // hc_mixes_finish: >= mix and >= hc * hc; one per mean-square chain
constexpr int kFinStage = 2048;    // hc_mixes_finish: partials staged per pass (16 KB; >= mix)

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

// hc_mixes_finish_kernel's first statement. x was written before the dots kernel that this one
// follows, and under PDL that kernel released this one only after its own wait: x is complete here,
// so the row's sum of squares runs before the wait for the dots' partials.
__device__ __forceinline__ float sum_squares_then_wait(const float* __restrict__ x, int64_t n) {
  const float ss = cuda::block_sum_squares_exact<kFinThreads>(x, n);
  ::di::cuda::grid_dependency_wait();
  return ss;
}

// Stage 2, one CTA per row: the row's mean square in cpu::sum_squares' exact fp32 order, rs = 1 /
// sqrt(ss / n + eps) (here rather than in CTAs of stage 1: there, beside the dot CTAs, it made the
// dots kernel 42 -> 91 us at batch 64); the chunk sums in chunk order (fp64); then the fp32 epilogue
// in the CPU's order - sigmoids, softmax rows, Sinkhorn - with one thread per comb element (every
// row / column sum is recomputed by each of its elements in the CPU's sequential order, so no sum is
// reordered).
__global__ void __launch_bounds__(kFinThreads)
    hc_mixes_finish_kernel(const double* __restrict__ part, const float* __restrict__ x, int64_t n, float norm_eps,
                           int splits, int hc, const uint8_t* scale, WType scale_t, const uint8_t* base,
                           WType base_t, int sinkhorn_iters, float hc_eps, float* __restrict__ out) {
  const float ss = sum_squares_then_wait(x + blockIdx.x * n, n);
  const int mix = (2 + hc) * hc;
  const int64_t r = blockIdx.x;
  const int t = threadIdx.x;
  __shared__ float m[(2 + kMaxHc) * kMaxHc];
  __shared__ float comb[kMaxHc * kMaxHc];
  __shared__ double staged[kFinStage];
  const float rs = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, static_cast<float>(n)), norm_eps)));
  // The chunk sums in chunk order. The row's partials come through shared memory, a stage at a time
  // with every load in flight (summing straight from global memory was a round trip per chunk).
  const double* pr = part + r * splits * mix;
  const int per_stage = kFinStage / mix;  // chunks per stage
  double sum = 0;
  for (int c0 = 0; c0 < splits; c0 += per_stage) {
    const int total = min(per_stage, splits - c0) * mix, nc = total / mix;
    for (int i0 = t; i0 < total; i0 += kFinThreads * 8) {  // 8 loads in flight per thread
      double v[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = i0 + j * kFinThreads < total ? pr[c0 * mix + i0 + j * kFinThreads] : 0.0;
#pragma unroll
      for (int j = 0; j < 8; ++j)
        if (i0 + j * kFinThreads < total) staged[i0 + j * kFinThreads] = v[j];
    }
    __syncthreads();
    if (t < mix)
      for (int c = 0; c < nc; ++c) sum += staged[c * mix + t];
    __syncthreads();
  }
  if (t < mix) m[t] = __fmul_rn(static_cast<float>(sum), rs);
  __syncthreads();
  float* o = out + r * mix;
  const float sc0 = cuda::attn::weight_elem(scale, scale_t, 0), sc1 = cuda::attn::weight_elem(scale, scale_t, 1),
              sc2 = cuda::attn::weight_elem(scale, scale_t, 2);
  auto bs = [&](int j) { return cuda::attn::weight_elem(base, base_t, j); };
  if (t < hc) o[t] = __fadd_rn(sigmoid_ref(__fadd_rn(__fmul_rn(m[t], sc0), bs(t))), hc_eps);
  else if (t < 2 * hc) o[t] = __fmul_rn(2.0f, sigmoid_ref(__fadd_rn(__fmul_rn(m[t], sc1), bs(t))));
  const bool own = t < hc * hc;
  const int j = own ? t / hc : 0, k = own ? t % hc : 0;  // this thread's comb element (row j, column k)
  float v = own ? __fadd_rn(__fmul_rn(m[2 * hc + t], sc2), bs(2 * hc + t)) : 0.0f;
  if (own) comb[t] = v;
  __syncthreads();
  // softmax over each row, + eps
  if (own) {
    float mx = comb[j * hc];
    for (int q = 1; q < hc; ++q) mx = cuda::attn::std_max(mx, comb[j * hc + q]);
    float sum = 0;
    for (int q = 0; q < hc; ++q) sum = __fadd_rn(sum, cuda::attn::exp_ref(__fsub_rn(comb[j * hc + q], mx)));
    v = __fadd_rn(__fdiv_rn(cuda::attn::exp_ref(__fsub_rn(v, mx)), sum), hc_eps);
  }
  __syncthreads();
  if (own) comb[t] = v;
  __syncthreads();
  // The Sinkhorn steps touch only the comb's threads: one warp's barrier when they fit in warp 0
  // (hc <= 5), and each thread's hc operands load before its sequential sum.
  const bool one_warp = hc * hc <= 32;
  auto sync = [&] {
    if (one_warp) __syncwarp();
    else __syncthreads();
  };
  auto norm = [&](int first, int step) {  // v /= (sum of comb[first + step q], q ascending) + eps
    if (own) {
      float c[kMaxHc];
#pragma unroll
      for (int q = 0; q < kMaxHc; ++q) c[q] = q < hc ? comb[first + step * q] : 0.0f;
      float sum = 0;
#pragma unroll
      for (int q = 0; q < kMaxHc; ++q)
        if (q < hc) sum = __fadd_rn(sum, c[q]);
      v = __fdiv_rn(v, __fadd_rn(sum, hc_eps));
    }
    sync();
    if (own) comb[t] = v;
    sync();
  };
  auto col_norm = [&] { norm(k, hc); };
  auto row_norm = [&] { norm(j * hc, 1); };
  col_norm();
  for (int it = 0; it + 1 < sinkhorn_iters; ++it) {
    row_norm();
    col_norm();
  }
  if (own) o[2 * hc + t] = v;
}

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
  ::di::cuda::launch(hc_mixes_finish_kernel, static_cast<unsigned>(s), kFinThreads, 0,
                     reinterpret_cast<const double*>(part.f32()), x.f32(), n, norm_eps, splits, hc, cuda::wdata(scale),
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
