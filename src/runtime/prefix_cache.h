// Prefix cache across requests: blocks of block_tokens tokens keyed by chained hashes (a block's
// key hashes its parent's key and its own tokens, so a key names the whole prefix up to the block's
// end), each holding a payload -- for V4.1 the block's global rows (compressed KV + index keys,
// 890 B/token on V4.1-Flash) and, in exact mode, the per-layer local state at the block's end.
// Blocks form a tree; eviction drops least recently used leaves until the bytes fit the capacity,
// skipping blocks whose payload someone else still holds (a request using the block's pages: they
// stay within this cache's budget while in use).
//
// The cache only indexes: what a payload is, and how a hit is turned into a request's caches, is the
// engine's business (prefix_restore.h). Tokens are stored per block and compared on lookup, so a hash
// collision is a miss, never a wrong hit. Single-threaded (the engine thread).
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

namespace di {

class PrefixCache {
 public:
  struct Payload {
    virtual ~Payload() = default;
  };

  struct Hit {
    int64_t n_tokens = 0;                                // whole blocks matched and usable
    std::vector<std::shared_ptr<const Payload>> blocks;  // block 0 .. n_tokens / block_tokens - 1
  };

  // block_tokens > 0; capacity_bytes >= 0 (0 keeps nothing).
  PrefixCache(int64_t block_tokens, int64_t capacity_bytes);

  int64_t block_tokens() const { return block_; }
  int64_t capacity_bytes() const { return capacity_; }
  int64_t bytes() const { return bytes_; }
  int64_t n_blocks() const { return static_cast<int64_t>(nodes_.size()); }
  int64_t n_evicted() const { return n_evicted_; }

  // Chained key of the block of `tokens` (block_tokens of them) after the prefix keyed `parent`
  // (0 for the first block).
  static uint64_t block_key(uint64_t parent, std::span<const int32_t> tokens);

  // The longest run of cached blocks that prefixes tokens[0, max_tokens), cut back to the deepest
  // block whose payload satisfies `usable` (all blocks when empty). Marks the run recently used.
  Hit lookup(std::span<const int32_t> tokens, int64_t max_tokens,
             const std::function<bool(const Payload&)>& usable = {});

  // The payload of block `index` of `tokens` (tokens[0, (index + 1) * block_tokens) must exist), or
  // nullptr when not cached.
  const Payload* find(std::span<const int32_t> tokens, int64_t index) const;
  // The payload of the block with this key (see block_key), or nullptr. Tokens are not compared.
  const Payload* find(uint64_t key) const;

  // Caches `block` (block_tokens tokens) after the prefix keyed `parent` (0: the first block),
  // replacing its payload when present and not in use, and returns its key -- block_key(parent, block) -- or 0 when
  // not kept: the parent is not cached (a chain never has holes), a hash collision, or a payload larger
  // than the capacity. Evicts least recently used leaves (never the new block's ancestors) to fit.
  uint64_t insert(uint64_t parent, std::span<const int32_t> block, std::shared_ptr<const Payload> payload,
                  int64_t bytes);

  // Drops every block.
  void clear();

 private:
  struct Node {
    uint64_t parent = 0;                    // key of the parent block, 0 for a first block
    std::vector<int32_t> tokens;            // [block_tokens] this block's tokens
    std::shared_ptr<const Payload> payload;
    int64_t bytes = 0;
    int64_t n_children = 0;
    std::list<uint64_t>::iterator lru;      // position in lru_ (front = least recently used)
  };
  // Key of block `index` of tokens, or 0 when some block up to it is not cached (keys are never 0).
  uint64_t chain_key(std::span<const int32_t> tokens, int64_t index) const;
  void touch(Node& n, uint64_t key);
  void evict_to(int64_t capacity, uint64_t protect);
  void erase(uint64_t key);

  int64_t block_, capacity_;
  int64_t bytes_ = 0, n_evicted_ = 0;
  std::unordered_map<uint64_t, Node> nodes_;
  std::list<uint64_t> lru_;
};

}  // namespace di
