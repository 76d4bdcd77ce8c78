// V4.1 attention (spec §2.4-2.5): window attention with the sink over FP8 window KV, plus the CSA2
// compressed branch — the compressor with its pending tail, the lightning indexer with its two-level
// candidate selection, and the Full / Reindex / Reuse sharing of compressed KV and top-k lists.
#include <algorithm>
#include <cmath>
#include <functional>
#include <utility>

#include "core/env_switch.h"
#include "core/error.h"
#include "model/model.h"
#include "model/model_scratch.h"

namespace di {

namespace {

// Window key lists for queries at positions q_first.. over keys whose chunk rows start at position
// key_first (the chunk starts at `start`; they differ only for the decoder_window_only rows). Query p
// lists the positions max(0, p-W+1) + j, j < len, ascending: len = W, except that a prefill (start 0)
// in the reference's layout lists min(end, W) (full_width: always W, so that the 64-index softmax
// blocks of the top-k list after it do not move with the end of the first chunk). Keys are the chunk
// rows at chunk_base.. and, past the first chunk, the ring's W rows at ring_base.. (slot = position %
// W). Positions holding nothing (after p, below `floor`, chunk rows not computed) are -1. One layout
// for every chunking: the -1 entries sit at the same list places whether the earlier positions come
// from the ring or the chunk (a GPU block reduction sums by list place).
std::vector<int32_t> window_lists(int64_t start, int64_t floor, int64_t key_first, int64_t q_first, int64_t nq,
                                  int64_t w, bool full_width, int64_t ring_base, int64_t chunk_base,
                                  int64_t* list_len) {
  const int64_t len = start == 0 && !full_width ? std::min(q_first + nq, w) : w;
  *list_len = len;
  std::vector<int32_t> idx(nq * len);
  for (int64_t i = 0; i < nq; ++i) {
    const int64_t p = q_first + i;
    for (int64_t j = 0; j < len; ++j) {
      const int64_t pos = std::max<int64_t>(0, p - w + 1) + j;
      int32_t v;
      if (pos > p || pos < floor) v = -1;
      else if (pos >= key_first) v = static_cast<int32_t>(chunk_base + (pos - key_first));
      else if (pos >= start) v = -1;  // a chunk row not computed here
      else v = static_cast<int32_t>(ring_base + pos % w);
      idx[i * len + j] = v;
    }
  }
  return idx;
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

// Writes every part's last min(n, W) current rows of kv [rows, Dh] (positions cur.first..) into its
// ring (rings[part]), one launch for the batch.
void Model::write_windows(Backend& be, const Tensor& kv, const Batch& batch, const std::vector<Tensor>& rings, int64_t w) {
  std::vector<int32_t> ring_of(static_cast<size_t>(batch.rows), -1);
  std::vector<int64_t> slots(static_cast<size_t>(batch.rows), 0);
  for (size_t pi = 0; pi < batch.parts.size(); ++pi) {
    const RowSpan& c = batch.parts[pi].cur;
    for (int64_t i = std::max<int64_t>(0, c.rows - w); i < c.rows; ++i) {
      ring_of[static_cast<size_t>(c.row0 + i)] = static_cast<int32_t>(pi);
      slots[static_cast<size_t>(c.row0 + i)] = (c.first + i) % w;
    }
  }
  be.pack_rows_to(kv, RowFormat::kFp8Ue8m0, rings, ring_of, slots);
}

Tensor Model::attention(int layer, const Tensor& x, Batch& batch, const std::function<void()>& beside) {
  const LayerSchedule& ls = cfg_.layers[layer];
  const AttentionWeights& a = w_.layers[layer].attn;
  Backend& be = backend_;
  const float eps = static_cast<float>(cfg_.norm_eps);
  int64_t win = cfg_.window;
  int heads = cfg_.n_heads, dh = cfg_.head_dim, rd = cfg_.rope_dim, ihd = cfg_.index_head_dim;

  // every projection once over the batch's rows: keys and compressor inputs from the current rows,
  // queries from the query rows
  AttnRows r;
  r.x = x;
  r.xq = batch.query_rows(be, x);

  // The attention's keys: [the rings of the parts past their first chunk ; every current row], then
  // (kv_more) the KV source's compressed rows in the page pool.
  const WindowLists& wl = window_lists_of(batch);
  std::vector<Tensor> rings;  // every part's ring of this layer
  for (const BatchPart& p : batch.parts) rings.push_back(p.state->layers[layer].window);
  Tensor keys;  // [ring rows + rows, Dh]
  static const bool compress_beside = env_switch_on("DEEPINFER_COMPRESS_BESIDE");
  static const bool indexer_first = env_switch_on("DEEPINFER_INDEXER_SIDE_FIRST");
  const bool indexed = ls.mode == AttnMode::kFull || ls.mode == AttnMode::kReindex;
  auto index_weights = [&] {
    r.wts = be.linear(r.xq, a.idx_weights_proj);  // [q rows, nIH]
    be.scale_bf16(r.wts, static_cast<float>(std::pow(ihd, -0.5) * std::pow(cfg_.index_n_heads, -0.5)));
  };
  auto compressor_inputs = [&] {
    if (ls.ratio == 1) {
      r.comp_kv = be.rmsnorm(be.linear(x, a.comp_wkv), a.comp_norm, eps);
    } else {
      r.comp_kv = be.linear(x, a.comp_wkv);  // fp32
      r.comp_score = be.linear(x, a.comp_wgate);
    }
    if (compress_beside) compress(layer, r, batch);
  };
  auto window_keys = [&] {
    r.kv = be.rmsnorm_rope_qdq(be.linear(x, a.wkv), a.kv_norm, eps, 1, dh, rd, batch.positions, rope_[layer],
                               RowFormat::kFp8Ue8m0);  // [rows, Dh]
    keys = r.kv;
    if (batch.ring_rows > 0) {  // the rings are read (one launch) before this step writes them
      keys = be.alloc(TType::kF32, {batch.ring_rows + batch.rows, dh});
      std::vector<Tensor> read;  // in ring_base order
      for (size_t pi = 0; pi < batch.parts.size(); ++pi)
        if (batch.ring_base[pi] >= 0) read.push_back(rings[pi]);
      be.unpack_caches(read, RowFormat::kFp8Ue8m0, keys, 0);
      be.copy_rows(keys, batch.ring_rows, r.kv, 0, batch.rows);
    }
    write_windows(be, r.kv, batch, rings, win);
  };
  // The window keys, a Full layer's compressor (its inputs, latents and index keys) and the indexer's
  // head weights need neither the queries nor the indexer: they are side work (Backend::side_begin),
  // and so is the caller's `beside`, while the queries run on the main chain. The indexer's inputs go
  // first, the window keys after them: the index scores wait for the first mark only, the attention
  // for the second. A/Bs (the same ops on the same inputs, so the same bits):
  // DEEPINFER_INDEXER_SIDE_FIRST=0 issues the window keys first and the head weights on the main chain;
  // DEEPINFER_COMPRESS_BESIDE=0 runs the compressor after the queries on the main chain.
  int index_ready = -1, keys_ready = -1;
  run_beside(be, [&] {
    if (indexer_first) {
      if (indexed) index_weights();
      if (ls.mode == AttnMode::kFull) compressor_inputs();
      index_ready = be.side_mark();
      window_keys();
    } else {
      window_keys();
      if (ls.mode == AttnMode::kFull) compressor_inputs();
    }
    keys_ready = be.side_mark();
  });
  if (!indexer_first) index_ready = keys_ready;
  if (beside) run_beside(be, beside);

  // q = rope(wq_b(qr)), qr = q_norm(wq_a(x)) [q rows, q_lora]: kept where the indexer reads it too
  r.q = be.linear_rope(be.linear(r.xq, a.wq_a), a.wq_b, heads, dh, rd, batch.q_positions, rope_[layer],
                       {&a.q_norm, eps, indexed ? &r.qr : nullptr});  // [q rows, H*Dh]
  if (indexed) {
    r.qi = be.linear(r.qr, a.idx_wq_b);  // [q rows, nIH * ihd]
    be.rope_qdq(r.qi, cfg_.index_n_heads, ihd, rd, batch.q_positions, rope_[layer], RowFormat::kFp4Ue8m0);
    if (!indexer_first) index_weights();
  }

  // One sparse attention over every query row of the batch, where the top-k lists point (each
  // part's row ids mapped through its pages) in the packed compressed rows.
  Tensor kv_more;
  std::vector<Tensor> lists(batch.parts.size());  // per part: [q rows, k] compressed row ids
  int64_t list_width = 0;
  if (ls.ratio > 0) {
    if (indexed) be.side_wait(index_ready);  // the head weights; the compressor's inputs or (compress_beside) its rows
    if (ls.mode == AttnMode::kFull && !compress_beside) compress(layer, r, batch);
    kv_more = kv_pool_->comp(ls.kv_source);
    if (batched_indexer()) {
      lists = {compressed_branch_batch(layer, r, batch)};
      list_width = lists[0].row_size();
    } else {
      for (size_t pi = 0; pi < batch.parts.size(); ++pi) {
        lists[pi] = compressed_branch(layer, r, static_cast<int>(pi), batch);
        list_width = std::max(list_width, lists[pi].row_size());
      }
    }
  }
  // the parts' row ids -> pool rows of the source, after the keys in kv
  const int64_t per_page = ls.ratio > 0 ? kv_pool_->rows_per_page(ls.kv_source) : 0, base = keys.rows();
  auto with_pool_rows = [&](const Tensor& head, const Tensor& ids, size_t first, size_t n) {
    std::vector<int64_t> table_start;
    std::vector<int32_t> table;
    for (size_t pi = first; pi < first + n; ++pi) {
      const BatchPart& p = batch.parts[pi];
      DI_CHECK(p.state->pool == kv_pool_);
      table_start.insert(table_start.end(), static_cast<size_t>(p.q.rows), static_cast<int64_t>(table.size()));
      for (const PageRef& page : p.state->pages) table.push_back(static_cast<int32_t>(page->id()));
    }
    return be.concat_paged_rows(head, ids, table_start, table, per_page, base);
  };
  Tensor idx = attention_lists(wl, lists, list_width, batch, with_pool_rows);  // [q rows, window ++ top-k]
  be.side_wait(keys_ready);
  Tensor o = be.sparse_attention(r.q, heads, keys, idx, a.attn_sink, 1.0f / std::sqrt(static_cast<float>(dh)), kv_more,
                                 RowFormat::kFp4E4m3);
  return attention_output(layer, std::move(o), batch.q_positions);
}

const WindowLists& Model::window_lists_of(Batch& batch) {
  WindowLists& wl = batch.window;
  if (wl.rows == batch.rows && wl.q_rows == batch.q_rows) return wl;  // the same for every layer of a layout
  const int64_t win = cfg_.window;
  wl = WindowLists{};
  wl.rows = batch.rows;
  wl.q_rows = batch.q_rows;
  for (size_t pi = 0; pi < batch.parts.size(); ++pi) {
    const BatchPart& p = batch.parts[pi];
    int64_t len = 0;
    wl.parts.push_back(window_lists(p.start, p.state->window_floor, p.cur.first, p.q.first, p.q.rows, win,
                                    !options_.reference_decode_quirks, batch.ring_base[pi],
                                    batch.ring_rows + p.cur.row0, &len));
    wl.len.push_back(len);
  }
  if (std::all_of(wl.len.begin(), wl.len.end(), [&](int64_t l) { return l == wl.len[0]; })) {
    std::vector<int32_t> all;
    for (const std::vector<int32_t>& v : wl.parts) all.insert(all.end(), v.begin(), v.end());
    wl.all = backend_.from_host_i32(all, {batch.q_rows, wl.len[0]});
  }
  return wl;
}

Tensor Model::attention_lists(const WindowLists& wl, const std::vector<Tensor>& lists, int64_t width, Batch& batch,
                              const WithPoolRows& with_pool_rows) {
  Backend& be = backend_;
  const size_t np = batch.parts.size();
  if (lists.size() == 1 && np > 1) {  // one list of every query row (compressed_branch_batch)
    if (!wl.all.empty()) return width == 0 ? wl.all : with_pool_rows(wl.all, lists[0], 0, np);
    std::vector<Tensor> views;  // window widths differ: the per-part path over row views
    for (const BatchPart& p : batch.parts) views.push_back(row_view(lists[0], p.q.row0, p.q.rows));
    return attention_lists(wl, views, width, batch, with_pool_rows);
  }
  // a part's list, padded with -1 to `width` at its end: a -1 after every entry of a row changes no
  // sum (CPU or GPU), a -1 between entries would (GPU block sums pair entries by list place)
  auto padded = [&](Tensor t, int64_t nq, int64_t want) {
    if (t.row_size() == want) return t;
    Tensor pad = be.from_host_i32(std::vector<int32_t>(static_cast<size_t>(nq * (want - t.row_size())), -1),
                                  {nq, want - t.row_size()});
    return t.row_size() == 0 ? pad : be.concat_cols(t, pad);
  };
  auto gather = [&](const std::function<Tensor(size_t)>& part_rows, int64_t cols) {  // [q rows, cols]
    if (np == 1) return part_rows(0);
    Tensor out = be.alloc(TType::kI32, {batch.q_rows, cols});
    for (size_t pi = 0; pi < np; ++pi)
      if (batch.parts[pi].q.rows > 0) be.copy_rows(out, batch.parts[pi].q.row0, part_rows(pi), 0, batch.parts[pi].q.rows);
    return out;
  };
  if (!wl.all.empty()) {  // one window width: [window lists ; top-k lists padded to one width]
    if (width == 0) return wl.all;
    const Tensor top = gather([&](size_t pi) { return padded(lists[pi], batch.parts[pi].q.rows, width); }, width);
    return with_pool_rows(wl.all, top, 0, np);
  }
  // window widths differ (reference layout, prefill chunks shorter than the window): per part
  // [window ; top-k], padded to the widest
  int64_t widest = 0;
  for (size_t pi = 0; pi < np; ++pi) widest = std::max(widest, wl.len[pi] + (lists[pi].empty() ? 0 : lists[pi].row_size()));
  return gather(
      [&](size_t pi) {
        const int64_t nq = batch.parts[pi].q.rows;
        Tensor w = be.from_host_i32(wl.parts[pi], {nq, wl.len[pi]});
        if (lists[pi].empty() || lists[pi].row_size() == 0) return padded(w, nq, widest);
        return padded(with_pool_rows(w, lists[pi], pi, 1), nq, widest);
      },
      widest);
}

Tensor Model::attention_output(int layer, Tensor o, const std::vector<int64_t>& positions) {
  const AttentionWeights& a = w_.layers[layer].attn;
  // wo_b(wo_a(inverse_rope(o))): [n, H*Dh] -> [n, G*o_lora] -> [n, D]
  return backend_.output_projection(std::move(o), a.wo_a, cfg_.o_groups, cfg_.n_heads, cfg_.head_dim, cfg_.rope_dim,
                                    positions, rope_[layer], a.wo_b);
}

void Model::compress(int layer, const AttnRows& r, Batch& batch) {
  const AttentionWeights& a = w_.layers[layer].attn;
  Backend& be = backend_;
  const float eps = static_cast<float>(cfg_.norm_eps);
  const int ratio = cfg_.layers[layer].ratio, dh = cfg_.head_dim, rd = cfg_.rope_dim, ihd = cfg_.index_head_dim;
  // the groups each part completes: gw .. gw + ng - 1, latent rows at .. at + ng - 1 of the batch
  struct Groups {
    int64_t gw = 0, ng = 0, at = 0;
  };
  std::vector<Groups> groups(batch.parts.size());
  int64_t total = 0;
  for (size_t pi = 0; pi < batch.parts.size(); ++pi) {
    const BatchPart& p = batch.parts[pi];
    DI_CHECK(p.cur.rows == p.n && p.state->pool == kv_pool_);  // Full layers run on every row
    const int64_t compress_len = (p.start + p.n) / ratio, g0 = p.start / ratio;
    // groups below keep_global_before keep the rows the prefix cache wrote
    const int64_t gw = std::max(g0, p.options.keep_global_before / ratio);
    groups[pi] = {gw, std::max<int64_t>(0, compress_len - gw), total};
    total += groups[pi].ng;
  }
  Tensor latent, mk, ms;  // [total, Dh] pre-RoPE latents; ratio > 1: their members [total * ratio, Dh]
  if (total > 0 && ratio == 1) latent = be.alloc(TType::kF32, {total, dh});
  if (total > 0 && ratio > 1) {
    mk = be.alloc(TType::kF32, {total * ratio, dh});
    ms = be.alloc(TType::kF32, {total * ratio, dh});
  }
  std::vector<int64_t> gpos, slots;  // per latent row: its group's first token, its pool row
  // Every part's row copies, in two batches (one launch each on CUDA): the group members (read from
  // the pending tails), then the new pending tokens (written to the tails) -- the reads before the
  // writes that may reuse their slots.
  std::vector<Backend::RowCopy> members, pending;
  for (size_t pi = 0; pi < batch.parts.size(); ++pi) {
    const BatchPart& p = batch.parts[pi];
    const Groups& g = groups[pi];
    LayerCache& cache = p.state->layers[layer];
    const int64_t start = p.start, end = start + p.n, compress_len = end / ratio;
    if (ratio == 1) {
      if (g.ng > 0) members.push_back({latent, g.at, r.comp_kv, p.cur.row0 + (g.gw - start), g.ng});
    } else {
      Tensor kvf = row_view(r.comp_kv, p.cur.row0, p.n), score = row_view(r.comp_score, p.cur.row0, p.n);
      // members of the completed groups: the pending tail, then this chunk's rows; one copy per
      // contiguous run (tail slots up to a wrap, then the chunk)
      const int64_t t0 = g.gw * ratio, t1 = compress_len * ratio, m0 = g.at * ratio;
      for (int64_t t = t0; t < t1;) {
        if (t < start) {
          const int64_t run = std::min({t1, start, t + ratio - t % ratio}) - t;
          members.push_back({mk, m0 + t - t0, cache.tail_kv, t % ratio, run});
          members.push_back({ms, m0 + t - t0, cache.tail_score, t % ratio, run});
          t += run;
        } else {
          members.push_back({mk, m0 + t - t0, kvf, t - start, t1 - t});
          members.push_back({ms, m0 + t - t0, score, t - start, t1 - t});
          t = t1;
        }
      }
      for (int64_t t = std::max(start, compress_len * ratio); t < end;) {  // new pending tokens, by runs
        const int64_t run = std::min(end, t + ratio - t % ratio) - t;
        pending.push_back({cache.tail_kv, t % ratio, kvf, t - start, run});
        pending.push_back({cache.tail_score, t % ratio, score, t - start, run});
        t += run;
      }
      // a step short enough to be rolled back keeps its inputs (see rollback_state)
      const bool keep_step = p.n <= cfg_.window;
      cache.step_kv = keep_step ? kvf : Tensor{};
      cache.step_score = keep_step ? score : Tensor{};
    }
    if (compress_len > start / ratio) p.state->index_keys_layer = layer;  // this layer published keys this step
    if (g.ng == 0) continue;
    for (int64_t j = 0; j < g.ng; ++j) gpos.push_back((g.gw + j) * ratio);  // a latent stands for its group's first token
    prepare_global_write(*p.state, g.gw * ratio, compress_len * ratio);
    const std::vector<int64_t> s = global_slots(*p.state, layer, g.gw, g.ng);
    slots.insert(slots.end(), s.begin(), s.end());
    cache.n_comp = std::max(cache.n_comp, compress_len);
    batch.scratch[pi].invalidate(layer);
  }
  be.copy_rows_batch(members);
  be.copy_rows_batch(pending);
  batch.index_keys.erase(layer);
  if (total == 0) return;
  // every part's new rows at once: latents, index keys, both packed into the page pool
  if (ratio > 1) {
    latent = be.softmax_pool(mk, ms, ratio);
    be.round_bf16(latent);
    latent = be.rmsnorm(latent, a.comp_norm, eps);
  }
  const Tensor k = be.rmsnorm_rope_qdq(be.linear(latent, a.idx_wk), a.idx_k_norm, eps, 1, ihd, rd, gpos, rope_[layer],
                                      RowFormat::kFp4Ue8m0);  // [total, ihd]
  be.pack_rows(k, RowFormat::kFp4Ue8m0, kv_pool_->index_keys(layer), slots);
  be.rope_qdq(latent, 1, dh, rd, gpos, rope_[layer], RowFormat::kFp4E4m3);
  be.pack_rows(latent, RowFormat::kFp4E4m3, kv_pool_->comp(layer), slots);
}

Tensor Model::compressed_branch_batch(int layer, const AttnRows& r, Batch& batch) {
  const LayerSchedule& ls = cfg_.layers[layer];
  Backend& be = backend_;
  if (ls.mode == AttnMode::kReuse) {
    auto it = batch.topk.find(ls.index_source);
    DI_CHECK(it != batch.topk.end());
    return it->second;
  }
  const int ratio = ls.ratio;
  std::vector<int64_t> visible(static_cast<size_t>(batch.q_rows), 0);
  int64_t widest = 0;
  for (const BatchPart& p : batch.parts) {
    const int64_t compress_len = (p.start + p.n) / ratio;
    DI_CHECK(p.state->pool == kv_pool_ && p.state->layers[ls.kv_source].n_comp >= compress_len);
    for (int64_t i = 0; i < p.q.rows; ++i) visible[static_cast<size_t>(p.q.row0 + i)] = (p.q.first + i + 1) / ratio;
    widest = std::max(widest, compress_len);
  }
  Tensor idx;
  if (widest == 0) {
    idx = be.alloc(TType::kI32, {batch.q_rows, 0});
  } else {
    Batch::IndexKeys& ik = batch.index_keys[ls.kv_source];
    const Tensor& pool_keys = kv_pool_->index_keys(ls.kv_source);
    if (ik.slots.empty()) {  // every part's key rows in the pool, listed on the device from the page tables
      std::vector<int64_t> lengths, table_start;
      std::vector<int32_t> table;
      int64_t keys = 0, top_page = 0;
      ik.offsets.assign(static_cast<size_t>(batch.q_rows), 0);
      for (const BatchPart& p : batch.parts) {
        const int64_t compress_len = (p.start + p.n) / ratio;
        std::fill_n(ik.offsets.begin() + p.q.row0, p.q.rows, keys);
        keys += compress_len;
        lengths.push_back(compress_len);
        table_start.push_back(static_cast<int64_t>(table.size()));
        for (const PageRef& page : p.state->pages) {
          table.push_back(static_cast<int32_t>(page->id()));
          top_page = std::max<int64_t>(top_page, page->id());
        }
      }
      const int64_t per_page = kv_pool_->rows_per_page(ls.kv_source);
      DI_CHECK((top_page + 1) * per_page <= pool_keys.rows());
      ik.slots = be.paged_row_list(lengths, table_start, table, per_page);
    }
    Tensor scores = be.index_scores_packed(r.qi, cfg_.index_n_heads, pool_keys, RowFormat::kFp4Ue8m0, ik.slots, r.wts,
                                           visible, ik.offsets);  // [q rows, T]
    if (ls.is_candidate_source) {
      batch.candidates = be.select_candidates(scores, visible, cfg_.candidate_topk_blocks, cfg_.candidate_block_size,
                                              TieBreak::kLowestIndex);
    } else if (ls.uses_candidates) {
      DI_CHECK(!batch.candidates.empty() && batch.candidates.row_size() == scores.row_size());
      be.mask_scores(scores, batch.candidates);
    }
    // k >= every part's own min(index_topk, compressed rows), so each row keeps the same entries
    const int k = static_cast<int>(std::min<int64_t>(cfg_.index_topk, scores.row_size()));
    idx = be.topk_indices(scores, k, visible, 0, TieBreak::kLowestIndex);
  }
  batch.topk[layer] = idx;
  return idx;
}

Tensor Model::compressed_branch(int layer, const AttnRows& r, int part, Batch& batch) {
  Tensor idx;
  const LayerSchedule& ls = cfg_.layers[layer];
  const BatchPart& p = batch.parts[part];
  ForwardScratch& scratch = batch.scratch[part];
  SequenceState& state = *p.state;
  Backend& be = backend_;
  const int ratio = ls.ratio, ihd = cfg_.index_head_dim;
  const int64_t nq = p.q.rows, compress_len = (p.start + p.n) / ratio;

  const LayerCache& src = state.layers[ls.kv_source];
  DI_CHECK(src.n_comp >= compress_len);
  if (ls.mode == AttnMode::kFull || ls.mode == AttnMode::kReindex) {
    if (compress_len == 0) {
      idx = be.alloc(TType::kI32, {nq, 0});
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
      if (keys.empty())
        keys = be.unpack_rows(state.pool->index_keys(keys_layer), RowFormat::kFp4Ue8m0, ihd,
                              global_slots(state, keys_layer, 0, compress_len));
      const TieBreak ties = options_.reference_decode_quirks ? TieBreak::kTorch : TieBreak::kLowestIndex;
      std::vector<int64_t> visible(nq);
      for (int64_t i = 0; i < nq; ++i) visible[i] = (p.q.first + i + 1) / ratio;
      Tensor scores = be.index_scores(row_view(r.qi, p.q.row0, nq), cfg_.index_n_heads, keys,
                                      row_view(r.wts, p.q.row0, nq), visible, {});
      if (ls.is_candidate_source) {
        scratch.candidates =
            be.select_candidates(scores, visible, cfg_.candidate_topk_blocks, cfg_.candidate_block_size, ties);
      } else if (ls.uses_candidates) {
        DI_CHECK(!scratch.candidates.empty());
        be.mask_scores(scores, scratch.candidates);
      }
      int k = static_cast<int>(std::min<int64_t>(cfg_.index_topk, compress_len));
      idx = be.topk_indices(scores, k, visible, 0, ties);
    }
    scratch.topk[layer] = idx;
  } else {
    auto it = scratch.topk.find(ls.index_source);
    DI_CHECK(it != scratch.topk.end());
    idx = it->second;
  }
  return idx;
}

Tensor Model::dspark_attention(int layer, const Tensor& x, const std::vector<int64_t>& positions,
                               SequenceState& state) {
  const AttentionWeights& a = w_.layers[layer].attn;
  LayerCache& cache = state.layers[layer];
  Backend& be = backend_;
  int64_t n = x.rows(), win = cfg_.window, last = positions.front() - 1;  // last seeded position
  int heads = cfg_.n_heads, dh = cfg_.head_dim, rd = cfg_.rope_dim;
  const float eps = static_cast<float>(cfg_.norm_eps);
  Tensor q = be.linear_rope(be.linear(x, a.wq_a), a.wq_b, heads, dh, rd, positions, rope_[layer], {&a.q_norm, eps});
  Tensor kv = be.rmsnorm_rope_qdq(be.linear(x, a.wkv), a.kv_norm, eps, 1, dh, rd, positions, rope_[layer],
                                  RowFormat::kFp8Ue8m0);
  // keys: the ring slots filled so far, then every block row (non-causal inside the block)
  Tensor keys = concat_rows(be, be.unpack_rows(cache.window, RowFormat::kFp8Ue8m0, dh, iota_slots(0, win)), kv);
  int64_t filled = std::min<int64_t>(win, last + 1), len = filled + n;
  std::vector<int32_t> idx(n * len);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < len; ++j) idx[i * len + j] = static_cast<int32_t>(j < filled ? j : win + (j - filled));
  Tensor o = be.sparse_attention(q, heads, keys, be.from_host_i32(idx, {n, len}), a.attn_sink,
                                 1.0f / std::sqrt(static_cast<float>(dh)));
  return attention_output(layer, std::move(o), positions);
}

}  // namespace di
