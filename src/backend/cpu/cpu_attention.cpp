// CPU backend: sparse attention with the sink, compressor pooling, the lightning indexer's scores,
// candidate blocks and top-k selection.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "backend/cpu/torch_topk.h"
#include "core/thread_pool.h"
#include "model/quant.h"

namespace di {
namespace {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int kAttnBlock = 64;  // the reference kernel's index block
}  // namespace

Tensor CpuBackend::sparse_attention(const Tensor& q, int heads, const Tensor& kv, const Tensor& idx,
                                    const Weight& sink, float softmax_scale, const Tensor& kv_more,
                                    RowFormat more_format) {
  int64_t s = q.rows(), d = kv.row_size(), l = idx.row_size(), n_kv = kv.rows();
  DI_CHECK(q.row_size() == heads * d && idx.rows() == s);
  const bool packed = kv_more.type == TType::kU8 && !kv_more.empty();
  DI_CHECK(kv_more.empty() || (packed ? kv_more.row_size() == packed_row_bytes(more_format, d) : kv_more.row_size() == d));
  const int64_t n_all = n_kv + (kv_more.empty() ? 0 : kv_more.rows());
  Tensor out = alloc(TType::kF32, {s, heads * d});
  parallel_for(s * heads, [&](int64_t b, int64_t e) {
    std::vector<float> acc(d), score(kAttnBlock), rows(packed ? kAttnBlock * d : 0);
    // key row id of [kv ; kv_more]; packed rows are dequantized into slot j of `rows` (as unpack_rows)
    auto key = [&](int32_t id, int64_t j) -> const float* {
      if (id < n_kv) return kv.f32() + id * d;
      if (!packed) return kv_more.f32() + (id - n_kv) * d;
      float* y = rows.data() + j * d;
      cpu::unpack_row(kv_more.u8() + (id - n_kv) * kv_more.row_size(), more_format, d, y);
      return y;
    };
    for (int64_t t = b; t < e; ++t) {
      int64_t r = t / heads;
      int h = static_cast<int>(t % heads);
      const float* qh = q.f32() + r * heads * d + h * d;
      const int32_t* ids = idx.i32() + r * l;
      std::fill(acc.begin(), acc.end(), 0.0f);
      float run_max = -1e30f, sum_exp = 0;
      for (int64_t blk = 0; blk < l; blk += kAttnBlock) {
        int64_t n = std::min<int64_t>(kAttnBlock, l - blk);
        float blk_max = kNegInf;
        for (int64_t j = 0; j < n; ++j) {
          int32_t id = ids[blk + j];
          if (id < 0) {
            score[j] = kNegInf;
            continue;
          }
          DI_CHECK(id < n_all);
          score[j] = cpu::dot(qh, key(id, j), d) * softmax_scale;
          blk_max = std::max(blk_max, score[j]);
        }
        float new_max = std::max(run_max, blk_max);
        float rescale = std::exp(run_max - new_max);
        sum_exp *= rescale;
        for (int64_t i = 0; i < d; ++i) acc[i] *= rescale;
        for (int64_t j = 0; j < n; ++j) {
          if (ids[blk + j] < 0) continue;
          float p = std::exp(score[j] - new_max);
          sum_exp += p;
          float pb = quant::round_bf16(p);  // probabilities enter PV in bf16
          const float* row = ids[blk + j] < n_kv || !packed ? key(ids[blk + j], j) : rows.data() + j * d;
          for (int64_t i = 0; i < d; ++i) acc[i] += pb * row[i];
        }
        run_max = new_max;
      }
      sum_exp += std::exp(cpu::weight_at(sink, h) - run_max);
      float* o = out.f32() + r * heads * d + h * d;
      for (int64_t i = 0; i < d; ++i) o[i] = quant::round_bf16(acc[i] / sum_exp);
    }
  });
  return out;
}

namespace {

// base + the pool row of row i of a paged sequence whose page ids start at table[first] (checked: the
// page exists and the row fits I32). map_paged_rows and paged_row_list.
int32_t paged_pool_row(const std::vector<int32_t>& table, int64_t first, int64_t i, int64_t rows_per_page,
                       int64_t base) {
  const int64_t page = first + i / rows_per_page;
  DI_CHECK(page >= 0 && page < static_cast<int64_t>(table.size()));
  const int64_t row = base + table[page] * rows_per_page + i % rows_per_page;
  DI_CHECK(row < (int64_t{1} << 31));
  return static_cast<int32_t>(row);
}

}  // namespace

void CpuBackend::map_paged_rows(Tensor& idx, const std::vector<int64_t>& table_start, const std::vector<int32_t>& table,
                                int64_t rows_per_page, int64_t base) {
  const int64_t s = idx.rows(), l = idx.row_size();
  DI_CHECK(idx.type == TType::kI32 && static_cast<int64_t>(table_start.size()) == s && rows_per_page > 0);
  for (int64_t r = 0; r < s; ++r)
    for (int64_t j = 0; j < l; ++j) {
      int32_t& v = idx.i32()[r * l + j];
      if (v >= 0) v = paged_pool_row(table, table_start[r], v, rows_per_page, base);
    }
}

Tensor CpuBackend::paged_row_list(const std::vector<int64_t>& lengths, const std::vector<int64_t>& table_start,
                                  const std::vector<int32_t>& table, int64_t rows_per_page) {
  DI_CHECK(lengths.size() == table_start.size() && rows_per_page > 0);
  int64_t total = 0;
  for (int64_t n : lengths) total += n;
  Tensor out = alloc(TType::kI32, {total});
  int32_t* o = out.i32();
  for (size_t p = 0; p < lengths.size(); ++p)
    for (int64_t i = 0; i < lengths[p]; ++i) *o++ = paged_pool_row(table, table_start[p], i, rows_per_page, 0);
  return out;
}

Tensor CpuBackend::softmax_pool(const Tensor& kv, const Tensor& score, int ratio) {
  int64_t d = kv.row_size(), g = kv.rows() / ratio;
  DI_CHECK(kv.rows() % ratio == 0 && score.rows() == kv.rows());
  Tensor out = alloc(TType::kF32, {g, d});
  for (int64_t j = 0; j < g; ++j)
    for (int64_t c = 0; c < d; ++c) {
      float mx = kNegInf;
      for (int t = 0; t < ratio; ++t) mx = std::max(mx, score.f32()[(j * ratio + t) * d + c]);
      float sum = 0;
      for (int t = 0; t < ratio; ++t) sum += std::exp(score.f32()[(j * ratio + t) * d + c] - mx);
      float acc = 0;
      for (int t = 0; t < ratio; ++t)
        acc += kv.f32()[(j * ratio + t) * d + c] * (std::exp(score.f32()[(j * ratio + t) * d + c] - mx) / sum);
      out.f32()[j * d + c] = acc;
    }
  return out;
}

Tensor CpuBackend::index_scores_packed(const Tensor& q, int heads, const Tensor& cache, RowFormat format,
                                       const Tensor& slots, const Tensor& w, const std::vector<int64_t>& visible,
                                       const std::vector<int64_t>& key_offsets) {
  DI_CHECK(heads > 0 && slots.type == TType::kI32);
  const std::vector<int64_t> rows(slots.i32(), slots.i32() + slots.numel());
  return index_scores(q, heads, unpack_rows(cache, format, q.row_size() / heads, rows), w, visible, key_offsets);
}

Tensor CpuBackend::index_scores(const Tensor& q, int heads, const Tensor& keys, const Tensor& w,
                                const std::vector<int64_t>& visible, const std::vector<int64_t>& key_offsets) {
  const int64_t s = q.rows(), hd = keys.row_size();
  const int64_t t_len = key_offsets.empty() ? keys.rows() : index_width(visible);
  DI_CHECK(q.row_size() == heads * hd && w.row_size() == heads && static_cast<int64_t>(visible.size()) == s);
  check_key_offsets(key_offsets, visible, keys.rows());
  Tensor out = alloc(TType::kF32, {s, t_len});
  parallel_for(s * t_len, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      int64_t r = i / t_len, t = i % t_len;
      if (t >= visible[r]) {
        out.f32()[i] = kNegInf;
        continue;
      }
      // bf16 einsum, bf16 relu*weight, head sum accumulated in fp32 and rounded once
      float acc = 0;
      for (int h = 0; h < heads; ++h) {
        const int64_t key = (key_offsets.empty() ? 0 : key_offsets[r]) + t;
        float qk = quant::round_bf16(cpu::dot(q.f32() + r * heads * hd + h * hd, keys.f32() + key * hd, hd));
        acc += quant::round_bf16(std::max(qk, 0.0f) * w.f32()[r * heads + h]);
      }
      out.f32()[i] = quant::round_bf16(acc);
    }
  }, 256);
  return out;
}

Tensor CpuBackend::select_candidates(const Tensor& scores, const std::vector<int64_t>& visible, int topk_blocks,
                                     int block_size, TieBreak ties) {
  int64_t s = scores.rows(), width = scores.row_size();
  int64_t n_blocks = (width + block_size - 1) / block_size;
  Tensor mask = zeros(TType::kU8, {s, width});
  parallel_for(s, [&](int64_t b, int64_t e) {
    std::vector<float> bs(n_blocks);
    std::vector<int64_t> order(n_blocks);
    for (int64_t r = b; r < e; ++r) {
      const float* sc = scores.f32() + r * width;
      for (int64_t k = 0; k < n_blocks; ++k) {
        float m = kNegInf;
        for (int64_t p = k * block_size; p < std::min<int64_t>(width, (k + 1) * block_size); ++p) m = std::max(m, sc[p]);
        bs[k] = m;
      }
      // the block holding the query's newest visible position is pinned in
      int64_t last = visible[r] > 0 ? (visible[r] - 1) / block_size : -1;
      if (last >= 0 && last < n_blocks) bs[last] = std::numeric_limits<float>::infinity();
      int64_t keep = std::min<int64_t>(topk_blocks, n_blocks);
      // lowest-index ties only look at the blocks a query can reach, so the width does not matter
      int64_t reach = last >= 0 ? std::min<int64_t>(n_blocks, last + 1) : 0;
      order = ties == TieBreak::kTorch ? cpu::torch_topk_indices(bs.data(), n_blocks, keep)
                                       : cpu::lowest_index_topk(bs.data(), reach, std::min(keep, reach));
      keep = static_cast<int64_t>(order.size());
      for (int64_t k = 0; k < keep; ++k) {
        int64_t blk = order[k];
        if (!(bs[blk] > kNegInf)) continue;
        for (int64_t p = blk * block_size; p < std::min<int64_t>(width, (blk + 1) * block_size); ++p)
          mask.u8()[r * width + p] = 1;
      }
    }
  });
  return mask;
}

void CpuBackend::mask_scores(Tensor& scores, const Tensor& keep_mask) {
  DI_CHECK(keep_mask.numel() == scores.numel());
  for (int64_t i = 0; i < scores.numel(); ++i)
    if (!keep_mask.u8()[i]) scores.f32()[i] = kNegInf;
}

Tensor CpuBackend::topk_indices(const Tensor& scores, int k, const std::vector<int64_t>& visible, int offset,
                                TieBreak ties) {
  int64_t s = scores.rows(), width = scores.row_size();
  DI_CHECK(k <= width);
  Tensor out = alloc(TType::kI32, {s, k});
  parallel_for(s, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      std::vector<int64_t> order;
      if (ties == TieBreak::kTorch) {
        order = cpu::torch_topk_indices(scores.f32() + r * width, width, k);
      } else {  // only visible positions can be picked; the rest of the row stays -1
        order = cpu::lowest_index_topk(scores.f32() + r * width, std::min<int64_t>(visible[r], width),
                                       std::min<int64_t>(k, std::min<int64_t>(visible[r], width)));
      }
      std::sort(order.begin(), order.end());
      for (int i = 0; i < k; ++i)
        out.i32()[r * k + i] =
            i < static_cast<int>(order.size()) && order[i] < visible[r] ? static_cast<int32_t>(order[i] + offset) : -1;
    }
  });
  return out;
}

}  // namespace di
