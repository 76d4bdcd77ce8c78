// A cache from a pre-tokenized word (raw bytes) to its BPE ids. Open addressing with short keys
// (<= 16 bytes) and short id lists (<= 2 ids) stored in the slot itself, so a typical hit touches
// one cache line and allocates nothing; longer ones live in flat arenas. Grows from a small table;
// cleared wholesale when full (words follow Zipf's law, so the frequent ones come straight back).
// Not thread-safe: the tokenizer keeps one per thread.
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

  // The ids cached for `key` (hash from hash(key)); nullptr when absent. Valid until the next insert.
  const int32_t* find(std::string_view key, uint64_t h, uint32_t* n_ids) const;
  void insert(std::string_view key, uint64_t h, const int32_t* ids, uint32_t n_ids);
  void clear();
  size_t size() const { return count_; }

 private:
  static constexpr size_t kInlineKey = 16;
  static constexpr uint32_t kInlineIds = 2;
  struct Slot {              // 32 bytes
    uint32_t tag;            // high half of the hash, never 0; 0 = empty
    uint8_t key_len;
    uint8_t n_ids;
    uint16_t unused;
    union {
      char key[kInlineKey];  // key_len <= kInlineKey
      uint32_t key_off;      // into keys_ otherwise
    };
    int32_t ids[kInlineIds]; // n_ids <= kInlineIds; else ids[0] is an offset into ids_
  };
  static constexpr int kMinBits = 12;
  static constexpr int kMaxBits = 18;
  void grow();
  bool key_equals(const Slot& s, std::string_view key) const;
  size_t home(uint64_t h) const { return static_cast<size_t>(h >> (64 - bits_)); }

  std::vector<Slot> slots_;
  int bits_ = kMinBits;
  std::string keys_;
  std::vector<int32_t> ids_;
  size_t count_ = 0;
};

}  // namespace di
