// Exact top-k with ties to the lowest index (TieBreak::kLowestIndex) on the device.
//
// Order: (value desc, index asc), a strict total order, so the selected set is unique. Each value
// becomes a 32-bit key (smaller = better, attn::desc_key); a block-wide radix select (4 passes of
// 8 bits, warp-aggregated shared-memory histograms) finds the k-th smallest key T and how many
// elements equal to T are needed; a pass in index order then keeps every key < T and the first
// `need` keys == T, compacting them with block prefix counts, so the output is already ascending.
//
// Long rows (500k positions) run in two stages so that a single row still spreads over the GPU:
// stage A selects the top-k of each chunk of C positions (one block per chunk) into a candidate
// list; stage B selects the top-k of a row's candidates. The global top-k is contained in the union
// of the chunk top-k's, and candidates stay in index order, so stage B's ties resolve the same way.
#include <algorithm>

#include "backend/cuda/attn_common.cuh"
#include "backend/cuda/attn_topk.cuh"
#include "backend/cuda/pdl_launch.cuh"
#include "backend/cuda/torch_select.h"

namespace di::cuda::attn {
namespace {

constexpr int kSelThreads = 512;
constexpr int kSelWarps = kSelThreads / 32;
constexpr int64_t kMinChunk = 8192;                   // positions per stage-A block
constexpr int64_t kStagedKeys = 8192;                 // a chunk's keys held in shared memory (32 KB)
constexpr int64_t kMaxCandidateBytes = 64ll << 20;     // candidate scratch per batch of rows

struct SelectShared {
  uint32_t hist[256];
  uint32_t warp_a[kSelWarps], warp_b[kSelWarps];
  uint32_t bin, rem;
};

// Threshold of the kk smallest keys among m: T = the kk-th smallest key, need = how many keys
// equal to T belong to the selection (>= 1). kk >= 1, kk <= m. Every thread gets the result.
template <class Key>
__device__ void radix_threshold(const Key& key, int64_t m, int64_t kk, SelectShared& sh, uint32_t& t_out,
                                uint32_t& need_out) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t m_round = (m + kSelThreads - 1) / kSelThreads * kSelThreads;
  uint32_t prefix = 0, rem = static_cast<uint32_t>(kk);
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += kSelThreads) sh.hist[i] = 0;
    __syncthreads();
    const uint32_t himask = shift == 24 ? 0u : (0xffffffffu << (shift + 8));
    for (int64_t i = threadIdx.x; i < m_round; i += kSelThreads) {
      const bool in = i < m;
      const uint32_t u = in ? key(i) : 0u;
      const bool take = in && (u & himask) == prefix;
      const uint32_t bin = (u >> shift) & 255u;
      const unsigned active = __ballot_sync(0xffffffffu, take);
      if (take) {  // one shared atomic per distinct bin per warp (score rows hold many exact ties)
        const unsigned peers = __match_any_sync(active, bin);
        if (lane == __ffs(peers) - 1) atomicAdd(&sh.hist[bin], static_cast<uint32_t>(__popc(peers)));
      }
    }
    __syncthreads();
    if (warp == 0) {
      uint32_t c[8], tot = 0;
#pragma unroll
      for (int b = 0; b < 8; ++b) tot += (c[b] = sh.hist[lane * 8 + b]);
      uint32_t incl = tot;
      for (int o = 1; o < 32; o *= 2) {
        const uint32_t v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
      }
      const uint32_t excl = incl - tot;
      const unsigned here = __ballot_sync(0xffffffffu, excl < rem && rem <= incl);
      if (lane == __ffs(here) - 1) {
        uint32_t cum = excl;
        for (int b = 0; b < 8; ++b) {
          if (cum + c[b] >= rem) {
            sh.bin = static_cast<uint32_t>(lane * 8 + b);
            sh.rem = rem - cum;
            break;
          }
          cum += c[b];
        }
      }
    }
    __syncthreads();
    prefix |= sh.bin << shift;
    rem = sh.rem;
    __syncthreads();  // sh.bin / sh.rem are rewritten by the next pass
  }
  t_out = prefix;
  need_out = rem;
}

// Visits the selected positions: emit(pos, i) with pos = rank among the selected in index order.
// Selected: every key < t, and the first `need` keys == t in index order. So the rank of position i is
// (keys < t before i) + min(keys == t before i, need), and one block-wide prefix of the two counts
// places everything: warp w owns the positions [w * span, (w + 1) * span) in 32-wide steps, counts
// them with ballots, the warps' totals are scanned once, then each warp walks its steps again and
// emits. (The tile-by-tile version scanned the 16 warps' counts twice per 512 positions: at 4096
// positions ~60% of the kernel's instructions.)
template <class Key, class Emit>
__device__ void compact_selected(const Key& key, int64_t m, uint32_t t, uint32_t need, SelectShared& sh,
                                 const Emit& emit) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const unsigned lt_mask = (1u << lane) - 1u;
  const int64_t span = (m + kSelThreads - 1) / kSelThreads * 32;  // positions per warp, a multiple of 32
  const int64_t w0 = warp * span, w1 = std::min(m, w0 + span);
  auto masks = [&](int64_t i, unsigned& less, unsigned& tie) {
    const uint32_t u = i < w1 ? key(i) : 0xffffffffu;
    less = __ballot_sync(0xffffffffu, i < w1 && u < t);
    tie = __ballot_sync(0xffffffffu, i < w1 && u == t);
  };
  uint32_t less_n = 0, tie_n = 0;  // this warp's counts (warp-uniform)
  for (int64_t base = w0; base < w1; base += 32) {
    unsigned less, tie;
    masks(base + lane, less, tie);
    less_n += static_cast<uint32_t>(__popc(less));
    tie_n += static_cast<uint32_t>(__popc(tie));
  }
  if (lane == 0) sh.warp_a[warp] = less_n, sh.warp_b[warp] = tie_n;
  __syncthreads();
  uint32_t less_before = 0, tie_before = 0;  // over the warps before this one
  for (int w = 0; w < warp; ++w) less_before += sh.warp_a[w], tie_before += sh.warp_b[w];
  for (int64_t base = w0; base < w1; base += 32) {
    unsigned less, tie;
    masks(base + lane, less, tie);
    const uint32_t lb = less_before + static_cast<uint32_t>(__popc(less & lt_mask));
    const uint32_t tb = tie_before + static_cast<uint32_t>(__popc(tie & lt_mask));
    const bool is_less = (less >> lane) & 1u, is_tie = (tie >> lane) & 1u;
    if (is_less || (is_tie && tb < need)) emit(lb + std::min(tb, need), base + lane);
    less_before += static_cast<uint32_t>(__popc(less));
    tie_before += static_cast<uint32_t>(__popc(tie));
  }
}

// out[r, from .. out_k) = -1: the rest of a row past its selection.
__device__ __forceinline__ void fill_unselected(int32_t* __restrict__ row_out, int64_t from, int64_t out_k) {
  for (int64_t i = max(from, int64_t{0}) + threadIdx.x; i < out_k; i += kSelThreads) row_out[i] = -1;
}

// Stage A: one block per (chunk, row). A chunk of <= kStagedKeys values is read once into shared
// memory as keys, which the radix passes and the compaction then read (a 4096-position row at batch
// 1: 16.9 -> 14.6 us on an H100, reading L2 five times before); longer chunks are read 5 times
// (L1/L2-resident). With one chunk the result is final (and the row's tail -1s are written here);
// otherwise min(k, len) (key, index) candidates per chunk.
__global__ void __launch_bounds__(kSelThreads) select_chunk_kernel(
    const float* __restrict__ values, int64_t stride, int64_t row0, const int64_t* __restrict__ n_rows,
    const int64_t* __restrict__ k_rows, int64_t chunk, int64_t n_chunks, int64_t kmax, uint32_t* __restrict__ cand_u,
    int32_t* __restrict__ cand_i, int64_t out_k, int32_t offset, int32_t* __restrict__ out) {
  ::di::cuda::grid_dependency_wait();
  __shared__ SelectShared sh;
  __shared__ uint32_t staged[kStagedKeys];
  const int64_t rb = blockIdx.y, r = row0 + rb, c = blockIdx.x;
  const int64_t n = n_rows[r], k = k_rows[r], base = c * chunk;
  const int64_t len = std::min(chunk, n - base);
  const bool final = n <= chunk;
  if (final && c == 0) fill_unselected(out + r * out_k, len > 0 ? std::min(k, len) : 0, out_k);
  if (len <= 0 || k <= 0) return;
  const int64_t kk = std::min(k, len);
  const float* row = values + r * stride + base;
  auto select = [&](const auto& key) {
    uint32_t t, need;
    radix_threshold(key, len, kk, sh, t, need);
    if (final) {
      int32_t* o = out + r * out_k;
      compact_selected(key, len, t, need, sh,
                       [&](uint32_t pos, int64_t i) { o[pos] = static_cast<int32_t>(i + offset); });
    } else {
      const int64_t slot = (rb * n_chunks + c) * kmax;
      compact_selected(key, len, t, need, sh, [&](uint32_t pos, int64_t i) {
        cand_u[slot + pos] = key(i);
        cand_i[slot + pos] = static_cast<int32_t>(base + i);
      });
    }
  };
  if (len <= kStagedKeys) {
    for (int64_t i = threadIdx.x; i < len; i += kSelThreads) staged[i] = desc_key(__ldg(row + i));
    __syncthreads();
    select([&](int64_t i) { return staged[i]; });
  } else {
    select([&](int64_t i) { return desc_key(__ldg(row + i)); });
  }
}

// Stage B: one block per multi-chunk row, over its candidates (every full chunk gave k of them).
__global__ void __launch_bounds__(kSelThreads) select_candidates_kernel(
    int64_t row0, const int64_t* __restrict__ n_rows, const int64_t* __restrict__ k_rows, int64_t chunk,
    int64_t n_chunks, int64_t kmax, const uint32_t* __restrict__ cand_u, const int32_t* __restrict__ cand_i,
    int64_t out_k, int32_t offset, int32_t* __restrict__ out) {
  ::di::cuda::grid_dependency_wait();
  __shared__ SelectShared sh;
  const int64_t rb = blockIdx.x, r = row0 + rb;
  const int64_t n = n_rows[r], k = k_rows[r];
  if (n <= chunk) return;  // selected by stage A
  int32_t* o = out + r * out_k;
  fill_unselected(o, std::max<int64_t>(k, 0), out_k);
  if (k <= 0) return;
  const int64_t full = (n - 1) / chunk;  // chunks before the last one
  const int64_t m = full * k + std::min(k, n - full * chunk);
  const int64_t slot0 = rb * n_chunks * kmax;
  auto at = [&](int64_t i) { return slot0 + (i / k) * kmax + i % k; };
  auto key = [&](int64_t i) { return cand_u[at(i)]; };
  uint32_t t, need;
  radix_threshold(key, m, k, sh, t, need);
  compact_selected(key, m, t, need, sh,
                   [&](uint32_t pos, int64_t i) { o[pos] = static_cast<int32_t>(cand_i[at(i)] + offset); });
}

// kTorch, one warp (block) per row; scratch: k pairs per row (heap branch) or n (nth_element).
__global__ void __launch_bounds__(32) torch_select_kernel(const float* __restrict__ values, int64_t stride, int64_t n,
                                                          int64_t k, int64_t row0, torch_select::Pair* scratch,
                                                          int32_t* __restrict__ sel) {
  ::di::cuda::grid_dependency_wait();
  using torch_select::Pair;
  const int64_t r = row0 + blockIdx.x;
  const int lane = threadIdx.x;
  const float* v = values + r * stride;
  int32_t* out = sel + r * k;
  if (torch_select::uses_heap(n, k)) {
    Pair* heap = scratch + static_cast<int64_t>(blockIdx.x) * k;
    for (int64_t j = lane; j < k; j += 32) heap[j] = Pair{v[j], static_cast<int32_t>(j)};
    __syncwarp();
    if (lane == 0) torch_select::make_heap(heap, k);
    __syncwarp();
    float top = heap[0].v;
    for (int64_t base = k; base < n; base += 32) {
      const int64_t j = base + lane;
      const float x = j < n ? __ldg(v + j) : 0.0f;
      unsigned cand = __ballot_sync(0xffffffffu, j < n && x > top);
      while (cand) {  // in index order; the top only rises, so later candidates are re-checked
        const int src = __ffs(cand) - 1;
        cand &= cand - 1;
        const float xv = __shfl_sync(0xffffffffu, x, src);
        if (xv > top) {
          if (lane == 0) torch_select::adjust_heap(heap, 0, k, Pair{xv, static_cast<int32_t>(base + src)});
          __syncwarp();
          top = heap[0].v;
        }
      }
    }
    __syncwarp();
    for (int64_t j = lane; j < k; j += 32) out[j] = heap[j].i;
  } else {
    Pair* f = scratch + static_cast<int64_t>(blockIdx.x) * n;
    for (int64_t j = lane; j < n; j += 32) f[j] = Pair{v[j], static_cast<int32_t>(j)};
    __syncwarp();
    if (lane == 0) torch_select::nth_element(f, k - 1, n);
    __syncwarp();
    for (int64_t j = lane; j < k; j += 32) out[j] = f[j].i;
  }
}

// One block per row: rank of each selected index among the row's k (distinct) indices.
__global__ void sorted_selection_kernel(const int32_t* __restrict__ sel, int64_t k, const int64_t* __restrict__ visible,
                                        int32_t offset, int32_t* __restrict__ out) {
  ::di::cuda::grid_dependency_wait();
  const int64_t r = blockIdx.x;
  const int32_t* s = sel + r * k;
  for (int64_t i = threadIdx.x; i < k; i += blockDim.x) {
    const int32_t x = s[i];
    int64_t rank = 0;
    for (int64_t j = 0; j < k; ++j) rank += __ldg(s + j) < x;
    out[r * k + rank] = x < visible[r] ? x + offset : -1;
  }
}

}  // namespace

void topk_torch(const float* values, int64_t rows, int64_t stride, int64_t n, int64_t k, int32_t* sel) {
  DI_CHECK(k >= 0 && k <= n && n <= stride && n <= INT32_MAX);
  if (rows == 0 || k == 0) return;
  const int64_t per_row = (torch_select::uses_heap(n, k) ? k : n) * static_cast<int64_t>(sizeof(torch_select::Pair));
  const int64_t batch = std::max<int64_t>(1, std::min<int64_t>({rows, 65535, kMaxCandidateBytes / per_row}));
  Scratch scratch(static_cast<size_t>(batch * per_row));
  for (int64_t row0 = 0; row0 < rows; row0 += batch) {
    const int64_t nb = std::min(batch, rows - row0);
    ::di::cuda::launch(torch_select_kernel, static_cast<unsigned>(nb), 32, 0, values, stride, n, k, row0,
                       scratch.as<torch_select::Pair>(), sel);
  }
}

void sorted_selection(const int32_t* sel, int64_t rows, int64_t k, const int64_t* visible, int32_t offset,
                      int32_t* out) {
  if (rows == 0 || k == 0) return;
  DI_CHECK(rows <= 0x7fffffff);
  ::di::cuda::launch(sorted_selection_kernel, static_cast<unsigned>(rows), 256, 0, sel, k, visible, offset, out);
}

void topk_lowest_index(const float* values, int64_t rows, int64_t stride, const std::vector<int64_t>& n,
                       const std::vector<int64_t>& k, int64_t out_k, int32_t offset, int32_t* out,
                       UploadCache* lists) {
  DI_CHECK(static_cast<int64_t>(n.size()) == rows && static_cast<int64_t>(k.size()) == rows);
  if (rows == 0 || out_k == 0) return;
  int64_t kmax = 0, nmax = 0;
  for (int64_t r = 0; r < rows; ++r) {
    DI_CHECK(k[r] >= 0 && k[r] <= n[r] && n[r] <= stride && k[r] <= out_k);
    kmax = std::max(kmax, k[r]);
    nmax = std::max(nmax, n[r]);
  }
  DI_CHECK(nmax <= INT32_MAX);
  const int64_t chunk = std::max(kMinChunk, 4 * kmax);
  const int64_t n_chunks = std::max<int64_t>(1, (nmax + chunk - 1) / chunk);  // >= 1: stage A writes the -1s
  std::vector<int64_t> nk(n);  // n then k: one upload
  nk.insert(nk.end(), k.begin(), k.end());
  Scratch nk_keep;
  const int64_t* n_dev = upload_via(lists, nk, nk_keep);
  const int64_t* k_dev = n_dev + rows;
  // Rows per batch: bounded by the candidate scratch and by the grid's y limit.
  const int64_t per_row = n_chunks > 1 ? n_chunks * kmax * 8 : 0;
  const int64_t batch = std::max<int64_t>(1, std::min<int64_t>(65535, per_row ? kMaxCandidateBytes / per_row : rows));
  const int64_t batch_rows = std::min(batch, rows);
  Scratch cu, ci;
  if (n_chunks > 1) {
    cu = Scratch(static_cast<size_t>(batch_rows * n_chunks * kmax) * 4);
    ci = Scratch(static_cast<size_t>(batch_rows * n_chunks * kmax) * 4);
  }
  for (int64_t row0 = 0; row0 < rows; row0 += batch_rows) {
    const int64_t nb = std::min(batch_rows, rows - row0);
    ::di::cuda::launch(select_chunk_kernel, dim3(static_cast<unsigned>(n_chunks), static_cast<unsigned>(nb)),
                       kSelThreads, 0, values, stride, row0, n_dev, k_dev, chunk, n_chunks,
                       kmax, cu.as<uint32_t>(), ci.as<int32_t>(), out_k, offset, out);
    if (n_chunks > 1) {
      ::di::cuda::launch(select_candidates_kernel, static_cast<unsigned>(nb), kSelThreads, 0, row0, n_dev,
                         k_dev, chunk, n_chunks, kmax, cu.as<uint32_t>(), ci.as<int32_t>(), out_k, offset,
                         out);
    }
  }
}

}  // namespace di::cuda::attn
