// The prefix cache index: chained block keys, longest-prefix lookup, usable cut-back, LRU eviction by
// bytes (leaves first, never the chain being inserted), collisions as misses.
#include <gtest/gtest.h>

#include <random>

#include "core/error.h"
#include "runtime/prefix_cache.h"
#include "test_util.h"

namespace di {
namespace {

struct Tag final : PrefixCache::Payload {
  explicit Tag(int v, bool usable = true) : value(v), usable(usable) {}
  int value;
  bool usable;
};

std::shared_ptr<Tag> tag(int v, bool usable = true) { return std::make_shared<Tag>(v, usable); }
int value(const std::shared_ptr<const PrefixCache::Payload>& p) { return static_cast<const Tag&>(*p).value; }

// Inserts every whole block of `tokens`, payload value = block index + base.
void insert_all(PrefixCache& c, const std::vector<int32_t>& tokens, int64_t bytes, int base = 0) {
  uint64_t key = 0;
  for (int64_t b = 0; (b + 1) * c.block_tokens() <= static_cast<int64_t>(tokens.size()); ++b) {
    std::span<const int32_t> blk(tokens.data() + b * c.block_tokens(), c.block_tokens());
    key = c.insert(key, blk, tag(base + static_cast<int>(b)), bytes);
    ASSERT_NE(key, 0u);
  }
}

std::vector<int32_t> random_tokens(std::mt19937_64& rng, int64_t n) {
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % 1000);
  return t;
}

TEST(PrefixCache, LongestWholeBlockPrefix) {
  std::mt19937_64 rng(testing_util::fresh_seed("PrefixCache.LongestWholeBlockPrefix"));
  PrefixCache c(4, 1 << 20);
  std::vector<int32_t> a = random_tokens(rng, 18);
  insert_all(c, a, 10);
  EXPECT_EQ(c.n_blocks(), 4);
  EXPECT_EQ(c.bytes(), 40);
  PrefixCache::Hit h = c.lookup(a, 100);
  EXPECT_EQ(h.n_tokens, 16);
  ASSERT_EQ(h.blocks.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(value(h.blocks[i]), i);
  EXPECT_EQ(c.lookup(a, 15).n_tokens, 12);  // bounded by max_tokens
  std::vector<int32_t> b = a;
  b[9] ^= 1;  // differs in block 2
  EXPECT_EQ(c.lookup(b, 100).n_tokens, 8);
  b[0] ^= 1;
  EXPECT_EQ(c.lookup(b, 100).n_tokens, 0);
  // a block's key depends on everything before it: the same block after another prefix is a miss
  std::vector<int32_t> shifted(a.begin() + 4, a.end());
  EXPECT_EQ(c.lookup(shifted, 100).n_tokens, 0);
  EXPECT_NE(c.find(a, 3), nullptr);
  EXPECT_EQ(c.find(b, 0), nullptr);
}

TEST(PrefixCache, UsableCutsBackToTheDeepestUsableBlock) {
  PrefixCache c(2, 1000);
  std::vector<int32_t> t = {1, 2, 3, 4, 5, 6, 7, 8};
  uint64_t k = 0;
  k = c.insert(k, std::span<const int32_t>(t.data(), 2), tag(0, true), 1);
  k = c.insert(k, std::span<const int32_t>(t.data() + 2, 2), tag(1, true), 1);
  k = c.insert(k, std::span<const int32_t>(t.data() + 4, 2), tag(2, false), 1);
  auto usable = [](const PrefixCache::Payload& p) { return static_cast<const Tag&>(p).usable; };
  EXPECT_EQ(c.lookup(t, 8).n_tokens, 6);
  EXPECT_EQ(c.lookup(t, 8, usable).n_tokens, 4);
}

TEST(PrefixCache, ChainsHaveNoHoles) {
  PrefixCache c(2, 1000);
  std::vector<int32_t> t = {1, 2, 3, 4};
  uint64_t k0 = PrefixCache::block_key(0, std::span<const int32_t>(t.data(), 2));
  EXPECT_EQ(c.insert(k0, std::span<const int32_t>(t.data() + 2, 2), tag(1), 1), 0u);  // parent missing
  EXPECT_EQ(c.insert(0, std::span<const int32_t>(t.data(), 2), tag(0), 1), k0);
  EXPECT_NE(c.insert(k0, std::span<const int32_t>(t.data() + 2, 2), tag(1), 1), 0u);
}

TEST(PrefixCache, EvictsLeastRecentlyUsedLeavesByBytes) {
  std::mt19937_64 rng(testing_util::fresh_seed("PrefixCache.EvictsLeastRecentlyUsedLeavesByBytes"));
  PrefixCache c(4, 100);
  std::vector<int32_t> a = random_tokens(rng, 12), b = random_tokens(rng, 12);
  insert_all(c, a, 15, 0);   // 45 bytes
  insert_all(c, b, 15, 10);  // 90 bytes
  EXPECT_EQ(c.lookup(a, 12).n_tokens, 12);  // a is now the more recent
  std::vector<int32_t> d = random_tokens(rng, 8);
  insert_all(c, d, 15, 20);  // 120 > 100: b's last two blocks go (leaves first)
  EXPECT_LE(c.bytes(), 100);
  EXPECT_EQ(c.n_evicted(), 2);
  EXPECT_EQ(c.lookup(a, 12).n_tokens, 12);
  EXPECT_EQ(c.lookup(b, 12).n_tokens, 4);
  EXPECT_EQ(c.lookup(d, 8).n_tokens, 8);
  // a payload bigger than the whole cache is not kept
  EXPECT_EQ(c.insert(0, std::span<const int32_t>(a.data(), 4), tag(99), 101), 0u);
  c.clear();
  EXPECT_EQ(c.bytes(), 0);
  EXPECT_EQ(c.lookup(a, 12).n_tokens, 0);
}

TEST(PrefixCache, ReplacingAPayloadUpdatesBytes) {
  PrefixCache c(2, 100);
  std::vector<int32_t> t = {5, 6};
  uint64_t k = c.insert(0, t, tag(1), 10);
  EXPECT_EQ(c.insert(0, t, tag(2), 30), k);
  EXPECT_EQ(c.bytes(), 30);
  EXPECT_EQ(c.n_blocks(), 1);
  EXPECT_EQ(static_cast<const Tag*>(c.find(k))->value, 2);
}

// A block whose payload a request still holds (it maps the block's pages) is neither evicted nor
// replaced: its pages stay within the cache's budget while in use.
TEST(PrefixCache, BlocksInUseAreNotEvictedOrReplaced) {
  PrefixCache c(2, 30);
  const std::vector<int32_t> a = {1, 2}, b = {3, 4}, d = {5, 6}, e = {7, 8};
  const uint64_t ka = c.insert(0, a, tag(1), 10);
  ASSERT_NE(ka, 0u);
  std::shared_ptr<const PrefixCache::Payload> held = c.lookup(a, 2).blocks.at(0);  // a request maps it
  ASSERT_NE(c.insert(0, b, tag(2), 10), 0u);
  ASSERT_NE(c.insert(0, d, tag(3), 10), 0u);
  ASSERT_NE(c.insert(0, e, tag(4), 10), 0u);  // over capacity: the least recently used free block goes
  EXPECT_NE(c.find(ka), nullptr);
  EXPECT_EQ(c.find(PrefixCache::block_key(0, b)), nullptr);
  EXPECT_EQ(c.bytes(), 30);
  EXPECT_EQ(c.insert(0, a, tag(5), 20), ka);  // in use: kept as it is
  EXPECT_EQ(static_cast<const Tag*>(c.find(ka))->value, 1);
  EXPECT_EQ(c.bytes(), 30);
  held.reset();
  EXPECT_EQ(c.insert(0, a, tag(6), 10), ka);  // free again: replaced
  EXPECT_EQ(static_cast<const Tag*>(c.find(ka))->value, 6);
  ASSERT_NE(c.insert(0, b, tag(7), 10), 0u);  // d, the least recently used, goes (a was just touched)
  EXPECT_EQ(c.bytes(), 30);
  EXPECT_EQ(c.find(PrefixCache::block_key(0, d)), nullptr);
}

TEST(PrefixCache, RandomInsertsKeepBytesAndTreeConsistent) {
  std::mt19937_64 rng(testing_util::fresh_seed("PrefixCache.RandomInsertsKeepBytesAndTreeConsistent"));
  const int64_t bt = 1 + rng() % 4;
  PrefixCache c(bt, 200 + rng() % 500);
  std::vector<std::vector<int32_t>> seqs;
  for (int i = 0; i < 20; ++i) {
    // shared prefixes: a few roots, random continuations
    std::vector<int32_t> s = seqs.empty() || rng() % 3 == 0 ? std::vector<int32_t>{} : seqs[rng() % seqs.size()];
    s.resize(std::min<size_t>(s.size(), rng() % 12));
    while (s.size() < 24) s.push_back(static_cast<int32_t>(rng() % 3));
    seqs.push_back(s);
  }
  for (int it = 0; it < 2000; ++it) {
    const auto& s = seqs[rng() % seqs.size()];
    if (rng() % 2) {
      PrefixCache::Hit h = c.lookup(s, static_cast<int64_t>(s.size()));
      ASSERT_EQ(static_cast<int64_t>(h.blocks.size()) * bt, h.n_tokens);
      continue;
    }
    uint64_t key = 0;
    int64_t n = 1 + static_cast<int64_t>(rng() % (s.size() / bt));
    for (int64_t b = 0; b < n; ++b) {
      key = c.insert(key, std::span<const int32_t>(s.data() + b * bt, bt), tag(0), 1 + rng() % 20);
      if (key == 0) break;
    }
    ASSERT_LE(c.bytes(), c.capacity_bytes());
  }
  // with no eviction pending, dropping the capacity to 0 through clear() leaves nothing behind
  EXPECT_GE(c.n_blocks(), 1);
  c.clear();
  EXPECT_EQ(c.n_blocks(), 0);
}

TEST(PrefixCache, BadSizes) {
  EXPECT_THROW(PrefixCache(0, 10), Error);
  EXPECT_THROW(PrefixCache(4, -1), Error);
}

}  // namespace
}  // namespace di
