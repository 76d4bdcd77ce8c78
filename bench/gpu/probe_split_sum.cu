// How long does summing K-split partials take, and does it depend on how the loads are written? The
// GEMMs' split fix-ups and reduce_splits add, for each output i, partial[sp * stride + i] over the
// splits in split order. Written as `sp < splits ? __ldcg(...) : 0` per load, ptxas emitted a branch
// per load and waited for each load at its join, so a sum ran one L2 round trip per split whatever
// the loads "in flight" (the time grew with the splits and not with the CTAs). Loading a clamped split
// unconditionally and adding only the real ones keeps the loads overlapped (mma_gemm.cuh, kFixupLoads).
//
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -o /tmp/probe bench/gpu/probe_split_sum.cu && /tmp/probe
//
// Prints the best of 20 event-timed launches (launch overhead included: compare against 1 split) for
// n outputs x splits, right after a kernel wrote the partials (as in the GEMM).
#include <cuda_runtime.h>

#include <cstdio>

// kClamped: the split index clamped and the load unconditional; else `sp < splits ? load : 0`.
template <int K, bool kClamped>
__global__ void sum_splits(const float* p, long stride, int splits, long n, float* y) {
  const long i = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float s = 0;
  for (int sp0 = 0; sp0 < splits; sp0 += K) {
    float v[K];
#pragma unroll
    for (int j = 0; j < K; ++j) {
      if constexpr (kClamped) v[j] = __ldcg(p + static_cast<long>(min(sp0 + j, splits - 1)) * stride + i);
      else v[j] = sp0 + j < splits ? __ldcg(p + static_cast<long>(sp0 + j) * stride + i) : 0.f;
    }
#pragma unroll
    for (int j = 0; j < K; ++j)
      if (sp0 + j < splits) s += v[j];
  }
  y[i] = s;
}

__global__ void fill(float* p, long n) {
  for (long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x; i < n; i += static_cast<long>(gridDim.x) * blockDim.x)
    p[i] = 1.0f;
}

int main() {
  float *p = nullptr, *y = nullptr;
  if (cudaMalloc(&p, 64 << 20) != cudaSuccess || cudaMalloc(&y, 1 << 20) != cudaSuccess) return 1;
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (long n : {4096L, 65536L})
    for (int splits : {1, 8, 20, 80})
      for (int k = 0; k < 3; ++k) {
        float best = 1e9f;
        for (int it = 0; it < 20; ++it) {
          fill<<<1024, 256>>>(p, n * splits);
          cudaEventRecord(a);
          const unsigned grid = static_cast<unsigned>((n + 255) / 256);
          if (k == 0) sum_splits<8, false><<<grid, 256>>>(p, n, splits, n, y);
          if (k == 1) sum_splits<32, false><<<grid, 256>>>(p, n, splits, n, y);
          if (k == 2) sum_splits<32, true><<<grid, 256>>>(p, n, splits, n, y);
          cudaEventRecord(b);
          cudaEventSynchronize(b);
          float ms = 0;
          cudaEventElapsedTime(&ms, a, b);
          best = ms < best ? ms : best;
        }
        std::printf("n %6ld splits %3d %s: %7.2f us\n", n, splits,
                    k == 0 ? "branchy, 8 loads" : k == 1 ? "branchy, 32 loads" : "clamped, 32 loads", best * 1000);
      }
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
