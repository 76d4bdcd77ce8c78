#include "runtime/prefix_cache.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "core/mix64.h"

namespace di {

PrefixCache::PrefixCache(int64_t block_tokens, int64_t capacity_bytes) : block_(block_tokens), capacity_(capacity_bytes) {
  if (block_tokens <= 0) throw Error("prefix cache block size: expected a positive number of tokens, got " + std::to_string(block_tokens));
  if (capacity_bytes < 0) throw Error("prefix_cache_bytes: expected >= 0, got " + std::to_string(capacity_bytes));
}

uint64_t PrefixCache::block_key(uint64_t parent, std::span<const int32_t> tokens) {
  uint64_t h = mix64(parent + 0x9E3779B97F4A7C15ull);
  for (int32_t t : tokens) h = mix64(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(t)) + 0x632BE59BD9B4E019ull));
  return h == 0 ? 1 : h;  // 0 means "no parent"
}

uint64_t PrefixCache::chain_key(std::span<const int32_t> tokens, int64_t index) const {
  uint64_t key = 0;
  for (int64_t b = 0; b <= index; ++b) {
    std::span<const int32_t> blk = tokens.subspan(b * block_, block_);
    uint64_t k = block_key(key, blk);
    auto it = nodes_.find(k);
    if (it == nodes_.end() || it->second.parent != key || !std::equal(blk.begin(), blk.end(), it->second.tokens.begin()))
      return 0;
    key = k;
  }
  return key;
}

void PrefixCache::touch(Node& n, uint64_t key) {
  if (n.lru != lru_.end()) lru_.erase(n.lru);
  n.lru = lru_.insert(lru_.end(), key);
}

PrefixCache::Hit PrefixCache::lookup(std::span<const int32_t> tokens, int64_t max_tokens,
                                     const std::function<bool(const Payload&)>& usable) {
  Hit hit;
  max_tokens = std::min<int64_t>(max_tokens, static_cast<int64_t>(tokens.size()));
  std::vector<std::pair<uint64_t, Node*>> run;
  uint64_t key = 0;
  for (int64_t b = 0; (b + 1) * block_ <= max_tokens; ++b) {
    std::span<const int32_t> blk = tokens.subspan(b * block_, block_);
    uint64_t k = block_key(key, blk);
    auto it = nodes_.find(k);
    if (it == nodes_.end() || it->second.parent != key || !std::equal(blk.begin(), blk.end(), it->second.tokens.begin()))
      break;
    run.emplace_back(k, &it->second);
    key = k;
  }
  size_t n = run.size();
  if (usable)
    while (n > 0 && !usable(*run[n - 1].second->payload)) --n;
  for (size_t i = 0; i < n; ++i) {  // root first, so ancestors are never more recent than descendants
    touch(*run[i].second, run[i].first);
    hit.blocks.push_back(run[i].second->payload);
  }
  hit.n_tokens = static_cast<int64_t>(n) * block_;
  return hit;
}

const PrefixCache::Payload* PrefixCache::find(std::span<const int32_t> tokens, int64_t index) const {
  DI_CHECK(static_cast<int64_t>(tokens.size()) >= (index + 1) * block_);
  uint64_t key = chain_key(tokens, index);
  return key == 0 ? nullptr : nodes_.at(key).payload.get();
}

const PrefixCache::Payload* PrefixCache::find(uint64_t key) const {
  auto it = nodes_.find(key);
  return it == nodes_.end() ? nullptr : it->second.payload.get();
}

uint64_t PrefixCache::insert(uint64_t parent, std::span<const int32_t> block, std::shared_ptr<const Payload> payload,
                             int64_t bytes) {
  DI_CHECK(payload != nullptr && bytes >= 0);
  DI_CHECK(static_cast<int64_t>(block.size()) == block_);
  if (parent != 0 && nodes_.count(parent) == 0) return 0;
  uint64_t key = block_key(parent, block);
  auto it = nodes_.find(key);
  if (it != nodes_.end()) {
    Node& n = it->second;
    if (n.parent != parent || !std::equal(block.begin(), block.end(), n.tokens.begin())) return 0;  // collision
    if (n.payload.use_count() == 1) {  // a payload in use stays (see evict_to)
      bytes_ += bytes - n.bytes;
      n.bytes = bytes;
      n.payload = std::move(payload);
    }
  } else {
    if (bytes > capacity_) return 0;
    Node n;
    n.parent = parent;
    n.tokens.assign(block.begin(), block.end());
    n.payload = std::move(payload);
    n.bytes = bytes;
    n.lru = lru_.end();
    nodes_.emplace(key, std::move(n));
    bytes_ += bytes;
    if (parent != 0) ++nodes_.at(parent).n_children;
  }
  // the chain, root first, becomes the most recently used (ancestors never more recent than descendants)
  std::vector<uint64_t> chain;
  for (uint64_t k = key; k != 0; k = nodes_.at(k).parent) chain.push_back(k);
  for (auto k = chain.rbegin(); k != chain.rend(); ++k) touch(nodes_.at(*k), *k);
  evict_to(capacity_, key);
  return nodes_.count(key) ? key : 0;
}

void PrefixCache::evict_to(int64_t capacity, uint64_t protect) {
  while (bytes_ > capacity) {
    // a block whose payload is held outside the cache (a request mapped its pages) stays
    auto victim = std::find_if(lru_.begin(), lru_.end(), [&](uint64_t k) {
      const Node& n = nodes_.at(k);
      return k != protect && n.n_children == 0 && n.payload.use_count() == 1;
    });
    if (victim == lru_.end()) victim = std::find(lru_.begin(), lru_.end(), protect);  // only the new leaf is left
    if (victim == lru_.end()) return;
    erase(*victim);
    ++n_evicted_;
  }
}

void PrefixCache::erase(uint64_t key) {
  Node& n = nodes_.at(key);
  DI_CHECK(n.n_children == 0);
  if (n.parent != 0) --nodes_.at(n.parent).n_children;
  bytes_ -= n.bytes;
  lru_.erase(n.lru);
  nodes_.erase(key);
}

void PrefixCache::clear() {
  nodes_.clear();
  lru_.clear();
  bytes_ = 0;
}

}  // namespace di
