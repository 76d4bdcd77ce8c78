#include "model/state_io.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "core/error.h"

namespace di {

SequenceState clone_state(const SequenceState& s, Backend& b) {
  SequenceState c = s;  // counts, history, the pages (shared: either copies one before writing it)
  for (LayerCache& l : c.layers) {
    l.window = copy_tensor(b, l.window);
    l.tail_kv = copy_tensor(b, l.tail_kv);
    l.tail_score = copy_tensor(b, l.tail_score);
    l.step_kv = copy_tensor(b, l.step_kv);
    l.step_score = copy_tensor(b, l.step_score);
  }
  return c;
}

namespace {

void check_range(const SequenceState& s, int64_t begin, int64_t end, const char* what) {
  if (begin < 0 || end < begin)
    throw Error(std::string(what) + ": bad range [" + std::to_string(begin) + ", " + std::to_string(end) + ")");
  for (size_t l = 0; l < s.layers.size(); ++l) {
    const LayerCache& c = s.layers[l];
    if (c.ratio == 0) continue;
    if (begin % c.ratio || end % c.ratio)
      throw Error(std::string(what) + ": [" + std::to_string(begin) + ", " + std::to_string(end) +
                  ") is not aligned to layer " + std::to_string(l) + "'s compress ratio " + std::to_string(c.ratio));
    if (end / c.ratio > c.n_comp)
      throw Error(std::string(what) + ": layer " + std::to_string(l) + " holds rows for " +
                  std::to_string(c.n_comp * c.ratio) + " positions, not " + std::to_string(end));
  }
}

}  // namespace

GlobalRows read_global_rows(const SequenceState& s, int64_t begin, int64_t end, Backend& b) {
  check_range(s, begin, end, "read_global_rows");
  GlobalRows g;
  g.begin = begin;
  g.end = end;
  GlobalKvPool& pool = *s.pool;
  for (size_t l = 0; l < s.layers.size(); ++l) {
    const LayerCache& c = s.layers[l];
    if (c.ratio == 0) continue;
    const int layer = static_cast<int>(l);
    const int64_t r0 = begin / c.ratio, n = (end - begin) / c.ratio;
    g.layers.push_back(layer);
    g.ratios.push_back(c.ratio);
    g.comp.push_back(b.alloc(TType::kU8, {n, pool.comp(layer).row_size()}));
    g.index_keys.push_back(b.alloc(TType::kU8, {n, pool.index_keys(layer).row_size()}));
    for_each_global_run(s, layer, r0, n, [&](int64_t pool_row, int64_t row, int64_t run) {
      b.copy_rows(g.comp.back(), row - r0, pool.comp(layer), pool_row, run);
      b.copy_rows(g.index_keys.back(), row - r0, pool.index_keys(layer), pool_row, run);
    });
  }
  return g;
}

void write_global_rows(SequenceState& s, const GlobalRows& g, Backend& b) {
  if (g.layers.empty()) return;
  for (size_t i = 0; i < g.layers.size(); ++i) {
    int l = g.layers[i], r = g.ratios[i];
    if (l < 0 || static_cast<size_t>(l) >= s.layers.size() || s.layers[l].ratio != r)
      throw Error("write_global_rows: rows for layer " + std::to_string(l) + " (ratio " + std::to_string(r) +
                  ") do not match this state's Full layers");
    const LayerCache& c = s.layers[l];
    if (g.begin / r > c.n_comp)
      throw Error("write_global_rows: layer " + std::to_string(l) + " holds rows for " +
                  std::to_string(c.n_comp * r) + " positions; rows from " + std::to_string(g.begin) +
                  " would leave a gap");
    DI_CHECK(g.comp[i].rows() == (g.end - g.begin) / r && g.index_keys[i].rows() == (g.end - g.begin) / r);
  }
  prepare_global_write(s, g.begin, g.end);
  GlobalKvPool& pool = *s.pool;
  for (size_t i = 0; i < g.layers.size(); ++i) {
    const int l = g.layers[i];
    LayerCache& c = s.layers[l];
    const int64_t r0 = g.begin / c.ratio, n = (g.end - g.begin) / c.ratio;
    for_each_global_run(s, l, r0, n, [&](int64_t pool_row, int64_t row, int64_t run) {
      b.copy_rows(pool.comp(l), pool_row, g.comp[i], row - r0, run);
      b.copy_rows(pool.index_keys(l), pool_row, g.index_keys[i], row - r0, run);
    });
    c.n_comp = std::max(c.n_comp, r0 + n);
  }
}

std::vector<PageRef> share_global_pages(const SequenceState& s, int64_t begin, int64_t end) {
  const int64_t t = s.pool->page_tokens();
  if (begin % t || end % t)
    throw Error("share_global_pages: [" + std::to_string(begin) + ", " + std::to_string(end) +
                ") is not aligned to the " + std::to_string(t) + "-position pages");
  check_range(s, begin, end, "share_global_pages");
  if (s.pool->page_bytes() == 0) return {};  // no Full layers: nothing global
  return std::vector<PageRef>(s.pages.begin() + begin / t, s.pages.begin() + end / t);
}

void adopt_global_pages(SequenceState& s, const std::vector<PageRef>& pages, int64_t begin) {
  const int64_t t = s.pool->page_tokens();
  if (begin % t || begin / t != static_cast<int64_t>(s.pages.size()))
    throw Error("adopt_global_pages: pages from position " + std::to_string(begin) + " onto a state with " +
                std::to_string(s.pages.size()) + " pages of " + std::to_string(t) + " positions");
  for (const LayerCache& c : s.layers)
    if (c.ratio > 0 && c.n_comp * c.ratio != begin)
      throw Error("adopt_global_pages: the state's global rows end at " + std::to_string(c.n_comp * c.ratio) +
                  ", not at " + std::to_string(begin));
  s.pages.insert(s.pages.end(), pages.begin(), pages.end());
  const int64_t end = begin + static_cast<int64_t>(pages.size()) * t;
  for (LayerCache& c : s.layers)
    if (c.ratio > 0) c.n_comp = end / c.ratio;
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
