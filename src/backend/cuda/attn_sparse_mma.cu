// Sparse attention on the bf16 tensor cores. Every query head of a row reads the same key / value
// rows (one shared latent, 512 wide on V4.1), so a 64-key block of a row's index list is a
// [heads x 64] score GEMM and a [heads x dh] value GEMM (mma.sync m16n8k16, fp32 accumulation).
// One CTA per (row, 64 heads, 64-key block), in two kernels:
//  1. scores: the block's keys and the row's queries staged as bf16 (exact: the model's queries
//     leave RoPE and its keys leave qdq / unpacking as bf16 values), S = Q K^T x scale (-inf for -1
//     ids) into a score buffer, and each head's block maximum;
//  2. values: the running max the CPU holds at this block (the max of the block maxima so far, from
//     -1e30), p = exp(s - max) in fp32 (summed into l), rounded to bf16 as the CPU rounds it, O = P V;
// then combine_splits merges the blocks' (O, max, l) with the sink. This is the CPU's arithmetic up
// to summation order and expf's ulps (which can round a probability to the neighbouring bf16), for
// each row on its own: batch-invariant by construction. The CUDA-core kernel in cuda_attention.cu
// re-staged every key block once per 16 heads, in fp32 (128 KB of shared memory per CTA).
#include <cuda_bf16.h>

#include <algorithm>
#include <limits>

#include "backend/cuda/attn_sparse_mma.cuh"
#include "backend/cuda/batch_invariance.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/mma_gemm.cuh"
#include "backend/cuda/pdl_launch.cuh"

namespace di::cuda::attn {
namespace {

constexpr int kBlock = 64;     // keys per block: the CPU's online-softmax step (the reference kernel's)
constexpr int kHeadTile = 64;  // heads per CTA
constexpr int kThreads = 256;  // 8 warps
constexpr int kPad = 8;        // bf16 padding per staged row: fragment loads hit 32 distinct banks
constexpr int kPStride = kBlock + kPad;
constexpr int kScoreCols = 256;  // dh columns the scores and values kernels stage at a time
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

__device__ __forceinline__ uint32_t lds32(const __nv_bfloat16* p) { return *reinterpret_cast<const uint32_t*>(p); }

__device__ __forceinline__ uint32_t pack_bf16(float a, float b) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);  // exact for bf16 values
  return *reinterpret_cast<const uint32_t*>(&v);
}

// B fragments of a [16 k x 8 n] tile stored k-major (row k at base + k * stride): lanes 0-15 address
// rows 0-15, and the transposing load hands each lane (k = 2q, 2q+1 | 2q+8, 2q+9; n = g).
__device__ __forceinline__ void ldmatrix_b_trans(const __nv_bfloat16* row_ptr, uint32_t& b0, uint32_t& b1) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(row_ptr));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];" : "=r"(b0), "=r"(b1) : "r"(addr));
}

// Block `blk` of row r's list: ids[j] (-1 past the list, for -1 and for out-of-range ids; staged
// when stage_ids), then columns [col0, col0 + cols) of the key rows as bf16 into tile [64][st]
// (zeros for -1), 8 elements per thread step.
__device__ void stage_keys(const AttnKeys& keys, const int32_t* __restrict__ idx, int64_t r, int64_t len, int64_t blk,
                           int dh, int col0, int cols, int st, bool stage_ids, int32_t* ids, __nv_bfloat16* tile) {
  if (stage_ids) {
    for (int j = threadIdx.x; j < kBlock; j += kThreads) {
      const int64_t pos = blk * kBlock + j;
      const int32_t id = pos < len ? idx[r * len + pos] : -1;
      ids[j] = id >= 0 && id < keys.n_kv + keys.n_more ? id : -1;
    }
    __syncthreads();
  }
  const int chunks = cols / 8;
  for (int e = threadIdx.x; e < kBlock * chunks; e += kThreads) {
    const int j = e / chunks, tc = e % chunks, c = col0 / 8 + tc, id = ids[j];
    float v[8];
    if (id < 0) {
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = 0.0f;
    } else if (id < keys.n_kv || keys.packed == nullptr) {
      const float* row = id < keys.n_kv ? keys.kv + static_cast<int64_t>(id) * dh : keys.more + (id - keys.n_kv) * dh;
      const float4 a = __ldg(reinterpret_cast<const float4*>(row + 8 * c));
      const float4 b = __ldg(reinterpret_cast<const float4*>(row + 8 * c) + 1);
      v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else {
      const uint8_t* row = keys.packed + (id - keys.n_kv) * keys.packed_row_bytes;
      if (keys.fmt == RowFormat::kFp8Ue8m0) {  // unpack_rows' values: bf16(e4m3 x e8m0)
        uint2 codes;
        if (reinterpret_cast<uintptr_t>(row) % 8 == 0) {
          codes = __ldg(reinterpret_cast<const uint2*>(row + 8 * c));
        } else {  // rows of other widths: bytes
          codes = make_uint2(0u, 0u);
#pragma unroll
          for (int i = 0; i < 8; ++i) (i < 4 ? codes.x : codes.y) |= static_cast<uint32_t>(row[8 * c + i]) << (8 * (i % 4));
        }
        const float s = e8m0_to_float(row[dh + 8 * c / 32]);
#pragma unroll
        for (int i = 0; i < 8; ++i)
          v[i] = dq::round_bf16(__fmul_rn(e4m3_to_float(static_cast<uint8_t>((i < 4 ? codes.x : codes.y) >> (8 * (i % 4)))), s));
      } else if (keys.fmt == RowFormat::kFp4E4m3) {  // bf16(e2m1 x e4m3), even element in the low nibble
        uint32_t codes = 0;
        if (reinterpret_cast<uintptr_t>(row) % 4 == 0) {
          codes = __ldg(reinterpret_cast<const uint32_t*>(row + 4 * c));
        } else {
#pragma unroll
          for (int i = 0; i < 4; ++i) codes |= static_cast<uint32_t>(row[4 * c + i]) << (8 * i);
        }
        const float s = e4m3_to_float(row[dh / 2 + 8 * c / 16]);
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = dq::round_bf16(__fmul_rn(dq::e2m1_to_float_fast((codes >> (4 * i)) & 15u), s));
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = packed_at(row, keys.fmt, dh, 8 * c + i);
      }
    }
    *reinterpret_cast<uint4*>(tile + j * st + 8 * tc) =
        make_uint4(pack_bf16(v[0], v[1]), pack_bf16(v[2], v[3]), pack_bf16(v[4], v[5]), pack_bf16(v[6], v[7]));
  }
}

// Kernel 1, grid (rows, head tiles, blocks). Warp w: heads 16 (w % 4) .. +16 of the tile, keys
// 32 (w / 4) .. +32 of the block (four n8 tiles), K = dh in steps of 16. dh is staged kScoreCols
// columns at a time (queries and keys), so the CTA holds 68 KB of shared memory instead of 133 and
// three CTAs fit an SM; the K steps still run in order, so the sums are the same.
__global__ void __launch_bounds__(kThreads)
    attn_scores_kernel(const float* __restrict__ q, AttnKeys keys, const int32_t* __restrict__ idx, int64_t len,
                       int heads, int dh, float scale, float* __restrict__ scores, float* __restrict__ blk_max) {
  ::di::cuda::grid_dependency_wait();
  extern __shared__ uint4 smem_u4[];
  const int st = min(dh, kScoreCols) + kPad;
  __nv_bfloat16* ks = reinterpret_cast<__nv_bfloat16*>(smem_u4);  // [64 keys][st]
  __nv_bfloat16* qs = ks + kBlock * st;                            // [64 heads][st]
  __shared__ int32_t ids[kBlock];
  __shared__ float red[2][kHeadTile];
  const int64_t r = blockIdx.x, blk = blockIdx.z, nblk = gridDim.z;
  const int h0 = blockIdx.y * kHeadTile, hn = min(kHeadTile, heads - h0);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, qd = lane % 4;
  const int mt = warp % 4, nh = warp / 4;
  const bool active = 16 * mt < hn;
  float acc[4][4] = {};
  for (int col0 = 0; col0 < dh; col0 += kScoreCols) {
    const int cols = min(kScoreCols, dh - col0), chunks = cols / 8;
    if (col0 > 0) __syncthreads();  // the previous columns' MMAs are done with the tiles
    // the row's queries as bf16
    for (int e = threadIdx.x; e < hn * chunks; e += kThreads) {
      const int h = e / chunks, c = e % chunks;
      const float4* p = reinterpret_cast<const float4*>(q + (r * heads + h0 + h) * dh + col0 + 8 * c);
      const float4 a = __ldg(p), b = __ldg(p + 1);
      *reinterpret_cast<uint4*>(qs + h * st + 8 * c) =
          make_uint4(pack_bf16(a.x, a.y), pack_bf16(a.z, a.w), pack_bf16(b.x, b.y), pack_bf16(b.z, b.w));
    }
    stage_keys(keys, idx, r, len, blk, dh, col0, cols, st, col0 == 0, ids, ks);
    __syncthreads();
    if (active) {
      const __nv_bfloat16* qa = qs + (16 * mt + g) * st + 2 * qd;
      const __nv_bfloat16* kb = ks + (32 * nh + g) * st + 2 * qd;
      for (int k0 = 0; k0 < cols; k0 += 16) {
        const uint32_t a[4] = {lds32(qa + k0), lds32(qa + 8 * st + k0), lds32(qa + k0 + 8),
                               lds32(qa + 8 * st + k0 + 8)};
#pragma unroll
        for (int t = 0; t < 4; ++t)
          mma::mma_bf16(acc[t], a, lds32(kb + 8 * t * st + k0), lds32(kb + 8 * t * st + k0 + 8));
      }
    }
  }
  // scale, -inf for missing keys, to the score buffer [rows, heads, nblk * 64]; block maxima
  float mx[2] = {kNegInf, kNegInf};  // heads g, g + 8 of the warp's tile
  if (active) {
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const int key = 32 * nh + 8 * t + 2 * qd;
      const bool v0 = ids[key] >= 0, v1 = ids[key + 1] >= 0;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const float s0 = v0 ? acc[t][2 * half] * scale : kNegInf, s1 = v1 ? acc[t][2 * half + 1] * scale : kNegInf;
        mx[half] = fmaxf(mx[half], fmaxf(s0, s1));
        const int h = h0 + 16 * mt + g + 8 * half;
        *reinterpret_cast<float2*>(scores + (r * heads + h) * nblk * kBlock + blk * kBlock + key) = make_float2(s0, s1);
      }
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      mx[half] = fmaxf(mx[half], __shfl_xor_sync(0xffffffffu, mx[half], 1));
      mx[half] = fmaxf(mx[half], __shfl_xor_sync(0xffffffffu, mx[half], 2));
      if (qd == 0) red[nh][16 * mt + g + 8 * half] = mx[half];
    }
  }
  __syncthreads();
  if (threadIdx.x < hn)
    blk_max[(r * heads + h0 + threadIdx.x) * nblk + blk] = fmaxf(red[0][threadIdx.x], red[1][threadIdx.x]);
}

// Kernel 2, grid (rows, head tiles, blocks): part[r, h, blk] = (sum_j bf16(p_j) v_j [dh], m, l).
// The values are staged kScoreCols dims at a time (43 KB of shared memory instead of 76); PV: warp w
// computes heads 16 (w % 4) .. +16 over the staged dims' half w / 4, 64 at a time.
__global__ void __launch_bounds__(kThreads)
    attn_values_kernel(AttnKeys keys, const int32_t* __restrict__ idx, int64_t len, int heads, int dh,
                       const float* __restrict__ scores, const float* __restrict__ blk_max, float* __restrict__ part) {
  ::di::cuda::grid_dependency_wait();
  extern __shared__ uint4 smem_u4[];
  const int st = min(dh, kScoreCols) + kPad;
  __nv_bfloat16* vs = reinterpret_cast<__nv_bfloat16*>(smem_u4);  // [64 keys][st]
  __nv_bfloat16* ps = vs + kBlock * st;                            // [64 heads][64 + kPad] probabilities
  __shared__ int32_t ids[kBlock];
  __shared__ float run_max[kHeadTile], lpart[4][kHeadTile];
  const int64_t r = blockIdx.x, blk = blockIdx.z, nblk = gridDim.z;
  const int h0 = blockIdx.y * kHeadTile, hn = min(kHeadTile, heads - h0);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, qd = lane % 4;
  // the CPU's running max when it reaches this block: the block maxima so far, folded from -1e30
  if (threadIdx.x < hn) {
    const float* bm = blk_max + (r * heads + h0 + threadIdx.x) * nblk;
    float m = -1e30f;
    for (int64_t b0 = 0; b0 <= blk; b0 += 8) {
      float v[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = b0 + i <= blk ? bm[b0 + i] : kNegInf;
#pragma unroll
      for (int i = 0; i < 8; ++i) m = std_max(m, v[i]);
    }
    run_max[threadIdx.x] = m;
  }
  // the first dims; its first barrier publishes run_max
  stage_keys(keys, idx, r, len, blk, dh, 0, min(dh, kScoreCols), st, true, ids, vs);
  {  // probabilities: thread (head t / 4, keys 16 (t % 4) .. +16)
    const int h = threadIdx.x / 4, c = threadIdx.x % 4;
    float l = 0.0f;
    if (h < hn) {
      const float m = run_max[h];
      const float4* sp = reinterpret_cast<const float4*>(scores + (r * heads + h0 + h) * nblk * kBlock + blk * kBlock + 16 * c);
      float s[16];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float4 v = sp[i];
        s[4 * i] = v.x, s[4 * i + 1] = v.y, s[4 * i + 2] = v.z, s[4 * i + 3] = v.w;
      }
      float p[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        p[i] = s[i] == kNegInf ? 0.0f : expf(s[i] - m);
        l += p[i];
      }
#pragma unroll
      for (int i = 0; i < 16; i += 2) *reinterpret_cast<uint32_t*>(ps + h * kPStride + 16 * c + i) = pack_bf16(p[i], p[i + 1]);
    }
    lpart[c][h] = l;
  }
  __syncthreads();
  if (threadIdx.x < hn) {
    float* pp = part + ((r * heads + h0 + threadIdx.x) * nblk + blk) * (dh + 2);
    pp[dh] = run_max[threadIdx.x];
    pp[dh + 1] = ((lpart[0][threadIdx.x] + lpart[1][threadIdx.x]) + lpart[2][threadIdx.x]) + lpart[3][threadIdx.x];
  }
  const int mt = warp % 4;
  const bool active = 16 * mt < hn;
  uint32_t a[4][4] = {};  // P fragments for the 4 k16 steps of the block's 64 keys
  if (active) {
    const __nv_bfloat16* pa = ps + (16 * mt + g) * kPStride + 2 * qd;
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      a[ks][0] = lds32(pa + 16 * ks);
      a[ks][1] = lds32(pa + 8 * kPStride + 16 * ks);
      a[ks][2] = lds32(pa + 16 * ks + 8);
      a[ks][3] = lds32(pa + 8 * kPStride + 16 * ks + 8);
    }
  }
  const __nv_bfloat16* vrow = vs + (lane % 16) * st;  // ldmatrix row address of this lane (k = lane % 16)
  for (int col0 = 0; col0 < dh; col0 += kScoreCols) {
    const int cols = min(kScoreCols, dh - col0);
    if (col0 > 0) {
      __syncthreads();  // the previous dims' MMAs are done with the tile
      stage_keys(keys, idx, r, len, blk, dh, col0, cols, st, false, ids, vs);
      __syncthreads();
    }
    if (!active) continue;
    const int d_begin = (warp / 4) * (cols / 2), d_end = d_begin + cols / 2;  // dims of the staged slice
    for (int d0 = d_begin; d0 < d_end; d0 += 64) {
      const int tiles = min(8, (d_end - d0) / 8);
      float acc[8][4] = {};
#pragma unroll
      for (int t = 0; t < 8; ++t) {
        if (t >= tiles) break;
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
          uint32_t b0, b1;
          ldmatrix_b_trans(vrow + 16 * ks * st + d0 + 8 * t, b0, b1);
          mma::mma_bf16(acc[t], a[ks], b0, b1);
        }
      }
#pragma unroll
      for (int t = 0; t < 8; ++t) {
        if (t >= tiles) break;
        const int d = col0 + d0 + 8 * t + 2 * qd;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int h = h0 + 16 * mt + g + 8 * half;
          *reinterpret_cast<float2*>(part + ((r * heads + h) * nblk + blk) * (dh + 2) + d) =
              make_float2(acc[t][2 * half], acc[t][2 * half + 1]);
        }
      }
    }
  }
}

// One CTA per (row, head); shared memory: the splits' m and weights e^(m_z - M).
__global__ void combine_splits_kernel(const float* __restrict__ part, int splits, int heads, int dh,
                                      const uint8_t* sink, WType sink_t, float* __restrict__ out) {
  ::di::cuda::grid_dependency_wait();
  extern __shared__ float wz[];  // [splits]
  __shared__ float shared_max, shared_total;
  const int64_t rh = blockIdx.x;
  const float* pp = part + rh * splits * (dh + 2);
  for (int z = threadIdx.x; z < splits; z += blockDim.x) wz[z] = pp[z * (dh + 2) + dh];
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = -1e30f;
    for (int z = 0; z < splits; ++z) m = std_max(m, wz[z]);
    shared_max = m;
  }
  __syncthreads();
  const float m = shared_max;
  for (int z = threadIdx.x; z < splits; z += blockDim.x) wz[z] = expf(wz[z] - m);
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0;
    for (int z = 0; z < splits; ++z) total += pp[z * (dh + 2) + dh + 1] * wz[z];
    shared_total = total + expf(weight_elem(sink, sink_t, rh % heads) - m);
  }
  __syncthreads();
  const float total = shared_total;
  for (int d = threadIdx.x; d < dh; d += blockDim.x) {
    float a = 0;
    for (int z0 = 0; z0 < splits; z0 += 8) {  // 8 loads in flight
      float v[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = z0 + i < splits ? pp[(z0 + i) * (dh + 2) + d] : 0.0f;
#pragma unroll
      for (int i = 0; i < 8; ++i)
        if (z0 + i < splits) a += v[i] * wz[z0 + i];
    }
    out[rh * dh + d] = round_bf16(a / total);
  }
}

}  // namespace

bool sparse_attention_mma_fits(const float* q, int heads, int dh, const AttnKeys& keys, int64_t len) {
  const bool f32_ok = reinterpret_cast<uintptr_t>(q) % 16 == 0 && reinterpret_cast<uintptr_t>(keys.kv) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(keys.more) % 16 == 0;
  return len > 0 && heads % 16 == 0 && dh % 16 == 0 && dh > 0 && dh <= 512 && f32_ok &&
         (len + kBlock - 1) / kBlock <= 65535;
}

void sparse_attention_mma(int64_t s, int heads, int dh, const float* q, const AttnKeys& keys, const int32_t* idx,
                          int64_t len, const uint8_t* sink, WType sink_t, float scale, float* out, CudaBackend& be) {
  DI_CHECK(sparse_attention_mma_fits(q, heads, dh, keys, len));
  const int64_t nblk = (len + kBlock - 1) / kBlock;
  const int head_tiles = (heads + kHeadTile - 1) / kHeadTile;
  const size_t tile_bytes = kBlock * static_cast<size_t>(std::min(dh, kScoreCols) + kPad) * 2;  // one staged slice
  const size_t smem_scores = 2 * tile_bytes, smem_values = tile_bytes + kHeadTile * kPStride * 2;
  static const bool attr_set = [] {
    const size_t most = 2 * kBlock * static_cast<size_t>(kScoreCols + kPad) * 2;
    DI_CUDA_CHECK(cudaFuncSetAttribute(attn_scores_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(most)));
    DI_CUDA_CHECK(cudaFuncSetAttribute(attn_values_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(most)));
    return true;
  }();
  (void)attr_set;
  // rows per launch: the scores and partials of a launch stay under the split-partial bound
  const int64_t row_bytes = static_cast<int64_t>(heads) * nblk * (kBlock + 1 + dh + 2) * 4;
  const int64_t rows_per_launch = std::clamp<int64_t>(bi::kMaxSplitPartialBytes / row_bytes, 1, s);
  const int64_t n = std::min(rows_per_launch, s);
  Tensor scores = be.alloc(TType::kF32, {n * heads, nblk * kBlock});
  Tensor bmax = be.alloc(TType::kF32, {n * heads, nblk});
  Tensor part = be.alloc(TType::kF32, {n * heads * nblk, dh + 2});
  for (int64_t r0 = 0; r0 < s; r0 += rows_per_launch) {
    const int64_t rows = std::min(rows_per_launch, s - r0);
    const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(head_tiles), static_cast<unsigned>(nblk));
    ::di::cuda::launch(attn_scores_kernel, grid, kThreads, smem_scores, q + r0 * heads * dh, keys, idx + r0 * len, len,
                       heads, dh, scale, scores.f32(), bmax.f32());
    ::di::cuda::launch(attn_values_kernel, grid, kThreads, smem_values, keys, idx + r0 * len, len, heads, dh,
                       scores.f32(), bmax.f32(), part.f32());
    combine_splits(part.f32(), static_cast<int>(nblk), rows, heads, dh, sink, sink_t, out + r0 * heads * dh);
  }
}

void combine_splits(const float* part, int splits, int64_t rows, int heads, int dh, const uint8_t* sink, WType sink_t,
                    float* out) {
  if (rows * heads == 0) return;
  DI_CHECK_MSG(rows * heads < (1LL << 31) && splits <= 8192, "sparse_attention: too many rows or list splits");
  ::di::cuda::launch(combine_splits_kernel, static_cast<unsigned>(rows * heads), 128, static_cast<size_t>(splits) * 4,
                     part, splits, heads, dh, sink, sink_t, out);
}

}  // namespace di::cuda::attn
