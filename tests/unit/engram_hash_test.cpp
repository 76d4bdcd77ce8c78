#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <random>
#include <vector>

#include "core/error.h"
#include "model/config.h"
#include "model/engram_hash.h"

namespace di {
namespace {

ModelConfig released_engram_config() {
  ModelConfig c;
  c.engram_layer_ids = {1, 14};
  c.engram_num_embeddings = {384006168, 384016682};
  c.engram_max_ngram = 4;
  c.engram_vocab_size = 16000000;
  c.engram_n_heads = 8;
  c.engram_head_dim = 256;
  c.engram_pad_id = 2;
  c.engram_compressed_vocab_size = 99092;
  return c;
}

// Spec §2.7: the released layout.
TEST(EngramHash, ReleasedLayoutPrimesOffsetsMultipliers) {
  const EngramLayout L = make_engram_layout(released_engram_config());
  ASSERT_EQ(L.n_slots(), 2);
  ASSERT_EQ(L.n_cols(), 24);
  ASSERT_EQ(L.primes.size(), 48u);
  EXPECT_EQ(L.primes[0], 16000057);
  EXPECT_EQ(L.primes[1], 16000079);
  EXPECT_EQ(L.primes[2], 16000081);
  EXPECT_EQ(L.primes[45], 16000877);
  EXPECT_EQ(L.primes[46], 16000879);
  EXPECT_EQ(L.primes[47], 16000889);
  // Increasing, all prime, every integer between two consecutive ones composite (so none skipped).
  for (size_t i = 0; i < L.primes.size(); ++i) {
    EXPECT_TRUE(engram_is_prime(static_cast<uint64_t>(L.primes[i])));
    const int64_t prev = i ? L.primes[i - 1] : 15999999;
    for (int64_t c = prev + 1; c < L.primes[i]; ++c) EXPECT_FALSE(engram_is_prime(static_cast<uint64_t>(c))) << c;
  }
  EXPECT_EQ(L.rows_used(0), 384006168);
  EXPECT_EQ(L.rows_used(1), 384016682);
  for (int s = 0; s < 2; ++s) {
    int64_t run = 0;
    for (int c = 0; c < 24; ++c) {
      EXPECT_EQ(L.offsets[static_cast<size_t>(s * 24 + c)], run);
      run += L.primes[static_cast<size_t>(s * 24 + c)];
    }
  }
  EXPECT_EQ(L.multipliers, (std::vector<int64_t>{76632096046245, 4839876093313, 35959672319349, 73987337458391,
                                                 67716810739261, 51510806800915, 30921347202721, 82619226485591}));
  EXPECT_EQ(L.slot_of_layer(1), 0);
  EXPECT_EQ(L.slot_of_layer(14), 1);
  EXPECT_EQ(L.slot_of_layer(2), -1);
}

// The golden_dev case: engram_vocab_size 100, 2 heads, layers 1 and 2, tables of 660 and 864 rows.
TEST(EngramHash, GoldenDevLayout) {
  const ModelConfig cfg = load_model_config(DI_TEST_DATA "/golden_dev/model");
  const EngramLayout L = make_engram_layout(cfg);
  EXPECT_EQ(L.primes, (std::vector<int64_t>{101, 103, 107, 109, 113, 127, 131, 137, 139, 149, 151, 157}));
  EXPECT_EQ(L.offsets, (std::vector<int64_t>{0, 101, 204, 311, 420, 533, 0, 131, 268, 407, 556, 707}));
  EXPECT_EQ(L.rows_used(0), 660);
  EXPECT_EQ(L.rows_used(1), 864);
  EXPECT_EQ(L.num_embeddings, (std::vector<int64_t>{660, 864}));
  ASSERT_EQ(L.multipliers.size(), 8u);
  for (int64_t m : L.multipliers) {
    EXPECT_EQ(m & 1, 1);
    EXPECT_GT(m, 0);
    EXPECT_LE(m, 2 * ((INT64_MAX / 413) / 2 - 1) + 1);
  }
}

// Worked by hand: 3-grams, 2 heads, primes 11 13 | 17 19, multipliers 3 5 7, pad 9.
TEST(EngramHash, HandComputedShortSequence) {
  EngramLayout L;
  L.layer_ids = {1};
  L.num_embeddings = {60};
  L.max_ngram = 3;
  L.n_heads = 2;
  L.head_dim = 4;
  L.compressed_vocab_size = 10;
  L.primes = {11, 13, 17, 19};
  L.offsets = {0, 11, 24, 41};
  L.multipliers = {3, 5, 7};
  const std::vector<int32_t> hist = {4, 2, kEngramDead, 6, 1};
  const std::vector<std::vector<int64_t>> expected = {
      {0, 18, 37, 52},   // pos 0: 12 ^ 45 = 33; 33 ^ 63 = 30 (shifts 1, 2 before the start: pad)
      {7, 16, 35, 48},   // pos 1: 6 ^ 20 = 18; 18 ^ 63 = 45
      {10, 13, 33, 50},  // pos 2: dead itself, all pad: 27 ^ 45 = 54; 54 ^ 63 = 9
      {8, 22, 24, 41},   // pos 3: 18 ^ 45 = 63 (shift 1 dead); 63 ^ 63 = 0 (still pad)
      {7, 14, 24, 56},   // pos 4: 3 ^ 30 = 29; 29 ^ 63 = 34 (shift 2 dead)
  };
  for (int64_t pos = 0; pos < 5; ++pos) {
    std::vector<int64_t> out(4);
    engram_hash_columns(L, 0, hist, pos, 9, out.data());
    EXPECT_EQ(out, expected[static_cast<size_t>(pos)]) << "pos " << pos;
  }
  // Batch form: [n_tokens][n_slots][n_cols].
  const std::vector<int64_t> positions = {4, 0, 2};
  std::vector<int64_t> batch(positions.size() * 4);
  engram_hash_tokens(L, hist, positions, 9, batch.data());
  EXPECT_EQ(batch, (std::vector<int64_t>{7, 14, 24, 56, 0, 18, 37, 52, 10, 13, 33, 50}));
}

// A product that wraps int64 gives a negative rolling value; the remainder follows Python (torch):
// non-negative for a positive prime.
TEST(EngramHash, WrappedProductUsesFloorRemainder) {
  EngramLayout L;
  L.layer_ids = {1};
  L.num_embeddings = {100};
  L.max_ngram = 2;
  L.n_heads = 1;
  L.primes = {97};
  L.offsets = {3};
  L.multipliers = {(int64_t{1} << 62) + 1, 1};
  const std::vector<int32_t> hist = {0, 2};  // pos 1: 2 * (2^62 + 1) wraps to INT64_MIN + 2; ^ 0 * 1
  int64_t out = 0;
  engram_hash_columns(L, 0, hist, 1, 0, &out);
  const int64_t v = INT64_MIN + 2;
  int64_t r = v % 97;
  if (r < 0) r += 97;
  EXPECT_EQ(out, r + 3);
}

// Random histories: every column inside its bucket; away from the start and from dead tokens the
// hash depends only on the last max_ngram ids; the batch form agrees with the per-slot form.
TEST(EngramHash, RandomHistories) {
  const uint64_t seed = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 gen(seed);
  const EngramLayout L = make_engram_layout(released_engram_config());
  const int n_cols = L.n_cols();
  for (int trial = 0; trial < 20; ++trial) {
    const int n = 5 + static_cast<int>(gen() % 40);
    std::vector<int32_t> hist(static_cast<size_t>(n));
    for (auto& h : hist) h = (gen() % 10 == 0) ? kEngramDead : static_cast<int32_t>(gen() % 99092);
    const int32_t pad = static_cast<int32_t>(gen() % 99092);
    std::vector<int64_t> positions(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) positions[static_cast<size_t>(i)] = i;
    std::vector<int64_t> batch(static_cast<size_t>(n) * 2 * static_cast<size_t>(n_cols));
    engram_hash_tokens(L, hist, positions, pad, batch.data());
    for (int pos = 0; pos < n; ++pos) {
      for (int s = 0; s < 2; ++s) {
        std::vector<int64_t> one(static_cast<size_t>(n_cols));
        engram_hash_columns(L, s, hist, pos, pad, one.data());
        for (int c = 0; c < n_cols; ++c) {
          const size_t k = static_cast<size_t>(s * n_cols + c);
          EXPECT_EQ(one[static_cast<size_t>(c)], batch[static_cast<size_t>(pos) * 2 * static_cast<size_t>(n_cols) + k]);
          EXPECT_GE(one[static_cast<size_t>(c)], L.offsets[k]);
          EXPECT_LT(one[static_cast<size_t>(c)], L.offsets[k] + L.primes[k]);
        }
        // Same 4-id window at a later position, different older history: same hash.
        bool clean = pos >= 3;
        for (int k = 0; k < 4 && clean; ++k) clean = hist[static_cast<size_t>(pos - k)] != kEngramDead;
        if (clean) {
          std::vector<int32_t> moved(static_cast<size_t>(pos + 7), 5);
          for (int k = 0; k < 4; ++k) moved[static_cast<size_t>(pos + 6 - k)] = hist[static_cast<size_t>(pos - k)];
          std::vector<int64_t> again(static_cast<size_t>(n_cols));
          engram_hash_columns(L, s, moved, pos + 6, pad, again.data());
          EXPECT_EQ(again, one);
        }
      }
    }
  }
}

TEST(EngramHash, ErrorsAndEmpty) {
  ModelConfig none;
  EXPECT_EQ(make_engram_layout(none).n_slots(), 0);
  ModelConfig bad = released_engram_config();
  bad.engram_num_embeddings = {1};
  EXPECT_THROW(make_engram_layout(bad), Error);
  bad = released_engram_config();
  bad.engram_max_ngram = 1;
  EXPECT_THROW(make_engram_layout(bad), Error);
  bad = released_engram_config();
  bad.engram_compressed_vocab_size = 0;
  EXPECT_THROW(make_engram_layout(bad), Error);
  bad = released_engram_config();
  bad.engram_layer_ids = {1, 1};
  EXPECT_THROW(make_engram_layout(bad), Error);

  const std::vector<int32_t> map = {0, 1, 2, 1};
  EXPECT_EQ(engram_compress(map, 3), 1);
  EXPECT_EQ(engram_compress(map, 3, true), kEngramDead);
  EXPECT_THROW(engram_compress(map, 4), Error);
  EXPECT_THROW(engram_compress(map, -1), Error);
  ModelConfig cfg = released_engram_config();
  cfg.engram_compressed_vocab_size = 3;
  EXPECT_EQ(engram_pad_compressed(cfg, map, 3), 2);
  EXPECT_THROW(engram_pad_compressed(cfg, map, 4), Error);
}

}  // namespace
}  // namespace di
