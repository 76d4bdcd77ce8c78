// Speculative verify steps: checkpoint_state before a forward of k tokens, rollback_state to the
// first j of them after it. The rolled-back state must behave, for every later forward and DSpark
// draft, exactly like a state that was fed only those j tokens (reference_decode_quirks off, where
// chunking changes no row): window rings get the dropped positions' old slots back, the ratio-2
// compressor tail is rebuilt from the step's kept inputs, counts and histories are cut back.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>

#include "core/error.h"
#include "test_util.h"
#include "tiny_model.h"

namespace di {
namespace {

using testing_util::fresh_seed;
using testing_util::random_ids;
using testing_util::slice;

class Rollback : public testing_util::TinyModelSuite {
 protected:
  // Feeds ids (one forward) and seeds the DSpark rings with their features.
  static ForwardResult feed(SequenceState& st, const std::vector<int32_t>& ids, bool all_logits = true) {
    ForwardResult r = model_->forward(st, ids, all_logits);
    model_->dspark_seed(st, r.features);
    return r;
  }
  static void expect_same_draft(SequenceState& a, SequenceState& b, int32_t anchor, const std::string& where) {
    DraftResult da = model_->dspark_draft(a, anchor), db = model_->dspark_draft(b, anchor);
    EXPECT_EQ(da.ids, db.ids) << where;
    EXPECT_EQ(da.logits, db.logits) << where;
    EXPECT_EQ(da.confidence, db.confidence) << where;
  }
};

TEST_F(Rollback, EveryAcceptedPrefixEqualsAFreshRun) {
  std::mt19937_64 rng(fresh_seed("Rollback.every_prefix"));
  const ModelConfig& cfg = model_->config();
  const int vocab = cfg.vocab_size;
  int checked = 0;
  for (int trial = 0; trial < 3; ++trial) {
    // even and odd prefix lengths put the step's start at the edge and inside a ratio-2 group
    int64_t prefix_len = 18 + 2 * static_cast<int64_t>(rng() % 10) + trial % 2;
    // a verify step (anchor + drafts), then the longest step a checkpoint covers (the window)
    int64_t k = trial < 2 ? 2 + static_cast<int64_t>(rng() % cfg.dspark_block_size) : cfg.window;
    std::vector<int32_t> prefix = random_ids(rng, prefix_len, vocab), step = random_ids(rng, k, vocab);
    SequenceState base = model_->new_sequence();
    feed(base, prefix);
    std::vector<int64_t> keeps;
    for (int64_t j = 0; j <= k; ++j)
      if (trial < 2 || j < 3 || j > k - 3 || j == k / 2) keeps.push_back(j);
    for (int64_t j : keeps) {
      SCOPED_TRACE("prefix " + std::to_string(prefix_len) + ", step " + std::to_string(k) + ", keep " + std::to_string(j));
      std::vector<int32_t> after = random_ids(rng, 1 + static_cast<int64_t>(rng() % 4), vocab);
      // speculative: run all k, seed them, roll back to j
      SequenceState spec = clone_state(base, *backend_);
      StateCheckpoint cp = checkpoint_state(spec, k, *backend_);
      feed(spec, step);
      rollback_state(spec, cp, j, *backend_);
      EXPECT_EQ(spec.n_tokens, prefix_len + j);
      EXPECT_EQ(spec.dspark_seeded, prefix_len + j);
      // fresh: only the j accepted tokens
      SequenceState fresh = clone_state(base, *backend_);
      if (j > 0) feed(fresh, slice(step, 0, j));
      int32_t anchor = static_cast<int32_t>(rng() % vocab);
      expect_same_draft(spec, fresh, anchor, "draft right after the rollback");
      ForwardResult a = feed(spec, after), b = feed(fresh, after);
      ASSERT_EQ(a.logits, b.logits);
      expect_same_draft(spec, fresh, anchor, "draft after the next step");
      // and one more decode token
      std::vector<int32_t> one = random_ids(rng, 1, vocab);
      ASSERT_EQ(feed(spec, one).logits, feed(fresh, one).logits);
      ++checked;
    }
  }
  std::printf("[rollback] %d (prefix, step, keep) cases bit-identical to fresh runs\n", checked);
}

// A decode loop of several verify steps, each rolled back to a random accepted prefix, ends in the
// same state as feeding the accepted tokens one forward each.
TEST_F(Rollback, ASpeculativeLoopMatchesFeedingTheAcceptedTokens) {
  std::mt19937_64 rng(fresh_seed("Rollback.loop"));
  const int vocab = model_->config().vocab_size, w = model_->config().window;
  std::vector<int32_t> prompt = random_ids(rng, 9 + static_cast<int64_t>(rng() % 8), vocab);
  SequenceState spec = model_->new_sequence(), plain = model_->new_sequence();
  feed(spec, prompt);
  feed(plain, prompt);
  for (int stepi = 0; stepi < 8; ++stepi) {
    int64_t k = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(w));
    int64_t j = static_cast<int64_t>(rng() % static_cast<uint64_t>(k + 1));
    std::vector<int32_t> step = random_ids(rng, k, vocab);
    StateCheckpoint cp = checkpoint_state(spec, k, *backend_);
    feed(spec, step);
    rollback_state(spec, cp, j, *backend_);
    if (j > 0) feed(plain, slice(step, 0, j));
  }
  EXPECT_EQ(spec.n_tokens, plain.n_tokens);
  EXPECT_EQ(spec.engram_history, plain.engram_history);
  std::vector<int32_t> tail = random_ids(rng, 5, vocab);
  EXPECT_EQ(feed(spec, tail).logits, feed(plain, tail).logits);
  expect_same_draft(spec, plain, tail.back(), "final draft");
}

TEST_F(Rollback, RejectsMisuse) {
  const int w = model_->config().window;
  SequenceState st = model_->new_sequence();
  feed(st, {0, 4, 9});
  EXPECT_THROW(checkpoint_state(st, w + 1, *backend_), Error);  // beyond the window: slots would repeat
  EXPECT_THROW(checkpoint_state(st, 0, *backend_), Error);
  StateCheckpoint cp = checkpoint_state(st, 2, *backend_);
  EXPECT_THROW(rollback_state(st, cp, 1, *backend_), Error);  // its forward has not run
  feed(st, {5, 6});
  EXPECT_THROW(rollback_state(st, cp, 3, *backend_), Error);  // more than the step fed
  rollback_state(st, cp, 1, *backend_);
  EXPECT_EQ(st.n_tokens, 4);
}

}  // namespace
}  // namespace di
