// A cache from a pre-tokenized word (raw bytes) to its BPE ids. Open addressing over flat arenas so
// a hit costs one hash and one memcmp, and nothing is allocated per word. Not thread-safe: the
// tokenizer keeps one per thread. Cleared wholesale when full (words follow Zipf's law, so the
// frequent ones come straight back).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace di {

class WordCache {
 public:
  static constexpr size_t kMaxKeyBytes = 128;  // longer words are rarely repeated

  WordCache();
  static uint64_t hash(std::string_view key);

  // The ids cached for `key` (hash from hash(key)); nullptr when absent.
  const int32_t* find(std::string_view key, uint64_t h, uint32_t* n_ids) const;
  void insert(std::string_view key, uint64_t h, const int32_t* ids, uint32_t n_ids);
  void clear();
  size_t size() const { return count_; }

 private:
  struct Slot {
    uint64_t hash;  // 0 = empty
    uint32_t key_off, ids_off;
    uint16_t key_len, n_ids;
  };
  static constexpr size_t kSlots = size_t{1} << 18;     // power of two
  static constexpr size_t kMaxEntries = kSlots / 2;    // load factor 1/2
  std::vector<Slot> slots_;
  std::string keys_;
  std::vector<int32_t> ids_;
  size_t count_ = 0;
};

}  // namespace di
