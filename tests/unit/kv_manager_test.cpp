// Hybrid KV accounting: the V4.1-Flash byte counts of spec §3.1 (890 B/token of global rows, the
// FP8 window rings of 43 layers), pages, and admission / growth / release balance.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "core/error.h"
#include "model/config.h"
#include "runtime/kv_manager.h"
#include "test_util.h"

namespace di {
namespace {

const std::string kFlashDir = std::string(DI_TEST_DATA) + "/configs/v41_flash";
const std::string kTinyDir = std::string(DI_TEST_DATA) + "/golden_dev/model";

TEST(KvLayout, V41FlashBytes) {
  ModelConfig cfg = load_model_config(kFlashDir);
  KvLayout l = KvLayout::from_config(cfg, 64);
  EXPECT_EQ(l.global_bytes_per_token, 890);
  // 3 ratio-2 sources: 32 rows of 356 B; layer 20 (ratio 1): 64 rows; Engram history 4 B/position
  EXPECT_EQ(l.page_bytes, 3 * 32 * 356 + 64 * 356 + 64 * 4);
  // window rings: 40 backbone + 3 DSpark layers x 128 slots x 528 B; tails: 3 x kv+score [2, 512] fp32
  EXPECT_EQ(l.local_bytes, 43 * 128 * 528 + 3 * 2 * 2 * 512 * 4);
  EXPECT_EQ(l.pages_for(0), 0);
  EXPECT_EQ(l.pages_for(64), 1);
  EXPECT_EQ(l.pages_for(65), 2);
  EXPECT_EQ(l.request_bytes(1000), l.local_bytes + 16 * l.page_bytes);
}

TEST(KvLayout, PagesHoldWholeCompressorGroups) {
  ModelConfig cfg = load_model_config(kTinyDir);
  EXPECT_THROW(KvLayout::from_config(cfg, 7), Error);
  EXPECT_THROW(KvLayout::from_config(cfg, 0), Error);
  KvLayout l = KvLayout::from_config(cfg, 8);
  // tiny model: head_dim 64 -> 36 B compressed rows, index_head_dim 64 -> 34 B keys; ratio 2 (layer 2)
  // and ratio 1 (layer 4) sources
  EXPECT_EQ(l.global_bytes_per_token, 70 / 2 + 70);
  EXPECT_EQ(l.page_bytes, 4 * 70 + 8 * 70 + 8 * 4);
}

TEST(KvManager, AdmitGrowShrinkRelease) {
  KvLayout l;
  l.page_tokens = 16;
  l.page_bytes = 10;
  l.local_bytes = 100;
  KvManager kv(l, 200);
  EXPECT_TRUE(kv.fits_alone(160));
  EXPECT_FALSE(kv.fits_alone(161));
  kv.admit(1, 20);  // 100 + 2 pages
  EXPECT_EQ(kv.used_bytes(), 120);
  EXPECT_EQ(kv.grow_bytes(1, 32), 0);
  EXPECT_EQ(kv.grow_bytes(1, 33), 10);
  kv.grow(1, 60);
  EXPECT_EQ(kv.pages_of(1), 4);
  EXPECT_FALSE(kv.can_admit(1));  // 140 + 110 > 200
  kv.shrink(1, 17);
  EXPECT_EQ(kv.pages_of(1), 2);
  EXPECT_EQ(kv.used_bytes(), 120);
  EXPECT_TRUE(kv.can_grow(1, 17 + 48));
  kv.release(1);
  kv.release(1);  // no-op
  EXPECT_EQ(kv.used_bytes(), 0);
  EXPECT_THROW(KvManager(l, 0), Error);
}

TEST(KvManager, RandomOperationsBalance) {
  std::mt19937_64 rng(testing_util::fresh_seed("KvManager.RandomOperationsBalance"));
  KvLayout l;
  l.page_tokens = 1 + rng() % 64;
  l.page_bytes = 1 + rng() % 1000;
  l.local_bytes = rng() % 5000;
  KvManager kv(l, 50 * l.local_bytes + 500 * l.page_bytes + 1);
  std::map<uint64_t, int64_t> tokens;
  for (int i = 0; i < 5000; ++i) {
    uint64_t id = rng() % 40;
    int64_t n = rng() % 400;
    if (!kv.holds(id)) {
      if (kv.can_admit(n)) {
        kv.admit(id, n);
        tokens[id] = n;
      }
    } else if (rng() % 4 == 0) {
      kv.release(id);
      tokens.erase(id);
    } else if (kv.can_grow(id, n)) {
      kv.grow(id, n);
      tokens[id] = std::max(tokens[id], n);
    }
    int64_t want = 0;
    for (const auto& [r, t] : tokens) {
      ASSERT_GE(kv.pages_of(r), l.pages_for(t));
      want += l.local_bytes + kv.pages_of(r) * l.page_bytes;
    }
    ASSERT_EQ(kv.used_bytes(), want);
    ASSERT_LE(kv.used_bytes(), kv.capacity_bytes());
  }
}

}  // namespace
}  // namespace di
