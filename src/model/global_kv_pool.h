// The shared page pool of V4.1's global KV (spec §3.1, §3.4): the FP4 compressed KV rows (288 B on
// V4.1-Flash) and FP4 index-key rows (68 B) of the Full (KV source) layers, for every sequence of a
// model, in pages of `page_tokens` positions.
//
// A page id names the same positions in every Full layer: page p of a ratio-r layer is rows
// [p * page_tokens / r, (p + 1) * page_tokens / r) of that layer's pool tensor. A sequence maps its
// positions to pages through its page table (SequenceState::pages); the prefix cache holds the same
// pages, so a hit maps cached pages into a new sequence without copying a row. Pages are
// reference-counted handles (PageRef): the page goes back to the free list when the last sequence
// or cache block holding it lets go. A sequence writes only to pages nobody else holds (copy on
// write: make_global_writable in sequence_state.h).
//
// Threads: the thread running forwards allocates pages and grows the storage; any thread may drop a
// PageRef (the engine thread drops finished requests and evicted cache blocks while a step runs on
// the worker) -- the free list is locked, the storage is touched only by the forward thread.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"

namespace di {

class GlobalKvPool;

// One page, held. Dropping the last handle frees it.
class GlobalPage {
 public:
  GlobalPage(std::shared_ptr<GlobalKvPool> pool, int32_t id) : pool_(std::move(pool)), id_(id) {}
  ~GlobalPage();
  GlobalPage(const GlobalPage&) = delete;
  GlobalPage& operator=(const GlobalPage&) = delete;
  int32_t id() const { return id_; }

 private:
  std::shared_ptr<GlobalKvPool> pool_;
  int32_t id_;
};
using PageRef = std::shared_ptr<const GlobalPage>;

class GlobalKvPool : public std::enable_shared_from_this<GlobalKvPool> {
 public:
  // page_tokens: a positive multiple of every Full layer's compress ratio (pages hold whole groups).
  static std::shared_ptr<GlobalKvPool> create(const ModelConfig& cfg, int64_t page_tokens, Backend& backend);

  int64_t page_tokens() const { return page_tokens_; }
  // Bytes of one page over all Full layers (compressed KV + index keys).
  int64_t page_bytes() const { return page_bytes_; }
  // Rows one page holds in `layer` (page_tokens / ratio); 0 for a layer without global rows.
  int64_t rows_per_page(int layer) const { return rows_per_page_.at(static_cast<size_t>(layer)); }
  bool has_rows(int layer) const { return rows_per_page(layer) > 0; }

  // Upper bound on pages in use (0: none). allocate() fails past it. Lowering it below the pages
  // in use is an error.
  void set_max_pages(int64_t pages);
  int64_t max_pages() const { return max_pages_; }
  // Pages the storage holds now (it grows by doubling as pages are taken).
  int64_t capacity_pages() const { return capacity_; }
  int64_t used_pages() const;
  // Grows the storage to hold `pages` pages (up front, e.g. for a benchmark's known size).
  void reserve(int64_t pages);
  // A free page, growing the storage when none is free. Forward thread only. Throws di::Error when
  // max_pages are all in use.
  PageRef allocate();

  // [capacity_pages * rows_per_page(layer), packed row] U8 storage of a Full layer. Forward thread.
  Tensor& comp(int layer) { return comp_.at(static_cast<size_t>(layer)); }
  Tensor& index_keys(int layer) { return keys_.at(static_cast<size_t>(layer)); }
  const Tensor& comp(int layer) const { return comp_.at(static_cast<size_t>(layer)); }
  const Tensor& index_keys(int layer) const { return keys_.at(static_cast<size_t>(layer)); }
  Backend& backend() { return backend_; }

 private:
  friend class GlobalPage;
  GlobalKvPool(const ModelConfig& cfg, int64_t page_tokens, Backend& backend);
  void release(int32_t id);
  void grow_storage(int64_t pages);

  Backend& backend_;
  int64_t page_tokens_ = 0, page_bytes_ = 0;
  std::vector<int64_t> rows_per_page_;  // per layer
  std::vector<Tensor> comp_, keys_;     // per layer (empty for layers without global rows)
  int64_t capacity_ = 0, max_pages_ = 0;
  mutable std::mutex mu_;
  std::vector<int32_t> free_;  // a stack: a fresh pool hands out ascending ids (contiguous rows)
};

}  // namespace di
