// MoE router on the GPU: fp32 logits with fp64 accumulation (the CPU's kF32 linear of the gate),
// then sqrt(softplus) scores, biased top-k selection and renormalised weights, one CTA per row.
// A BF16 gate with D % 8 == 0 and 16-byte aligned x / gate takes the FP64 tensor cores
// (moe_route_dmma.cu); F16 / F32 gates and the other shapes take the CUDA-core kernel here.
#include <cmath>
#include <string>

#include "backend/cuda/moe_elem.cuh"
#include "backend/cuda/moe_kernels.cuh"
#include "backend/cuda/moe_select.cuh"
#include "backend/cuda/pdl_launch.cuh"

namespace di::cuda::moe {
namespace {

constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ double warp_sum(double v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(kFull, v, off);
  return v;
}

// One warp per (expert, row): D fp32 activations + D gate values in, 2*D fp64 FLOPs; the gate
// (E*D*2 bytes) stays in L2 across rows. fp32 x fp32 products are exact in fp64, so the sum is
// within an ulp of exact for any order and rounds to the CPU's fp32 value (but for rare halfway
// cases).
template <ElemType T>
__global__ void router_logits_kernel(const float* __restrict__ x, const uint8_t* __restrict__ gate, int64_t s,
                                     int64_t n_exp, int64_t d, float* __restrict__ logits) {
  ::di::cuda::grid_dependency_wait();
  const int lane = threadIdx.x & 31;
  const int64_t e = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (e >= n_exp) return;
  for (int64_t r = blockIdx.y; r < s; r += gridDim.y) {
    const float* xr = x + r * d;
    double acc = 0;
    for (int64_t i = lane; i < d; i += 32)
      acc += static_cast<double>(xr[i]) * static_cast<double>(load_elem<T>(gate, e * d + i));
    acc = warp_sum(acc);
    if (lane == 0) logits[r * n_exp + e] = static_cast<float>(acc);
  }
}

// One CTA per row: kSelThreads threads compute the E scores (fp64 exp / log1p, ~1 us each, so one
// warp per row took 14 us at E = 384), then warp 0 picks (moe_select.cuh). Selection is "the k largest
// biased scores, ties to the lowest expert id".
// The CPU picks torch.topk's elements (std::nth_element / partial_sort order); both agree unless two
// biased fp32 scores tie exactly at the k-th place, which random or real router logits essentially
// never do. The weights are summed in descending-score order (the CPU's order may differ: an ulp at most).
constexpr int kSelThreads = kMaxRouted;  // one score per thread: 128 threads computed three each in turn

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
    sc[e] = route_score(lg[k], gate_temp);
    biased[e] = sc[e] + bs[k];
  }
  __syncthreads();
  if (threadIdx.x >= 32) return;
  pick_top_k(sc, biased, n_exp, top_k, route_scale, weights + r * top_k, experts + r * top_k);
}

template <ElemType T>
void launch_logits(const float* x, const uint8_t* gate, int64_t s, int64_t e, int64_t d, float* logits) {
  if (T == ElemType::kBf16 && router_logits_bf16_dmma(x, gate, s, e, d, logits)) return;
  constexpr int kWarps = 8;
  dim3 grid(static_cast<unsigned>((e + kWarps - 1) / kWarps), static_cast<unsigned>(s < 65535 ? s : 65535));
  ::di::cuda::launch(router_logits_kernel<T>, grid, kWarps * 32, 0, x, gate, s, e, d, logits);
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
