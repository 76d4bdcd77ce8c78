#include "tokenizer/word_cache.h"

#include <algorithm>
#include <cstring>

namespace di {

namespace {

__extension__ typedef unsigned __int128 U128;

inline uint64_t mix(uint64_t a, uint64_t b) {
  U128 r = static_cast<U128>(a) * b;
  return static_cast<uint64_t>(r) ^ static_cast<uint64_t>(r >> 64);
}

constexpr uint64_t kP0 = 0xa0761d6478bd642full, kP1 = 0xe7037ed1a0b428dbull,
                   kP2 = 0x8ebc6af09c88c6e3ull;

}  // namespace

WordCache::WordCache() : slots_(kSlots, Slot{0, 0, 0, 0, 0}) {}

uint64_t WordCache::hash(std::string_view key) {
  const auto* p = reinterpret_cast<const unsigned char*>(key.data());
  size_t n = key.size();
  uint64_t h = kP0 ^ (n * kP1);
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = mix(h ^ w, kP1);
    p += 8;
    n -= 8;
  }
  if (n > 0) {
    uint64_t w = 0;
    std::memcpy(&w, p, n);
    h = mix(h ^ w, kP2);
  }
  h = mix(h, kP0);
  return h | 1;  // never 0 (the empty marker)
}

const int32_t* WordCache::find(std::string_view key, uint64_t h, uint32_t* n_ids) const {
  size_t i = h & (kSlots - 1);
  for (;;) {
    const Slot& s = slots_[i];
    if (s.hash == 0) return nullptr;
    if (s.hash == h && s.key_len == key.size() &&
        std::memcmp(keys_.data() + s.key_off, key.data(), key.size()) == 0) {
      *n_ids = s.n_ids;
      return ids_.data() + s.ids_off;
    }
    i = (i + 1) & (kSlots - 1);
  }
}

void WordCache::insert(std::string_view key, uint64_t h, const int32_t* ids, uint32_t n_ids) {
  if (key.size() > kMaxKeyBytes || n_ids > 0xFFFF) return;
  if (count_ >= kMaxEntries) clear();
  size_t i = h & (kSlots - 1);
  while (slots_[i].hash != 0) {
    if (slots_[i].hash == h && slots_[i].key_len == key.size() &&
        std::memcmp(keys_.data() + slots_[i].key_off, key.data(), key.size()) == 0)
      return;
    i = (i + 1) & (kSlots - 1);
  }
  Slot& s = slots_[i];
  s.hash = h;
  s.key_off = static_cast<uint32_t>(keys_.size());
  s.key_len = static_cast<uint16_t>(key.size());
  s.ids_off = static_cast<uint32_t>(ids_.size());
  s.n_ids = static_cast<uint16_t>(n_ids);
  keys_.append(key);
  ids_.insert(ids_.end(), ids, ids + n_ids);
  ++count_;
}

void WordCache::clear() {
  if (count_ == 0) return;
  std::fill(slots_.begin(), slots_.end(), Slot{0, 0, 0, 0, 0});
  keys_.clear();
  ids_.clear();
  count_ = 0;
}

}  // namespace di
