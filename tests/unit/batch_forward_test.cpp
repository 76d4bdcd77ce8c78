// Continuous batching on the CPU backend is batch-invariant: each entry of forward_batch gets
// exactly (bit for bit) the logits and DSpark features it gets alone, whatever the other entries
// are -- prefill chunks of any length (inside compress groups too), one-token decodes, entries that
// keep only their last window rows (decoder_window_only) -- because every dense CPU op computes each
// row with a summation order that does not depend on the number of rows (linear: per (row, output)
// in K order; MoE: per token in expert-id order), and attention runs per entry.
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <random>

#include "core/error.h"
#include "test_util.h"
#include "tiny_model.h"

namespace di {
namespace {

using testing_util::fresh_seed;
using testing_util::random_ids;

struct Step {
  std::vector<int32_t> ids;
  ForwardOptions options;
};

// Random chunk plans for one sequence: prefill chunks of 1..W+5 tokens, then one-token decodes
// mixed with short chunks; all_logits random; decoder_window_only on some long chunks.
std::vector<Step> random_plan(std::mt19937_64& rng, int vocab, int window, int64_t max_tokens) {
  std::vector<Step> plan;
  int64_t total = 0, target = 20 + static_cast<int64_t>(rng() % static_cast<uint64_t>(max_tokens - 20));
  while (total < target) {
    int64_t n = rng() % 2 == 0 ? 1 : 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(window + 5));
    n = std::min(n, target - total);
    Step s;
    s.ids = random_ids(rng, n, vocab);
    if (total == 0) s.ids[0] = 0;  // bos
    s.options.all_logits = rng() % 2 == 0;
    s.options.decoder_window_only = n > window && rng() % 2 == 0;
    plan.push_back(s);
    total += n;
  }
  return plan;
}

void expect_same(const ForwardResult& batched, const ForwardResult& alone, Backend& be, const std::string& where) {
  ASSERT_EQ(batched.logits.size(), alone.logits.size()) << where;
  for (size_t i = 0; i < alone.logits.size(); ++i) ASSERT_EQ(batched.logits[i], alone.logits[i]) << where << " logit " << i;
  EXPECT_EQ(batched.rows_position, alone.rows_position) << where;
  ASSERT_EQ(batched.features.shape, alone.features.shape) << where;
  std::vector<float> fb = be.to_host_f32(batched.features), fa = be.to_host_f32(alone.features);
  for (size_t i = 0; i < fa.size(); ++i) ASSERT_EQ(fb[i], fa[i]) << where << " feature " << i;
}

// Runs `n_seq` random plans alone (on `alone_model`), then the same plans interleaved in random
// batches (on `model`); every entry's results must match exactly. Returns the number of batched
// forwards with > 1 entry.
int check_batch_invariance(Model& model, Model& alone_model, Backend& be, uint64_t seed, int n_seq) {
  std::mt19937_64 rng(seed);
  const ModelConfig& cfg = model.config();
  std::vector<std::vector<Step>> plans;
  for (int s = 0; s < n_seq; ++s) plans.push_back(random_plan(rng, cfg.vocab_size, cfg.window, 90));
  std::vector<std::vector<ForwardResult>> alone(n_seq);
  for (int s = 0; s < n_seq; ++s) {
    SequenceState st = alone_model.new_sequence();
    for (const Step& step : plans[s]) {
      std::vector<BatchEntry> one{{&st, step.ids, step.options}};
      alone[s].push_back(alone_model.forward_batch(one)[0]);
    }
  }
  std::vector<SequenceState> states;
  for (int s = 0; s < n_seq; ++s) states.push_back(model.new_sequence());
  std::vector<size_t> next(n_seq, 0);
  int multi = 0;
  for (int round = 0;; ++round) {
    std::vector<int> members;
    for (int s = 0; s < n_seq; ++s)
      if (next[s] < plans[s].size() && rng() % 4 != 0) members.push_back(s);
    bool done = true;
    for (int s = 0; s < n_seq; ++s) done = done && next[s] == plans[s].size();
    if (done) break;
    if (members.empty()) continue;
    std::shuffle(members.begin(), members.end(), rng);
    std::vector<BatchEntry> batch;
    for (int s : members) batch.push_back({&states[s], plans[s][next[s]].ids, plans[s][next[s]].options});
    std::vector<ForwardResult> out = model.forward_batch(batch);
    EXPECT_EQ(out.size(), members.size());
    multi += members.size() > 1;
    for (size_t i = 0; i < members.size(); ++i) {
      int s = members[i];
      expect_same(out[i], alone[s][next[s]], be,
                  "round " + std::to_string(round) + " sequence " + std::to_string(s) + " step " + std::to_string(next[s]));
      ++next[s];
    }
  }
  return multi;
}

int check_batch_invariance(Model& model, Backend& be, uint64_t seed, int n_seq) {
  return check_batch_invariance(model, model, be, seed, n_seq);
}

// Runs check(seed) with fresh seeds until at least `want` batched forwards had several entries (the
// random schedules vary; up to 5 rounds). Returns their number.
int batched_steps(int want, const char* name, const std::function<int(uint64_t)>& check) {
  int multi = 0;
  for (int round = 0; round < 5 && multi < want; ++round) multi += check(fresh_seed(name));
  return multi;
}

class BatchForward : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    backend_ = make_cpu_backend();
    consistent_ = testing_util::load_tiny_model(*backend_, false);
    reference_ = testing_util::load_tiny_model(*backend_, true);
  }
  static void TearDownTestSuite() {
    consistent_.reset();
    reference_.reset();
    backend_.reset();
  }
  static std::unique_ptr<Backend> backend_;
  static std::unique_ptr<Model> consistent_;  // reference_decode_quirks off
  static std::unique_ptr<Model> reference_;   // on
};
std::unique_ptr<Backend> BatchForward::backend_;
std::unique_ptr<Model> BatchForward::consistent_;
std::unique_ptr<Model> BatchForward::reference_;

TEST_F(BatchForward, EachEntryMatchesItsRunAloneExactly) {
  int multi = batched_steps(6, "BatchForward.quirks_off",
                            [&](uint64_t seed) { return check_batch_invariance(*consistent_, *backend_, seed, 4); });
  std::printf("[batch forward] quirks off: %d batched steps with several entries, all bit-identical\n", multi);
  EXPECT_GE(multi, 6);
}

// The reference's decode quirks are per sequence (its index-key source, torch's tie order over the
// row's width), so batching leaves them alone as well.
TEST_F(BatchForward, HoldsWithTheReferenceDecodeQuirksToo) {
  int multi = batched_steps(3, "BatchForward.quirks_on",
                            [&](uint64_t seed) { return check_batch_invariance(*reference_, *backend_, seed, 4); });
  std::printf("[batch forward] quirks on: %d batched steps with several entries, all bit-identical\n", multi);
  EXPECT_GE(multi, 3);
}

// A prefix-cache replay (keep_global_before) batched with another sequence's chunk.
// The batched indexer (one index-score / top-k pass over every sequence's rows, their keys in one
// tensor) gives each sequence the lists, and so the logits, of the indexer run per sequence.
TEST_F(BatchForward, BatchedIndexerGivesThePerSequenceResults) {
  ModelOptions o;
  o.reference_decode_quirks = false;
  o.batched_indexer = false;
  std::unique_ptr<Model> per_sequence = Model::load(std::string(DI_TEST_DATA) + "/golden_dev/model", *backend_, o);
  int multi = batched_steps(6, "BatchForward.indexer", [&](uint64_t seed) {
    return check_batch_invariance(*consistent_, *per_sequence, *backend_, seed, 4);
  });
  std::printf("[batch forward] batched indexer vs per sequence: %d batched steps, all bit-identical\n", multi);
  EXPECT_GE(multi, 6);
}

TEST_F(BatchForward, ReplayEntriesToo) {
  Model& m = *consistent_;
  const int w = m.config().window, vocab = m.config().vocab_size;
  std::mt19937_64 rng(fresh_seed("BatchForward.replay"));
  std::vector<int32_t> ids = random_ids(rng, 3 * w, vocab), other = random_ids(rng, 11, vocab);
  const int64_t h = 2 * w + 4;
  SequenceState cold = m.new_sequence();
  m.forward(cold, testing_util::slice(ids, 0, h));
  auto restored = [&] {
    SequenceState s = m.new_sequence();
    write_global_rows(s, read_global_rows(cold, 0, h, *backend_), *backend_);
    m.restore_history(s, testing_util::slice(ids, 0, h));
    set_replay_start(s, h - w);
    return s;
  };
  SequenceState alone = restored(), batched = restored(), side = m.new_sequence();
  ForwardOptions replay;
  replay.keep_global_before = h;
  std::vector<BatchEntry> one{{&alone, testing_util::slice(ids, h - w, h), replay}};
  ForwardResult ra = m.forward_batch(one)[0];
  std::vector<BatchEntry> two{{&side, other, {}}, {&batched, testing_util::slice(ids, h - w, h), replay}};
  ForwardResult rb = m.forward_batch(two)[1];
  expect_same(rb, ra, *backend_, "replay");
  std::vector<int32_t> rest = testing_util::slice(ids, h, 3 * w);
  EXPECT_EQ(m.forward(alone, rest, true).logits, m.forward(batched, rest, true).logits);
}

TEST_F(BatchForward, ForwardIsABatchOfOne) {
  std::mt19937_64 rng(fresh_seed("BatchForward.one"));
  std::vector<int32_t> ids = random_ids(rng, 23, consistent_->config().vocab_size);
  SequenceState a = consistent_->new_sequence(), b = consistent_->new_sequence();
  ForwardResult ra = consistent_->forward(a, ids, true);
  std::vector<BatchEntry> one{{&b, ids, {}}};
  one[0].options.all_logits = true;
  ForwardResult rb = consistent_->forward_batch(one)[0];
  EXPECT_EQ(ra.logits, rb.logits);
  EXPECT_EQ(a.n_tokens, 23);
  EXPECT_EQ(b.n_tokens, 23);
  EXPECT_EQ(ra.features.rows(), 23);
}

TEST_F(BatchForward, RejectsTheSameStateTwice) {
  SequenceState st = consistent_->new_sequence();
  std::vector<BatchEntry> twice{{&st, {0, 5}, {}}, {&st, {7}, {}}};
  EXPECT_THROW(consistent_->forward_batch(twice), Error);
  EXPECT_EQ(st.n_tokens, 0);
}

TEST_F(BatchForward, DecoderWindowOnlyKeepsTheLastWindowRows) {
  const int w = consistent_->config().window;
  std::mt19937_64 rng(fresh_seed("BatchForward.window_only"));
  std::vector<int32_t> ids = random_ids(rng, 3 * w + 5, consistent_->config().vocab_size);
  SequenceState st = consistent_->new_sequence();
  std::vector<BatchEntry> e{{&st, ids, {}}};
  e[0].options.all_logits = true;
  e[0].options.decoder_window_only = true;
  ForwardResult r = consistent_->forward_batch(e)[0];
  EXPECT_EQ(r.rows_position, 2 * w + 5);
  EXPECT_EQ(r.logits.size(), static_cast<size_t>(w) * consistent_->config().vocab_size);
  EXPECT_EQ(r.features.rows(), w);
  EXPECT_EQ(st.n_tokens, 3 * w + 5);
  // the DSpark rings take the kept rows' features from their position on
  consistent_->dspark_seed(st, r.features, r.rows_position);
  EXPECT_EQ(st.dspark_seeded, 3 * w + 5);
  EXPECT_THROW(consistent_->dspark_seed(st, r.features, r.rows_position), Error);  // already seeded
  EXPECT_EQ(consistent_->dspark_draft(st, 7).ids.size(), static_cast<size_t>(consistent_->config().dspark_block_size + 1));
}

}  // namespace
}  // namespace di
