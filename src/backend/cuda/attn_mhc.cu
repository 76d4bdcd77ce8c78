// CUDA backend: the mHC (hyper-connection) ops, bit-compatible with cpu_elementwise.cpp: the same
// fp32 rounding points in the same order (no FMA contraction where the CPU multiplies then adds).
#include "backend/cuda/attn_common.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.cuh"

namespace di {
namespace {

using cuda::attn::WType;

constexpr int kMaxHc = 8;              // comb is hc x hc in shared memory
constexpr int kMixThreads = 256;       // warp 0: mean square; warps 1..7: the dot products
constexpr int kMixChunk = 12;          // fp64 accumulators per thread per pass over the row
constexpr int kMixWarps = kMixThreads / 32;

__device__ __forceinline__ float sigmoid_ref(float x) {
  return __fdiv_rn(1.0f, __fadd_rn(1.0f, cuda::attn::exp_ref(-x)));
}

// One block per row. Reads x [n] once per 12 mixes and fn [mix, n] (L2-resident); 24 x n fp64 FMAs
// for hc = 4. Warp 0 sums the squares in cpu::dot's exact fp32 order (8 interleaved lanes) while
// the other warps accumulate the mixes in fp64; thread 0 then runs the fp32 epilogue in the CPU's order.
__global__ void hc_mixes_kernel(const float* __restrict__ x, int64_t n, int hc, const uint8_t* fn, WType fn_t,
                                const uint8_t* scale, WType scale_t, const uint8_t* base, WType base_t,
                                float norm_eps, int sinkhorn_iters, float hc_eps, float* __restrict__ out) {
  const int mix = (2 + hc) * hc;
  const int64_t r = blockIdx.x;
  const float* xr = x + r * n;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __shared__ double part[kMixWarps][kMixChunk];
  __shared__ double dots[(2 + kMaxHc) * kMaxHc];
  __shared__ float rs_sh;
  __shared__ float comb[kMaxHc * kMaxHc];

  if (warp == 0) {
    // cpu::dot(xr, xr, n): lane j < 8 sums x[i + j]^2 for i = 0, 8, ...; then tail and tree.
    float s = 0;
    const int64_t n8 = n - n % 8;
    if (lane < 8) {
#pragma unroll 8
      for (int64_t i = lane; i < n8; i += 8) s = __fadd_rn(s, __fmul_rn(xr[i], xr[i]));
    }
    float s1 = __shfl_down_sync(0xffffffffu, s, 1);  // lane 0: s1, lane 2: s3, lane 4: s5, lane 6: s7
    float p01 = __fadd_rn(s, s1);                    // lane 0: s0+s1, 2: s2+s3, 4: s4+s5, 6: s6+s7
    float p23 = __shfl_down_sync(0xffffffffu, p01, 2);
    float q = __fadd_rn(p01, p23);                   // lane 0: (s0+s1)+(s2+s3), lane 4: (s4+s5)+(s6+s7)
    float q4 = __shfl_down_sync(0xffffffffu, q, 4);
    if (lane == 0) {
      float tail = 0;
      for (int64_t i = n8; i < n; ++i) tail = __fadd_rn(tail, __fmul_rn(xr[i], xr[i]));
      float ss = __fadd_rn(__fadd_rn(q, q4), tail);
      float var = __fadd_rn(__fdiv_rn(ss, static_cast<float>(n)), norm_eps);
      rs_sh = __fdiv_rn(1.0f, __fsqrt_rn(var));
    }
  }
  for (int j0 = 0; j0 < mix; j0 += kMixChunk) {
    const int nj = min(kMixChunk, mix - j0);
    double acc[kMixChunk];
#pragma unroll
    for (int j = 0; j < kMixChunk; ++j) acc[j] = 0;
    if (warp > 0) {
      for (int64_t i = threadIdx.x - 32; i < n; i += kMixThreads - 32) {
        const double xv = xr[i];
#pragma unroll
        for (int j = 0; j < kMixChunk; ++j)
          if (j < nj) acc[j] += xv * static_cast<double>(cuda::attn::weight_elem(fn, fn_t, (j0 + j) * n + i));
      }
    }
#pragma unroll
    for (int j = 0; j < kMixChunk; ++j) {
      double v = acc[j];
      for (int o = 16; o > 0; o /= 2) v += __shfl_down_sync(0xffffffffu, v, o);
      if (lane == 0) part[warp][j] = v;
    }
    __syncthreads();
    if (threadIdx.x < nj) {
      double v = 0;
      for (int w = 1; w < kMixWarps; ++w) v += part[w][threadIdx.x];
      dots[j0 + threadIdx.x] = v;
    }
    __syncthreads();
  }
  if (threadIdx.x != 0) return;

  // Epilogue, one thread, fp32 in the CPU's order.
  const float rs = rs_sh;
  const float sc0 = cuda::attn::weight_elem(scale, scale_t, 0), sc1 = cuda::attn::weight_elem(scale, scale_t, 1),
              sc2 = cuda::attn::weight_elem(scale, scale_t, 2);
  float* o = out + r * mix;
  auto m = [&](int j) { return __fmul_rn(static_cast<float>(dots[j]), rs); };
  auto bs = [&](int j) { return cuda::attn::weight_elem(base, base_t, j); };
  for (int k = 0; k < hc; ++k) o[k] = __fadd_rn(sigmoid_ref(__fadd_rn(__fmul_rn(m(k), sc0), bs(k))), hc_eps);
  for (int k = 0; k < hc; ++k)
    o[hc + k] = __fmul_rn(2.0f, sigmoid_ref(__fadd_rn(__fmul_rn(m(hc + k), sc1), bs(hc + k))));
  for (int i = 0; i < hc * hc; ++i) comb[i] = __fadd_rn(__fmul_rn(m(2 * hc + i), sc2), bs(2 * hc + i));
  for (int j = 0; j < hc; ++j) {  // softmax over each row, + eps
    float mx = comb[j * hc];
    for (int k = 1; k < hc; ++k) mx = cuda::attn::std_max(mx, comb[j * hc + k]);
    float sum = 0;
    for (int k = 0; k < hc; ++k) {
      comb[j * hc + k] = cuda::attn::exp_ref(__fsub_rn(comb[j * hc + k], mx));
      sum = __fadd_rn(sum, comb[j * hc + k]);
    }
    for (int k = 0; k < hc; ++k) comb[j * hc + k] = __fadd_rn(__fdiv_rn(comb[j * hc + k], sum), hc_eps);
  }
  auto col_norm = [&] {
    for (int k = 0; k < hc; ++k) {
      float sum = 0;
      for (int j = 0; j < hc; ++j) sum = __fadd_rn(sum, comb[j * hc + k]);
      for (int j = 0; j < hc; ++j) comb[j * hc + k] = __fdiv_rn(comb[j * hc + k], __fadd_rn(sum, hc_eps));
    }
  };
  auto row_norm = [&] {
    for (int j = 0; j < hc; ++j) {
      float sum = 0;
      for (int k = 0; k < hc; ++k) sum = __fadd_rn(sum, comb[j * hc + k]);
      for (int k = 0; k < hc; ++k) comb[j * hc + k] = __fdiv_rn(comb[j * hc + k], __fadd_rn(sum, hc_eps));
    }
  };
  col_norm();
  for (int it = 0; it + 1 < sinkhorn_iters; ++it) {
    row_norm();
    col_norm();
  }
  for (int i = 0; i < hc * hc; ++i) o[2 * hc + i] = comb[i];
}

// out[r, i] = bf16(sum_k pre[k] x[r, k, i]): reads hc x D, writes D per row.
__global__ void hc_pre_kernel(const float* __restrict__ x, const float* __restrict__ mix, int64_t mw, int hc,
                              int64_t d, int64_t total, float* __restrict__ y) {
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
  DI_CHECK(n > 0);
  hc_mixes_kernel<<<static_cast<unsigned>(s), kMixThreads>>>(x.f32(), n, hc, cuda::wdata(fn), fn_t, cuda::wdata(scale),
                                                             sc_t, cuda::wdata(base), bs_t, norm_eps, sinkhorn_iters,
                                                             hc_eps, out.f32());
  DI_CUDA_LAUNCH_CHECK();
  return out;
}

Tensor CudaBackend::hc_pre(const Tensor& x, const Tensor& mix, int hc) {
  check_hc(hc, "hc_pre");
  const int64_t s = x.rows(), d = x.row_size() / hc, mw = mix.row_size();
  DI_CHECK(x.row_size() == hc * d && mix.rows() == s && mw >= hc);
  Tensor y = alloc(TType::kF32, {s, d});
  const int64_t total = s * d;
  if (total == 0) return y;
  hc_pre_kernel<<<elem_blocks(total), kElemThreads>>>(x.f32(), mix.f32(), mw, hc, d, total, y.f32());
  DI_CUDA_LAUNCH_CHECK();
  return y;
}

Tensor CudaBackend::hc_post(const Tensor& y, const Tensor& residual, const Tensor& mix, int hc) {
  check_hc(hc, "hc_post");
  const int64_t s = y.rows(), d = y.row_size(), mw = mix.row_size();
  DI_CHECK(residual.rows() == s && residual.row_size() == hc * d && mix.rows() == s && mw >= (2 + hc) * hc);
  Tensor out = alloc(TType::kF32, {s, hc * d});
  const int64_t total = s * hc * d;
  if (total == 0) return out;
  hc_post_kernel<<<elem_blocks(total), kElemThreads>>>(y.f32(), residual.f32(), mix.f32(), mw, hc, d, total, out.f32());
  DI_CUDA_LAUNCH_CHECK();
  return out;
}

Tensor CudaBackend::stream_mean(const Tensor& x, int hc) {
  check_hc(hc, "stream_mean");
  const int64_t s = x.rows(), d = x.row_size() / hc;
  DI_CHECK(x.row_size() == hc * d);
  Tensor y = alloc(TType::kF32, {s, d});
  const int64_t total = s * d;
  if (total == 0) return y;
  stream_mean_kernel<<<elem_blocks(total), kElemThreads>>>(x.f32(), hc, d, total, y.f32());
  DI_CUDA_LAUNCH_CHECK();
  return y;
}

}  // namespace di
