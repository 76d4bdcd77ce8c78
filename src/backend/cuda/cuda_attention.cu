// CUDA backend: sparse attention with the sink, compressor pooling, the lightning indexer's scores,
// candidate blocks and top-k selection (semantics: src/backend/cpu/cpu_attention.cpp).
//
// Tie modes of the selections, both on the device (attn_topk.cu), no host round trip: kLowestIndex
// (radix select); kTorch, the reference-compatibility path, picks the elements torch.topk picks on
// the CPU (cpu::torch_topk_indices: libstdc++ partial_sort / nth_element on (value, index) pairs),
// emulated step by step (torch_select.h), so the choice among tied values is exactly the CPU's.
#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/cuda/attn_common.cuh"
#include "backend/cuda/attn_keys.cuh"
#include "backend/cuda/attn_sparse_mma.cuh"
#include "backend/cuda/attn_topk.cuh"
#include "backend/cuda/batch_invariance.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_quant.cuh"
#include "backend/cuda/pdl_launch.cuh"

namespace di {
namespace {

using cuda::attn::AttnKeys;
using cuda::attn::packed_at;
using cuda::attn::Scratch;
using cuda::attn::WType;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// ---- sparse attention -----------------------------------------------------------------------------

constexpr int kAttnBlock = 64;   // the reference kernel's index block
constexpr int kAttnWarps = 8;
constexpr int kHeadsPerWarp = 2;
constexpr int kAttnOnePass = 0;       // modes of sparse_attention_kernel: online softmax over the whole list
constexpr int kAttnMaxPass = 1;       // the scores' max per 64-block only
constexpr int kAttnAfterMaxPass = 2;  // a split of the list, starting from the CPU's running max

// One halving step of transpose_reduce16: lanes with bit `kHalf` set keep the upper half.
template <int kHalf>
__device__ __forceinline__ void transpose_step(float (&v)[16], int lane) {
  const bool upper = (lane & kHalf) != 0;
#pragma unroll
  for (int i = 0; i < kHalf; ++i) {
    const float lo = v[i], hi = v[i + kHalf];
    const float send = upper ? lo : hi;
    v[i] = (upper ? hi : lo) + __shfl_xor_sync(0xffffffffu, send, kHalf);
  }
}

// v[16] per lane -> every lane returns sum over the warp of v[lane & 15] (16 shuffles for 16 sums).
__device__ __forceinline__ float transpose_reduce16(float (&v)[16], int lane) {
  transpose_step<8>(v, lane);
  transpose_step<4>(v, lane);
  transpose_step<2>(v, lane);
  transpose_step<1>(v, lane);
  return v[0] + __shfl_xor_sync(0xffffffffu, v[0], 16);
}

// The CUDA-core sparse attention, for the shapes the tensor-core path (attn_sparse_mma.cu: heads and
// head dim multiples of 16) does not take.
// One block per (query row, group of 16 heads); each warp owns 2 heads, each lane DPL of the Dh
// dims (d = lane + 32 c). Per 64-index block the gathered kv rows [64, Dh] are staged in shared
// memory once and read by every head of the block. Per row and head: L x Dh x 2 FMAs (QK and PV);
// global reads: L kv rows per head group.
template <int DPL>
__global__ void __launch_bounds__(kAttnWarps * 32) sparse_attention_kernel(
    const float* __restrict__ q, AttnKeys keys, const int32_t* __restrict__ idx, int64_t len, const uint8_t* sink, WType sink_t, float scale, int heads, int dh, bool vec4, int64_t split_len,
    int mode, float* __restrict__ blk_max, float* __restrict__ part, float* __restrict__ out) {
  ::di::cuda::grid_dependency_wait();
  constexpr int kHpw = kHeadsPerWarp;
  extern __shared__ float4 smem4[];
  float* tile = reinterpret_cast<float*>(smem4);  // [64, dh]
  __shared__ int32_t ids[kAttnBlock];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  float* pbuf = tile + kAttnBlock * dh + warp * kHpw * kAttnBlock;  // [kHpw, 64] bf16 probabilities
  const int64_t r = blockIdx.x;
  const int h0 = (blockIdx.y * nwarps + warp) * kHpw;

  float qv[kHpw][DPL], acc[kHpw][DPL], run_max[kHpw], sum_exp[kHpw];
#pragma unroll
  for (int hh = 0; hh < kHpw; ++hh) {
    run_max[hh] = -1e30f;
    sum_exp[hh] = 0;
#pragma unroll
    for (int c = 0; c < DPL; ++c) {
      const int d = lane + 32 * c, h = h0 + hh;
      qv[hh][c] = (h < heads && d < dh) ? q[(r * heads + h) * dh + d] : 0.0f;
      acc[hh][c] = 0;
    }
  }

  // this CTA's share of the list: [blockIdx.z * split_len, +split_len) (split_len a multiple of 64)
  const int64_t lo = blockIdx.z * split_len, hi = std::min<int64_t>(len, lo + split_len);
  const int64_t nblk = (len + kAttnBlock - 1) / kAttnBlock;
  if (mode == kAttnAfterMaxPass) {
    // start from the running max the CPU holds when it reaches block lo / 64: the max of the block
    // maxima before it, so every probability is rounded to bf16 against the CPU's max
#pragma unroll
    for (int hh = 0; hh < kHpw; ++hh) {
      const int h = h0 + hh;
      float m = -1e30f;
      if (h < heads)
        for (int64_t b = lane; b < lo / kAttnBlock; b += 32) m = fmaxf(m, blk_max[(r * heads + h) * nblk + b]);
#pragma unroll
      for (int o = 1; o < 32; o *= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
      run_max[hh] = m;
    }
  }
  for (int64_t blk = lo; blk < hi; blk += kAttnBlock) {
    const int n = static_cast<int>(std::min<int64_t>(kAttnBlock, hi - blk));
    __syncthreads();  // the previous tile and ids are consumed
    for (int j = threadIdx.x; j < kAttnBlock; j += blockDim.x) {  // blocks of 1 warp exist (<= 2 heads)
      const int32_t id = j < n ? idx[r * len + blk + j] : -1;
      ids[j] = (id >= 0 && id < keys.n_kv + keys.n_more) ? id : -1;  // out-of-range ids are skipped like -1
    }
    __syncthreads();
    const bool fp4_blocks = keys.packed != nullptr && keys.fmt == RowFormat::kFp4E4m3 && dh % 16 == 0;
    if (fp4_blocks) {  // packed FP4 rows 16 values (8 code bytes + 1 scale) at a time
      const int nb = dh / 16;
      const bool wide = keys.packed_row_bytes % 8 == 0 && reinterpret_cast<uintptr_t>(keys.packed) % 8 == 0;
      for (int e = threadIdx.x; e < kAttnBlock * nb; e += blockDim.x) {
        const int j = e / nb, b = e % nb, id = ids[j];
        if (id < keys.n_kv) continue;  // f32 rows and -1 below
        const uint8_t* pr = keys.packed + (id - keys.n_kv) * keys.packed_row_bytes;
        uint32_t w[2];
        if (wide) {
          const uint2 v = __ldg(reinterpret_cast<const uint2*>(pr + b * 8));
          w[0] = v.x, w[1] = v.y;
        } else {
          w[0] = w[1] = 0;
          for (int t = 0; t < 8; ++t) w[t / 4] |= static_cast<uint32_t>(pr[b * 8 + t]) << (8 * (t % 4));
        }
        const float s = cuda::e4m3_to_float(pr[dh / 2 + b]);
        float* out = tile + j * dh + b * 16;
#pragma unroll
        for (int t = 0; t < 16; ++t) {  // fp4_e4m3_dequant_at's value for element b * 16 + t
          const uint32_t byte = (w[t / 8] >> (8 * ((t / 2) % 4))) & 0xFFu;
          out[t] = cuda::dq::round_bf16(__fmul_rn(cuda::dq::e2m1_to_float_fast(t & 1 ? byte >> 4 : byte & 0x0Fu), s));
        }
      }
    }
    if (vec4) {
      const int row4 = dh / 4;
      for (int e = threadIdx.x; e < kAttnBlock * row4; e += blockDim.x) {
        const int j = e / row4, d4 = e % row4, id = ids[j];
        if (id >= keys.n_kv && keys.packed != nullptr) {
          if (fp4_blocks) continue;  // staged above
          const uint8_t* pr = keys.packed + (id - keys.n_kv) * keys.packed_row_bytes;
          smem4[e] = make_float4(packed_at(pr, keys.fmt, dh, 4 * d4), packed_at(pr, keys.fmt, dh, 4 * d4 + 1),
                                 packed_at(pr, keys.fmt, dh, 4 * d4 + 2), packed_at(pr, keys.fmt, dh, 4 * d4 + 3));
          continue;
        }
        const float* row = id < keys.n_kv ? keys.kv + static_cast<int64_t>(id) * dh : keys.more + (id - keys.n_kv) * dh;
        smem4[e] = id >= 0 ? __ldg(reinterpret_cast<const float4*>(row) + d4) : make_float4(0, 0, 0, 0);
      }
    } else {
      for (int e = threadIdx.x; e < kAttnBlock * dh; e += blockDim.x) {
        const int j = e / dh, d = e % dh, id = ids[j];
        if (id >= keys.n_kv && keys.packed != nullptr) {
          if (!fp4_blocks) tile[e] = packed_at(keys.packed + (id - keys.n_kv) * keys.packed_row_bytes, keys.fmt, dh, d);
          continue;
        }
        const float* row = id < keys.n_kv ? keys.kv + static_cast<int64_t>(id) * dh : keys.more + (id - keys.n_kv) * dh;
        tile[e] = id >= 0 ? __ldg(row + d) : 0.0f;
      }
    }
    __syncthreads();

    // Scores of 16 indices at a time into pbuf (lane l < 16 writes index ch * 16 + l).
#pragma unroll 1
    for (int ch = 0; ch < 4; ++ch) {
      float part[kHpw][16];
#pragma unroll
      for (int jj = 0; jj < 16; ++jj) {
        const float* row = tile + (ch * 16 + jj) * dh;
#pragma unroll
        for (int hh = 0; hh < kHpw; ++hh) part[hh][jj] = 0;
#pragma unroll
        for (int c = 0; c < DPL; ++c) {
          const int d = lane + 32 * c;
          if (d < dh) {
            const float x = row[d];
#pragma unroll
            for (int hh = 0; hh < kHpw; ++hh) part[hh][jj] = fmaf(qv[hh][c], x, part[hh][jj]);
          }
        }
      }
      const bool valid = ids[ch * 16 + (lane & 15)] >= 0;
#pragma unroll
      for (int hh = 0; hh < kHpw; ++hh) {
        const float dot = transpose_reduce16(part[hh], lane);
        if (lane < 16) pbuf[hh * kAttnBlock + ch * 16 + lane] = valid ? dot * scale : kNegInf;
      }
    }
    __syncwarp();
    if (mode == kAttnMaxPass) {  // block maxima only
#pragma unroll
      for (int hh = 0; hh < kHpw; ++hh) {
        const int h = h0 + hh;
        const float* ph = pbuf + hh * kAttnBlock;
        float bmax = fmaxf(ph[lane], ph[lane + 32]);
#pragma unroll
        for (int o = 1; o < 32; o *= 2) bmax = fmaxf(bmax, __shfl_xor_sync(0xffffffffu, bmax, o));
        if (lane == 0 && h < heads) blk_max[(r * heads + h) * nblk + blk / kAttnBlock] = bmax;
      }
      __syncwarp();
      continue;
    }

    // Online softmax update (fp32 p into the denominator, bf16 p into PV); lane: indices l, l + 32.
#pragma unroll
    for (int hh = 0; hh < kHpw; ++hh) {
      float* ph = pbuf + hh * kAttnBlock;
      const float s0 = ph[lane], s1 = ph[lane + 32];
      float bmax = fmaxf(s0, s1);
#pragma unroll
      for (int o = 1; o < 32; o *= 2) bmax = fmaxf(bmax, __shfl_xor_sync(0xffffffffu, bmax, o));
      const float new_max = cuda::attn::std_max(run_max[hh], bmax);
      const float rescale = expf(run_max[hh] - new_max);
      const float p0 = s0 == kNegInf ? 0.0f : expf(s0 - new_max);
      const float p1 = s1 == kNegInf ? 0.0f : expf(s1 - new_max);
      float psum = p0 + p1;
#pragma unroll
      for (int o = 1; o < 32; o *= 2) psum += __shfl_xor_sync(0xffffffffu, psum, o);
      ph[lane] = cuda::round_bf16(p0);
      ph[lane + 32] = cuda::round_bf16(p1);
      sum_exp[hh] = sum_exp[hh] * rescale + psum;
      run_max[hh] = new_max;
#pragma unroll
      for (int c = 0; c < DPL; ++c) acc[hh][c] *= rescale;
    }
    __syncwarp();

    // PV: acc[d] += bf16(p_j) * kv_j[d].
    for (int j = 0; j < n; ++j) {
      float pj[kHpw];
#pragma unroll
      for (int hh = 0; hh < kHpw; ++hh) pj[hh] = pbuf[hh * kAttnBlock + j];
      const float* row = tile + j * dh;
#pragma unroll
      for (int c = 0; c < DPL; ++c) {
        const int d = lane + 32 * c;
        if (d < dh) {
          const float x = row[d];
#pragma unroll
          for (int hh = 0; hh < kHpw; ++hh) acc[hh][c] = fmaf(pj[hh], x, acc[hh][c]);
        }
      }
    }
  }

  if (mode == kAttnMaxPass) return;
  if (part != nullptr) {  // a K split: unnormalised acc, max and sum to [r, h, split, dh + 2]
#pragma unroll
    for (int hh = 0; hh < kHpw; ++hh) {
      const int h = h0 + hh;
      if (h >= heads) continue;
      float* pp = part + ((r * heads + h) * gridDim.z + blockIdx.z) * (dh + 2);
#pragma unroll
      for (int c = 0; c < DPL; ++c) {
        const int d = lane + 32 * c;
        if (d < dh) pp[d] = acc[hh][c];
      }
      if (lane == 0) {
        pp[dh] = run_max[hh];
        pp[dh + 1] = sum_exp[hh];
      }
    }
    return;
  }
#pragma unroll
  for (int hh = 0; hh < kHpw; ++hh) {
    const int h = h0 + hh;
    if (h >= heads) continue;
    const float total = sum_exp[hh] + expf(cuda::attn::weight_elem(sink, sink_t, h) - run_max[hh]);
#pragma unroll
    for (int c = 0; c < DPL; ++c) {
      const int d = lane + 32 * c;
      if (d < dh) out[(r * heads + h) * dh + d] = cuda::round_bf16(acc[hh][c] / total);
    }
  }
}

template <int DPL>
void launch_sparse_attention(int64_t s, int heads, int dh, const float* q, const AttnKeys& keys, const int32_t* idx, int64_t len, const uint8_t* sink, WType sink_t, float scale,
                             float* out, CudaBackend& be) {
  // Decode has one query row per launch: fewer heads per CTA and the list split over CTAs (partials
  // merged by a second kernel) so that ~two waves of the 132 SMs share the work. The batch-invariant
  // mode splits every list into single 64-blocks instead, whatever the row count
  // (batch_invariance.cuh); warps per CTA only regroup heads, so they may follow the row count.
  const int64_t blocks = (len + kAttnBlock - 1) / kAttnBlock;
  int nwarps = std::min(kAttnWarps, (heads + kHeadsPerWarp - 1) / kHeadsPerWarp);
  if (s * ((heads + nwarps * kHeadsPerWarp - 1) / (nwarps * kHeadsPerWarp)) * blocks < 264)
    nwarps = std::min(nwarps, 4);
  const int groups = (heads + nwarps * kHeadsPerWarp - 1) / (nwarps * kHeadsPerWarp);
  const cuda::bi::ListSplit split = cuda::bi::sparse_attention_split(be.batch_invariant(), s, groups, blocks);
  const int64_t split_len = split.blocks_per_split * kAttnBlock;
  const int used =  // non-empty splits (split_len is 0 only for an empty list)
      split_len > 0 ? static_cast<int>(std::max<int64_t>(1, (len + split_len - 1) / split_len)) : 1;
  const bool merge = used > 1 || split.always_merge;
  // Rows per launch: all of them, except that the invariant mode bounds its partials' memory.
  const int64_t part_row_bytes = static_cast<int64_t>(heads) * used * (dh + 2) * 4;
  const int64_t rows_per_launch =
      be.batch_invariant() ? std::clamp<int64_t>(cuda::bi::kMaxSplitPartialBytes / part_row_bytes, 1, s) : s;
  Tensor part, bmax;
  if (merge) {
    part = be.alloc(TType::kF32, {rows_per_launch * heads * used, dh + 2});
    bmax = be.alloc(TType::kF32, {rows_per_launch * heads, blocks});
  }
  const bool vec4 = dh % 4 == 0 && reinterpret_cast<uintptr_t>(keys.kv) % 16 == 0 &&  // 16-byte kv row loads
                    reinterpret_cast<uintptr_t>(keys.more) % 16 == 0;
  const size_t smem = (static_cast<size_t>(kAttnBlock) * dh + static_cast<size_t>(nwarps) * kHeadsPerWarp * kAttnBlock) *
                      sizeof(float);
  static const bool attr_set = [] {
    const size_t max_smem =
        (static_cast<size_t>(kAttnBlock) * 32 * DPL + static_cast<size_t>(kAttnWarps) * kHeadsPerWarp * kAttnBlock) *
        sizeof(float);
    DI_CUDA_CHECK(cudaFuncSetAttribute(sparse_attention_kernel<DPL>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(max_smem)));
    return true;
  }();
  (void)attr_set;
  for (int64_t r0 = 0; r0 < s; r0 += rows_per_launch) {
    const int64_t rows = std::min(rows_per_launch, s - r0);
    const float* qr = q + r0 * heads * dh;
    const int32_t* ir = idx + r0 * len;
    float* outr = out + r0 * heads * dh;
    const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(groups), static_cast<unsigned>(used));
    if (merge) {  // pass 1: block maxima (QK only); pass 2: the splits, each from the CPU's running max
      ::di::cuda::launch(sparse_attention_kernel<DPL>, grid, nwarps * 32, smem, qr, keys, ir, len, sink, sink_t, scale,
                         heads, dh, vec4, split_len, kAttnMaxPass, bmax.f32(), nullptr, outr);
      ::di::cuda::launch(sparse_attention_kernel<DPL>, grid, nwarps * 32, smem, qr, keys, ir, len, sink, sink_t, scale,
                         heads, dh, vec4, split_len, kAttnAfterMaxPass, bmax.f32(), part.f32(), outr);
    } else {
      ::di::cuda::launch(sparse_attention_kernel<DPL>, grid, nwarps * 32, smem, qr, keys, ir, len, sink, sink_t, scale,
                         heads, dh, vec4, std::max<int64_t>(len, 1), kAttnOnePass, nullptr, nullptr, outr);
    }
    if (merge) {
      cuda::attn::combine_splits(part.f32(), used, rows, heads, dh, sink, sink_t, outr);
    }
  }
}

// ---- paged row ids -> pool rows ----------------------------------------------------------------------

// Row id v (>= 0) of a sequence whose page ids start at `pages` -> its pool row.
__device__ __forceinline__ int32_t pool_row(int32_t v, const int32_t* __restrict__ pages, int64_t rows_per_page,
                                            int64_t base) {
  return static_cast<int32_t>(base + pages[v / rows_per_page] * rows_per_page + v % rows_per_page);
}

__global__ void map_paged_rows_kernel(int32_t* __restrict__ idx, int64_t total, int64_t len,
                                      const int64_t* __restrict__ table_start, const int32_t* __restrict__ table,
                                      int64_t rows_per_page, int64_t base) {
  ::di::cuda::grid_dependency_wait();
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t v = idx[e];
    if (v >= 0) idx[e] = pool_row(v, table + table_start[e / len], rows_per_page, base);
  }
}

// out [S, a + b] = head [S, a] ++ ids [S, b] mapped as map_paged_rows_kernel maps them.
__global__ void concat_paged_rows_kernel(const int32_t* __restrict__ head, int64_t a, const int32_t* __restrict__ ids,
                                         int64_t b, int64_t total, const int64_t* __restrict__ table_start,
                                         const int32_t* __restrict__ table, int64_t rows_per_page, int64_t base,
                                         int32_t* __restrict__ out) {
  ::di::cuda::grid_dependency_wait();
  const int64_t w = a + b;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / w, c = e % w;
    if (c < a) {
      out[e] = head[r * a + c];
    } else {
      const int32_t v = ids[r * b + (c - a)];
      out[e] = v < 0 ? v : pool_row(v, table + table_start[r], rows_per_page, base);
    }
  }
}

// out[first[p] + i] = table[table_start[p] + i / rows_per_page] * rows_per_page + i % rows_per_page for
// i < length of part p (first[p + 1] - first[p]); grid (row chunks, parts).
__global__ void paged_row_list_kernel(const int64_t* __restrict__ first, const int64_t* __restrict__ table_start,
                                      const int32_t* __restrict__ table, int64_t rows_per_page,
                                      int32_t* __restrict__ out) {
  ::di::cuda::grid_dependency_wait();
  const int p = blockIdx.y;
  const int64_t n = first[p + 1] - first[p];
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[first[p] + i] =
        static_cast<int32_t>(table[table_start[p] + i / rows_per_page] * rows_per_page + i % rows_per_page);
}

// ---- softmax pooling ------------------------------------------------------------------------------

// One thread per (group, channel): ratio x 2 reads, column-coalesced. CPU order and exp (exp_ref).
__global__ void softmax_pool_kernel(const float* __restrict__ kv, const float* __restrict__ score, int ratio, int64_t d,
                                    int64_t total, float* __restrict__ out) {
  ::di::cuda::grid_dependency_wait();
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = e / d, c = e % d;
    const float* sc = score + j * ratio * d + c;
    const float* kc = kv + j * ratio * d + c;
    float mx = kNegInf;
    for (int t = 0; t < ratio; ++t) mx = cuda::attn::std_max(mx, sc[t * d]);
    float sum = 0;
    for (int t = 0; t < ratio; ++t) sum = __fadd_rn(sum, cuda::attn::exp_ref(__fsub_rn(sc[t * d], mx)));
    float acc = 0;
    for (int t = 0; t < ratio; ++t)
      acc = __fadd_rn(acc, __fmul_rn(kc[t * d], __fdiv_rn(cuda::attn::exp_ref(__fsub_rn(sc[t * d], mx)), sum)));
    out[e] = acc;
  }
}

// ---- index scores ---------------------------------------------------------------------------------

// One block per (tile of positions, query row), one thread per position. The query row [heads, hd],
// its head weights and the tile's keys sit in shared memory; each dot runs in cpu::dot's exact
// fp32 order, so the scores are bit-identical to the CPU's. heads x hd multiplies per position.
// key_off (optional): row r's keys start at row key_off[r] of `keys`.
__global__ void index_scores_kernel(const float* __restrict__ q, int heads, int hd, const float* __restrict__ keys,
                                    const int64_t* __restrict__ key_off, int64_t t_len, const float* __restrict__ w,
                                    const int64_t* __restrict__ visible, int64_t row0, float* __restrict__ out) {
  ::di::cuda::grid_dependency_wait();
  extern __shared__ float smem[];
  const int tile = blockDim.x, kstride = hd + 1;  // +1: conflict-free column reads
  float* qs = smem;                               // [heads * hd]
  float* ws = qs + heads * hd;                    // [heads]
  float* ks = ws + heads;                         // [tile, hd + 1]
  const int64_t r = row0 + blockIdx.y, t0 = static_cast<int64_t>(blockIdx.x) * tile;
  const int64_t vis = visible[r];
  if (key_off) keys += key_off[r] * hd;
  const int64_t n_load = std::max<int64_t>(0, std::min<int64_t>(std::min<int64_t>(tile, t_len - t0), vis - t0));
  if (n_load > 0) {
    for (int i = threadIdx.x; i < heads * hd; i += tile) qs[i] = q[r * heads * hd + i];
    for (int i = threadIdx.x; i < heads; i += tile) ws[i] = w[r * heads + i];
    for (int64_t e = threadIdx.x; e < n_load * hd; e += tile)
      ks[(e / hd) * kstride + e % hd] = keys[(t0 + e / hd) * hd + e % hd];
  }
  __syncthreads();
  const int64_t t = t0 + threadIdx.x;
  if (t >= t_len) return;
  if (t >= vis) {
    out[r * t_len + t] = kNegInf;
    return;
  }
  const float* kt = ks + threadIdx.x * kstride;
  float acc = 0;
  for (int h = 0; h < heads; ++h) {
    float qk = cuda::round_bf16(cuda::attn::cpu_dot_exact(qs + h * hd, kt, hd));
    qk = qk < 0.0f ? 0.0f : qk;  // std::max(qk, 0.0f)
    acc = __fadd_rn(acc, cuda::round_bf16(__fmul_rn(qk, ws[h])));
  }
  out[r * t_len + t] = cuda::round_bf16(acc);
}

// hd = 128 (V4.1's index head dim): each thread's key row lives in registers (32 16-byte loads,
// once), the query row and head weights in shared memory (broadcast 16-byte reads); the same exact
// fp32 order as above (cpu::dot's eight chains over heads in order). The kernel above read both
// operands of every product from shared memory and ran at 2 CTAs per SM (82 KB of staged keys):
// 716 us per call at batch 64 over 4K keys, where the fp32 multiplies and adds alone take ~130 us.
// kPacked: key j is row slots[j] of a packed FP4 + UE8M0 cache (68 bytes: 64 of codes, 4 scales),
// dequantized into the registers as unpack_rows does -- 68 bytes read per key instead of 512 written by
// an unpack and read back.
constexpr int kRegHd = 128;
constexpr int kRegThreads = 128;
constexpr int kPackedIndexRow = kRegHd / 2 + kRegHd / 32;  // bytes of a kFp4Ue8m0 row of 128 values
constexpr int kQStride = kRegHd / 4 + 1;                     // float4 per staged query head (padded)

// kSplit threads per key (small batches, whose kRegThreads-key CTAs leave most SMs idle: 33 CTAs for
// 4K keys at batch 1): thread part p of a key computes the head terms h = p, p + kSplit, ... and the
// part-0 thread adds all the key's terms in head order from shared memory -- the same terms and the
// same additions as one thread per key.
template <bool kPacked, int kSplit>
__global__ void __launch_bounds__(kRegThreads)
    index_scores_reg_kernel(const float* __restrict__ q, int heads, const float* __restrict__ keys,
                            const uint8_t* __restrict__ cache, const int32_t* __restrict__ slots,
                            const int64_t* __restrict__ key_off, int64_t t_len, const float* __restrict__ w,
                            const int64_t* __restrict__ visible, int64_t row0, float* __restrict__ out) {
  ::di::cuda::grid_dependency_wait();
  constexpr int kKeys = kRegThreads / kSplit;  // keys per CTA
  extern __shared__ float4 smem4[];
  const float4* qs = smem4;  // [heads, kQStride] float4: a warp's kSplit parts read kSplit heads in distinct banks
  float* ws = reinterpret_cast<float*>(smem4 + heads * kQStride);  // [heads]
  float* terms = ws + heads;                                      // [kKeys, heads] when kSplit > 1
  const int part = static_cast<int>(threadIdx.x) % kSplit, key = static_cast<int>(threadIdx.x) / kSplit;
  const int64_t r = row0 + blockIdx.y, t = static_cast<int64_t>(blockIdx.x) * kKeys + key;
  const int64_t vis = visible[r], first_key = key_off ? key_off[r] : 0;
  const float4* qr = reinterpret_cast<const float4*>(q + r * heads * kRegHd);
  for (int i = threadIdx.x; i < heads * kRegHd / 4; i += kRegThreads)
    smem4[i / (kRegHd / 4) * kQStride + i % (kRegHd / 4)] = qr[i];
  for (int i = threadIdx.x; i < heads; i += kRegThreads) ws[i] = w[r * heads + i];
  __syncthreads();
  const bool live = t < t_len && t < vis;
  if (t < t_len && !live && part == 0) out[r * t_len + t] = kNegInf;
  float acc = 0;
  if (live) {
    float k[kRegHd];
    if constexpr (kPacked) {
      // rows are 4-byte aligned (68 = 17 x 4)
      const uint32_t* row = reinterpret_cast<const uint32_t*>(cache + static_cast<int64_t>(slots[first_key + t]) *
                                                                           kPackedIndexRow);
      uint32_t words[kPackedIndexRow / 4];
#pragma unroll
      for (int j = 0; j < kPackedIndexRow / 4; ++j) words[j] = __ldg(row + j);
      // fp4_ue8m0_dequant_at on the words held in registers: value i is nibble i % 8 of word i / 8, its
      // scale byte i / 32 of word 16. An E2M1 value times a power of two is a bf16 value, so the
      // rounding to bf16 matters only for a NaN scale (0xFF).
#pragma unroll
      for (int b = 0; b < kRegHd / 32; ++b) {
        const uint8_t sbyte = static_cast<uint8_t>(words[kRegHd / 8] >> (8 * b));
        const float scale = cuda::e8m0_to_float(sbyte);
#pragma unroll
        for (int i = 32 * b; i < 32 * b + 32; ++i) {
          const float v = __fmul_rn(cuda::dq::e2m1_to_float_fast((words[i / 8] >> (4 * (i % 8))) & 0xFu), scale);
          k[i] = sbyte == 0xFF ? cuda::round_bf16(v) : v;
        }
      }
    } else {
      const float4* kp = reinterpret_cast<const float4*>(keys + (first_key + t) * kRegHd);
#pragma unroll
      for (int j = 0; j < kRegHd / 4; ++j) {
        const float4 v = kp[j];
        k[4 * j] = v.x, k[4 * j + 1] = v.y, k[4 * j + 2] = v.z, k[4 * j + 3] = v.w;
      }
    }
    for (int h = part; h < heads; h += kSplit) {
      const float4* qh = qs + h * kQStride;
      float c[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // cpu::dot's chains: c[j] sums the products i = j mod 8
#pragma unroll
      for (int i = 0; i < kRegHd / 8; ++i) {
        const float4 a = qh[2 * i], b = qh[2 * i + 1];
        c[0] = __fadd_rn(c[0], __fmul_rn(a.x, k[8 * i]));
        c[1] = __fadd_rn(c[1], __fmul_rn(a.y, k[8 * i + 1]));
        c[2] = __fadd_rn(c[2], __fmul_rn(a.z, k[8 * i + 2]));
        c[3] = __fadd_rn(c[3], __fmul_rn(a.w, k[8 * i + 3]));
        c[4] = __fadd_rn(c[4], __fmul_rn(b.x, k[8 * i + 4]));
        c[5] = __fadd_rn(c[5], __fmul_rn(b.y, k[8 * i + 5]));
        c[6] = __fadd_rn(c[6], __fmul_rn(b.z, k[8 * i + 6]));
        c[7] = __fadd_rn(c[7], __fmul_rn(b.w, k[8 * i + 7]));
      }
      float qk = cuda::round_bf16(cuda::sum_dot_chains(c, 0.0f));  // hd % 8 == 0: the tail is empty (+0)
      qk = qk < 0.0f ? 0.0f : qk;  // std::max(qk, 0.0f)
      const float term = cuda::round_bf16(__fmul_rn(qk, ws[h]));
      if constexpr (kSplit == 1) acc = __fadd_rn(acc, term);
      else terms[key * heads + h] = term;
    }
  }
  if constexpr (kSplit > 1) {
    __syncthreads();
    if (!live || part != 0) return;
    for (int h = 0; h < heads; ++h) acc = __fadd_rn(acc, terms[key * heads + h]);
  }
  if (live) out[r * t_len + t] = cuda::round_bf16(acc);
}

// index_scores_reg_kernel over rows [0, s) x keys [0, t_len): 8 or 4 threads per key while one
// thread per key would fill at most a quarter / half of the SMs (batch 1 - 2 at 4K keys), else one
// (at batch 8 the 4 threads' repeated key decoding cost more than the wider grid gained: 30.8 against
// 21.4 us per call on an H100).
template <bool kPacked>
void launch_index_scores_reg(const float* q, int heads, const float* keys, const uint8_t* cache, const int32_t* slots,
                             const int64_t* key_off, int64_t t_len, const float* w, const int64_t* visible, int64_t s,
                             float* out) {
  static const bool allowed = env_switch_on("DEEPINFER_INDEX_SPLIT");
  const int64_t ctas = (t_len + kRegThreads - 1) / kRegThreads * s, sms = cuda::sm_count();
  const int split = !allowed ? 1 : ctas <= sms / 4 ? 8 : ctas <= sms / 2 ? 4 : 1;
  const int keys_per_cta = kRegThreads / split;
  const size_t smem = static_cast<size_t>(heads) * (4 * kQStride + 1 + (split > 1 ? keys_per_cta : 0)) * sizeof(float);
  const unsigned tiles = static_cast<unsigned>((t_len + keys_per_cta - 1) / keys_per_cta);
  auto kernel = split == 8 ? index_scores_reg_kernel<kPacked, 8>
                : split == 4 ? index_scores_reg_kernel<kPacked, 4>
                             : index_scores_reg_kernel<kPacked, 1>;
  for (int64_t row0 = 0; row0 < s; row0 += 65535) {
    const unsigned nb = static_cast<unsigned>(std::min<int64_t>(65535, s - row0));
    ::di::cuda::launch(kernel, dim3(tiles, nb), kRegThreads, smem, q, heads, keys, cache, slots, key_off, t_len, w,
                       visible, row0, out);
  }
}

// keys[j] = unpack of cache row slots[j] (dim values), one thread per value.
__global__ void unpack_slots_kernel(const uint8_t* __restrict__ cache, int64_t row_bytes,
                                    const int32_t* __restrict__ slots, int64_t n, RowFormat f, int dim,
                                    float* __restrict__ keys) {
  ::di::cuda::grid_dependency_wait();
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n * dim;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x)
    keys[e] = packed_at(cache + static_cast<int64_t>(slots[e / dim]) * row_bytes, f, dim, static_cast<int>(e % dim));
}

// ---- candidate blocks -----------------------------------------------------------------------------

// bs[r, b] = max of block b of row r (std::max order), the row's newest block pinned to +inf;
// flags[r, b] = 0 (mark_blocks_kernel sets the kept ones).
__global__ void block_max_kernel(const float* __restrict__ scores, int64_t width, int block_size, int64_t n_blocks,
                                 const int64_t* __restrict__ last, int64_t total, float* __restrict__ bs,
                                 uint8_t* __restrict__ flags) {
  ::di::cuda::grid_dependency_wait();
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / n_blocks, b = e % n_blocks;
    const float* sc = scores + r * width;
    float m = kNegInf;
    for (int64_t p = b * block_size; p < std::min<int64_t>(width, (b + 1) * block_size); ++p)
      m = cuda::attn::std_max(m, sc[p]);
    bs[e] = b == last[r] ? std::numeric_limits<float>::infinity() : m;
    flags[e] = 0;
  }
}

// The candidate mask when every reachable block is kept (keep >= reach on every row, as at contexts
// up to topk_blocks x block_size): mask[r, p] = 1 for p in a block b < reach[r] that is the row's
// newest or holds a value > -inf (the blocks mark_blocks_kernel would mark), else 0. One pass
// instead of block_max, the top-k and mark / expand.
__global__ void reachable_blocks_kernel(const float* __restrict__ scores, int64_t width, int block_size,
                                        int64_t n_blocks, const int64_t* __restrict__ last, int64_t total,
                                        uint8_t* __restrict__ mask) {
  ::di::cuda::grid_dependency_wait();
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / width, b = e % width / block_size, lr = last[r];
    const int64_t reach = lr >= 0 ? std::min<int64_t>(n_blocks, lr + 1) : 0;
    bool keep = b < reach && b == lr;
    const float* sc = scores + r * width;
    for (int64_t p = b * block_size; b < reach && !keep && p < std::min<int64_t>(width, (b + 1) * block_size); ++p)
      keep = sc[p] > kNegInf;
    mask[e] = keep ? 1 : 0;
  }
}

// flags[r, list[r, i]] = 1 for the listed blocks whose score is finite.
__global__ void mark_blocks_kernel(const int32_t* __restrict__ list, int64_t keep, const float* __restrict__ bs,
                                   int64_t n_blocks, int64_t total, uint8_t* __restrict__ flags) {
  ::di::cuda::grid_dependency_wait();
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / keep;
    const int32_t b = list[e];
    if (b >= 0 && bs[r * n_blocks + b] > kNegInf) flags[r * n_blocks + b] = 1;
  }
}

// mask[r, p] = flags[r, p / block_size].
__global__ void expand_blocks_kernel(const uint8_t* __restrict__ flags, int64_t n_blocks, int64_t width, int block_size,
                                     int64_t total, uint8_t* __restrict__ mask) {
  ::di::cuda::grid_dependency_wait();
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / width, p = e % width;
    mask[e] = flags[r * n_blocks + p / block_size];
  }
}

__global__ void mask_scores_kernel(float* __restrict__ scores, const uint8_t* __restrict__ keep, int64_t total) {
  ::di::cuda::grid_dependency_wait();
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x)
    if (!keep[e]) scores[e] = kNegInf;
}

constexpr int kElemThreads = 256;
unsigned elem_blocks(int64_t total) {
  return static_cast<unsigned>(std::min<int64_t>(cuda::blocks_for(total, kElemThreads), 65536));
}

}  // namespace

Tensor CudaBackend::sparse_attention(const Tensor& q, int heads, const Tensor& kv, const Tensor& idx, const Weight& sink,
                                     float softmax_scale, const Tensor& kv_more, RowFormat more_format) {
  const int64_t s = q.rows(), d = kv.row_size(), len = idx.row_size();
  DI_CHECK(q.type == TType::kF32 && kv.type == TType::kF32 && idx.type == TType::kI32);
  const bool packed = !kv_more.empty() && kv_more.type == TType::kU8;
  DI_CHECK(kv_more.empty() || (packed ? kv_more.row_size() == packed_row_bytes(more_format, d)
                                      : kv_more.type == TType::kF32 && kv_more.row_size() == d));
  const AttnKeys keys{kv.f32(),  kv.rows(), packed || kv_more.empty() ? nullptr : kv_more.f32(),
                      packed ? kv_more.u8() : nullptr, kv_more.empty() ? 0 : kv_more.rows(),
                      packed ? kv_more.row_size() : 0, more_format};
  DI_CHECK(heads > 0 && q.row_size() == heads * d && idx.rows() == s);
  DI_CHECK(sink.rows * sink.cols >= heads);
  const WType sink_t = cuda::attn::weight_type(sink, "sparse_attention", "sink");
  Tensor out = alloc(TType::kF32, {s, heads * d});
  if (s == 0 || d == 0) return out;
  if (d > 512)
    throw Error("cuda op sparse_attention: head dim " + std::to_string(d) + " is not supported (at most 512)");
  const int dh = static_cast<int>(d);
  const uint8_t* sk = cuda::wdata(sink);
  if (cuda::attn::sparse_attention_mma_fits(q.f32(), heads, dh, keys, len)) {
    cuda::attn::sparse_attention_mma(s, heads, dh, q.f32(), keys, idx.i32(), len, sk, sink_t, softmax_scale, out.f32(), *this);
    return out;
  }
  const int need = (dh + 31) / 32;
  if (need <= 1) launch_sparse_attention<1>(s, heads, dh, q.f32(), keys, idx.i32(), len, sk, sink_t, softmax_scale, out.f32(), *this);
  else if (need <= 2) launch_sparse_attention<2>(s, heads, dh, q.f32(), keys, idx.i32(), len, sk, sink_t, softmax_scale, out.f32(), *this);
  else if (need <= 4) launch_sparse_attention<4>(s, heads, dh, q.f32(), keys, idx.i32(), len, sk, sink_t, softmax_scale, out.f32(), *this);
  else if (need <= 8) launch_sparse_attention<8>(s, heads, dh, q.f32(), keys, idx.i32(), len, sk, sink_t, softmax_scale, out.f32(), *this);
  else launch_sparse_attention<16>(s, heads, dh, q.f32(), keys, idx.i32(), len, sk, sink_t, softmax_scale, out.f32(), *this);
  return out;
}

namespace {

// The largest id a row may hold maps below 2^31 (ids < its table's pages x rows_per_page).
void check_pool_rows(const std::vector<int32_t>& table, int64_t rows_per_page, int64_t base, const char* op) {
  int64_t max_page = 0;
  for (int32_t p : table) max_page = std::max<int64_t>(max_page, p);
  DI_CHECK_MSG(base + (max_page + 1) * rows_per_page <= (int64_t{1} << 31), std::string(op) + ": pool rows past 2^31");
}

}  // namespace

void CudaBackend::map_paged_rows(Tensor& idx, const std::vector<int64_t>& table_start, const std::vector<int32_t>& table,
                                 int64_t rows_per_page, int64_t base) {
  const int64_t s = idx.rows(), len = idx.row_size();
  DI_CHECK(idx.type == TType::kI32 && static_cast<int64_t>(table_start.size()) == s && rows_per_page > 0);
  check_pool_rows(table, rows_per_page, base, "map_paged_rows");
  if (s * len == 0 || table.empty()) return;
  Scratch starts = cuda::attn::upload(table_start), pages = cuda::attn::upload(table);
  ::di::cuda::launch(map_paged_rows_kernel, elem_blocks(s * len), kElemThreads, 0, idx.i32(), s * len, len,
                     starts.as<int64_t>(), pages.as<int32_t>(), rows_per_page, base);
}

Tensor CudaBackend::concat_paged_rows(const Tensor& head, const Tensor& ids, const std::vector<int64_t>& table_start,
                                      const std::vector<int32_t>& table, int64_t rows_per_page, int64_t base) {
  if (!fused_chains_) return Backend::concat_paged_rows(head, ids, table_start, table, rows_per_page, base);
  const int64_t s = head.rows(), a = head.row_size(), b = ids.row_size();
  DI_CHECK(head.type == TType::kI32 && ids.type == TType::kI32 && ids.rows() == s);
  DI_CHECK(static_cast<int64_t>(table_start.size()) == s && rows_per_page > 0);
  check_pool_rows(table, rows_per_page, base, "concat_paged_rows");
  // a table-less batch holds no id >= 0 to map: the plain concatenation
  if (table.empty()) return concat_cols(head, ids);
  Tensor out = alloc(TType::kI32, {s, a + b});
  if (s * (a + b) == 0) return out;
  ::di::cuda::launch(concat_paged_rows_kernel, elem_blocks(s * (a + b)), kElemThreads, 0, head.i32(), a, ids.i32(), b,
                     s * (a + b), page_uploads_->get(table_start), page_uploads_->get(table), rows_per_page, base,
                     out.i32());
  return out;
}

Tensor CudaBackend::paged_row_list(const std::vector<int64_t>& lengths, const std::vector<int64_t>& table_start,
                                   const std::vector<int32_t>& table, int64_t rows_per_page) {
  DI_CHECK(lengths.size() == table_start.size() && rows_per_page > 0 && lengths.size() <= 65535);
  std::vector<int64_t> first(lengths.size() + 1, 0);
  int64_t longest = 0;
  for (size_t p = 0; p < lengths.size(); ++p) {
    // every row of the part has a page, and the pool rows stay below 2^31 (checked here, on the host)
    DI_CHECK(lengths[p] >= 0 && table_start[p] >= 0 &&
             table_start[p] + (lengths[p] + rows_per_page - 1) / rows_per_page <= static_cast<int64_t>(table.size()));
    first[p + 1] = first[p] + lengths[p];
    longest = std::max(longest, lengths[p]);
  }
  check_pool_rows(table, rows_per_page, 0, "paged_row_list");
  Tensor out = alloc(TType::kI32, {first.back()});
  if (first.back() == 0) return out;
  Scratch firsts_keep;
  const int64_t* firsts = cuda::upload_via(list_uploads_.get(), first, firsts_keep);
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(cuda::blocks_for(longest, kElemThreads), 1024)),
                  static_cast<unsigned>(lengths.size()));
  ::di::cuda::launch(paged_row_list_kernel, grid, kElemThreads, 0, firsts, page_uploads_->get(table_start),
                     page_uploads_->get(table), rows_per_page, out.i32());
  return out;
}

Tensor CudaBackend::softmax_pool(const Tensor& kv, const Tensor& score, int ratio) {
  DI_CHECK(ratio > 0);
  const int64_t d = kv.row_size(), g = kv.rows() / ratio;
  DI_CHECK(kv.rows() % ratio == 0 && score.rows() == kv.rows() && score.row_size() == d);
  Tensor out = alloc(TType::kF32, {g, d});
  const int64_t total = g * d;
  if (total == 0) return out;
  ::di::cuda::launch(softmax_pool_kernel, elem_blocks(total), kElemThreads, 0, kv.f32(), score.f32(), ratio, d, total,
                     out.f32());
  return out;
}

Tensor CudaBackend::index_scores(const Tensor& q, int heads, const Tensor& keys, const Tensor& w,
                                 const std::vector<int64_t>& visible, const std::vector<int64_t>& key_offsets) {
  const int64_t s = q.rows(), hd = keys.row_size();
  const int64_t t_len = key_offsets.empty() ? keys.rows() : index_width(visible);
  DI_CHECK(heads > 0 && q.row_size() == heads * hd && w.row_size() == heads && w.rows() == s &&
           static_cast<int64_t>(visible.size()) == s);
  check_key_offsets(key_offsets, visible, keys.rows());
  Tensor out = alloc(TType::kF32, {s, t_len});
  if (s == 0 || t_len == 0) return out;
  // Positions per block: 128 unless the query row and key tile overflow shared memory.
  int tile = 128;
  auto smem_for = [&](int t) { return static_cast<size_t>(heads * hd + heads + t * (hd + 1)) * sizeof(float); };
  constexpr size_t kMaxSmem = 200 * 1024;
  while (tile > 32 && smem_for(tile) > kMaxSmem) tile /= 2;
  if (smem_for(tile) > kMaxSmem)
    throw Error("cuda op index_scores: " + std::to_string(heads) + " heads x " + std::to_string(hd) +
                " dims do not fit in shared memory");
  static const bool attr_set = [] {
    DI_CUDA_CHECK(cudaFuncSetAttribute(index_scores_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(kMaxSmem)));
    return true;
  }();
  (void)attr_set;
  Scratch vis_keep, offs_keep;
  const int64_t* vis = cuda::upload_via(list_uploads_.get(), visible, vis_keep);
  const int64_t* offs = cuda::upload_via(list_uploads_.get(), key_offsets, offs_keep);
  if (hd == kRegHd && heads <= 64) {  // keys in registers, the query row in <= 40 KB of shared memory
    launch_index_scores_reg<false>(q.f32(), heads, keys.f32(), nullptr, nullptr, offs, t_len, w.f32(),
                                   vis, s, out.f32());
    return out;
  }
  const unsigned tiles = static_cast<unsigned>((t_len + tile - 1) / tile);
  for (int64_t row0 = 0; row0 < s; row0 += 65535) {
    const unsigned nb = static_cast<unsigned>(std::min<int64_t>(65535, s - row0));
    ::di::cuda::launch(index_scores_kernel, dim3(tiles, nb), tile, smem_for(tile), q.f32(), heads, static_cast<int>(hd),
                       keys.f32(), offs, t_len, w.f32(), vis, row0, out.f32());
  }
  return out;
}

Tensor CudaBackend::index_scores_packed(const Tensor& q, int heads, const Tensor& cache, RowFormat format,
                                        const Tensor& slots, const Tensor& w, const std::vector<int64_t>& visible,
                                        const std::vector<int64_t>& key_offsets) {
  DI_CHECK(heads > 0 && q.row_size() % heads == 0 && slots.type == TType::kI32 && cache.type == TType::kU8);
  const int64_t s = q.rows(), hd = q.row_size() / heads, n_keys = slots.numel();
  DI_CHECK(cache.row_size() == packed_row_bytes(format, hd));
  if (!(format == RowFormat::kFp4Ue8m0 && hd == kRegHd && heads <= 64)) {  // other shapes: unpack, then score
    Tensor keys = alloc(TType::kF32, {n_keys, hd});
    if (n_keys > 0) {
      ::di::cuda::launch(unpack_slots_kernel, elem_blocks(n_keys * hd), kElemThreads, 0, cache.u8(), cache.row_size(),
                         slots.i32(), n_keys, format, static_cast<int>(hd), keys.f32());
    }
    return index_scores(q, heads, keys, w, visible, key_offsets);
  }
  const int64_t t_len = key_offsets.empty() ? n_keys : index_width(visible);
  DI_CHECK(w.row_size() == heads && w.rows() == s && static_cast<int64_t>(visible.size()) == s);
  check_key_offsets(key_offsets, visible, n_keys);
  Tensor out = alloc(TType::kF32, {s, t_len});
  if (s == 0 || t_len == 0) return out;
  Scratch vis_keep, offs_keep;
  const int64_t* vis = cuda::upload_via(list_uploads_.get(), visible, vis_keep);
  const int64_t* offs = cuda::upload_via(list_uploads_.get(), key_offsets, offs_keep);
  launch_index_scores_reg<true>(q.f32(), heads, nullptr, cache.u8(), slots.i32(), offs, t_len, w.f32(),
                                vis, s, out.f32());
  return out;
}

Tensor CudaBackend::select_candidates(const Tensor& scores, const std::vector<int64_t>& visible, int topk_blocks,
                                      int block_size, TieBreak ties) {
  const int64_t s = scores.rows(), width = scores.row_size();
  DI_CHECK(block_size > 0 && topk_blocks >= 0 && static_cast<int64_t>(visible.size()) == s);
  const int64_t n_blocks = (width + block_size - 1) / block_size;
  Tensor mask = alloc(TType::kU8, {s, width});  // every byte written below
  if (s == 0 || n_blocks == 0) return mask;
  const int64_t keep = std::min<int64_t>(topk_blocks, n_blocks);
  std::vector<int64_t> last(s), reach(s), kr(s);
  bool keeps_all = ties == TieBreak::kLowestIndex;  // the lowest-index top-k of reach blocks out of reach: all
  for (int64_t r = 0; r < s; ++r) {
    last[r] = visible[r] > 0 ? (visible[r] - 1) / block_size : -1;
    reach[r] = last[r] >= 0 ? std::min<int64_t>(n_blocks, last[r] + 1) : 0;
    kr[r] = std::min(keep, reach[r]);
    keeps_all = keeps_all && kr[r] == reach[r];
  }
  Scratch last_keep;
  const int64_t* last_dev = cuda::upload_via(list_uploads_.get(), last, last_keep);
  if (keeps_all) {
    ::di::cuda::launch(reachable_blocks_kernel, elem_blocks(s * width), kElemThreads, 0, scores.f32(), width,
                       block_size, n_blocks, last_dev, s * width, mask.u8());
    return mask;
  }
  // Block scores [S, n_blocks] with the newest block pinned; flags [S, n_blocks] of the kept blocks.
  Scratch bs(static_cast<size_t>(s * n_blocks) * sizeof(float)), flags(static_cast<size_t>(s * n_blocks));
  ::di::cuda::launch(block_max_kernel, elem_blocks(s * n_blocks), kElemThreads, 0, scores.f32(), width, block_size,
                     n_blocks, last_dev, s * n_blocks, bs.as<float>(), flags.as<uint8_t>());
  if (keep > 0) {
    Scratch list(static_cast<size_t>(s * keep) * sizeof(int32_t));
    if (ties == TieBreak::kTorch)  // reference-compatibility path: torch.topk's choice among ties (torch_select.h)
      cuda::attn::topk_torch(bs.as<float>(), s, n_blocks, n_blocks, keep, list.as<int32_t>());
    else
      cuda::attn::topk_lowest_index(bs.as<float>(), s, n_blocks, reach, kr, keep, 0, list.as<int32_t>(),
                                    list_uploads_.get());
    ::di::cuda::launch(mark_blocks_kernel, elem_blocks(s * keep), kElemThreads, 0, list.as<int32_t>(), keep,
                       bs.as<float>(), n_blocks, s * keep, flags.as<uint8_t>());
  }
  ::di::cuda::launch(expand_blocks_kernel, elem_blocks(s * width), kElemThreads, 0, flags.as<uint8_t>(), n_blocks,
                     width, block_size, s * width, mask.u8());
  return mask;
}

void CudaBackend::mask_scores(Tensor& scores, const Tensor& keep_mask) {
  DI_CHECK(keep_mask.numel() == scores.numel() && keep_mask.type == TType::kU8 && scores.type == TType::kF32);
  const int64_t total = scores.numel();
  if (total == 0) return;
  ::di::cuda::launch(mask_scores_kernel, elem_blocks(total), kElemThreads, 0, scores.f32(), keep_mask.u8(), total);
}

Tensor CudaBackend::topk_indices(const Tensor& scores, int k, const std::vector<int64_t>& visible, int offset,
                                 TieBreak ties) {
  const int64_t s = scores.rows(), width = scores.row_size();
  DI_CHECK(k >= 0 && k <= width && static_cast<int64_t>(visible.size()) == s);
  Tensor out = alloc(TType::kI32, {s, k});
  if (s == 0 || k == 0) return out;
  if (ties == TieBreak::kTorch) {
    // Reference-compatibility path: torch.topk's choice among ties over the whole row (the CPU's
    // kTorch), emulated on the device (torch_select.h); then ascending, invisible entries -1.
    Scratch sel(static_cast<size_t>(s * k) * sizeof(int32_t)), vis_keep;
    const int64_t* vis = cuda::upload_via(list_uploads_.get(), visible, vis_keep);
    cuda::attn::topk_torch(scores.f32(), s, width, width, k, sel.as<int32_t>());
    cuda::attn::sorted_selection(sel.as<int32_t>(), s, k, vis, offset, out.i32());
    return out;
  }
  // Only visible positions can be picked; the rest of the row stays -1.
  std::vector<int64_t> n(s), kr(s);
  for (int64_t r = 0; r < s; ++r) {
    n[r] = std::clamp<int64_t>(visible[r], 0, width);
    kr[r] = std::min<int64_t>(k, n[r]);
  }
  cuda::attn::topk_lowest_index(scores.f32(), s, width, n, kr, k, offset, out.i32(), list_uploads_.get());
  return out;
}

}  // namespace di
