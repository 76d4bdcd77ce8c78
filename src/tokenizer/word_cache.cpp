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

inline uint32_t tag_of(uint64_t h) {
  const auto t = static_cast<uint32_t>(h >> 32);
  return t ? t : 1;
}

}  // namespace

WordCache::WordCache() { slots_.assign(size_t{1} << bits_, Slot{}); }

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
  return mix(h, kP0);
}

bool WordCache::key_equals(const Slot& s, std::string_view key) const {
  if (s.key_len != key.size()) return false;
  const char* stored = key.size() <= kInlineKey ? s.key : keys_.data() + s.key_off;
  return std::memcmp(stored, key.data(), key.size()) == 0;
}

const int32_t* WordCache::find(std::string_view key, uint64_t h, uint32_t* n_ids) const {
  if (key.size() > kMaxKeyBytes) return nullptr;
  const uint32_t tag = tag_of(h);
  const size_t mask = slots_.size() - 1;
  for (size_t i = home(h);; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.tag == 0) return nullptr;
    if (s.tag == tag && key_equals(s, key)) {
      *n_ids = s.n_ids;
      return s.n_ids <= kInlineIds ? s.ids : ids_.data() + s.ids[0];
    }
  }
}

void WordCache::grow() {
  if (bits_ >= kMaxBits) {
    clear();
    return;
  }
  std::vector<Slot> old;
  old.swap(slots_);
  ++bits_;
  slots_.assign(size_t{1} << bits_, Slot{});
  const size_t mask = slots_.size() - 1;
  // Re-home by the stored tag (the hash's high half; bits_ <= 32 so it holds the home index).
  for (const Slot& s : old) {
    if (s.tag == 0) continue;
    size_t i = (static_cast<uint64_t>(s.tag) << 32) >> (64 - bits_);
    while (slots_[i].tag != 0) i = (i + 1) & mask;
    slots_[i] = s;
  }
}

void WordCache::insert(std::string_view key, uint64_t h, const int32_t* ids, uint32_t n_ids) {
  if (key.size() > kMaxKeyBytes || n_ids > 255) return;
  if ((count_ + 1) * 2 > slots_.size()) grow();
  const uint32_t tag = tag_of(h);
  const size_t mask = slots_.size() - 1;
  size_t i = home(h);
  for (; slots_[i].tag != 0; i = (i + 1) & mask)
    if (slots_[i].tag == tag && key_equals(slots_[i], key)) return;
  Slot& s = slots_[i];
  s.tag = tag;
  s.key_len = static_cast<uint8_t>(key.size());
  s.n_ids = static_cast<uint8_t>(n_ids);
  if (key.size() <= kInlineKey) {
    std::memcpy(s.key, key.data(), key.size());
  } else {
    s.key_off = static_cast<uint32_t>(keys_.size());
    keys_.append(key);
  }
  if (n_ids <= kInlineIds) {
    std::copy(ids, ids + n_ids, s.ids);
  } else {
    s.ids[0] = static_cast<int32_t>(ids_.size());
    ids_.insert(ids_.end(), ids, ids + n_ids);
  }
  ++count_;
}

void WordCache::clear() {
  if (count_ == 0) return;
  std::fill(slots_.begin(), slots_.end(), Slot{});
  keys_.clear();
  ids_.clear();
  count_ = 0;
}

}  // namespace di
