#include "model/sequence_state.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace di {

SequenceState make_sequence_state(const ModelConfig& cfg, Backend& backend, std::shared_ptr<GlobalKvPool> pool) {
  DI_CHECK(pool != nullptr);
  SequenceState st;
  st.pool = std::move(pool);
  for (const LayerSchedule& ls : cfg.layers) {
    LayerCache c;
    c.dspark = ls.is_dspark;
    c.window = backend.zeros(TType::kU8, {cfg.window, packed_row_bytes(RowFormat::kFp8Ue8m0, cfg.head_dim)});
    if (ls.mode == AttnMode::kFull) {
      DI_CHECK(st.pool->has_rows(ls.layer));
      c.ratio = ls.ratio;
      if (ls.ratio > 1) {
        c.tail_kv = backend.zeros(TType::kF32, {ls.ratio, cfg.head_dim});
        c.tail_score = backend.zeros(TType::kF32, {ls.ratio, cfg.head_dim});
      }
    }
    st.layers.push_back(std::move(c));
  }
  return st;
}

void prepare_global_write(SequenceState& s, int64_t begin, int64_t end) {
  GlobalKvPool& pool = *s.pool;
  const int64_t t = pool.page_tokens(), n_pages = (end + t - 1) / t;
  for (int64_t p = begin / t; p < std::min<int64_t>(n_pages, static_cast<int64_t>(s.pages.size())); ++p) {
    if (s.pages[p].use_count() == 1) continue;
    PageRef own = pool.allocate();  // may grow the storage: the tensors are fetched after it
    for (size_t l = 0; l < s.layers.size(); ++l) {
      const int64_t rows = pool.rows_per_page(static_cast<int>(l));
      if (rows == 0) continue;
      for (Tensor* pt : {&pool.comp(static_cast<int>(l)), &pool.index_keys(static_cast<int>(l))})
        pool.backend().copy_rows(*pt, own->id() * rows, *pt, s.pages[p]->id() * rows, rows);
    }
    s.pages[p] = std::move(own);
  }
  while (static_cast<int64_t>(s.pages.size()) < n_pages) s.pages.push_back(pool.allocate());
}

void for_each_global_run(const SequenceState& s, int layer, int64_t row0, int64_t n,
                         const std::function<void(int64_t, int64_t, int64_t)>& fn) {
  const int64_t per_page = s.pool->rows_per_page(layer);
  DI_CHECK(per_page > 0);
  DI_CHECK_MSG((row0 + n + per_page - 1) / per_page <= static_cast<int64_t>(s.pages.size()),
               "global rows past the state's pages");
  for (int64_t r = row0; r < row0 + n;) {
    int64_t p = r / per_page, pool_row = s.pages[p]->id() * per_page + r % per_page;
    int64_t run = std::min(row0 + n, (p + 1) * per_page) - r;
    // whole following pages that sit right after this one in the pool join the run
    while (r + run < row0 + n && s.pages[p + 1]->id() == s.pages[p]->id() + 1) {
      ++p;
      run = std::min(row0 + n, (p + 1) * per_page) - r;
    }
    fn(pool_row, r, run);
    r += run;
  }
}

std::vector<int64_t> global_slots(const SequenceState& s, int layer, int64_t row0, int64_t n) {
  std::vector<int64_t> slots(static_cast<size_t>(n));
  for_each_global_run(s, layer, row0, n, [&](int64_t pool_row, int64_t row, int64_t run) {
    for (int64_t i = 0; i < run; ++i) slots[static_cast<size_t>(row - row0 + i)] = pool_row + i;
  });
  return slots;
}

int64_t local_state_bytes(const SequenceState& s) {
  int64_t n = 0;
  for (const LayerCache& c : s.layers) n += c.window.bytes() + c.tail_kv.bytes() + c.tail_score.bytes();
  return n;
}

int64_t pages_needed(const SequenceState& s) {
  int64_t positions = s.n_tokens;
  for (const LayerCache& c : s.layers) positions = std::max(positions, c.n_comp * c.ratio);
  return (positions + s.pool->page_tokens() - 1) / s.pool->page_tokens();
}

namespace {

// Ring rows of positions [p0, p0 + n) (n <= ring size, so distinct slots): copies, or writes back.
Tensor read_ring(Backend& b, const Tensor& ring, int64_t p0, int64_t n) {
  int64_t w = ring.rows();
  Tensor out = b.alloc(TType::kU8, {n, ring.row_size()});
  for (int64_t i = 0; i < n;) {
    int64_t slot = (p0 + i) % w, run = std::min(n - i, w - slot);  // contiguous up to the ring's end
    b.copy_rows(out, i, ring, slot, run);
    i += run;
  }
  return out;
}

void write_ring(Backend& b, Tensor& ring, int64_t p0, const Tensor& rows, int64_t r0, int64_t n) {
  int64_t w = ring.rows();
  for (int64_t i = 0; i < n;) {
    int64_t slot = (p0 + i) % w, run = std::min(n - i, w - slot);
    b.copy_rows(ring, slot, rows, r0 + i, run);
    i += run;
  }
}

}  // namespace

StateCheckpoint checkpoint_state(const SequenceState& s, int64_t n_new_tokens, Backend& b) {
  if (s.layers.empty()) throw Error("checkpoint_state: the state has no layers");
  const int64_t w = s.layers[0].window.rows();
  if (n_new_tokens < 1 || n_new_tokens > w)
    throw Error("checkpoint_state: " + std::to_string(n_new_tokens) + " new tokens; a rollback checkpoint covers 1.." +
                std::to_string(w) + " (the sliding window)");
  StateCheckpoint cp;
  cp.n_tokens = s.n_tokens;
  cp.n_new = n_new_tokens;
  cp.dspark_seeded = s.dspark_seeded;
  cp.index_keys_layer = s.index_keys_layer;
  // DSpark seeding after this point may write positions dspark_seeded .. n_tokens + n_new
  int64_t ds_n = std::min(w, s.n_tokens + n_new_tokens - s.dspark_seeded);
  for (const LayerCache& c : s.layers) {
    cp.ring_rows.push_back(c.dspark ? Tensor{} : read_ring(b, c.window, s.n_tokens, n_new_tokens));
    cp.dspark_rows.push_back(c.dspark && ds_n > 0 ? read_ring(b, c.window, s.dspark_seeded, ds_n) : Tensor{});
    cp.tail_kv.push_back(c.ratio > 1 ? copy_tensor(b, c.tail_kv) : Tensor{});
    cp.tail_score.push_back(c.ratio > 1 ? copy_tensor(b, c.tail_score) : Tensor{});
    cp.n_comp.push_back(c.n_comp);
  }
  cp.dspark_saved = ds_n;
  return cp;
}

void rollback_state(SequenceState& s, const StateCheckpoint& cp, int64_t n_keep, Backend& b) {
  const int64_t start = cp.n_tokens, end = start + n_keep;
  if (s.n_tokens != cp.n_tokens + cp.n_new)
    throw Error("rollback_state: the state holds " + std::to_string(s.n_tokens) + " tokens; the checkpoint expects " +
                std::to_string(cp.n_tokens + cp.n_new) + " (its forward not run, or run twice)");
  if (n_keep < 0 || n_keep > cp.n_new)
    throw Error("rollback_state: n_keep " + std::to_string(n_keep) + " outside 0.." + std::to_string(cp.n_new));
  const int64_t ds_from = cp.dspark_seeded, ds_keep = std::min(s.dspark_seeded, end);
  DI_CHECK(ds_keep >= ds_from);
  if (s.dspark_seeded > ds_from + cp.dspark_saved)
    throw Error("rollback_state: DSpark seeded up to " + std::to_string(s.dspark_seeded) +
                ", past what the checkpoint saved (" + std::to_string(ds_from + cp.dspark_saved) + ")");
  int last_emitting = -1;  // the last Full layer a forward of the kept tokens alone would see emit
  for (size_t l = 0; l < s.layers.size(); ++l) {
    LayerCache& c = s.layers[l];
    if (c.dspark) {
      // slots of positions seeded after the checkpoint and dropped now get their old rows back
      if (s.dspark_seeded > ds_keep)
        write_ring(b, c.window, ds_keep, cp.dspark_rows[l], ds_keep - ds_from, s.dspark_seeded - ds_keep);
      continue;
    }
    write_ring(b, c.window, end, cp.ring_rows[l], n_keep, cp.n_new - n_keep);
    if (c.ratio == 0) continue;
    if (end / c.ratio > start / c.ratio) last_emitting = static_cast<int>(l);
    c.n_comp = std::max(cp.n_comp[l], end / c.ratio);
    if (c.ratio > 1) {
      // the pending group of the kept prefix: members before the step from the saved tail, the
      // others from the step's compressor inputs
      for (int64_t t = end / c.ratio * c.ratio; t < end; ++t) {
        if (t < start) {
          b.copy_rows(c.tail_kv, t % c.ratio, cp.tail_kv[l], t % c.ratio, 1);
          b.copy_rows(c.tail_score, t % c.ratio, cp.tail_score[l], t % c.ratio, 1);
        } else {
          DI_CHECK_MSG(c.step_kv.rows() == cp.n_new, "the step's compressor inputs were not kept");
          b.copy_rows(c.tail_kv, t % c.ratio, c.step_kv, t - start, 1);
          b.copy_rows(c.tail_score, t % c.ratio, c.step_score, t - start, 1);
        }
      }
      c.step_kv = Tensor{};
      c.step_score = Tensor{};
    }
  }
  s.index_keys_layer = last_emitting >= 0 ? last_emitting : cp.index_keys_layer;
  if (s.engram_history.size() > static_cast<size_t>(end)) s.engram_history.resize(static_cast<size_t>(end));
  s.dspark_seeded = ds_keep;
  s.n_tokens = end;
  // pages of the dropped positions go back to the pool
  if (static_cast<int64_t>(s.pages.size()) > pages_needed(s)) s.pages.resize(static_cast<size_t>(pages_needed(s)));
}

}  // namespace di
