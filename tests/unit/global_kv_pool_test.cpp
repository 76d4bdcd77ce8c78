// The global-KV page pool (src/model/global_kv_pool.h) and the page tables over it: pages are
// reference-counted and reused, the limit is an error naming the pool, growth keeps the rows,
// clones share pages until one writes (copy on write), adopted pages are the writer's own (no
// copy) and give the same logits as copied rows, and a rollback returns the pages it no longer needs.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "core/error.h"
#include "model/state_io.h"
#include "test_util.h"
#include "tiny_model.h"

namespace di {
namespace {

using testing_util::fresh_seed;
using testing_util::random_ids;
using testing_util::slice;

std::vector<uint8_t> bytes_of(const Tensor& t, int64_t row0, int64_t n) {
  const uint8_t* p = t.u8() + row0 * t.row_size();
  return std::vector<uint8_t>(p, p + n * t.row_size());
}

std::vector<int32_t> page_ids(const SequenceState& s) {
  std::vector<int32_t> ids;
  for (const PageRef& p : s.pages) ids.push_back(p->id());
  return ids;
}

// The tiny model (max 128 positions) with 16-position pages, so a sequence spans several.
class GlobalKvPoolTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    backend_ = make_cpu_backend();
    model_ = testing_util::load_tiny_model(*backend_, false, 16);
  }
  static void TearDownTestSuite() {
    model_.reset();
    backend_.reset();
  }
  static inline std::unique_ptr<Backend> backend_;
  static inline std::unique_ptr<Model> model_;
};

TEST_F(GlobalKvPoolTest, PagesAreCountedReusedAndLimited) {
  std::mt19937_64 rng(fresh_seed("GlobalKvPool.PagesAreCountedReusedAndLimited"));
  const ModelConfig& cfg = model_->config();
  auto pool = GlobalKvPool::create(cfg, 8, *backend_);
  EXPECT_EQ(pool->rows_per_page(2), 4);  // ratio 2
  EXPECT_EQ(pool->rows_per_page(4), 8);  // ratio 1
  EXPECT_EQ(pool->rows_per_page(0), 0);  // a window-only layer keeps no global rows
  EXPECT_EQ(pool->page_bytes(), 8 * global_bytes_per_token(cfg));

  const int n = 5 + static_cast<int>(rng() % 20);
  std::vector<PageRef> held;
  for (int i = 0; i < n; ++i) held.push_back(pool->allocate());
  for (int i = 0; i < n; ++i) EXPECT_EQ(held[i]->id(), i);  // a fresh pool hands out ascending ids
  EXPECT_EQ(pool->used_pages(), n);
  // rows written into the pages survive the storage growing under them
  std::vector<uint8_t> before;
  Tensor& comp = pool->comp(4);
  for (int64_t i = 0; i < comp.rows() * comp.row_size(); ++i) comp.u8()[i] = static_cast<uint8_t>(rng());
  before = bytes_of(comp, 0, n * 8);
  std::vector<PageRef> more;
  for (int i = 0; i < 3 * n; ++i) more.push_back(pool->allocate());
  EXPECT_GE(pool->capacity_pages(), 4 * n);
  EXPECT_EQ(bytes_of(pool->comp(4), 0, n * 8), before);
  // dropped pages come back first; a copy of a handle keeps its page
  PageRef kept = held[0];
  std::set<int32_t> dropped;
  std::vector<PageRef> odd;
  for (int i = 0; i < n; ++i) {
    if (i % 2 == 0 && i > 0) dropped.insert(held[i]->id());
    if (i % 2 == 1) odd.push_back(held[i]);
  }
  held.clear();
  EXPECT_EQ(pool->used_pages(), 3 * n + 1 + static_cast<int64_t>(odd.size()));
  std::vector<PageRef> again;
  std::set<int32_t> reused;
  for (size_t i = 0; i < dropped.size(); ++i) {
    again.push_back(pool->allocate());
    reused.insert(again.back()->id());
  }
  EXPECT_EQ(reused, dropped);
  // the limit
  EXPECT_THROW(pool->set_max_pages(pool->used_pages() - 1), Error);
  pool->set_max_pages(pool->used_pages() + 1);
  PageRef last = pool->allocate();
  try {
    pool->allocate();
    FAIL() << "allocate past the limit";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kv page pool exhausted"), std::string::npos) << e.what();
  }
  EXPECT_THROW(GlobalKvPool::create(cfg, 7, *backend_), Error);  // not a multiple of ratio 2
}

TEST_F(GlobalKvPoolTest, ClonesSharePagesUntilOneWrites) {
  std::mt19937_64 rng(fresh_seed("GlobalKvPool.ClonesSharePagesUntilOneWrites"));
  const int vocab = model_->config().vocab_size;
  GlobalKvPool& pool = model_->kv_pool();
  const int64_t t = pool.page_tokens();
  const int64_t n = 2 * t + 2 + static_cast<int64_t>(rng() % (t - 4)) / 2 * 2;  // inside page 2, even
  SequenceState a = model_->new_sequence();
  model_->forward(a, random_ids(rng, n, vocab));
  ASSERT_EQ(a.pages.size(), 3u);
  const GlobalRows rows_a = read_global_rows(a, 0, n, *backend_);
  const int64_t used = pool.used_pages();
  SequenceState b = clone_state(a, *backend_);
  EXPECT_EQ(page_ids(b), page_ids(a));
  EXPECT_EQ(pool.used_pages(), used);
  model_->forward(b, random_ids(rng, 4, vocab));  // writes into page 2 only: it is copied first
  EXPECT_EQ(pool.used_pages(), used + 1);
  EXPECT_EQ(b.pages[0]->id(), a.pages[0]->id());
  EXPECT_EQ(b.pages[1]->id(), a.pages[1]->id());
  EXPECT_NE(b.pages[2]->id(), a.pages[2]->id());
  const GlobalRows again = read_global_rows(a, 0, n, *backend_);
  for (size_t i = 0; i < rows_a.layers.size(); ++i) {
    EXPECT_EQ(bytes_of(again.comp[i], 0, again.comp[i].rows()), bytes_of(rows_a.comp[i], 0, rows_a.comp[i].rows()));
    EXPECT_EQ(bytes_of(again.index_keys[i], 0, again.index_keys[i].rows()),
              bytes_of(rows_a.index_keys[i], 0, rows_a.index_keys[i].rows()));
  }
  // b's copy of page 2 starts as a's: its rows below n are a's rows
  const GlobalRows rows_b = read_global_rows(b, 0, n, *backend_);
  for (size_t i = 0; i < rows_a.layers.size(); ++i)
    EXPECT_EQ(bytes_of(rows_b.comp[i], 0, rows_b.comp[i].rows()), bytes_of(rows_a.comp[i], 0, rows_a.comp[i].rows()));
}

// A replay hit restored from adopted pages and one restored from copied rows continue to the same
// logits, bit for bit; the adopted pages are the writer's.
TEST_F(GlobalKvPoolTest, AdoptedPagesActLikeCopiedRows) {
  std::mt19937_64 rng(fresh_seed("GlobalKvPool.AdoptedPagesActLikeCopiedRows"));
  const int vocab = model_->config().vocab_size;
  GlobalKvPool& pool = model_->kv_pool();
  const int64_t t = pool.page_tokens(), w = model_->config().window;
  const int64_t h = t * (2 + static_cast<int64_t>(rng() % 3)), n = h + 5 + static_cast<int64_t>(rng() % 20);
  std::vector<int32_t> ids = random_ids(rng, n, vocab);
  SequenceState writer = model_->new_sequence();
  model_->forward(writer, slice(ids, 0, h + 3));

  auto restore = [&](bool adopt) {
    SequenceState s = model_->new_sequence();
    if (adopt) {
      const int64_t used = pool.used_pages();
      adopt_global_pages(s, share_global_pages(writer, 0, h), 0);
      EXPECT_EQ(pool.used_pages(), used);
      const std::vector<int32_t> writer_ids = page_ids(writer);
      EXPECT_EQ(page_ids(s), std::vector<int32_t>(writer_ids.begin(), writer_ids.begin() + h / t));
    } else {
      write_global_rows(s, read_global_rows(writer, 0, h, *backend_), *backend_);
    }
    model_->restore_history(s, slice(ids, 0, h - w));
    set_replay_start(s, h - w);
    std::vector<BatchEntry> e{{&s, slice(ids, h - w, h), {}}};
    e[0].options.keep_global_before = h;
    model_->forward_batch(e);
    return model_->forward(s, slice(ids, h, n), true).logits;
  };
  const GlobalRows before = read_global_rows(writer, 0, h, *backend_);
  EXPECT_EQ(restore(true), restore(false));
  const GlobalRows after = read_global_rows(writer, 0, h, *backend_);  // the writer's rows untouched
  for (size_t i = 0; i < before.layers.size(); ++i)
    EXPECT_EQ(bytes_of(after.comp[i], 0, after.comp[i].rows()), bytes_of(before.comp[i], 0, before.comp[i].rows()));
  EXPECT_THROW(share_global_pages(writer, 0, h + t), Error);  // not written that far
  EXPECT_THROW(share_global_pages(writer, 0, t / 2), Error);  // not page-aligned
  SequenceState fresh = model_->new_sequence();
  EXPECT_THROW(adopt_global_pages(fresh, share_global_pages(writer, 0, t), t), Error);  // would leave a gap
}

TEST_F(GlobalKvPoolTest, RollbackReturnsThePagesOfDroppedPositions) {
  std::mt19937_64 rng(fresh_seed("GlobalKvPool.RollbackReturnsThePagesOfDroppedPositions"));
  const int vocab = model_->config().vocab_size;
  GlobalKvPool& pool = model_->kv_pool();
  const int64_t t = pool.page_tokens(), w = model_->config().window;
  const int64_t n_new = std::min<int64_t>(w, 6);
  const int64_t start = t - 2 - static_cast<int64_t>(rng() % 2);  // the step crosses into page 1
  SequenceState s = model_->new_sequence();
  model_->forward(s, random_ids(rng, start, vocab));
  ASSERT_EQ(s.pages.size(), 1u);
  const int64_t used = pool.used_pages();
  StateCheckpoint cp = checkpoint_state(s, n_new, *backend_);
  model_->forward(s, random_ids(rng, n_new, vocab), true);
  EXPECT_EQ(s.pages.size(), 2u);
  EXPECT_EQ(pool.used_pages(), used + 1);
  rollback_state(s, cp, 1, *backend_);
  EXPECT_EQ(s.pages.size(), 1u);
  EXPECT_EQ(pool.used_pages(), used);
}

}  // namespace
}  // namespace di
