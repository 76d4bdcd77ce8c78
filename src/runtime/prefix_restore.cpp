#include "runtime/prefix_restore.h"

#include "core/error.h"

namespace di {
namespace {

void adopt_blocks(SequenceState& s, const PrefixCache::Hit& hit) {
  std::vector<PageRef> pages;
  for (const auto& p : hit.blocks) {
    const auto& blk = static_cast<const CachedBlock&>(*p);
    pages.insert(pages.end(), blk.pages.begin(), blk.pages.end());
  }
  adopt_global_pages(s, pages, 0);
  for (const LayerCache& c : s.layers)
    if (c.ratio > 0) DI_CHECK(c.n_comp * c.ratio == hit.n_tokens);
}

}  // namespace

std::shared_ptr<const SequenceState> capture_local(const SequenceState& s, Backend& b) {
  auto c = std::make_shared<SequenceState>(s);  // counters; tensors still shared until copied below
  c->engram_history.clear();
  for (LayerCache& l : c->layers) {
    l.window = copy_tensor(b, l.window);
    l.tail_kv = copy_tensor(b, l.tail_kv);
    l.tail_score = copy_tensor(b, l.tail_score);
    l.step_kv = Tensor();  // only a rollback right after a forward reads these
    l.step_score = Tensor();
  }
  c->pages.clear();
  return c;
}

int64_t cached_block_bytes(const CachedBlock& block) {
  int64_t n = static_cast<int64_t>(block.pages.size()) * block.page_bytes;
  return block.local ? n + local_state_bytes(*block.local) : n;
}

SequenceState restore_exact(Model& model, const PrefixCache::Hit& hit, const std::vector<int32_t>& tokens) {
  DI_CHECK(!hit.blocks.empty());
  const auto& last = static_cast<const CachedBlock&>(*hit.blocks.back());
  DI_CHECK(last.local && last.local->n_tokens == hit.n_tokens);
  Backend& b = model.backend();
  SequenceState s = *last.local;
  std::vector<int64_t> n_comp;
  for (LayerCache& l : s.layers) {
    l.window = copy_tensor(b, l.window);
    l.tail_kv = copy_tensor(b, l.tail_kv);
    l.tail_score = copy_tensor(b, l.tail_score);
    n_comp.push_back(l.n_comp);
    l.n_comp = 0;  // the blocks' pages bring the rows
  }
  adopt_blocks(s, hit);
  for (size_t i = 0; i < s.layers.size(); ++i) DI_CHECK(s.layers[i].n_comp == n_comp[i]);
  model.restore_history(s, std::vector<int32_t>(tokens.begin(), tokens.begin() + hit.n_tokens));
  return s;
}

SequenceState restore_replay(Model& model, const PrefixCache::Hit& hit, const std::vector<int32_t>& tokens,
                             int64_t start) {
  DI_CHECK(start >= 0 && start < hit.n_tokens);
  SequenceState s = model.new_sequence();
  adopt_blocks(s, hit);
  model.restore_history(s, std::vector<int32_t>(tokens.begin(), tokens.begin() + start));
  set_replay_start(s, start);
  return s;
}

}  // namespace di
