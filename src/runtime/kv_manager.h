// Hybrid KV accounting for V4.1 (spec §3.1): what one request costs in KV memory, and admission /
// growth / release of requests against a byte capacity.
//
// A request holds two kinds of KV:
//  - local state, a fixed size per request: a `sliding_window`-slot FP8 window ring per layer
//    (backbone and DSpark stages), the ratio > 1 compressor tails (fp32 kv + score rows);
//  - global rows, growing with its positions and counted in pages of `page_tokens` positions: FP4
//    compressed KV and FP4 index keys of the Full (KV source) layers only (890 B/token on
//    V4.1-Flash), plus the Engram token history (one int32 per position).
// The layout is the same on the CPU and CUDA backends.
//
// The global rows themselves live in the model's shared page pool (src/model/global_kv_pool.h), in
// pages of the same size; this class decides admission, growth and preemption by bytes. The pages of
// a prefix-cache hit a request maps are charged to the cache's budget only (the cache keeps such
// blocks while a request holds them); the blocks a request writes and the cache captures count
// against both.
#pragma once

#include <algorithm>
#include <cstdint>
#include <unordered_map>

#include "model/config.h"

namespace di {

struct KvLayout {
  int64_t page_tokens = 64;          // positions per page
  int64_t page_bytes = 0;            // global rows + Engram history of page_tokens positions
  int64_t global_bytes_per_token = 0;  // compressed KV + index keys of the Full layers (890 on V4.1-Flash)
  int64_t local_bytes = 0;           // per request: window rings (all layers) + compressor tails

  // page_tokens must be a positive multiple of every compress ratio (pages hold whole groups).
  static KvLayout from_config(const ModelConfig& cfg, int64_t page_tokens);

  int64_t pages_for(int64_t n_tokens) const { return (n_tokens + page_tokens - 1) / page_tokens; }
  // Bytes a request with n_tokens positions in its caches holds.
  int64_t request_bytes(int64_t n_tokens) const { return local_bytes + pages_for(n_tokens) * page_bytes; }
};

class KvManager {
 public:
  KvManager(const KvLayout& layout, int64_t capacity_bytes);

  const KvLayout& layout() const { return layout_; }
  int64_t capacity_bytes() const { return capacity_; }
  int64_t used_bytes() const { return used_; }
  int64_t free_bytes() const { return capacity_ - used_; }
  int64_t n_requests() const { return static_cast<int64_t>(pages_.size()); }
  bool holds(uint64_t id) const { return pages_.count(id) != 0; }
  int64_t pages_of(uint64_t id) const;

  // Whether a request of n_tokens positions fits in an otherwise empty cache.
  bool fits_alone(int64_t n_tokens) const { return layout_.request_bytes(n_tokens) <= capacity_; }
  // shared_tokens: leading positions whose pages the request shares with the prefix cache (a hit it
  // maps, not copies); the cache's budget holds those pages, so they are not charged here.
  bool can_admit(int64_t n_tokens, int64_t shared_tokens = 0) const {
    return admit_bytes(n_tokens, shared_tokens) <= free_bytes();
  }
  // Takes the local state and the pages for n_tokens positions but the shared ones. DI_CHECKs
  // can_admit and a new id.
  void admit(uint64_t id, int64_t n_tokens, int64_t shared_tokens = 0);
  // Extra bytes `id` needs to hold n_tokens positions (0 when its pages already cover them).
  int64_t grow_bytes(uint64_t id, int64_t n_tokens) const;
  bool can_grow(uint64_t id, int64_t n_tokens) const { return grow_bytes(id, n_tokens) <= free_bytes(); }
  // Grows (never shrinks) `id`'s pages to cover n_tokens positions. DI_CHECKs can_grow.
  void grow(uint64_t id, int64_t n_tokens);
  // Returns pages beyond n_tokens positions (after a rollback of rejected draft tokens).
  void shrink(uint64_t id, int64_t n_tokens);
  // Frees everything `id` holds; no-op for an unknown id.
  void release(uint64_t id);

 private:
  struct Held {
    int64_t pages = 0;   // charged
    int64_t shared = 0;  // leading pages shared with the prefix cache, not charged
  };
  int64_t admit_bytes(int64_t n_tokens, int64_t shared_tokens) const;
  int64_t charged_pages(const Held& h, int64_t n_tokens) const {
    return std::max<int64_t>(0, layout_.pages_for(n_tokens) - h.shared);
  }

  KvLayout layout_;
  int64_t capacity_ = 0;
  int64_t used_ = 0;
  std::unordered_map<uint64_t, Held> pages_;  // request -> pages
};

}  // namespace di
