// The prefix cache's two paths at model level, and the decoder-side window-only prefill:
//  - exact: clone_state at a block boundary H, continue -> bit-identical to the cold run;
//  - SWA bounded replay: only the global rows of [0, H) are kept; a fresh state gets them back
//    (write_global_rows, restore_history), replays [H - W, H) to rebuild the window rings and
//    compressor tails without rewriting those rows, then continues: close to cold, not identical
//    (the replayed rows' window attention lacks the positions before H - W);
//  - decoder_window_only: layers after the last KV source run on a long chunk's last W rows only.
// Measured errors are printed; bounds are stated beside each test.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>

#include "core/error.h"
#include "test_util.h"
#include "tiny_model.h"

namespace di {
namespace {

using testing_util::fresh_seed;
using testing_util::max_rel_error;
using testing_util::random_ids;
using testing_util::slice;

// The bytes of a CPU tensor.
std::vector<uint8_t> tensor_bytes(const Tensor& t) {
  const uint8_t* p = t.u8();
  return std::vector<uint8_t>(p, p + t.numel() * (t.type == TType::kU8 ? 1 : 4));
}

class StateIo : public testing_util::TinyModelSuite {
 protected:
};

TEST_F(StateIo, GlobalBytesPerToken) {
  // V4.1-Flash: 3 ratio-2 layers x (288 + 68) / 2 + layer 20's 356 = 890 B (spec §3.1)
  EXPECT_EQ(global_bytes_per_token(load_model_config(std::string(DI_TEST_DATA) + "/configs/v41_flash")), 890);
  // the tiny model: head dim 64 (36 B rows), index dim 64 (34 B): layer 2 at ratio 2, layer 4 at 1
  EXPECT_EQ(global_bytes_per_token(model_->config()), 70 / 2 + 70);
}

TEST_F(StateIo, CloneContinuesBitIdentically) {
  std::mt19937_64 rng(fresh_seed("StateIo.clone"));
  const int vocab = model_->config().vocab_size;
  const int64_t n = 60, h = 2 * (5 + static_cast<int64_t>(rng() % 20));  // a block boundary
  std::vector<int32_t> ids = random_ids(rng, n, vocab);
  SequenceState cold = model_->new_sequence();
  model_->forward(cold, slice(ids, 0, h));
  SequenceState snap = clone_state(cold, *backend_);
  ForwardResult want = model_->forward(cold, slice(ids, h, n), true);
  // the snapshot is independent of the state it came from, and of copies of itself
  SequenceState again = clone_state(snap, *backend_);
  ForwardResult got = model_->forward(snap, slice(ids, h, n), true);
  EXPECT_EQ(got.logits, want.logits);
  std::vector<int32_t> other = random_ids(rng, 7, vocab);
  model_->forward(snap, other);
  EXPECT_EQ(model_->forward(again, slice(ids, h, n), true).logits, want.logits);
}

TEST_F(StateIo, GlobalRowsRoundTrip) {
  std::mt19937_64 rng(fresh_seed("StateIo.rows"));
  SequenceState a = model_->new_sequence(), b = model_->new_sequence();
  model_->forward(a, random_ids(rng, 41, model_->config().vocab_size));
  GlobalRows lo = read_global_rows(a, 0, 16, *backend_), hi = read_global_rows(a, 16, 40, *backend_);
  EXPECT_EQ(lo.layers, (std::vector<int>{2, 4}));
  EXPECT_EQ(lo.comp[0].rows(), 8);   // ratio 2
  EXPECT_EQ(lo.comp[1].rows(), 16);  // ratio 1
  EXPECT_THROW(write_global_rows(b, hi, *backend_), Error);  // would leave [0, 16) empty
  write_global_rows(b, lo, *backend_);
  write_global_rows(b, hi, *backend_);
  GlobalRows all_a = read_global_rows(a, 0, 40, *backend_), all_b = read_global_rows(b, 0, 40, *backend_);
  for (size_t i = 0; i < all_a.layers.size(); ++i) {
    EXPECT_EQ(tensor_bytes(all_a.comp[i]), tensor_bytes(all_b.comp[i]));
    EXPECT_EQ(tensor_bytes(all_a.index_keys[i]), tensor_bytes(all_b.index_keys[i]));
  }
  EXPECT_EQ(b.layers[2].n_comp, 20);
  EXPECT_EQ(b.layers[4].n_comp, 40);
  EXPECT_THROW(read_global_rows(a, 0, 41, *backend_), Error);  // not ratio-aligned
  EXPECT_THROW(read_global_rows(a, 0, 42, *backend_), Error);  // not written
}

// Relative L2 distance of two logits vectors.
double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

// Cold run vs a prefix hit at H restored from global rows. `replay_chunks`: the replay of
// [from, H) fed in that many forwards (0: no replay at all, continue from H with empty rings).
// Returns the continuation's logits for [H, n); checks what must hold exactly on the way.
std::vector<float> restore_and_continue(Model& model, Backend& be, const std::vector<int32_t>& ids, int64_t h,
                                        int64_t from, int replay_chunks, const SequenceState& cold_at_h) {
  SequenceState st = model.new_sequence();
  GlobalRows rows = read_global_rows(cold_at_h, 0, h, be);
  write_global_rows(st, rows, be);
  model.restore_history(st, slice(ids, 0, h));
  set_replay_start(st, replay_chunks > 0 ? from : h);
  for (int c = 0; c < replay_chunks; ++c) {
    int64_t a = from + (h - from) * c / replay_chunks, b = from + (h - from) * (c + 1) / replay_chunks;
    std::vector<BatchEntry> e{{&st, slice(ids, a, b), {}}};
    e[0].options.keep_global_before = h;
    ForwardResult r = model.forward_batch(e)[0];
    EXPECT_EQ(r.features.rows(), b - a);  // the replayed rows' DSpark features, to seed the drafter
  }
  EXPECT_EQ(st.n_tokens, h);
  // the replay did not rewrite the cached global rows; layer 0's window rows depend on the token
  // alone, so its rebuilt ring equals the cold one
  GlobalRows after = read_global_rows(st, 0, h, be);
  for (size_t i = 0; i < rows.layers.size(); ++i) EXPECT_EQ(tensor_bytes(after.comp[i]), tensor_bytes(rows.comp[i]));
  if (replay_chunks > 0 && h - from == model.config().window) {
    EXPECT_EQ(tensor_bytes(st.layers[0].window), tensor_bytes(cold_at_h.layers[0].window));
  }
  return model.forward(st, slice(ids, h, static_cast<int64_t>(ids.size())), true).logits;
}

// SWA bounded replay (replay [H - W, H)) vs cold. The tiny model's random weights and 16-token
// window make the approximation coarse: relative L2 of the continuation's logits measured up to
// ~0.9 (36 cases), while continuing with empty rings (no replay) is always worse. Bound: below 1.25
// and below the no-replay error. Hits within the first window replay from position 0: bit-identical.
// Replaying in two chunks gives exactly the one-chunk result (the rings hold nothing below H - W).
TEST_F(StateIo, BoundedReplayIsCloseToCold) {
  std::mt19937_64 rng(fresh_seed("StateIo.replay"));
  const int vocab = model_->config().vocab_size, w = model_->config().window;
  const int64_t n = 90;
  std::vector<int32_t> ids = random_ids(rng, n, vocab);
  ids[0] = 0;
  for (int64_t h : std::vector<int64_t>{12, w, 2 * w + 6, 4 * w, 76}) {
    SCOPED_TRACE("hit " + std::to_string(h));
    SequenceState cold = model_->new_sequence();
    model_->forward(cold, slice(ids, 0, h));
    SequenceState cold_at_h = clone_state(cold, *backend_);
    std::vector<float> want = model_->forward(cold, slice(ids, h, n), true).logits;
    int64_t from = std::max<int64_t>(0, h - w);
    std::vector<float> got = restore_and_continue(*model_, *backend_, ids, h, from, 1, cold_at_h);
    if (from == 0) {
      EXPECT_EQ(got, want);
      continue;
    }
    EXPECT_EQ(restore_and_continue(*model_, *backend_, ids, h, from, 2, cold_at_h), got);
    double err = rel_l2(got, want);
    double none = rel_l2(restore_and_continue(*model_, *backend_, ids, h, h, 0, cold_at_h), want);
    double twice = rel_l2(restore_and_continue(*model_, *backend_, ids, h, std::max<int64_t>(0, h - 2 * w), 1, cold_at_h), want);
    std::printf("[bounded replay] hit at %2lld: relative L2 of the continuation's logits: replay W %.3g, replay 2W %.3g, "
                "no replay %.3g\n", static_cast<long long>(h), err, twice, none);
    EXPECT_LT(err, 1.25);
    EXPECT_LT(err, none);
  }
}

// decoder_window_only on a long prefill chunk: the last row's logits vs the exact forward, and vs the
// forward of the last window alone (the context before it lost). Measured on the tiny model over
// ~1,250 seeds (max |diff| / max |logit|): median 0.03-0.08, worst 0.265 (a 0.25 bound failed 2 times in
// ~950 runs); the window alone 0.34-1.1, and the approximation's error at most 0.25 of it. Bounds: 0.4,
// and half the window-alone error. The following decode steps stay within 0.4.
TEST_F(StateIo, DecoderWindowOnlyIsCloseToExact) {
  std::mt19937_64 rng(fresh_seed("StateIo.window_only"));
  const int vocab = model_->config().vocab_size, w = model_->config().window;
  for (int64_t n : std::vector<int64_t>{w + 1, 2 * w + 3, 5 * w + 1}) {
    std::vector<int32_t> ids = random_ids(rng, n, vocab), next = random_ids(rng, 4, vocab);
    SequenceState exact = model_->new_sequence(), approx = model_->new_sequence();
    ForwardResult want = model_->forward(exact, ids);
    std::vector<BatchEntry> e{{&approx, ids, {}}};
    e[0].options.decoder_window_only = true;
    ForwardResult got = model_->forward_batch(e)[0];
    double err = max_rel_error(got.logits, want.logits), worst_decode = 0;
    for (int32_t t : next)
      worst_decode = std::max(worst_decode, max_rel_error(model_->forward(approx, {t}).logits,
                                                          model_->forward(exact, {t}).logits));
    SequenceState cut = model_->new_sequence();
    const double lost = max_rel_error(model_->forward(cut, slice(ids, n - w, n)).logits, want.logits);
    std::printf("[decoder window only] chunk %3lld: last row %.3g, next 4 decode steps %.3g, the window alone %.3g "
                "(max |diff| / max |logit|)\n", static_cast<long long>(n), err, worst_decode, lost);
    EXPECT_LT(err, 0.4);
    EXPECT_LT(err, 0.5 * lost);
    EXPECT_LT(worst_decode, 0.4);
  }
}

}  // namespace
}  // namespace di
