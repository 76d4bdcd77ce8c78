// Do Hopper's warpgroup f16 MMAs (wgmma m64n8k16, HGMMA) sum exactly as the warp-level ones (mma.sync
// m16n8k16, HMMA) do? The exact MXFP4 expert GEMM runs on HMMA (ptxas lowers its e4m3 mma.sync to two
// f16 HMMAs); if HGMMA gives the same bits, a wgmma tile with the weight widened to f16 in registers
// and the activation as f16 in shared memory keeps the default path's numerics (the FP8 wgmma does
// not: it truncates products, bench/RESULTS.md, eleventh session).
//
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -o /tmp/probe bench/gpu/probe_hgmma_f16.cu && /tmp/probe
//
// Each CTA (one warpgroup) takes its own A [64 x 32], B [32 x 8] f16 and C [64 x 8] f32, and computes
// D = A B + C twice: two chained k16 steps of mma.sync per warp, and two chained wgmma k16 steps (A
// from registers in the mma.sync fragment layout, B from shared memory, K-major, unswizzled). Three
// value distributions: f16 over a wide exponent range with cancelling signs; MXFP4 weights (E2M1)
// times E4M3 activations (the expert GEMM's operands); the same with C = 0 (a fresh K block).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

namespace {

constexpr int kM = 64, kN = 8, kK = 32, kThreads = 128;

#define CHECK(x)                                                                      \
  do {                                                                                \
    cudaError_t e = (x);                                                              \
    if (e != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

__device__ uint32_t pack(__half lo, __half hi) {
  return static_cast<uint32_t>(__half_as_ushort(lo)) | (static_cast<uint32_t>(__half_as_ushort(hi)) << 16);
}

// a [64][32], b [32][8] (k-major rows of B^T: b[n][k] stored as bt[n * 32 + k]), c / d [64][8]
__global__ void __launch_bounds__(kThreads) probe_kernel(const __half* __restrict__ a_all, const __half* __restrict__ bt_all,
                                                         const float* __restrict__ c_all, float* __restrict__ d_hmma,
                                                         float* __restrict__ d_hgmma) {
  const __half* a = a_all + blockIdx.x * kM * kK;
  const __half* bt = bt_all + blockIdx.x * kN * kK;
  const float* c = c_all + blockIdx.x * kM * kN;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, q = lane % 4;
  const int r0 = 16 * warp + g, r1 = r0 + 8;
  // B for wgmma: per k16 step s, two core matrices (k 0-7, k 8-15) of 8 rows (n) x 16 bytes, 128 bytes
  // apart (lbo); step s at 256 s.
  __shared__ __align__(128) __half bs[2][2][kN][8];
  for (int i = threadIdx.x; i < 2 * 2 * kN * 8; i += kThreads) {
    const int s = i / (2 * kN * 8), half = (i / (kN * 8)) % 2, n = (i / 8) % kN, k = i % 8;
    bs[s][half][n][k] = bt[n * kK + 16 * s + 8 * half + k];
  }
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
  uint32_t af[2][4], bf[2][2];
  for (int s = 0; s < 2; ++s) {
    const int k0 = 16 * s;
    af[s][0] = pack(a[r0 * kK + k0 + 2 * q], a[r0 * kK + k0 + 2 * q + 1]);
    af[s][1] = pack(a[r1 * kK + k0 + 2 * q], a[r1 * kK + k0 + 2 * q + 1]);
    af[s][2] = pack(a[r0 * kK + k0 + 2 * q + 8], a[r0 * kK + k0 + 2 * q + 9]);
    af[s][3] = pack(a[r1 * kK + k0 + 2 * q + 8], a[r1 * kK + k0 + 2 * q + 9]);
    bf[s][0] = pack(bt[g * kK + k0 + 2 * q], bt[g * kK + k0 + 2 * q + 1]);
    bf[s][1] = pack(bt[g * kK + k0 + 2 * q + 8], bt[g * kK + k0 + 2 * q + 9]);
  }
  const float cin[4] = {c[r0 * kN + 2 * q], c[r0 * kN + 2 * q + 1], c[r1 * kN + 2 * q], c[r1 * kN + 2 * q + 1]};
  // HMMA: two chained k16 steps
  float d[4] = {cin[0], cin[1], cin[2], cin[3]};
  for (int s = 0; s < 2; ++s)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(af[s][0]), "r"(af[s][1]), "r"(af[s][2]), "r"(af[s][3]), "r"(bf[s][0]), "r"(bf[s][1]));
  // HGMMA: the same two steps
  float e[4] = {cin[0], cin[1], cin[2], cin[3]};
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
  for (int s = 0; s < 2; ++s) {
    const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(&bs[s][0][0][0]));
    const uint64_t desc = static_cast<uint64_t>((addr & 0x3FFFFu) >> 4) | (static_cast<uint64_t>(128 >> 4) << 16) |
                          (static_cast<uint64_t>(256 >> 4) << 32);
    asm volatile(  // scale-d 1 (accumulate), A and B unscaled, B not transposed (K-major)
        "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1, 0;\n}\n"
        : "+f"(e[0]), "+f"(e[1]), "+f"(e[2]), "+f"(e[3])
        : "r"(af[s][0]), "r"(af[s][1]), "r"(af[s][2]), "r"(af[s][3]), "l"(desc), "r"(1));
  }
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  for (float& v : e) asm volatile("" : "+f"(v)::"memory");
  float* dh = d_hmma + blockIdx.x * kM * kN;
  float* dg = d_hgmma + blockIdx.x * kM * kN;
  dh[r0 * kN + 2 * q] = d[0], dh[r0 * kN + 2 * q + 1] = d[1], dh[r1 * kN + 2 * q] = d[2], dh[r1 * kN + 2 * q + 1] = d[3];
  dg[r0 * kN + 2 * q] = e[0], dg[r0 * kN + 2 * q + 1] = e[1], dg[r1 * kN + 2 * q] = e[2], dg[r1 * kN + 2 * q + 1] = e[3];
}

float e2m1(std::mt19937& rng) {
  static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const uint32_t c = rng() % 16;
  return (c & 8 ? -1.0f : 1.0f) * mag[c & 7];
}

float e4m3(std::mt19937& rng) {  // a random finite E4M3 value
  for (;;) {
    const uint32_t c = rng() % 256;
    const int e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7) continue;  // NaN
    const float v = e == 0 ? std::ldexp(static_cast<float>(m), -9) : std::ldexp(1.0f + m / 8.0f, e - 7);
    return c & 128 ? -v : v;
  }
}

}  // namespace

int main() {
  constexpr int kCtas = 4096;
  std::mt19937 rng(12345);
  std::vector<__half> a(kCtas * kM * kK), bt(kCtas * kN * kK);
  std::vector<float> c(kCtas * kM * kN), dh(c.size()), dg(c.size());
  __half *a_d, *bt_d;
  float *c_d, *dh_d, *dg_d;
  CHECK(cudaMalloc(&a_d, a.size() * sizeof(__half)));
  CHECK(cudaMalloc(&bt_d, bt.size() * sizeof(__half)));
  CHECK(cudaMalloc(&c_d, c.size() * 4));
  CHECK(cudaMalloc(&dh_d, c.size() * 4));
  CHECK(cudaMalloc(&dg_d, c.size() * 4));
  int failures = 0;
  const char* names[3] = {"wide-range f16, cancelling signs, random C", "E2M1 x E4M3, random C", "E2M1 x E4M3, C = 0"};
  for (int dist = 0; dist < 3; ++dist) {
    long long mismatches = 0, total = 0;
    double worst = 0;
    for (int round = 0; round < 16; ++round) {
      std::uniform_real_distribution<float> u(-1.0f, 1.0f);
      std::uniform_int_distribution<int> ex(-12, 12);
      for (size_t i = 0; i < a.size(); ++i)
        a[i] = __float2half(dist == 0 ? std::ldexp(u(rng), ex(rng)) : e2m1(rng));
      for (size_t i = 0; i < bt.size(); ++i)
        bt[i] = __float2half(dist == 0 ? std::ldexp(u(rng), ex(rng)) : e4m3(rng));
      for (size_t i = 0; i < c.size(); ++i) c[i] = dist == 2 ? 0.0f : std::ldexp(u(rng), ex(rng) + 4);
      CHECK(cudaMemcpy(a_d, a.data(), a.size() * sizeof(__half), cudaMemcpyHostToDevice));
      CHECK(cudaMemcpy(bt_d, bt.data(), bt.size() * sizeof(__half), cudaMemcpyHostToDevice));
      CHECK(cudaMemcpy(c_d, c.data(), c.size() * 4, cudaMemcpyHostToDevice));
      probe_kernel<<<kCtas, kThreads>>>(a_d, bt_d, c_d, dh_d, dg_d);
      CHECK(cudaGetLastError());
      CHECK(cudaMemcpy(dh.data(), dh_d, dh.size() * 4, cudaMemcpyDeviceToHost));
      CHECK(cudaMemcpy(dg.data(), dg_d, dg.size() * 4, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < dh.size(); ++i) {
        ++total;
        if (std::memcmp(&dh[i], &dg[i], 4) != 0) {
          ++mismatches;
          worst = std::max(worst, std::fabs(static_cast<double>(dh[i]) - dg[i]) / std::max(1e-30, std::fabs(static_cast<double>(dh[i]))));
        }
      }
      if (round == 0) {  // both against fp64 on the first CTA: a layout error shows as O(1) errors
        double err_h = 0, err_g = 0;
        for (int r = 0; r < kM; ++r)
          for (int n = 0; n < kN; ++n) {
            double ref = c[r * kN + n];
            for (int k = 0; k < kK; ++k) ref += static_cast<double>(__half2float(a[r * kK + k])) * __half2float(bt[n * kK + k]);
            const double scale = std::max(1e-30, std::fabs(ref));
            err_h = std::max(err_h, std::fabs(ref - dh[r * kN + n]) / scale);
            err_g = std::max(err_g, std::fabs(ref - dg[r * kN + n]) / scale);
          }
        std::printf("  %s: CTA 0 against fp64, worst relative error HMMA %.3g, HGMMA %.3g\n", names[dist], err_h, err_g);
      }
    }
    std::printf("%s: %lld of %lld sums differ in some bit (worst relative %.3g)\n", names[dist], mismatches, total, worst);
    failures += mismatches != 0;
  }
  std::printf("%s\n", failures == 0 ? "HGMMA f16 == HMMA f16, bit for bit" : "HGMMA f16 and HMMA f16 differ");
  return failures == 0 ? 0 : 3;
}
