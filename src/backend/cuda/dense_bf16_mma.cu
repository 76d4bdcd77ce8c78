// Dense linears with BF16 weights (the fp32 head; compressor and indexer projections) on the bf16
// tensor cores, for batched rows: y[S, N] = x W^T with fp32 sums (mma.sync m16n8k16). At 64 rows the
// CUDA-core kernel (fp64 sums for fp32 outputs) took 9.2 ms for the head, whose weights stream in
// 0.31 ms. x is split into bf16 hi + lo (lo = bf16(x - hi)), two MMAs per tile: the products are
// exact to ~2^-16 relative for any fp32 x, and exact for the bf16 values the model passes (lo = 0).
// The sums are the tensor core's fp32, not fp64 rounded once: within a few fp32 ulps of the CPU's.
//
// CTA: 8 warps x 32 weight rows, 8 NT tokens. K in chunks of 64: a lane loads 16 bytes of each of
// its 4 rows at k [8q, 8q + 8) and [32 + 8q, +8) (64 contiguous bytes per row and load), which feed
// the MMA k slots in a fixed permutation that the staged activations follow; the next chunk's weights
// and activations load while this one computes.
#include <cuda_bf16.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/dense_linear.cuh"

namespace di::cuda::dense {
namespace {

constexpr int kMmaWarps = 8;
constexpr int kMmaThreads = kMmaWarps * 32;
constexpr int kRowsPerCta = kMmaWarps * 32;
constexpr int kChunk = 64;            // K per pipeline step
constexpr int kXStride = kChunk + 4;  // bf16 per staged token row (8-byte aligned rows)

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t word_of(const uint4 (&v)[2], int w) {
  const uint4& u = v[w / 4];
  switch (w % 4) {
    case 0: return u.x;
    case 1: return u.y;
    case 2: return u.z;
    default: return u.w;
  }
}

// Lane word w (0..7) of a row chunk holds k = kof(w), kof(w) + 1 (bf16 pairs): the lane's 16 bytes
// at [8q, 8q + 8) then [32 + 8q, +8). MMA step s (k16) takes words 2s (slots 2q, 2q+1) and 2s + 1
// (slots 2q+8, 2q+9): k [8q + 4s, +4) for s < 2, [32 + 8q + 4(s - 2), +4) after.
__device__ __forceinline__ int step_k(int q, int s) { return s < 2 ? 8 * q + 4 * s : 32 + 8 * q + 4 * (s - 2); }

template <int NT>
__global__ void __launch_bounds__(kMmaThreads, 1)
    bf16_mma_kernel(const float* __restrict__ x, int S, const uint16_t* __restrict__ w, int N, int K, bool bf16_out,
                    float* __restrict__ y) {
  constexpr int kTok = 8 * NT;
  __shared__ __align__(16) __nv_bfloat16 xs[2][2][kTok][kXStride];  // [buffer][hi, lo][token][k]
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, q = lane % 4;
  const int t0 = blockIdx.y * kTok, tokens = min(kTok, S - t0);
  const int row0 = blockIdx.x * kRowsPerCta + warp * 32;
  const uint16_t* wr[2][2];
  bool ok[2][2];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = row0 + 16 * mt + 8 * h + g;
      ok[mt][h] = r < N;
      wr[mt][h] = w + static_cast<int64_t>(ok[mt][h] ? r : 0) * K + 8 * q;
    }
  auto load_w = [&](uint4 (&a)[2][2][2], int k0) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        a[mt][h][0] = ok[mt][h] ? __ldg(reinterpret_cast<const uint4*>(wr[mt][h] + k0)) : make_uint4(0u, 0u, 0u, 0u);
        a[mt][h][1] = ok[mt][h] ? __ldg(reinterpret_cast<const uint4*>(wr[mt][h] + k0 + 32)) : make_uint4(0u, 0u, 0u, 0u);
      }
  };
  // tokens x 64 fp32 of chunk k0 -> bf16 hi / lo, a float4 per thread step
  auto stage_x = [&](int buf, int k0) {
    for (int i = threadIdx.x; i < kTok * (kChunk / 4); i += kMmaThreads) {
      const int t = i / (kChunk / 4), c = i % (kChunk / 4);
      const float4 v = t < tokens ? __ldg(reinterpret_cast<const float4*>(x + static_cast<int64_t>(t0 + t) * K + k0) + c)
                                  : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      const __nv_bfloat162 h01 = __floats2bfloat162_rn(v.x, v.y), h23 = __floats2bfloat162_rn(v.z, v.w);
      const __nv_bfloat162 l01 = __floats2bfloat162_rn(v.x - __low2float(h01), v.y - __high2float(h01));
      const __nv_bfloat162 l23 = __floats2bfloat162_rn(v.z - __low2float(h23), v.w - __high2float(h23));
      __nv_bfloat162* hi = reinterpret_cast<__nv_bfloat162*>(&xs[buf][0][t][4 * c]);
      __nv_bfloat162* lo = reinterpret_cast<__nv_bfloat162*>(&xs[buf][1][t][4 * c]);
      hi[0] = h01, hi[1] = h23, lo[0] = l01, lo[1] = l23;
    }
  };
  float acc[2][NT][4] = {};
  uint4 cur[2][2][2], nxt[2][2][2];
  load_w(cur, 0);
  stage_x(0, 0);
  __syncthreads();
  const int nt_active = (tokens + 7) / 8;
  for (int k0 = 0, it = 0; k0 < K; k0 += kChunk, ++it) {
    const int buf = it & 1;
    if (k0 + kChunk < K) {
      load_w(nxt, k0 + kChunk);
      stage_x(buf ^ 1, k0 + kChunk);
    }
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      uint32_t a[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        a[mt][0] = word_of(cur[mt][0], 2 * s);
        a[mt][1] = word_of(cur[mt][1], 2 * s);
        a[mt][2] = word_of(cur[mt][0], 2 * s + 1);
        a[mt][3] = word_of(cur[mt][1], 2 * s + 1);
      }
      const int kk = step_k(q, s);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        if (nt >= nt_active) break;
#pragma unroll
        for (int part = 0; part < 2; ++part) {  // hi, then lo
          const uint2 b = *reinterpret_cast<const uint2*>(&xs[buf][part][nt * 8 + g][kk]);
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) mma_bf16(acc[mt][nt], a[mt], b.x, b.y);
        }
      }
    }
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) cur[mt][h][0] = nxt[mt][h][0], cur[mt][h][1] = nxt[mt][h][1];
    __syncthreads();  // buffer `buf` is read; the other one is staged
  }
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = row0 + 16 * mt + 8 * (i >> 1) + g, t = nt * 8 + 2 * q + (i & 1);
        if (r < N && t < tokens) {
          const float v = acc[mt][nt][i];
          y[static_cast<int64_t>(t0 + t) * N + r] = bf16_out ? round_bf16(v) : v;
        }
      }
}

template <int NT>
void launch_bf16_mma(const float* x, int64_t S, const Weight& w, bool bf16_out, float* y) {
  const dim3 grid(static_cast<unsigned>((w.rows + kRowsPerCta - 1) / kRowsPerCta), static_cast<unsigned>((S + 8 * NT - 1) / (8 * NT)));
  bf16_mma_kernel<NT><<<grid, kMmaThreads>>>(x, static_cast<int>(S), reinterpret_cast<const uint16_t*>(wdata(w)),
                                            static_cast<int>(w.rows), static_cast<int>(w.cols), bf16_out, y);
  DI_CUDA_LAUNCH_CHECK();
}

}  // namespace

bool bf16_mma_fits(const float* x, int64_t rows, const Weight& w) {
  return w.dtype == DType::kBF16 && rows >= 2 && w.cols % kChunk == 0 && w.rows < (1LL << 31) &&
         rows * w.cols < (1LL << 31) && (rows + 63) / 64 <= 65535 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(wdata(w)) % 16 == 0;
}

void bf16_mma_linear(const float* x, int64_t rows, const Weight& w, bool bf16_out, float* y) {
  DI_CHECK(bf16_mma_fits(x, rows, w));
  switch (nt_for(rows)) {
    case 1: return launch_bf16_mma<1>(x, rows, w, bf16_out, y);
    case 2: return launch_bf16_mma<2>(x, rows, w, bf16_out, y);
    case 4: return launch_bf16_mma<4>(x, rows, w, bf16_out, y);
    default: return launch_bf16_mma<8>(x, rows, w, bf16_out, y);
  }
}

}  // namespace di::cuda::dense
