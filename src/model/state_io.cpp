#include "model/state_io.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "core/error.h"

namespace di {

namespace {

Tensor copy_rows_of(Backend& b, const Tensor& t, int64_t r0, int64_t n, int64_t capacity) {
  Tensor out = b.alloc(t.type, {capacity, t.row_size()});
  if (n > 0) b.copy_rows(out, 0, t, r0, n);
  return out;
}

Tensor deep_copy(Backend& b, const Tensor& t) {
  if (t.empty() && t.shape.empty()) return t;
  return copy_rows_of(b, t, 0, t.rows(), t.rows());
}

}  // namespace

SequenceState clone_state(const SequenceState& s, Backend& b) {
  SequenceState c = s;  // counts, history; tensors still shared
  for (LayerCache& l : c.layers) {
    l.window = deep_copy(b, l.window);
    l.tail_kv = deep_copy(b, l.tail_kv);
    l.tail_score = deep_copy(b, l.tail_score);
    l.step_kv = deep_copy(b, l.step_kv);
    l.step_score = deep_copy(b, l.step_score);
    if (l.ratio > 0) {
      l.comp = copy_rows_of(b, l.comp, 0, l.n_comp, l.comp.rows());
      l.index_keys = copy_rows_of(b, l.index_keys, 0, l.n_comp, l.index_keys.rows());
    }
  }
  return c;
}

GlobalRows read_global_rows(const SequenceState& s, int64_t begin, int64_t end, Backend& b) {
  if (begin < 0 || end < begin)
    throw Error("read_global_rows: bad range [" + std::to_string(begin) + ", " + std::to_string(end) + ")");
  GlobalRows g;
  g.begin = begin;
  g.end = end;
  for (size_t l = 0; l < s.layers.size(); ++l) {
    const LayerCache& c = s.layers[l];
    if (c.ratio == 0) continue;
    if (begin % c.ratio || end % c.ratio)
      throw Error("read_global_rows: [" + std::to_string(begin) + ", " + std::to_string(end) +
                  ") is not aligned to layer " + std::to_string(l) + "'s compress ratio " + std::to_string(c.ratio));
    if (end / c.ratio > c.n_comp)
      throw Error("read_global_rows: layer " + std::to_string(l) + " holds rows for " +
                  std::to_string(c.n_comp * c.ratio) + " positions, not " + std::to_string(end));
    int64_t r0 = begin / c.ratio, n = (end - begin) / c.ratio;
    g.layers.push_back(static_cast<int>(l));
    g.ratios.push_back(c.ratio);
    g.comp.push_back(copy_rows_of(b, c.comp, r0, n, n));
    g.index_keys.push_back(copy_rows_of(b, c.index_keys, r0, n, n));
  }
  return g;
}

void write_global_rows(SequenceState& s, const GlobalRows& g, Backend& b) {
  for (size_t i = 0; i < g.layers.size(); ++i) {
    int l = g.layers[i], r = g.ratios[i];
    if (l < 0 || static_cast<size_t>(l) >= s.layers.size() || s.layers[l].ratio != r)
      throw Error("write_global_rows: rows for layer " + std::to_string(l) + " (ratio " + std::to_string(r) +
                  ") do not match this state's Full layers");
    LayerCache& c = s.layers[l];
    int64_t r0 = g.begin / r, n = (g.end - g.begin) / r;
    if (r0 > c.n_comp)
      throw Error("write_global_rows: layer " + std::to_string(l) + " holds rows for " +
                  std::to_string(c.n_comp * r) + " positions; rows from " + std::to_string(g.begin) +
                  " would leave a gap");
    DI_CHECK(g.comp[i].rows() == n && g.index_keys[i].rows() == n);
    reserve_compressed(c, r0 + n, b);
    if (n > 0) {
      b.copy_rows(c.comp, r0, g.comp[i], 0, n);
      b.copy_rows(c.index_keys, r0, g.index_keys[i], 0, n);
    }
    c.n_comp = std::max(c.n_comp, r0 + n);
  }
}

int64_t global_bytes_per_token(const ModelConfig& cfg) {
  int64_t block = 1;  // a span every ratio divides
  for (const LayerSchedule& ls : cfg.layers)
    if (ls.mode == AttnMode::kFull && !ls.is_dspark) block = std::lcm(block, static_cast<int64_t>(ls.ratio));
  int64_t bytes = 0;
  for (const LayerSchedule& ls : cfg.layers)
    if (ls.mode == AttnMode::kFull && !ls.is_dspark)
      bytes += block / ls.ratio * (packed_row_bytes(RowFormat::kFp4E4m3, cfg.head_dim) +
                                   packed_row_bytes(RowFormat::kFp4Ue8m0, cfg.index_head_dim));
  return (bytes + block - 1) / block;
}

void set_replay_start(SequenceState& s, int64_t position) {
  if (position < 0) throw Error("set_replay_start: negative position " + std::to_string(position));
  s.n_tokens = position;
  s.window_floor = position;
  s.dspark_seeded = position;
}

}  // namespace di
