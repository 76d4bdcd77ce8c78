// V4.1 attention (spec §2.4-2.5): window attention with the sink over FP8 window KV, plus the CSA2
// compressed branch — the compressor with its pending tail, the lightning indexer with its two-level
// candidate selection, and the Full / Reindex / Reuse sharing of compressed KV and top-k lists.
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/model.h"
#include "model/model_scratch.h"

namespace di {

namespace {

// Window key lists in the reference's layout. Prefill (start 0): query i lists min(n, W) positions
// from max(0, i-W+1); keys are the chunk rows. Otherwise each query lists the W ring slots oldest
// first; keys are [ring (W rows) ; chunk rows], slots holding nothing yet are -1.
std::vector<int32_t> window_lists(int64_t start, int64_t n, int64_t w, int64_t* list_len) {
  std::vector<int32_t> idx;
  if (start == 0) {
    int64_t len = std::min(n, w);
    *list_len = len;
    idx.resize(n * len);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < len; ++j) {
        int64_t p = std::max<int64_t>(0, i - w + 1) + j;
        idx[i * len + j] = p > i ? -1 : static_cast<int32_t>(p);
      }
    return idx;
  }
  *list_len = w;
  idx.resize(n * w);
  for (int64_t i = 0; i < n; ++i) {
    int64_t p = start + i;
    int64_t oldest = p % w + 1;
    for (int64_t j = 0; j < w; ++j) {
      int64_t slot = (oldest + j) % w;
      if (slot > p) {  // ring still filling
        idx[i * w + j] = -1;
        continue;
      }
      int64_t pos = p - ((p - slot) % w);  // the position this slot holds as of query p
      idx[i * w + j] = static_cast<int32_t>(pos >= start ? w + (pos - start) : slot);
    }
  }
  return idx;
}

// Writes the last min(n, W) rows of `kv` (positions start..) into the ring.
void write_window(Backend& be, const Tensor& kv, int64_t start, int64_t w, Tensor& ring) {
  int64_t n = kv.rows(), first = std::max<int64_t>(0, n - w);
  Tensor tail = be.alloc(TType::kF32, {n - first, kv.row_size()});
  be.copy_rows(tail, 0, kv, first, n - first);
  std::vector<int64_t> slots;
  for (int64_t i = first; i < n; ++i) slots.push_back((start + i) % w);
  be.pack_rows(tail, RowFormat::kFp8Ue8m0, ring, slots);
}

std::vector<int64_t> iota_slots(int64_t begin, int64_t n) {
  std::vector<int64_t> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = begin + i;
  return v;
}

Tensor concat_rows(Backend& be, const Tensor& a, const Tensor& b) {
  Tensor out = be.alloc(a.type, {a.rows() + b.rows(), a.row_size()});
  if (a.rows()) be.copy_rows(out, 0, a, 0, a.rows());
  if (b.rows()) be.copy_rows(out, a.rows(), b, 0, b.rows());
  return out;
}

}  // namespace

Tensor Model::attention(int layer, const Tensor& x, const std::vector<int64_t>& positions, SequenceState& state,
                        ForwardScratch& scratch) {
  const LayerSchedule& ls = cfg_.layers[layer];
  const AttentionWeights& a = w_.layers[layer].attn;
  LayerCache& cache = state.layers[layer];
  Backend& be = backend_;
  int64_t n = x.rows(), start = positions.front(), win = cfg_.window;
  int heads = cfg_.n_heads, dh = cfg_.head_dim, rd = cfg_.rope_dim;

  Tensor qr = be.rmsnorm(be.linear(x, a.wq_a), a.q_norm, static_cast<float>(cfg_.norm_eps));  // [n, q_lora]
  Tensor q = be.linear(qr, a.wq_b);                                                           // [n, H*Dh]
  be.rope(q, heads, dh, rd, positions, rope_[layer], false);
  Tensor kv = be.rmsnorm(be.linear(x, a.wkv), a.kv_norm, static_cast<float>(cfg_.norm_eps));  // [n, Dh]
  be.rope(kv, 1, dh, rd, positions, rope_[layer], false);
  be.qdq(kv, RowFormat::kFp8Ue8m0);

  // keys: [chunk] (prefill) or [ring ; chunk]; the ring is read before this chunk is written
  Tensor keys = kv;
  if (start > 0) keys = concat_rows(be, be.unpack_rows(cache.window, RowFormat::kFp8Ue8m0, dh, iota_slots(0, win)), kv);
  if (scratch.window_idx.empty()) {  // the same lists serve every layer of this forward
    std::vector<int32_t> widx = window_lists(start, n, win, &scratch.window_list_len);
    scratch.window_idx = be.from_host_i32(widx, {n, scratch.window_list_len});
  }
  write_window(be, kv, start, win, cache.window);

  Tensor idx = scratch.window_idx;
  if (ls.ratio > 0) {
    Tensor comp_rows, comp_idx;
    compressed_branch(layer, x, qr, positions, state, scratch, static_cast<int>(keys.rows()), comp_rows, comp_idx);
    if (comp_idx.row_size() > 0) {
      keys = concat_rows(be, keys, comp_rows);
      idx = be.concat_cols(idx, comp_idx);  // [n, window list ++ top-k list]
    }
  }
  Tensor o = be.sparse_attention(q, heads, keys, idx, a.attn_sink, 1.0f / std::sqrt(static_cast<float>(dh)));
  return attention_output(layer, o, positions);
}

Tensor Model::attention_output(int layer, Tensor& o, const std::vector<int64_t>& positions) {
  const AttentionWeights& a = w_.layers[layer].attn;
  backend_.rope(o, cfg_.n_heads, cfg_.head_dim, cfg_.rope_dim, positions, rope_[layer], true);
  Tensor z = backend_.grouped_linear(o, a.wo_a, cfg_.o_groups);  // [n, G*o_lora]
  return backend_.linear(z, a.wo_b);                               // [n, D]
}

void Model::compressed_branch(int layer, const Tensor& x, const Tensor& qr, const std::vector<int64_t>& positions,
                              SequenceState& state, ForwardScratch& scratch, int offset, Tensor& rows, Tensor& idx) {
  const LayerSchedule& ls = cfg_.layers[layer];
  const AttentionWeights& a = w_.layers[layer].attn;
  Backend& be = backend_;
  const float eps = static_cast<float>(cfg_.norm_eps);
  int64_t n = x.rows(), start = positions.front(), end = start + n;
  int ratio = ls.ratio, dh = cfg_.head_dim, rd = cfg_.rope_dim, ihd = cfg_.index_head_dim;
  int64_t compress_len = end / ratio;

  if (ls.mode == AttnMode::kFull) {
    LayerCache& cache = state.layers[layer];
    int64_t g0 = start / ratio, ng = compress_len - g0;  // groups completed by this chunk
    Tensor latent;                                       // [ng, Dh] pre-RoPE latent
    if (ratio == 1) {
      latent = be.rmsnorm(be.linear(x, a.comp_wkv), a.comp_norm, eps);
    } else {
      Tensor kvf = be.linear(x, a.comp_wkv), score = be.linear(x, a.comp_wgate);  // [n, Dh] fp32
      if (ng > 0) {
        // members of the completed groups: the pending tail, then this chunk's rows
        Tensor mk = be.alloc(TType::kF32, {ng * ratio, dh}), ms = be.alloc(TType::kF32, {ng * ratio, dh});
        for (int64_t t = g0 * ratio; t < compress_len * ratio; ++t) {
          int64_t r = t - g0 * ratio;
          if (t < start) {
            be.copy_rows(mk, r, cache.tail_kv, t % ratio, 1);
            be.copy_rows(ms, r, cache.tail_score, t % ratio, 1);
          } else {
            be.copy_rows(mk, r, kvf, t - start, 1);
            be.copy_rows(ms, r, score, t - start, 1);
          }
        }
        latent = be.softmax_pool(mk, ms, ratio);
        be.round_bf16(latent);
        latent = be.rmsnorm(latent, a.comp_norm, eps);
      }
      for (int64_t t = std::max(start, compress_len * ratio); t < end; ++t) {  // new pending tokens
        be.copy_rows(cache.tail_kv, t % ratio, kvf, t - start, 1);
        be.copy_rows(cache.tail_score, t % ratio, score, t - start, 1);
      }
    }
    if (ng > 0) {
      std::vector<int64_t> gpos(ng);
      for (int64_t j = 0; j < ng; ++j) gpos[j] = (g0 + j) * ratio;  // a latent stands for its group's first token
      reserve_compressed(cache, compress_len, be);
      Tensor k = be.rmsnorm(be.linear(latent, a.idx_wk), a.idx_k_norm, eps);  // [ng, ihd]
      be.rope(k, 1, ihd, rd, gpos, rope_[layer], false);
      be.qdq(k, RowFormat::kFp4Ue8m0);
      be.pack_rows(k, RowFormat::kFp4Ue8m0, cache.index_keys, iota_slots(g0, ng));
      state.index_keys_layer = layer;
      scratch.invalidate(layer);
      be.rope(latent, 1, dh, rd, gpos, rope_[layer], false);
      be.qdq(latent, RowFormat::kFp4E4m3);
      be.pack_rows(latent, RowFormat::kFp4E4m3, cache.comp, iota_slots(g0, ng));
      cache.n_comp = compress_len;
    }
  }

  const LayerCache& src = state.layers[ls.kv_source];
  DI_CHECK(src.n_comp >= compress_len);
  if (ls.mode == AttnMode::kFull || ls.mode == AttnMode::kReindex) {
    if (compress_len == 0) {
      idx = be.alloc(TType::kI32, {n, 0});
    } else {
      // The reference's indexers read the index keys most recently published by any Full layer that
      // emitted a row (SharedAttentionRuntime.index_k). A ratio-2 layer whose group is still open
      // (decode at an even position) publishes nothing, so it scores against the keys of the last
      // emitting layer -- on V4.1 the ratio-1 layer 20 of the previous step. Reproduced here so that
      // decode matches the official implementation.
      int keys_layer =
          options_.reference_decode_quirks && state.index_keys_layer >= 0 ? state.index_keys_layer : ls.kv_source;
      const LayerCache& key_src = state.layers[keys_layer];
      DI_CHECK(key_src.n_comp >= compress_len);
      Tensor& keys = scratch.index_keys[{keys_layer, compress_len}];
      if (keys.empty()) keys = be.unpack_rows(key_src.index_keys, RowFormat::kFp4Ue8m0, ihd, iota_slots(0, compress_len));
      Tensor qi = be.linear(qr, a.idx_wq_b);  // [n, nIH * ihd]
      be.rope(qi, cfg_.index_n_heads, ihd, rd, positions, rope_[layer], false);
      be.qdq(qi, RowFormat::kFp4Ue8m0);
      Tensor wts = be.linear(x, a.idx_weights_proj);  // [n, nIH]
      be.scale_bf16(wts, static_cast<float>(std::pow(ihd, -0.5) * std::pow(cfg_.index_n_heads, -0.5)));
      const TieBreak ties = options_.reference_decode_quirks ? TieBreak::kTorch : TieBreak::kLowestIndex;
      std::vector<int64_t> visible(n);
      for (int64_t i = 0; i < n; ++i) visible[i] = (positions[i] + 1) / ratio;
      Tensor scores = be.index_scores(qi, cfg_.index_n_heads, keys, wts, visible);
      if (ls.is_candidate_source) {
        scratch.candidates =
            be.select_candidates(scores, visible, cfg_.candidate_topk_blocks, cfg_.candidate_block_size, ties);
      } else if (ls.uses_candidates) {
        DI_CHECK(!scratch.candidates.empty());
        be.mask_scores(scores, scratch.candidates);
      }
      int k = static_cast<int>(std::min<int64_t>(cfg_.index_topk, compress_len));
      idx = be.topk_indices(scores, k, visible, offset, ties);
    }
    scratch.topk[layer] = idx;
  } else {
    auto it = scratch.topk.find(ls.index_source);
    DI_CHECK(it != scratch.topk.end());
    idx = it->second;
  }
  Tensor& unpacked = scratch.comp_rows[{ls.kv_source, compress_len}];
  if (unpacked.empty())
    unpacked = compress_len > 0 ? be.unpack_rows(src.comp, RowFormat::kFp4E4m3, dh, iota_slots(0, compress_len))
                                : be.alloc(TType::kF32, {0, dh});
  rows = unpacked;
}

Tensor Model::dspark_attention(int layer, const Tensor& x, const std::vector<int64_t>& positions,
                               SequenceState& state) {
  const AttentionWeights& a = w_.layers[layer].attn;
  LayerCache& cache = state.layers[layer];
  Backend& be = backend_;
  int64_t n = x.rows(), win = cfg_.window, last = positions.front() - 1;  // last seeded position
  int heads = cfg_.n_heads, dh = cfg_.head_dim, rd = cfg_.rope_dim;
  const float eps = static_cast<float>(cfg_.norm_eps);
  Tensor qr = be.rmsnorm(be.linear(x, a.wq_a), a.q_norm, eps);
  Tensor q = be.linear(qr, a.wq_b);
  be.rope(q, heads, dh, rd, positions, rope_[layer], false);
  Tensor kv = be.rmsnorm(be.linear(x, a.wkv), a.kv_norm, eps);
  be.rope(kv, 1, dh, rd, positions, rope_[layer], false);
  be.qdq(kv, RowFormat::kFp8Ue8m0);
  // keys: the ring slots filled so far, then every block row (non-causal inside the block)
  Tensor keys = concat_rows(be, be.unpack_rows(cache.window, RowFormat::kFp8Ue8m0, dh, iota_slots(0, win)), kv);
  int64_t filled = std::min<int64_t>(win, last + 1), len = filled + n;
  std::vector<int32_t> idx(n * len);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < len; ++j) idx[i * len + j] = static_cast<int32_t>(j < filled ? j : win + (j - filled));
  Tensor o = be.sparse_attention(q, heads, keys, be.from_host_i32(idx, {n, len}), a.attn_sink,
                                 1.0f / std::sqrt(static_cast<float>(dh)));
  return attention_output(layer, o, positions);
}

}  // namespace di
