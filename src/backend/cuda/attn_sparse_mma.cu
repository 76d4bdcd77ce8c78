// Sparse attention on the bf16 tensor cores. Every query head of a row reads the same key / value
// rows (one shared latent, 512 wide on V4.1), so a 64-key block of a row's index list is a
// [heads x 64] score GEMM and a [heads x dh] value GEMM (mma.sync m16n8k16, fp32 accumulation).
// Two kernels, each with CTAs per (row, head tile, 64-key block):
//  1. scores: the block's keys and the tile's queries staged as bf16 (exact: the model's queries
//     leave RoPE and its keys leave qdq / unpacking as bf16 values), S = Q K^T x scale (-inf for -1
//     ids) into a score buffer, and each head's block maximum; the block's keys may be split over
//     CTAs (key parts), each writing its part's maximum;
//  2. values: the running max the CPU holds at this block (the max of the block maxima so far, over
//     all their parts, from -1e30), p = exp(s - max) in fp32 (summed into l), rounded to bf16 as the
//     CPU rounds it, O = P V; the dh dims may be split over CTAs (dim slices), each computing the
//     same probabilities;
// then combine_splits merges the blocks' (O, max, l) with the sink -- or, in launches of many rows,
// one merged kernel walks each row's blocks doing both (no partials in memory, the same bits). This
// is the CPU's arithmetic up
// to summation order and expf's ulps (which can round a probability to the neighbouring bf16), for
// each row on its own: batch-invariant by construction. The CUDA-core kernel in cuda_attention.cu
// re-staged every key block once per 16 heads, in fp32 (128 KB of shared memory per CTA).
// A small grid (decode: a row's 640 keys are 10 blocks, 10 CTAs of 64 heads at batch 1) narrows the
// scores kernel's head tile to 32 or 16 heads, then splits its key blocks into 2 or 4 parts, and
// splits the values kernel's dims, so that more SMs work (batch 1 above: 160 score CTAs of 16 heads x
// 16 keys, 80 value CTAs of 64 dims). Every score and output element is the same MMA chain (k in the
// same order) whatever the tiling, and the running max the same max of the same scores, so the launch
// shape changes no bit.
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
constexpr int kHeadTile = 64;  // heads per CTA of the values kernel; the scores kernel's widest tile
constexpr int kThreads = 256;  // 8 warps
constexpr int kWarps = kThreads / 32;
constexpr int kMinSliceDims = 64;  // the values kernel's narrowest dim slice: 32 dims (4 n8 tiles) per warp
constexpr int kMaxKeyParts = 4;    // the scores kernel's most CTAs per key block: 16 keys (2 warps of 8) each
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

constexpr int kUnroll = 4;  // staging: chunks per thread whose loads are issued before any is converted

// The raw bytes of a staged chunk (8 elements of a key row): f32 rows 32 bytes, FP8 rows 8 code bytes
// and the block scale, FP4 (E4M3 scales) 4 code bytes and the scale; other formats and unaligned rows
// are read again when converted.
struct RawChunk {
  uint4 a, b;
};

__device__ __forceinline__ RawChunk load_chunk(const AttnKeys& keys, int id, int dh, int c) {
  RawChunk raw{};
  if (id < 0) return raw;
  if (id < keys.n_kv || keys.packed == nullptr) {
    const float* row = id < keys.n_kv ? keys.kv + static_cast<int64_t>(id) * dh : keys.more + (id - keys.n_kv) * dh;
    raw.a = __ldg(reinterpret_cast<const uint4*>(row + 8 * c));
    raw.b = __ldg(reinterpret_cast<const uint4*>(row + 8 * c) + 1);
    return raw;
  }
  const uint8_t* row = keys.packed + (id - keys.n_kv) * keys.packed_row_bytes;
  if (keys.fmt == RowFormat::kFp8Ue8m0 && reinterpret_cast<uintptr_t>(row) % 8 == 0) {
    const uint2 codes = __ldg(reinterpret_cast<const uint2*>(row + 8 * c));
    raw.a = make_uint4(codes.x, codes.y, __ldg(row + dh + 8 * c / 32), 0u);
  } else if (keys.fmt == RowFormat::kFp4E4m3 && reinterpret_cast<uintptr_t>(row) % 4 == 0) {
    raw.a = make_uint4(__ldg(reinterpret_cast<const uint32_t*>(row + 4 * c)), 0u, __ldg(row + dh / 2 + 8 * c / 16), 0u);
  }
  return raw;
}

// 8 E2M1 codes (element i in bits 4i..4i+3) times an E4M3 scale as 4 bf16 pairs, exactly: the magnitude
// bytes of each code's bf16 pattern come from two byte-permute tables (0, 0.5, 1, 1.5, 2, 3, 4, 6), the
// sign is the code's top bit, and the product of an E2M1 and an E4M3 value is exact in bf16 (so the
// bf16 multiply is unpack_rows' bf16(e2m1 x scale)).
__device__ __forceinline__ uint4 e2m1x8_to_bf16(uint32_t codes, float scale) {
  constexpr uint32_t kLoA = 0xC0800000u, kLoB = 0xC0804000u;  // low bytes of the bf16 of |code| 0-3, 4-7
  constexpr uint32_t kHiA = 0x3F3F3F00u, kHiB = 0x40404040u;  // high bytes
  const __nv_bfloat162 s2 = __float2bfloat162_rn(scale);      // exact: an E4M3 value
  uint32_t w[4];
#pragma unroll
  for (int half = 0; half < 2; ++half) {  // codes 4 half .. +4
    const uint32_t c = codes >> (16 * half), sel = c & 0x7777u;
    const uint32_t lo = __byte_perm(kLoA, kLoB, sel), hi = __byte_perm(kHiA, kHiB, sel);
    const uint32_t p0 = __byte_perm(lo, hi, 0x5140u), p1 = __byte_perm(lo, hi, 0x7362u);  // codes (0, 1), (2, 3)
    w[2 * half] = p0 | ((c << 12) & 0x8000u) | ((c << 24) & 0x80000000u);
    w[2 * half + 1] = p1 | ((c << 4) & 0x8000u) | ((c << 16) & 0x80000000u);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat162 v = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&w[i]), s2);
    w[i] = *reinterpret_cast<const uint32_t*>(&v);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Chunk c of key `id` as 4 bf16 pairs, from its raw bytes: unpack_rows' dequantization (its values are
// bf16, so pack_bf16 of them is exact).
__device__ __forceinline__ uint4 convert_chunk(const AttnKeys& keys, int id, int dh, int c, const RawChunk& raw) {
  float v[8];
  if (id < 0) return make_uint4(0u, 0u, 0u, 0u);
  if (id < keys.n_kv || keys.packed == nullptr) {
    v[0] = __uint_as_float(raw.a.x), v[1] = __uint_as_float(raw.a.y), v[2] = __uint_as_float(raw.a.z),
    v[3] = __uint_as_float(raw.a.w), v[4] = __uint_as_float(raw.b.x), v[5] = __uint_as_float(raw.b.y),
    v[6] = __uint_as_float(raw.b.z), v[7] = __uint_as_float(raw.b.w);
  } else {
    const uint8_t* row = keys.packed + (id - keys.n_kv) * keys.packed_row_bytes;
    if (keys.fmt == RowFormat::kFp8Ue8m0) {  // unpack_rows' values: bf16(e4m3 x e8m0)
      uint2 codes = make_uint2(raw.a.x, raw.a.y);
      uint8_t sc = static_cast<uint8_t>(raw.a.z);
      if (reinterpret_cast<uintptr_t>(row) % 8 != 0) {  // rows of other widths: bytes
        codes = make_uint2(0u, 0u);
#pragma unroll
        for (int i = 0; i < 8; ++i) (i < 4 ? codes.x : codes.y) |= static_cast<uint32_t>(row[8 * c + i]) << (8 * (i % 4));
        sc = row[dh + 8 * c / 32];
      }
      const float s = e8m0_to_float(sc);
#pragma unroll
      for (int i = 0; i < 8; ++i)  // (rounded to bf16 where it is packed)
        v[i] = __fmul_rn(e4m3_to_float(static_cast<uint8_t>((i < 4 ? codes.x : codes.y) >> (8 * (i % 4)))), s);
    } else if (keys.fmt == RowFormat::kFp4E4m3) {  // bf16(e2m1 x e4m3), even element in the low nibble
      uint32_t codes = raw.a.x;
      uint8_t sc = static_cast<uint8_t>(raw.a.z);
      if (reinterpret_cast<uintptr_t>(row) % 4 != 0) {
        codes = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) codes |= static_cast<uint32_t>(row[4 * c + i]) << (8 * i);
        sc = row[dh / 2 + 8 * c / 16];
      }
      return e2m1x8_to_bf16(codes, e4m3_to_float(sc));
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = packed_at(row, keys.fmt, dh, 8 * c + i);
    }
  }
  return make_uint4(pack_bf16(v[0], v[1]), pack_bf16(v[2], v[3]), pack_bf16(v[4], v[5]), pack_bf16(v[6], v[7]));
}

// Thread t's elements t, t + kThreads, ... of a [rows][chunks] tile as (row, chunk), stepped without
// an integer division per element (staging was issue-bound on them).
struct ChunkWalk {
  int row, chunk, chunks, d_row, d_chunk;
  __device__ explicit ChunkWalk(int n_chunks)
      : row(threadIdx.x / n_chunks), chunk(threadIdx.x % n_chunks), chunks(n_chunks), d_row(kThreads / n_chunks),
        d_chunk(kThreads % n_chunks) {}
  __device__ void next() {
    row += d_row, chunk += d_chunk;
    if (chunk >= chunks) chunk -= chunks, ++row;
  }
};

// Keys [key0, key0 + nkeys) of block `blk` of row r's list: ids[j] for key key0 + j (-1 past the
// list, for -1 and for out-of-range ids; staged when stage_ids), then columns [col0, col0 + cols) of
// those key rows as bf16 into tile [nkeys][st] (zeros for -1), 8 elements per chunk, kUnroll chunks'
// loads in flight per thread (the staging is a chain of L2 round trips otherwise).
__device__ void stage_keys(const AttnKeys& keys, const int32_t* __restrict__ idx, int64_t r, int64_t len, int64_t blk,
                           int key0, int nkeys, int dh, int col0, int cols, int st, bool stage_ids, int32_t* ids,
                           __nv_bfloat16* tile) {
  if (stage_ids) {
    for (int j = threadIdx.x; j < nkeys; j += kThreads) {
      const int64_t pos = blk * kBlock + key0 + j;
      const int32_t id = pos < len ? idx[r * len + pos] : -1;
      ids[j] = id >= 0 && id < keys.n_kv + keys.n_more ? id : -1;
    }
    __syncthreads();
  }
  const int chunks = cols / 8;
  for (ChunkWalk w(chunks); w.row < nkeys;) {
    const ChunkWalk first = w;
    RawChunk raw[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u, w.next())
      raw[u] = w.row < nkeys ? load_chunk(keys, ids[w.row], dh, col0 / 8 + w.chunk) : RawChunk{};
    ChunkWalk at = first;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u, at.next()) {
      if (at.row >= nkeys) break;
      *reinterpret_cast<uint4*>(tile + at.row * st + 8 * at.chunk) =
          convert_chunk(keys, ids[at.row], dh, col0 / 8 + at.chunk, raw[u]);
    }
  }
}

// Kernel 1, grid (rows, head tiles of HT heads, blocks x kParts): CTA (r, tile, blk x kParts + part)
// scores the tile's heads against keys [part x 64 / kParts, +64 / kParts) of block blk (kParts 1, or
// 2 and 4 at HT 16: a small launch splits a block so that more SMs stage its keys). The 8 warps split
// the [HT x 64] tile into HT / 16 m16 tiles, each shared by kWarpsPerM warps over the keys: warp w takes
// heads 16 (w % kMTiles) .. +16 and keys kKeysPerWarp (w / kMTiles) .. +kKeysPerWarp (kNTiles n8
// tiles); K = dh in steps of 16 (HT 64: 4 m tiles x 2 warps x 32 keys; HT 16: 1 m tile x 8 warps x 8
// keys). Of a key part, only the warps whose keys fall in it multiply (HT 16: 4 warps at 2 parts, 2
// at 4); the others help stage. dh is staged kScoreCols columns at a time (queries and keys), so the
// CTA holds (64 / kParts + HT) x 264 x 2 bytes of shared memory (68 KB at HT 64, three CTAs an SM)
// instead of 133 KB; the K steps still run in order, so the sums are the same. Each CTA writes its
// part's maxima: blk_max [rows, heads, nblk x kParts].
template <int HT, int kParts>
__global__ void __launch_bounds__(kThreads)
    attn_scores_kernel(const float* __restrict__ q, AttnKeys keys, const int32_t* __restrict__ idx, int64_t len,
                       int heads, int dh, float scale, float* __restrict__ scores, float* __restrict__ blk_max) {
  ::di::cuda::grid_dependency_wait();
  constexpr int kMTiles = HT / 16, kWarpsPerM = kWarps / kMTiles, kKeysPerWarp = kBlock / kWarpsPerM,
                kNTiles = kKeysPerWarp / 8, kPartKeys = kBlock / kParts, kKeyWarps = kPartKeys / kKeysPerWarp;
  static_assert(HT % 16 == 0 && kWarps % kMTiles == 0 && kNTiles >= 1, "8 warps over the head tile");
  static_assert(kPartKeys % kKeysPerWarp == 0, "whole warps of keys per part");
  extern __shared__ uint4 smem_u4[];
  const int st = min(dh, kScoreCols) + kPad;
  __nv_bfloat16* ks = reinterpret_cast<__nv_bfloat16*>(smem_u4);  // [kPartKeys][st]
  __nv_bfloat16* qs = ks + kPartKeys * st;                         // [HT heads][st]
  __shared__ int32_t ids[kPartKeys];
  __shared__ float red[kWarpsPerM][HT];  // per head, the maxima of the warps sharing its m tile
  const int64_t r = blockIdx.x, blk = blockIdx.z / kParts, nblk = gridDim.z / kParts;
  const int part = blockIdx.z % kParts, key0 = part * kPartKeys;
  const int h0 = blockIdx.y * HT, hn = min(HT, heads - h0);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, qd = lane % 4;
  const int mt = warp % kMTiles, nh = warp / kMTiles;
  const bool active = 16 * mt < hn && nh < kKeyWarps;
  float acc[kNTiles][4] = {};
  for (int col0 = 0; col0 < dh; col0 += kScoreCols) {
    const int cols = min(kScoreCols, dh - col0), chunks = cols / 8;
    if (col0 > 0) __syncthreads();  // the previous columns' MMAs are done with the tiles
    // the row's queries as bf16, kUnroll chunks' loads in flight per thread
    for (ChunkWalk w(chunks); w.row < hn;) {
      const ChunkWalk first = w;
      float4 a[kUnroll], b[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u, w.next()) {
        if (w.row >= hn) break;
        const float4* p = reinterpret_cast<const float4*>(q + (r * heads + h0 + w.row) * dh + col0 + 8 * w.chunk);
        a[u] = __ldg(p), b[u] = __ldg(p + 1);
      }
      ChunkWalk at = first;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u, at.next()) {
        if (at.row >= hn) break;
        *reinterpret_cast<uint4*>(qs + at.row * st + 8 * at.chunk) = make_uint4(
            pack_bf16(a[u].x, a[u].y), pack_bf16(a[u].z, a[u].w), pack_bf16(b[u].x, b[u].y), pack_bf16(b[u].z, b[u].w));
      }
    }
    stage_keys(keys, idx, r, len, blk, key0, kPartKeys, dh, col0, cols, st, col0 == 0, ids, ks);
    __syncthreads();
    if (active) {
      const __nv_bfloat16* qa = qs + (16 * mt + g) * st + 2 * qd;
      const __nv_bfloat16* kb = ks + (kKeysPerWarp * nh + g) * st + 2 * qd;
      for (int k0 = 0; k0 < cols; k0 += 16) {
        const uint32_t a[4] = {lds32(qa + k0), lds32(qa + 8 * st + k0), lds32(qa + k0 + 8),
                               lds32(qa + 8 * st + k0 + 8)};
#pragma unroll
        for (int t = 0; t < kNTiles; ++t)
          mma::mma_bf16(acc[t], a, lds32(kb + 8 * t * st + k0), lds32(kb + 8 * t * st + k0 + 8));
      }
    }
  }
  // scale, -inf for missing keys, to the score buffer [rows, heads, nblk * 64]; the part's maxima
  float mx[2] = {kNegInf, kNegInf};  // heads g, g + 8 of the warp's tile
  if (active) {
#pragma unroll
    for (int t = 0; t < kNTiles; ++t) {
      const int key = kKeysPerWarp * nh + 8 * t + 2 * qd;  // in the part
      const bool v0 = ids[key] >= 0, v1 = ids[key + 1] >= 0;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const float s0 = v0 ? acc[t][2 * half] * scale : kNegInf, s1 = v1 ? acc[t][2 * half + 1] * scale : kNegInf;
        mx[half] = fmaxf(mx[half], fmaxf(s0, s1));
        const int h = h0 + 16 * mt + g + 8 * half;
        *reinterpret_cast<float2*>(scores + (r * heads + h) * nblk * kBlock + blk * kBlock + key0 + key) =
            make_float2(s0, s1);
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
  if (threadIdx.x < hn) {  // a max: the same value in any order
    float m = red[0][threadIdx.x];
#pragma unroll
    for (int w = 1; w < kKeyWarps; ++w) m = fmaxf(m, red[w][threadIdx.x]);
    blk_max[(r * heads + h0 + threadIdx.x) * nblk * kParts + blk * kParts + part] = m;
  }
}

// The probabilities of block blk for the tile's hn heads (both values kernels): thread (head t / 4,
// keys 16 (t % 4) .. +16) turns the scores into p = e^(s - run_max[h]) (0 for -inf), stores bf16(p)
// into ps [64 heads][kPStride] and its sum of p into lpart[t % 4][h].
__device__ __forceinline__ void block_probabilities(const float* __restrict__ scores, int64_t r, int heads, int h0,
                                                    int hn, int64_t nblk, int64_t blk, const float* run_max,
                                                    __nv_bfloat16* ps, float (*lpart)[kHeadTile]) {
  const int h = threadIdx.x / 4, c = threadIdx.x % 4;
  float l = 0.0f;
  if (h < hn) {
    const float m = run_max[h];
    const float4* sp = reinterpret_cast<const float4*>(scores + (r * heads + h0 + h) * nblk * kBlock + blk * kBlock + 16 * c);
    float p[16];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float4 v = sp[i];
      p[4 * i] = v.x, p[4 * i + 1] = v.y, p[4 * i + 2] = v.z, p[4 * i + 3] = v.w;
    }
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      p[i] = p[i] == kNegInf ? 0.0f : expf(p[i] - m);
      l += p[i];
    }
#pragma unroll
    for (int i = 0; i < 16; i += 2) *reinterpret_cast<uint32_t*>(ps + h * kPStride + 16 * c + i) = pack_bf16(p[i], p[i + 1]);
  }
  lpart[c][h] = l;
}

// Head h's l of the block: its four threads' sums in a fixed order.
__device__ __forceinline__ float block_l(const float (*lpart)[kHeadTile], int h) {
  return ((lpart[0][h] + lpart[1][h]) + lpart[2][h]) + lpart[3][h];
}

// The P fragments (A operand, heads 16 mt .. +16) of the block's 4 k16 steps.
__device__ __forceinline__ void load_p_fragments(const __nv_bfloat16* ps, int mt, int g, int qd, uint32_t (&a)[4][4]) {
  const __nv_bfloat16* pa = ps + (16 * mt + g) * kPStride + 2 * qd;
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    a[ks][0] = lds32(pa + 16 * ks);
    a[ks][1] = lds32(pa + 8 * kPStride + 16 * ks);
    a[ks][2] = lds32(pa + 16 * ks + 8);
    a[ks][3] = lds32(pa + 8 * kPStride + 16 * ks + 8);
  }
}

// Kernel 2, grid (rows, head tiles x dim slices, blocks): part[r, h, blk] = (sum_j bf16(p_j) v_j [dh],
// m, l), CTA (.., tile * slices + slice, ..) writing dims [slice x slice_dims, +slice_dims) and slice
// 0 the (m, l) pair; every slice computes the tile's probabilities alike. blk_max holds the maxima of
// the scores kernel's `parts` key parts per block. The values are staged
// kScoreCols dims at a time (43 KB of shared memory instead of 76 at one slice); PV: warp w computes
// heads 16 (w % 4) .. +16 over the staged dims' half w / 4, 64 at a time.
__global__ void __launch_bounds__(kThreads)
    attn_values_kernel(AttnKeys keys, const int32_t* __restrict__ idx, int64_t len, int heads, int dh, int slice_dims,
                       int parts, const float* __restrict__ scores, const float* __restrict__ blk_max,
                       float* __restrict__ part) {
  ::di::cuda::grid_dependency_wait();
  extern __shared__ uint4 smem_u4[];
  const int st = min(slice_dims, kScoreCols) + kPad;
  __nv_bfloat16* vs = reinterpret_cast<__nv_bfloat16*>(smem_u4);  // [64 keys][st]
  __nv_bfloat16* ps = vs + kBlock * st;                            // [64 heads][64 + kPad] probabilities
  __shared__ int32_t ids[kBlock];
  __shared__ float run_max[kHeadTile], lpart[4][kHeadTile];
  const int64_t r = blockIdx.x, blk = blockIdx.z, nblk = gridDim.z;
  const int slices = dh / slice_dims, slice = blockIdx.y % slices;
  const int h0 = (blockIdx.y / slices) * kHeadTile, hn = min(kHeadTile, heads - h0);
  const int d_first = slice * slice_dims, d_last = d_first + slice_dims;  // this CTA's dims
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, qd = lane % 4;
  // the CPU's running max when it reaches this block: the maxima of blocks 0 .. blk (all their key
  // parts), folded from -1e30 (a max of maxima: the same value however the blocks were split)
  if (threadIdx.x < hn) {
    const float* bm = blk_max + (r * heads + h0 + threadIdx.x) * nblk * parts;
    const int64_t n_max = (blk + 1) * parts;
    float m = -1e30f;
    for (int64_t b0 = 0; b0 < n_max; b0 += 8) {
      float v[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = b0 + i < n_max ? bm[b0 + i] : kNegInf;
#pragma unroll
      for (int i = 0; i < 8; ++i) m = std_max(m, v[i]);
    }
    run_max[threadIdx.x] = m;
  }
  // the slice's first dims; its first barrier publishes run_max
  stage_keys(keys, idx, r, len, blk, 0, kBlock, dh, d_first, min(slice_dims, kScoreCols), st, true, ids, vs);
  block_probabilities(scores, r, heads, h0, hn, nblk, blk, run_max, ps, lpart);
  __syncthreads();
  if (slice == 0 && threadIdx.x < hn) {
    float* pp = part + ((r * heads + h0 + threadIdx.x) * nblk + blk) * (dh + 2);
    pp[dh] = run_max[threadIdx.x];
    pp[dh + 1] = block_l(lpart, threadIdx.x);
  }
  const int mt = warp % 4;
  const bool active = 16 * mt < hn;
  uint32_t a[4][4] = {};  // P fragments for the 4 k16 steps of the block's 64 keys
  if (active) load_p_fragments(ps, mt, g, qd, a);
  const __nv_bfloat16* vrow = vs + (lane % 16) * st;  // ldmatrix row address of this lane (k = lane % 16)
  for (int col0 = d_first; col0 < d_last; col0 += kScoreCols) {
    const int cols = min(kScoreCols, d_last - col0);
    if (col0 > d_first) {
      __syncthreads();  // the previous dims' MMAs are done with the tile
      stage_keys(keys, idx, r, len, blk, 0, kBlock, dh, col0, cols, st, false, ids, vs);
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

// Kernel 2 and combine_splits in one, for launches of many rows: grid (rows, head tiles x dim slices
// of S dims); CTA (r, ..) walks the row's blocks in order and keeps its slice of O in registers. Per
// block it does what attn_values_kernel does (the same running max, bf16 probabilities, l and fresh
// MMA chain acc) and then what combine_splits_kernel does with that block's partial (O = fma(acc, w,
// O), L = fma(l, w, L) with w = e^(m_z - M), M the row's largest block maximum, known from the scores
// kernel), so the output has the split path's bits without its [rows, heads, blocks, dh + 2]
// partials (84 MB written and read back at batch 64). Warp w: heads 16 (w % 4) .. +16, dims
// (w / 4) S / 2 .. +S / 2 of the slice.
template <int S>
__global__ void __launch_bounds__(kThreads)
    attn_values_merged_kernel(AttnKeys keys, const int32_t* __restrict__ idx, int64_t len, int heads, int dh,
                              int64_t nblk, int parts, const float* __restrict__ scores,
                              const float* __restrict__ blk_max, const uint8_t* sink, WType sink_t,
                              float* __restrict__ out) {
  ::di::cuda::grid_dependency_wait();
  constexpr int st = S + kPad, kTiles = S / 16;  // n8 tiles per warp: S / 2 dims
  extern __shared__ uint4 smem_u4[];
  __nv_bfloat16* vs = reinterpret_cast<__nv_bfloat16*>(smem_u4);  // [64 keys][st]
  __nv_bfloat16* ps = vs + kBlock * st;                            // [64 heads][64 + kPad] probabilities
  __shared__ int32_t ids[kBlock];
  __shared__ float run_max[kHeadTile], row_max[kHeadTile], lpart[4][kHeadTile], total[kHeadTile];
  const int64_t r = blockIdx.x;
  const int slices = dh / S, slice = blockIdx.y % slices;
  const int h0 = (blockIdx.y / slices) * kHeadTile, hn = min(kHeadTile, heads - h0);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, qd = lane % 4;
  const int mt = warp % 4, d0 = (warp / 4) * (S / 2);
  const bool active = 16 * mt < hn;
  const float* bm = blk_max + (r * heads + h0 + threadIdx.x) * nblk * parts;  // this thread's head (< hn)
  float l_sum = 0.0f;                                                          // combine's total, thread h
  if (threadIdx.x < hn) {  // M: every block's maxima folded from -1e30 in the split path's order
    float m = -1e30f;
    for (int64_t i = 0; i < nblk * parts; ++i) m = std_max(m, bm[i]);
    row_max[threadIdx.x] = m;
    run_max[threadIdx.x] = -1e30f;
  }
  float o[kTiles][4] = {};
  const __nv_bfloat16* vrow = vs + (lane % 16) * st;  // ldmatrix row address of this lane (k = lane % 16)
  for (int64_t blk = 0; blk < nblk; ++blk) {
    if (blk > 0) __syncthreads();  // the previous block's MMAs are done with vs and ps
    if (threadIdx.x < hn) {        // the running max at this block: the same fold, continued
      float m = run_max[threadIdx.x];
      for (int p = 0; p < parts; ++p) m = std_max(m, bm[blk * parts + p]);
      run_max[threadIdx.x] = m;
    }
    // ids and the slice's values; its first barrier publishes run_max (and row_max)
    stage_keys(keys, idx, r, len, blk, 0, kBlock, dh, slice * S, S, st, true, ids, vs);
    block_probabilities(scores, r, heads, h0, hn, nblk, blk, run_max, ps, lpart);
    __syncthreads();
    if (threadIdx.x < hn) {
      const float w = expf(run_max[threadIdx.x] - row_max[threadIdx.x]);
      l_sum = __fmaf_rn(block_l(lpart, threadIdx.x), w, l_sum);
    }
    if (!active) continue;
    float w[2];  // the block's weight e^(m_z - M) for heads g, g + 8 of the warp's tile
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int h = 16 * mt + g + 8 * half;
      w[half] = expf(run_max[h] - row_max[h]);
    }
    uint32_t a[4][4];
    load_p_fragments(ps, mt, g, qd, a);
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
      float acc[4] = {};
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        uint32_t b0, b1;
        ldmatrix_b_trans(vrow + 16 * ks * st + d0 + 8 * t, b0, b1);
        mma::mma_bf16(acc, a[ks], b0, b1);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) o[t][i] = __fmaf_rn(acc[i], w[i / 2], o[t][i]);
    }
  }
  if (threadIdx.x < hn) total[threadIdx.x] = l_sum + expf(weight_elem(sink, sink_t, h0 + threadIdx.x) - row_max[threadIdx.x]);
  __syncthreads();
  if (!active) return;
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
    const int d = slice * S + d0 + 8 * t + 2 * qd;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int h = 16 * mt + g + 8 * half;
      *reinterpret_cast<float2*>(out + (r * heads + h0 + h) * dh + d) =
          make_float2(round_bf16(o[t][2 * half] / total[h]), round_bf16(o[t][2 * half + 1] / total[h]));
    }
  }
}

// One CTA per (row, head); shared memory: the splits' m (then weights e^(m_z - M)) and l. Every
// thread loads the m and l of its splits at once and each its kCombineDims dims' partials of
// kCombineSplits splits at a time, clamped (cuda_common.cuh): a round trip per 16 splits, not per dim
// and split. The sums are explicit fmas in split order: attn_values_merged_kernel computes them alike.
constexpr int kCombineThreads = 256, kCombineDims = 2, kCombineSplits = 16;
__global__ void __launch_bounds__(kCombineThreads)
    combine_splits_kernel(const float* __restrict__ part, int splits, int heads, int dh, const uint8_t* sink,
                          WType sink_t, float* __restrict__ out) {
  ::di::cuda::grid_dependency_wait();
  extern __shared__ float wz[];  // [2][splits]: m then e^(m_z - M); l
  __shared__ float shared_max, shared_total;
  const int64_t rh = blockIdx.x;
  const float* pp = part + rh * splits * (dh + 2);
  for (int z = threadIdx.x; z < splits; z += kCombineThreads) {
    const float mz = pp[z * (dh + 2) + dh], lz = pp[z * (dh + 2) + dh + 1];
    wz[z] = mz, wz[splits + z] = lz;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = -1e30f;
    for (int z = 0; z < splits; ++z) m = std_max(m, wz[z]);
    shared_max = m;
  }
  __syncthreads();
  const float m = shared_max;
  for (int z = threadIdx.x; z < splits; z += kCombineThreads) wz[z] = expf(wz[z] - m);
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0;
    for (int z = 0; z < splits; ++z) total = __fmaf_rn(wz[splits + z], wz[z], total);
    shared_total = total + expf(weight_elem(sink, sink_t, rh % heads) - m);
  }
  __syncthreads();
  const float total = shared_total;
  for (int d0 = threadIdx.x; d0 < dh; d0 += kCombineDims * kCombineThreads) {
    float a[kCombineDims] = {};
    for (int z0 = 0; z0 < splits; z0 += kCombineSplits) {
      float v[kCombineDims][kCombineSplits];
#pragma unroll
      for (int j = 0; j < kCombineDims; ++j)
#pragma unroll
        for (int i = 0; i < kCombineSplits; ++i)
          v[j][i] = pp[min(z0 + i, splits - 1) * (dh + 2) + min(d0 + j * kCombineThreads, dh - 1)];
#pragma unroll
      for (int j = 0; j < kCombineDims; ++j)
#pragma unroll
        for (int i = 0; i < kCombineSplits; ++i)
          if (z0 + i < splits) a[j] = __fmaf_rn(v[j][i], wz[z0 + i], a[j]);
    }
#pragma unroll
    for (int j = 0; j < kCombineDims; ++j) {
      const int d = d0 + j * kCombineThreads;
      if (d < dh) out[rh * dh + d] = round_bf16(a[j] / total);
    }
  }
}

// How one launch tiles the work: the scores kernel's heads and keys per CTA and the values kernel's
// dims per CTA. Chosen from the launch size alone; no choice changes a bit (see the top of the file).
struct LaunchShape {
  int head_tile;   // 16, 32 or 64
  int key_parts;   // 1, 2 or 4 score CTAs per key block (more than 1 only at head_tile 16)
  int slice_dims;  // dh / slices, a multiple of 16
};

// The widest shape (64 heads, whole key blocks, all dims) when it gives two CTAs per SM or more;
// below that, the head tile halves (down to 16), then the key parts double (up to kMaxKeyParts), and
// the dim slices double (down to kMinSliceDims dims) until it does. A head tile of twice the heads or
// more also halves: its extra warps would only idle. Past two per SM the wider tiles win, sharing one
// staged key block among more heads and one staged query tile among more keys.
LaunchShape launch_shape(int64_t rows, int heads, int dh, int64_t nblk) {
  const int64_t target = 2 * static_cast<int64_t>(sm_count());
  const auto ctas = [&](int tile) { return rows * ((heads + tile - 1) / tile) * nblk; };
  LaunchShape shape{kHeadTile, 1, dh};
  while (shape.head_tile > 16 && (shape.head_tile / 2 >= heads || ctas(shape.head_tile) < target)) shape.head_tile /= 2;
  while (shape.head_tile == 16 && shape.key_parts < kMaxKeyParts && ctas(16) * shape.key_parts < target &&
         nblk * shape.key_parts * 2 <= 65535)  // grid z
    shape.key_parts *= 2;
  while (shape.slice_dims % 32 == 0 && shape.slice_dims / 2 >= kMinSliceDims &&
         ctas(kHeadTile) * (dh / shape.slice_dims) < target)
    shape.slice_dims /= 2;
  return shape;
}

// The merged values kernel's dims per CTA, or 0 for the split path (values + combine_splits). Each
// merged CTA walks a whole list, so it takes launches of many rows: 128 dims per CTA once that gives a
// CTA per SM, else 64 (dh not a multiple of 128) at two per SM. Wider slices recompute fewer
// probabilities (every slice computes its heads' own) -- at batch 64 (H200, ncu): 84.6 us per layer at
// 64 dims, 57.0 at 128, 74.0 at 256 (128 CTAs: under a wave). Either path gives the same bits.
int merged_slice_dims(int64_t rows, int heads, int dh) {
  const int64_t sms = sm_count(), tiles = rows * ((heads + kHeadTile - 1) / kHeadTile);
  if (dh % 128 == 0 && tiles * (dh / 128) >= sms) return 128;
  if (dh % 64 == 0 && tiles * (dh / 64) >= 2 * sms) return 64;
  return 0;
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
  static const bool attr_set = [] {
    const auto allow = [](auto kernel, int ht) {
      const size_t most = (kBlock + ht) * static_cast<size_t>(kScoreCols + kPad) * 2;
      DI_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(most)));
    };
    allow(attn_scores_kernel<16, 1>, 16);
    allow(attn_scores_kernel<16, 2>, 16);
    allow(attn_scores_kernel<16, 4>, 16);
    allow(attn_scores_kernel<32, 1>, 32);
    allow(attn_scores_kernel<64, 1>, 64);
    allow(attn_values_kernel, kHeadTile);  // more than its kBlock x 264 + 64 x 72 bf16
    return true;  // (the merged kernel's kBlock x 136 + 64 x 72 bf16 are under the default 48 KB)
  }();
  (void)attr_set;
  // rows per launch: the scores and partials of a launch stay under the split-partial bound (key parts
  // only in launches of under two CTAs per SM, whose few extra maxima it need not count)
  const int64_t row_bytes = static_cast<int64_t>(heads) * nblk * (kBlock + 1 + dh + 2) * 4;
  const int64_t rows_per_launch = std::clamp<int64_t>(bi::kMaxSplitPartialBytes / row_bytes, 1, s);
  const int64_t n = std::min(rows_per_launch, s);
  // the most key parts of any launch: the last launch's, the smallest
  const int64_t last_rows = s - (s - 1) / rows_per_launch * rows_per_launch;
  const int most_parts = launch_shape(last_rows, heads, dh, nblk).key_parts;
  Tensor scores = be.alloc(TType::kF32, {n * heads, nblk * kBlock});
  Tensor bmax = be.alloc(TType::kF32, {n * heads, nblk * most_parts});  // [rows, heads, nblk x key parts]
  Tensor part;  // [rows, heads, nblk, dh + 2], for the split path only
  for (int64_t r0 = 0; r0 < s; r0 += rows_per_launch) {
    const int64_t rows = std::min(rows_per_launch, s - r0);
    const LaunchShape shape = launch_shape(rows, heads, dh, nblk);
    DI_CHECK(shape.key_parts <= most_parts && (shape.key_parts == 1 || shape.head_tile == 16));  // 8-key warps
    const size_t key_tile =
        kBlock / shape.key_parts * static_cast<size_t>(std::min(dh, kScoreCols) + kPad) * 2;  // a part's keys
    const size_t smem_scores = key_tile + static_cast<size_t>(shape.head_tile) * (std::min(dh, kScoreCols) + kPad) * 2;
    const size_t smem_values =
        kBlock * static_cast<size_t>(std::min(shape.slice_dims, kScoreCols) + kPad) * 2 + kHeadTile * kPStride * 2;
    const int score_tiles = (heads + shape.head_tile - 1) / shape.head_tile;
    const int value_tiles = (heads + kHeadTile - 1) / kHeadTile * (dh / shape.slice_dims);  // head tiles x slices
    const dim3 score_grid(static_cast<unsigned>(rows), static_cast<unsigned>(score_tiles),
                          static_cast<unsigned>(nblk * shape.key_parts));
    const dim3 value_grid(static_cast<unsigned>(rows), static_cast<unsigned>(value_tiles), static_cast<unsigned>(nblk));
    auto* scores_kernel = shape.head_tile == 32   ? attn_scores_kernel<32, 1>
                          : shape.head_tile == 64 ? attn_scores_kernel<64, 1>
                          : shape.key_parts == 1  ? attn_scores_kernel<16, 1>
                          : shape.key_parts == 2  ? attn_scores_kernel<16, 2>
                                                  : attn_scores_kernel<16, 4>;
    ::di::cuda::launch(scores_kernel, score_grid, kThreads, smem_scores, q + r0 * heads * dh, keys, idx + r0 * len, len,
                       heads, dh, scale, scores.f32(), bmax.f32());
    if (const int merged = merged_slice_dims(rows, heads, dh)) {
      const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>((heads + kHeadTile - 1) / kHeadTile * (dh / merged)));
      const size_t smem = kBlock * static_cast<size_t>(merged + kPad) * 2 + kHeadTile * kPStride * 2;
      ::di::cuda::launch(merged == 128 ? attn_values_merged_kernel<128> : attn_values_merged_kernel<64>, grid, kThreads,
                         smem, keys, idx + r0 * len, len, heads, dh, nblk, shape.key_parts, scores.f32(), bmax.f32(),
                         sink, sink_t, out + r0 * heads * dh);
      continue;
    }
    if (part.empty()) part = be.alloc(TType::kF32, {n * heads * nblk, dh + 2});
    ::di::cuda::launch(attn_values_kernel, value_grid, kThreads, smem_values, keys, idx + r0 * len, len, heads, dh,
                       shape.slice_dims, shape.key_parts, scores.f32(), bmax.f32(), part.f32());
    combine_splits(part.f32(), static_cast<int>(nblk), rows, heads, dh, sink, sink_t, out + r0 * heads * dh);
  }
}

void combine_splits(const float* part, int splits, int64_t rows, int heads, int dh, const uint8_t* sink, WType sink_t,
                    float* out) {
  if (rows * heads == 0) return;
  DI_CHECK_MSG(rows * heads < (1LL << 31) && splits <= 8192, "sparse_attention: too many rows or list splits");
  ::di::cuda::launch(combine_splits_kernel, static_cast<unsigned>(rows * heads), kCombineThreads,
                     static_cast<size_t>(splits) * 8,
                     part, splits, heads, dh, sink, sink_t, out);
}

}  // namespace di::cuda::attn
