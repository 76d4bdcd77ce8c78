#include "model/global_kv_pool.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace di {

GlobalPage::~GlobalPage() { pool_->release(id_); }

std::shared_ptr<GlobalKvPool> GlobalKvPool::create(const ModelConfig& cfg, int64_t page_tokens, Backend& backend) {
  return std::shared_ptr<GlobalKvPool>(new GlobalKvPool(cfg, page_tokens, backend));
}

GlobalKvPool::GlobalKvPool(const ModelConfig& cfg, int64_t page_tokens, Backend& backend)
    : backend_(backend), page_tokens_(page_tokens) {
  if (page_tokens <= 0)
    throw Error("kv page size: expected a positive number of positions, got " + std::to_string(page_tokens));
  const int64_t comp_row = packed_row_bytes(RowFormat::kFp4E4m3, cfg.head_dim);
  const int64_t key_row = packed_row_bytes(RowFormat::kFp4Ue8m0, cfg.index_head_dim);
  for (const LayerSchedule& ls : cfg.layers) {
    const bool global = ls.mode == AttnMode::kFull;
    if (global && page_tokens % ls.ratio != 0)
      throw Error("kv page size " + std::to_string(page_tokens) + " is not a multiple of layer " +
                  std::to_string(ls.layer) + "'s compress ratio " + std::to_string(ls.ratio));
    const int64_t rows = global ? page_tokens / ls.ratio : 0;
    rows_per_page_.push_back(rows);
    page_bytes_ += rows * (comp_row + key_row);
    comp_.push_back(global ? backend.zeros(TType::kU8, {0, comp_row}) : Tensor{});
    keys_.push_back(global ? backend.zeros(TType::kU8, {0, key_row}) : Tensor{});
  }
}

void GlobalKvPool::set_max_pages(int64_t pages) {
  if (pages < 0) throw Error("kv page pool: negative page limit " + std::to_string(pages));
  if (pages > 0 && pages < used_pages())
    throw Error("kv page pool: a limit of " + std::to_string(pages) + " pages is below the " +
                std::to_string(used_pages()) + " in use");
  max_pages_ = pages;
}

int64_t GlobalKvPool::used_pages() const {
  std::lock_guard<std::mutex> lock(mu_);
  return capacity_ - static_cast<int64_t>(free_.size());
}

void GlobalKvPool::grow_storage(int64_t pages) {
  if (pages <= capacity_) return;
  for (size_t l = 0; l < rows_per_page_.size(); ++l) {
    if (rows_per_page_[l] == 0) continue;
    for (Tensor* t : {&comp_[l], &keys_[l]}) {
      Tensor bigger = backend_.alloc(TType::kU8, {pages * rows_per_page_[l], t->row_size()});
      if (t->rows() > 0) backend_.copy_rows(bigger, 0, *t, 0, t->rows());
      *t = std::move(bigger);
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  // new ids below the free ones, highest first: pops come out ascending
  std::vector<int32_t> fresh;
  for (int64_t p = pages - 1; p >= capacity_; --p) fresh.push_back(static_cast<int32_t>(p));
  free_.insert(free_.begin(), fresh.begin(), fresh.end());
  capacity_ = pages;
}

void GlobalKvPool::reserve(int64_t pages) {
  if (max_pages_ > 0 && pages > max_pages_)
    throw Error("kv page pool: cannot reserve " + std::to_string(pages) + " pages past the limit of " +
                std::to_string(max_pages_));
  grow_storage(pages);
}

PageRef GlobalKvPool::allocate() {
  bool grow = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t used = capacity_ - static_cast<int64_t>(free_.size());
    if (max_pages_ > 0 && used >= max_pages_)
      throw Error("kv page pool exhausted: all " + std::to_string(max_pages_) + " pages of " +
                  std::to_string(page_bytes_) + " B are in use");
    grow = free_.empty();
  }
  if (grow) {  // only this (the forward) thread takes pages, so there is still none free
    int64_t want = std::max<int64_t>(4, capacity_ * 2);
    if (max_pages_ > 0) want = std::min(want, max_pages_);
    grow_storage(want);
  }
  std::lock_guard<std::mutex> lock(mu_);
  const int32_t id = free_.back();
  free_.pop_back();
  return std::make_shared<const GlobalPage>(shared_from_this(), id);
}

void GlobalKvPool::release(int32_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(id);
}

}  // namespace di
