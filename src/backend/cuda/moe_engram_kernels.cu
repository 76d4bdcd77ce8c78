// Engram on the GPU: table row lookup (FP8 x E8M0 per 32 -> bf16) and the gated injection of the
// looked-up value into each hyper-connection stream.
#include <cmath>

#include "backend/cuda/moe_elem.cuh"
#include "backend/cuda/moe_kernels.cuh"
#include "backend/cuda/pdl_launch.cuh"

namespace di::cuda::moe {
namespace {

constexpr unsigned kFull = 0xffffffffu;

// One thread per 16 codes: 16 B of codes + 1 scale in, 64 B of floats out (coalesced 16-byte
// accesses). hd % 32 == 0, so every 16-code chunk lies inside one scale block.
__global__ void engram_lookup_kernel(const int32_t* __restrict__ cols, int64_t n, const uint8_t* __restrict__ table,
                                     const uint8_t* __restrict__ scales, int64_t table_rows, int64_t hd,
                                     float* __restrict__ out) {
  ::di::cuda::grid_dependency_wait();
  const int64_t chunks = hd / 16;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= n * chunks) return;
  const int64_t i = t / chunks, c = (t % chunks) * 16;
  const int64_t row = cols[i];
  float4* o = reinterpret_cast<float4*>(out + i * hd + c);
  if (row < 0 || row >= table_rows) {  // the CPU DI_CHECKs this; never read out of bounds here
    const float q = __int_as_float(0x7fc00000);
    for (int j = 0; j < 4; ++j) o[j] = make_float4(q, q, q, q);
    return;
  }
  const uint4 w = *reinterpret_cast<const uint4*>(table + row * hd + c);
  const float sc = e8m0_to_float(scales[row * (hd / 32) + c / 32]);
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
  for (int j = 0; j < 4; ++j) {
    float v[4];
    for (int b = 0; b < 4; ++b) v[b] = round_bf16(__fmul_rn(e4m3_to_float((words[j] >> (8 * b)) & 0xffu), sc));
    o[j] = make_float4(v[0], v[1], v[2], v[3]);
  }
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(kFull, v, off);
  return v;
}

// One block per (token, stream): reads h, key, value (3*D floats) and q, k (2*D weights), writes D
// floats; ~8*D FLOPs. The three fp32 sums are reduced in a different order from the CPU's (ulps).
// Thread t takes elements t, t + kThreads, ... in rounds of kHeld whose loads are in flight together; with one
// round (D <= kThreads kHeld) h and value stay in registers for the output. <T, 512, 10> loads a V4.1 row in one
// round (batch 1 on an H100: 7.0 us after its input, against 15.7 us for <T, 256, 1>, the original kernel, whose
// dependent L2 round trip per 256 elements CudaBackend keeps for DEEPINFER_WIDE_INJECT=0; sums in another order).
template <ElemType T, int kThreads, int kHeld>
__global__ void __launch_bounds__(kThreads)
    engram_inject_kernel(const float* __restrict__ x, const float* __restrict__ kv, const uint8_t* __restrict__ qw,
                         const uint8_t* __restrict__ kw, int hc, int64_t d, float eps, float inv_sqrt_d,
                         float* __restrict__ out) {
  ::di::cuda::grid_dependency_wait();
  __shared__ float red[3][32];
  const int64_t r = blockIdx.x / hc;
  const int k = static_cast<int>(blockIdx.x % hc);
  const float* h = x + (r * hc + k) * d;
  const float* key = kv + r * (hc + 1) * d + k * d;
  const float* value = kv + r * (hc + 1) * d + hc * d;
  constexpr int64_t kSpan = static_cast<int64_t>(kThreads) * kHeld;
  const bool one_round = d <= kSpan;
  float shh = 0, skk = 0, sdot = 0;
  float hv[kHeld], vv[kHeld];
  for (int64_t base = 0; base < d; base += kSpan) {
    float kk[kHeld], wq[kHeld], wk[kHeld];
#pragma unroll
    for (int j = 0; j < kHeld; ++j) {
      const int64_t i = min(base + threadIdx.x + j * kThreads, d - 1);  // clamped loads: values past d go unused
      hv[j] = h[i], kk[j] = key[i];
      wq[j] = load_elem<T>(qw, k * d + i), wk[j] = load_elem<T>(kw, k * d + i);
      if (one_round) vv[j] = value[i];
    }
#pragma unroll
    for (int j = 0; j < kHeld; ++j) {
      if (base + threadIdx.x + j * kThreads >= d) break;
      const float wgt = __fmul_rn(wq[j], wk[j]);
      shh += hv[j] * hv[j];
      skk += kk[j] * kk[j];
      sdot += __fmul_rn(hv[j], wgt) * kk[j];
    }
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, warps = kThreads / 32;
  shh = warp_sum(shh), skk = warp_sum(skk), sdot = warp_sum(sdot);
  if (lane == 0) red[0][warp] = shh, red[1][warp] = skk, red[2][warp] = sdot;
  __syncthreads();
  if (warp == 0) {
    shh = lane < warps ? red[0][lane] : 0.0f;
    skk = lane < warps ? red[1][lane] : 0.0f;
    sdot = lane < warps ? red[2][lane] : 0.0f;
    shh = warp_sum(shh), skk = warp_sum(skk), sdot = warp_sum(sdot);
    if (lane == 0) red[0][0] = shh, red[1][0] = skk, red[2][0] = sdot;
  }
  __syncthreads();
  const float fd = static_cast<float>(d);
  const float hh = red[0][0] / fd, kk = red[1][0] / fd;
  const float rstd = __fmul_rn(1.0f / sqrtf(hh + eps), 1.0f / sqrtf(kk + eps));
  const float dotv = __fmul_rn(__fmul_rn(red[2][0], rstd), inv_sqrt_d);
  const float mag = sqrtf(fmaxf(fabsf(dotv), 1e-6f));
  const float gate = 1.0f / (1.0f + exp_f32(-copysignf(mag, dotv)));
  float* o = out + (r * hc + k) * d;
  if (one_round) {
#pragma unroll
    for (int j = 0; j < kHeld; ++j) {
      const int64_t i = threadIdx.x + j * kThreads;
      if (i < d) o[i] = round_bf16(__fadd_rn(hv[j], __fmul_rn(gate, vv[j])));
    }
    return;
  }
  for (int64_t i = threadIdx.x; i < d; i += kThreads) o[i] = round_bf16(__fadd_rn(h[i], __fmul_rn(gate, value[i])));
}

template <ElemType T>
void launch_inject(bool wide, unsigned blocks, const float* x, const float* kv, const uint8_t* q, const uint8_t* k,
                   int hc, int64_t d, float eps, float inv_sqrt_d, float* out) {
  if (wide)
    ::di::cuda::launch(engram_inject_kernel<T, 512, 10>, blocks, 512, 0, x, kv, q, k, hc, d, eps, inv_sqrt_d, out);
  else
    ::di::cuda::launch(engram_inject_kernel<T, 256, 1>, blocks, 256, 0, x, kv, q, k, hc, d, eps, inv_sqrt_d, out);
}

}  // namespace

void engram_lookup(const int32_t* cols, int64_t n, const uint8_t* table, const uint8_t* scales, int64_t table_rows,
                   int64_t hd, float* out) {
  DI_CHECK_MSG(hd % 32 == 0, "engram_lookup: head dim must be a multiple of 32");
  if (n == 0 || hd == 0) return;
  constexpr int kThreads = 256;
  ::di::cuda::launch(engram_lookup_kernel, blocks_for(n * (hd / 16), kThreads), kThreads, 0, cols, n, table, scales,
                     table_rows, hd, out);
}

void engram_inject(const float* x, const float* kv, const uint8_t* q, const uint8_t* k, DType w_dtype, int64_t s,
                   int hc, int64_t d, float eps, float* out, bool wide) {
  if (s == 0 || d == 0) return;
  const float inv_sqrt_d = 1.0f / std::sqrt(static_cast<float>(d));  // on the host, as the CPU
  const unsigned blocks = static_cast<unsigned>(s * hc);
  switch (elem_type(w_dtype, "engram_inject q/k weight")) {
    case ElemType::kBf16: return launch_inject<ElemType::kBf16>(wide, blocks, x, kv, q, k, hc, d, eps, inv_sqrt_d, out);
    case ElemType::kF16: return launch_inject<ElemType::kF16>(wide, blocks, x, kv, q, k, hc, d, eps, inv_sqrt_d, out);
    case ElemType::kF32: return launch_inject<ElemType::kF32>(wide, blocks, x, kv, q, k, hc, d, eps, inv_sqrt_d, out);
  }
}

}  // namespace di::cuda::moe
