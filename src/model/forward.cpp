// The V4.1 forward over a batch of sequences (spec §2.1): embedding, four residual streams, the
// blocks (Engram before its layers), the final collapse and fp32 head. Dense work runs once over the
// concatenated rows of every sequence; Model::attention splits per sequence. With
// decoder_window_only, a long chunk keeps only its last `window` rows after the last KV source.
#include <algorithm>
#include <string>

#include "core/error.h"
#include "model/model.h"
#include "model/model_scratch.h"

namespace di {

namespace {

// Throws di::Error for an entry the forward cannot run.
void check_entry(const BatchEntry& en, const ModelConfig& cfg, bool has_engram) {
  DI_CHECK(en.state != nullptr && !en.ids.empty());
  const SequenceState& st = *en.state;
  const int64_t n = static_cast<int64_t>(en.ids.size()), start = st.n_tokens;
  if (start + n > cfg.max_position)
    throw Error("sequence of " + std::to_string(start + n) + " tokens exceeds max_position_embeddings " +
                std::to_string(cfg.max_position));
  for (int32_t id : en.ids)
    if (id < 0 || id >= cfg.vocab_size)
      throw Error("token id " + std::to_string(id) + " out of range [0, " + std::to_string(cfg.vocab_size) + ")");
  const int64_t keep = en.options.keep_global_before;
  for (const LayerCache& c : st.layers)
    if (c.ratio > 0 && (keep % c.ratio != 0 || c.n_comp < std::min(keep, start + n) / c.ratio))
      throw Error("forward: keep_global_before " + std::to_string(keep) + " must be a multiple of every compress " +
                  "ratio and covered by the state's global rows (" + std::to_string(c.n_comp * c.ratio) + " positions)");
  if (has_engram && st.engram_history.size() < static_cast<size_t>(start))
    throw Error("forward: the state's Engram history holds " + std::to_string(st.engram_history.size()) +
                " tokens, fewer than its " + std::to_string(start) + " positions (restore_history first)");
}

}  // namespace

void Model::restore_history(SequenceState& state, const std::vector<int32_t>& prefix_ids) {
  state.engram_history.clear();
  if (engram_.n_slots() == 0) return;
  for (int32_t id : prefix_ids) state.engram_history.push_back(engram_compress(engram_token_map_, id));
}

int Model::last_kv_source_layer() const {
  int last = -1;
  for (const LayerSchedule& ls : cfg_.layers)
    if (!ls.is_dspark && ls.mode == AttnMode::kFull) last = ls.layer;
  return last;
}

ForwardResult Model::forward(SequenceState& state, const std::vector<int32_t>& ids, bool all_logits,
                             const ForwardHooks* hooks) {
  std::vector<BatchEntry> one(1);
  one[0].state = &state;
  one[0].ids = ids;
  one[0].options.all_logits = all_logits;
  return std::move(forward_batch(one, hooks)[0]);
}

std::vector<int32_t> Model::engram_hashes(SequenceState& state, int64_t start, const std::vector<int32_t>& ids) {
  // the history holds the positions before `start` (a replay may find more: they are fed again)
  std::vector<int32_t>& hist = state.engram_history;
  hist.resize(static_cast<size_t>(start));
  for (int32_t id : ids) hist.push_back(engram_compress(engram_token_map_, id));
  const int64_t n = static_cast<int64_t>(ids.size());
  std::vector<int64_t> positions(n);
  for (int64_t i = 0; i < n; ++i) positions[i] = start + i;
  std::vector<int64_t> all(n * engram_.n_slots() * engram_.n_cols());
  engram_hash_tokens(engram_, hist, positions, engram_pad_, all.data());
  return std::vector<int32_t>(all.begin(), all.end());  // row ids < 2^31 (table sizes)
}

std::vector<ForwardResult> Model::forward_batch(std::vector<BatchEntry>& entries, const ForwardHooks* hooks) {
  DI_CHECK(!entries.empty());
  const int ns = engram_.n_slots(), nc = engram_.n_cols();
  for (size_t e = 0; e < entries.size(); ++e) {
    check_entry(entries[e], cfg_, ns > 0);
    for (size_t f = 0; f < e; ++f)
      if (entries[f].state == entries[e].state)
        throw Error("forward_batch: entries " + std::to_string(f) + " and " + std::to_string(e) +
                    " feed the same sequence state");
  }
  backend_.side_join();  // side work of an earlier forward that threw before its join
  Batch batch;
  batch.split_layer = last_kv_source_layer();
  batch.scratch.resize(entries.size());
  std::vector<int32_t> all_ids;
  std::vector<std::vector<int32_t>> hashes(entries.size());  // per entry: [n][slot][col] Engram rows
  for (BatchEntry& en : entries) {
    BatchPart p;
    p.state = en.state;
    p.options = en.options;
    p.start = en.state->n_tokens;
    p.n = static_cast<int64_t>(en.ids.size());
    p.cur = {batch.rows, p.n, p.start};
    p.truncates = en.options.decoder_window_only && batch.split_layer >= 0 && p.n > cfg_.window;
    if (ns > 0) hashes[batch.parts.size()] = engram_hashes(*en.state, p.start, en.ids);
    batch.parts.push_back(p);
    for (int64_t i = 0; i < p.n; ++i) batch.positions.push_back(p.start + i);
    batch.rows += p.n;
    all_ids.insert(all_ids.end(), en.ids.begin(), en.ids.end());
  }
  batch.ring_base.assign(batch.parts.size(), -1);  // the parts past their first chunk read their rings
  for (size_t e = 0; e < batch.parts.size(); ++e)
    if (batch.parts[e].start > 0) {
      batch.ring_base[e] = batch.ring_rows;
      batch.ring_rows += cfg_.window;
    }
  auto engram_cols = [&](int slot) {  // [current rows, nc] I32
    std::vector<int32_t> v(batch.rows * nc);
    for (size_t e = 0; e < batch.parts.size(); ++e) {
      const BatchPart& p = batch.parts[e];
      for (int64_t i = 0; i < p.cur.rows; ++i) {
        const int32_t* row = hashes[e].data() + ((p.cur.first - p.start + i) * ns + slot) * nc;
        std::copy(row, row + nc, v.begin() + (p.cur.row0 + i) * nc);
      }
    }
    return backend_.from_host_i32(v, {batch.rows, nc});
  };

  Tensor h = repeat_streams(backend_.embed(backend_.from_host_i32(all_ids, {batch.rows}), w_.embed));  // [N, hc*D]
  Tensor pre = one_hot_pre(batch.rows);
  struct Tap {
    Tensor rows;                 // [rows then, D] bf16
    std::vector<RowSpan> spans;  // the parts' rows then
  };
  std::vector<Tap> taps;
  Tensor carried_x;  // the block's attention input, computed by the block before it (empty: not)
  for (int l = 0; l < cfg_.n_layers; ++l) {
    const LayerSchedule& ls = cfg_.layers[l];
    if (hooks && hooks->at_layer) hooks->at_layer(l);
    if (hooks && hooks->before_layer) hooks->before_layer(l, h, pre);
    if (ls.engram_slot >= 0) {
      h = engram(l, h, engram_cols(ls.engram_slot));
      if (hooks && hooks->after_engram) hooks->after_engram(l, h);
    }
    if (ls.dspark_tap >= 0) {  // attention input
      Tap t{backend_.stream_mean(h, cfg_.hc_mult), {}};
      for (const BatchPart& p : batch.parts) t.spans.push_back(p.cur);
      taps.push_back(std::move(t));
    }
    // the next block's input is computed with this block's output unless something may change the
    // streams in between (its Engram, a hook)
    const bool carry =
        l + 1 < cfg_.n_layers && cfg_.layers[l + 1].engram_slot < 0 && !(hooks && hooks->before_layer);
    Tensor next_x;
    h = block(l, h, pre, batch, hooks, carried_x.empty() ? nullptr : &carried_x,
              carry ? &w_.layers[l + 1].attn_norm : nullptr, &next_x);
    carried_x = next_x;
    if (hooks && hooks->after_block) hooks->after_block(l, h, pre);
  }

  // the final collapse reuses the last block's FFN-site pre (V4.1 has no hc_head); the head runs on
  // every row of all_logits entries and the last row of the others
  Tensor x = backend_.hc_pre(h, pre, cfg_.hc_mult);
  auto head_rows = [](const BatchPart& p) { return p.options.all_logits ? p.cur.rows : int64_t{1}; };
  int64_t n_head = 0;
  for (const BatchPart& p : batch.parts) n_head += head_rows(p);
  if (n_head != x.rows()) {
    Tensor sel = backend_.alloc(TType::kF32, {n_head, x.row_size()});
    int64_t r = 0;
    for (const BatchPart& p : batch.parts) {
      backend_.copy_rows(sel, r, x, p.cur.row0 + p.cur.rows - head_rows(p), head_rows(p));
      r += head_rows(p);
    }
    x = sel;
  }
  x = backend_.rmsnorm(x, w_.norm, static_cast<float>(cfg_.norm_eps));
  std::span<const float> logits = backend_.to_host_f32_staged(backend_.linear(x, w_.head));  // [n_head, vocab]

  std::vector<ForwardResult> results(batch.parts.size());
  const int64_t vocab = cfg_.vocab_size;
  int64_t r = 0;
  for (size_t e = 0; e < batch.parts.size(); ++e) {
    const BatchPart& p = batch.parts[e];
    ForwardResult& res = results[e];
    std::span<const float> mine = logits.subspan(r * vocab, head_rows(p) * vocab);
    if (p.options.borrow_logits)
      res.borrowed_logits = mine;
    else
      res.logits.assign(mine.begin(), mine.end());
    r += head_rows(p);
    res.rows_position = p.cur.first;
    for (const Tap& t : taps) {  // this part's final rows of every tap
      const RowSpan& then = t.spans[e];
      Tensor rows = rows_of(backend_, t.rows, then.row0 + (p.cur.first - then.first), p.cur.rows);
      res.features = res.features.empty() ? rows : backend_.concat_cols(res.features, rows);
    }
    p.state->n_tokens += p.n;
  }
  return results;
}

}  // namespace di
