#include "runtime/prefix_restore.h"

#include "core/error.h"

namespace di {
namespace {

Tensor deep_copy(Backend& b, const Tensor& t) {
  if (t.empty()) return t;
  Tensor out = b.alloc(t.type, t.shape);
  if (t.rows() > 0) b.copy_rows(out, 0, t, 0, t.rows());
  return out;
}

void write_blocks(SequenceState& s, const PrefixCache::Hit& hit, Backend& b) {
  for (const auto& p : hit.blocks) write_global_rows(s, static_cast<const CachedBlock&>(*p).rows, b);
  for (const LayerCache& c : s.layers)
    if (c.ratio > 0) DI_CHECK(c.n_comp * c.ratio == hit.n_tokens);
}

}  // namespace

int64_t tensor_bytes(const Tensor& t) {
  if (t.empty()) return 0;
  return t.numel() * (t.type == TType::kU8 ? 1 : 4);
}

std::shared_ptr<const SequenceState> capture_local(const SequenceState& s, Backend& b) {
  auto c = std::make_shared<SequenceState>(s);  // counters; tensors still shared until copied below
  c->engram_history.clear();
  for (LayerCache& l : c->layers) {
    l.window = deep_copy(b, l.window);
    l.tail_kv = deep_copy(b, l.tail_kv);
    l.tail_score = deep_copy(b, l.tail_score);
    l.step_kv = Tensor();  // only a rollback right after a forward reads these
    l.step_score = Tensor();
    if (l.ratio > 0) {
      l.comp = b.zeros(TType::kU8, {0, l.comp.row_size()});
      l.index_keys = b.zeros(TType::kU8, {0, l.index_keys.row_size()});
    }
  }
  return c;
}

int64_t cached_block_bytes(const CachedBlock& block) {
  int64_t n = 0;
  for (const Tensor& t : block.rows.comp) n += tensor_bytes(t);
  for (const Tensor& t : block.rows.index_keys) n += tensor_bytes(t);
  if (block.local)
    for (const LayerCache& l : block.local->layers)
      n += tensor_bytes(l.window) + tensor_bytes(l.tail_kv) + tensor_bytes(l.tail_score);
  return n;
}

SequenceState restore_exact(Model& model, const PrefixCache::Hit& hit, const std::vector<int32_t>& tokens) {
  DI_CHECK(!hit.blocks.empty());
  const auto& last = static_cast<const CachedBlock&>(*hit.blocks.back());
  DI_CHECK(last.local && last.local->n_tokens == hit.n_tokens);
  Backend& b = model.backend();
  SequenceState s = *last.local;
  std::vector<int64_t> n_comp;
  for (LayerCache& l : s.layers) {
    l.window = deep_copy(b, l.window);
    l.tail_kv = deep_copy(b, l.tail_kv);
    l.tail_score = deep_copy(b, l.tail_score);
    n_comp.push_back(l.n_comp);
    if (l.ratio > 0) {  // fresh, empty compressed caches: the blocks fill them in order
      l.comp = b.zeros(TType::kU8, {0, l.comp.row_size()});
      l.index_keys = b.zeros(TType::kU8, {0, l.index_keys.row_size()});
      l.n_comp = 0;
    }
  }
  write_blocks(s, hit, b);
  for (size_t i = 0; i < s.layers.size(); ++i) DI_CHECK(s.layers[i].n_comp == n_comp[i]);
  model.restore_history(s, std::vector<int32_t>(tokens.begin(), tokens.begin() + hit.n_tokens));
  return s;
}

SequenceState restore_replay(Model& model, const PrefixCache::Hit& hit, const std::vector<int32_t>& tokens,
                             int64_t start) {
  DI_CHECK(start >= 0 && start < hit.n_tokens);
  SequenceState s = model.new_sequence();
  write_blocks(s, hit, model.backend());
  model.restore_history(s, std::vector<int32_t>(tokens.begin(), tokens.begin() + start));
  set_replay_start(s, start);
  return s;
}

}  // namespace di
