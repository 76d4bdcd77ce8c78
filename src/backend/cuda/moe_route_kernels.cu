// MoE router on the GPU: fp32 logits with fp64 accumulation (the CPU's kF32 linear of the gate),
// then sqrt(softplus) scores, biased top-k selection and renormalised weights, one CTA per row.
#include <climits>
#include <cmath>
#include <string>

#include "backend/cuda/moe_elem.cuh"
#include "backend/cuda/moe_kernels.cuh"
#include "backend/cuda/pdl_launch.cuh"

namespace di::cuda::moe {
namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kMaxRouted = 512;  // routed experts the selection kernel takes (2 x 512 floats of shared memory)

__device__ __forceinline__ double warp_sum(double v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(kFull, v, off);
  return v;
}

// Two bf16 values packed in a 32-bit word, low half first.
__device__ __forceinline__ double dot2_bf16(float a, float b, uint32_t w) {
  return static_cast<double>(a) * bf16_bits_to_float(static_cast<uint16_t>(w & 0xffffu)) +
         static_cast<double>(b) * bf16_bits_to_float(static_cast<uint16_t>(w >> 16));
}

// One warp per (expert, row): D fp32 activations + D gate values in, 2*D fp64 FLOPs; the gate
// (E*D*2 bytes) stays in L2 across rows. fp32 x fp32 products are exact in fp64, so the sum is
// within an ulp of exact for any order and rounds to the CPU's fp32 value (but for rare halfway
// cases). kVec8: BF16 gate with D % 8 == 0 and 16-byte aligned rows (16-byte loads).
template <ElemType T, bool kVec8>
__global__ void router_logits_kernel(const float* __restrict__ x, const uint8_t* __restrict__ gate, int64_t s,
                                     int64_t n_exp, int64_t d, float* __restrict__ logits) {
  ::di::cuda::grid_dependency_wait();
  const int lane = threadIdx.x & 31;
  const int64_t e = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (e >= n_exp) return;
  for (int64_t r = blockIdx.y; r < s; r += gridDim.y) {
    const float* xr = x + r * d;
    double acc = 0;
    if constexpr (kVec8) {
      const uint4* g = reinterpret_cast<const uint4*>(gate + e * d * 2);
      const float4* xv = reinterpret_cast<const float4*>(xr);
      constexpr int kU = 4;  // loads of kU steps in flight (one step at a time was a round trip each)
      const int64_t steps = d / 8;
      for (int64_t i0 = lane; i0 < steps; i0 += 32 * kU) {
        uint4 gw[kU];
        float4 a[kU], b[kU];
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          const int64_t i = i0 + 32 * u;
          if (i < steps) gw[u] = g[i], a[u] = xv[2 * i], b[u] = xv[2 * i + 1];
        }
#pragma unroll
        for (int u = 0; u < kU; ++u)  // the same order as one step at a time
          if (i0 + 32 * u < steps)
            acc += dot2_bf16(a[u].x, a[u].y, gw[u].x) + dot2_bf16(a[u].z, a[u].w, gw[u].y) +
                   dot2_bf16(b[u].x, b[u].y, gw[u].z) + dot2_bf16(b[u].z, b[u].w, gw[u].w);
      }
    } else {
      for (int64_t i = lane; i < d; i += 32)
        acc += static_cast<double>(xr[i]) * static_cast<double>(load_elem<T>(gate, e * d + i));
    }
    acc = warp_sum(acc);
    if (lane == 0) logits[r * n_exp + e] = static_cast<float>(acc);
  }
}

// One CTA per row: kSelThreads threads compute the E scores (fp64 exp / log1p, ~1 us each, so one
// warp per row took 14 us at E = 384), then warp 0 runs top_k warp-wide argmax passes over the biased
// scores held in registers. Selection is "the k largest biased scores, ties to the lowest expert id".
// The CPU picks torch.topk's elements (std::nth_element / partial_sort order); both agree unless two
// biased fp32 scores tie exactly at the k-th place, which random or real router logits essentially
// never do. The weights are summed in descending-score order (the CPU's order may differ: an ulp at most).
constexpr int kSelThreads = 128;

__global__ void __launch_bounds__(kSelThreads)
    router_select_kernel(const float* __restrict__ logits, const uint8_t* __restrict__ bias, ElemType bias_type,
                         int n_exp, int top_k, float route_scale, float gate_temp, float* __restrict__ weights,
                         int32_t* __restrict__ experts) {
  ::di::cuda::grid_dependency_wait();
  __shared__ float sc[kMaxRouted], biased[kMaxRouted];
  const int64_t r = blockIdx.x;
  constexpr int kPer = kMaxRouted / kSelThreads;
  float lg[kPer], bs[kPer];  // every load before any score
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int e = threadIdx.x + kSelThreads * k;
    lg[k] = e < n_exp ? logits[r * n_exp + e] : 0.0f;
    bs[k] = e < n_exp ? load_elem(bias, bias_type, e) : 0.0f;
  }
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int e = threadIdx.x + kSelThreads * k;
    if (e >= n_exp) break;
    const float l = lg[k] / gate_temp;
    const float sp = l > 20.0f ? l : log1p_f32(exp_f32(l));  // torch softplus, threshold 20
    sc[e] = sqrtf(sp);
    biased[e] = sc[e] + bs[k];
  }
  __syncthreads();
  if (threadIdx.x >= 32) return;
  const int lane = threadIdx.x;
  constexpr int kLane = kMaxRouted / 32;
  float v[kLane];  // expert lane + 32 k; NaN = padding or already picked: never wins
#pragma unroll
  for (int k = 0; k < kLane; ++k) v[k] = lane + 32 * k < n_exp ? biased[lane + 32 * k] : __int_as_float(0x7fc00000);
  int picks[kMaxTopK];
  for (int j = 0; j < top_k; ++j) {
    float bv = -INFINITY;
    int bi = INT_MAX;
#pragma unroll
    for (int k = 0; k < kLane; ++k)
      if (v[k] > bv || (v[k] == bv && lane + 32 * k < bi)) bv = v[k], bi = lane + 32 * k;
    for (int off = 16; off > 0; off >>= 1) {
      const float ov = __shfl_xor_sync(kFull, bv, off);
      const int oi = __shfl_xor_sync(kFull, bi, off);
      if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
    }
    picks[j] = bi;  // the same in every lane
#pragma unroll
    for (int k = 0; k < kLane; ++k)
      if (lane + 32 * k == bi) v[k] = __int_as_float(0x7fc00000);
  }
  if (lane != 0) return;
  float sum = 0;
  for (int j = 0; j < top_k; ++j)
    if (picks[j] < n_exp) sum += sc[picks[j]];
  for (int j = 0; j < top_k; ++j) {
    const bool ok = picks[j] < n_exp;  // false only for NaN scores
    float w = ok ? sc[picks[j]] : 0.0f;
    if (top_k > 1) w /= (sum + 1e-20f);
    weights[r * top_k + j] = w * route_scale;
    experts[r * top_k + j] = ok ? picks[j] : -1;
  }
}

template <ElemType T>
void launch_logits(const float* x, const uint8_t* gate, int64_t s, int64_t e, int64_t d, float* logits) {
  constexpr int kWarps = 8;
  dim3 grid(static_cast<unsigned>((e + kWarps - 1) / kWarps), static_cast<unsigned>(s < 65535 ? s : 65535));
  const bool vec = T == ElemType::kBf16 && d % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(gate) % 16 == 0;
  if (vec)
    ::di::cuda::launch(router_logits_kernel<T, true>, grid, kWarps * 32, 0, x, gate, s, e, d, logits);
  else
    ::di::cuda::launch(router_logits_kernel<T, false>, grid, kWarps * 32, 0, x, gate, s, e, d, logits);
}

}  // namespace

void router_logits(const float* x, const uint8_t* gate, DType gate_dtype, int64_t s, int64_t e, int64_t d,
                   float* logits) {
  if (s == 0 || e == 0) return;
  switch (elem_type(gate_dtype, "moe_route gate")) {
    case ElemType::kBf16: return launch_logits<ElemType::kBf16>(x, gate, s, e, d, logits);
    case ElemType::kF16: return launch_logits<ElemType::kF16>(x, gate, s, e, d, logits);
    case ElemType::kF32: return launch_logits<ElemType::kF32>(x, gate, s, e, d, logits);
  }
}

void router_select(const float* logits, const uint8_t* bias, DType bias_dtype, int64_t s, int64_t e, int top_k,
                   float route_scale, float gate_temp, float* weights, int32_t* experts) {
  if (s == 0) return;
  DI_CHECK_MSG(top_k >= 1 && top_k <= kMaxTopK && top_k <= e, "moe_route: top_k out of range");
  const ElemType bt = elem_type(bias_dtype, "moe_route bias");
  DI_CHECK_MSG(e <= kMaxRouted, "moe_route: " + std::to_string(e) + " routed experts, the selection kernel takes at most " +
                                    std::to_string(kMaxRouted));
  DI_CHECK_MSG(s <= 0x7fffffff, "moe_route: too many rows");
  ::di::cuda::launch(router_select_kernel, static_cast<unsigned>(s), kSelThreads, 0, logits, bias, bt,
                     static_cast<int>(e), top_k, route_scale, gate_temp, weights, experts);
}

}  // namespace di::cuda::moe
