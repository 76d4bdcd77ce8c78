#include "runtime/kv_manager.h"

#include <string>

#include "core/error.h"
#include "model/memory_estimate.h"

namespace di {

KvLayout KvLayout::from_config(const ModelConfig& cfg, int64_t page_tokens) {
  if (page_tokens <= 0) throw Error("kv page size: expected a positive number of positions, got " + std::to_string(page_tokens));
  KvLayout l;
  l.page_tokens = page_tokens;
  KvCacheBytes b = kv_cache_bytes(cfg);
  int64_t page_global = 0, global_per_2_tokens = 0;
  for (const LayerSchedule& ls : cfg.layers) {
    if (ls.mode != AttnMode::kFull) continue;
    if (page_tokens % ls.ratio != 0)
      throw Error("kv page size " + std::to_string(page_tokens) + " is not a multiple of layer " +
                  std::to_string(ls.layer) + "'s compress ratio " + std::to_string(ls.ratio));
    int64_t record = static_cast<int64_t>(b.compressed_record + b.index_key_record);
    page_global += page_tokens / ls.ratio * record;
    global_per_2_tokens += 2 / ls.ratio * record;
  }
  l.global_bytes_per_token = global_per_2_tokens / 2;
  int64_t history = cfg.engram_layer_ids.empty() ? 0 : static_cast<int64_t>(sizeof(int32_t));
  l.page_bytes = page_global + page_tokens * history;
  l.local_bytes = static_cast<int64_t>(b.window_per_request + b.compressor_tail_per_request);
  return l;
}

KvManager::KvManager(const KvLayout& layout, int64_t capacity_bytes) : layout_(layout), capacity_(capacity_bytes) {
  if (capacity_bytes <= 0)
    throw Error("kv_capacity_bytes: expected a positive number of bytes, got " + std::to_string(capacity_bytes));
}

int64_t KvManager::pages_of(uint64_t id) const {
  auto it = pages_.find(id);
  return it == pages_.end() ? 0 : it->second.pages;
}

int64_t KvManager::admit_bytes(int64_t n_tokens, int64_t shared_tokens) const {
  Held h;
  h.shared = shared_tokens / layout_.page_tokens;
  return layout_.local_bytes + charged_pages(h, n_tokens) * layout_.page_bytes;
}

void KvManager::admit(uint64_t id, int64_t n_tokens, int64_t shared_tokens) {
  DI_CHECK(!holds(id));
  DI_CHECK(can_admit(n_tokens, shared_tokens));
  Held h;
  h.shared = shared_tokens / layout_.page_tokens;
  h.pages = charged_pages(h, n_tokens);
  pages_[id] = h;
  used_ += layout_.local_bytes + h.pages * layout_.page_bytes;
}

int64_t KvManager::grow_bytes(uint64_t id, int64_t n_tokens) const {
  auto it = pages_.find(id);
  DI_CHECK(it != pages_.end());
  int64_t extra = charged_pages(it->second, n_tokens) - it->second.pages;
  return extra > 0 ? extra * layout_.page_bytes : 0;
}

void KvManager::grow(uint64_t id, int64_t n_tokens) {
  DI_CHECK(can_grow(id, n_tokens));
  Held& h = pages_.at(id);
  int64_t want = charged_pages(h, n_tokens);
  if (want <= h.pages) return;
  used_ += (want - h.pages) * layout_.page_bytes;
  h.pages = want;
}

void KvManager::shrink(uint64_t id, int64_t n_tokens) {
  Held& h = pages_.at(id);
  int64_t want = charged_pages(h, n_tokens);
  if (want >= h.pages) return;
  used_ -= (h.pages - want) * layout_.page_bytes;
  h.pages = want;
}

void KvManager::release(uint64_t id) {
  auto it = pages_.find(id);
  if (it == pages_.end()) return;
  used_ -= layout_.local_bytes + it->second.pages * layout_.page_bytes;
  pages_.erase(it);
  DI_CHECK(used_ >= 0);
}

}  // namespace di
