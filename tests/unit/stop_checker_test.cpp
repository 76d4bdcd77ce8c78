// Stop checker: stop strings inside and across tokens, held-back streaming text, stop ids and eos,
// the length limit, and random texts against a direct computation.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "sampling/stop_checker.h"
#include "test_util.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace di {
namespace {

using testing_util::fresh_seed;

SamplingParams with_stop(std::vector<std::string> stop, bool include = false) {
  SamplingParams p;
  p.stop = std::move(stop);
  p.include_stop_str_in_output = include;
  return p;
}

// Feeds pieces as tokens 1000, 1001, ...; returns the streamed text per step.
std::vector<std::string> feed(StopChecker& c, const std::vector<std::string>& pieces) {
  std::vector<std::string> out;
  for (size_t i = 0; i < pieces.size() && !c.finished(); ++i) out.push_back(c.push(static_cast<int32_t>(1000 + i), pieces[i]).text);
  return out;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += x;
  return s;
}

TEST(StopChecker, StopStringInsideOneToken) {
  StopChecker c(with_stop({"STOP"}), -1, 100);
  std::vector<std::string> out = feed(c, {"Hello", " wor", "ld STOP here", "never"});
  EXPECT_EQ(out, (std::vector<std::string>{"Hello", " wor", "ld "}));
  EXPECT_EQ(c.finish_reason(), FinishReason::kStop);
  EXPECT_EQ(c.stop_string(), "STOP");
  EXPECT_EQ(c.stop_token(), -1);
  EXPECT_EQ(c.text(), "Hello world ");
  EXPECT_EQ(c.n_tokens(), 3);
  EXPECT_STREQ(finish_reason_name(c.finish_reason()), "stop");
}

TEST(StopChecker, StopStringAcrossTokensIsHeldBack) {
  StopChecker c(with_stop({"</end>"}), -1, 100);
  StopStep s = c.push(1, "abc<");
  EXPECT_EQ(s.text, "abc");
  EXPECT_EQ(c.held_back(), 1u);
  s = c.push(2, "/e");
  EXPECT_EQ(s.text, "");
  EXPECT_EQ(c.held_back(), 3u);
  s = c.push(3, "nd>tail");
  EXPECT_EQ(s.text, "");
  EXPECT_EQ(s.finish, FinishReason::kStop);
  EXPECT_EQ(c.text(), "abc");
  EXPECT_EQ(c.flush_tail("\xEF\xBF\xBD"), "");  // text past a stop string is dropped
}

TEST(StopChecker, FalseStartIsReleased) {
  StopChecker c(with_stop({"</end>"}), -1, 100);
  EXPECT_EQ(c.push(1, "a<").text, "a");
  EXPECT_EQ(c.push(2, "/x").text, "</x");
  EXPECT_EQ(c.push(3, "</en").text, "");
  EXPECT_EQ(c.push(4, "d").text, "");
  EXPECT_EQ(c.push(5, "!").text, "</end!");
  EXPECT_FALSE(c.finished());
}

TEST(StopChecker, IncludeStopStringKeepsItButNotWhatFollows) {
  StopChecker c(with_stop({"##"}, /*include=*/true), -1, 100);
  std::vector<std::string> out = feed(c, {"x#", "#y", "z"});
  EXPECT_EQ(joined(out), "x##");
  EXPECT_EQ(c.text(), "x##");
  EXPECT_EQ(c.stop_string(), "##");
}

TEST(StopChecker, FirstOccurrenceToCompleteWinsWhateverTheTokens) {
  // "bc" completes before "abcd" although "abcd" starts earlier; the same in one piece or two.
  for (const std::vector<std::string>& pieces :
       {std::vector<std::string>{"xab", "cd"}, std::vector<std::string>{"xabcd"}, std::vector<std::string>{"xa", "b", "c"}}) {
    StopChecker a(with_stop({"abcd", "bc"}), -1, 100);
    feed(a, pieces);
    EXPECT_EQ(a.text(), "xa");
    EXPECT_EQ(a.stop_string(), "bc");
  }
  // Completing together: the one that starts first (the longer).
  StopChecker b(with_stop({"bc", "abc"}, true), -1, 100);
  feed(b, {"zabcd"});
  EXPECT_EQ(b.text(), "zabc");
  EXPECT_EQ(b.stop_string(), "abc");
}

TEST(StopChecker, StopIdsAndEos) {
  SamplingParams p;
  p.stop_token_ids = {7};
  {
    StopChecker c(p, /*eos_id=*/2, 100);
    EXPECT_EQ(c.push(5, "hi").text, "hi");
    StopStep s = c.push(7, "<tool>");
    EXPECT_EQ(s.finish, FinishReason::kStop);
    EXPECT_EQ(s.text, "");
    EXPECT_EQ(c.stop_token(), 7);
    EXPECT_EQ(c.text(), "hi");
  }
  {
    StopChecker c(p, 2, 100);
    EXPECT_EQ(c.push(2, "").finish, FinishReason::kStop);
    EXPECT_EQ(c.stop_token(), 2);
  }
  p.ignore_eos = true;
  p.include_stop_str_in_output = true;
  {
    StopChecker c(p, 2, 100);
    EXPECT_EQ(c.push(2, "e").finish, FinishReason::kNone);
    EXPECT_EQ(c.push(7, "<tool>").text, "<tool>");
    EXPECT_EQ(c.text(), "e<tool>");
    EXPECT_EQ(c.flush_tail("\xEF\xBF\xBD"), "\xEF\xBF\xBD");  // a stop id is not a stop string
  }
}

TEST(StopChecker, LengthReleasesHeldText) {
  StopChecker c(with_stop({"STOP"}), 2, 3);
  EXPECT_EQ(c.push(1, "a").text, "a");
  EXPECT_EQ(c.push(1, "ST").text, "");
  StopStep s = c.push(1, "O");
  EXPECT_EQ(s.finish, FinishReason::kLength);
  EXPECT_EQ(s.text, "STO");
  EXPECT_STREQ(finish_reason_name(c.finish_reason()), "length");
  EXPECT_EQ(c.flush_tail("\xEF\xBF\xBD"), "\xEF\xBF\xBD");
  EXPECT_EQ(c.text(), "aSTO\xEF\xBF\xBD");
  // A stop id on the last allowed token is a stop, not a length finish.
  StopChecker d(SamplingParams{}, 2, 1);
  EXPECT_EQ(d.push(2, "").finish, FinishReason::kStop);
}

TEST(StopChecker, MultiByteStopString) {
  StopChecker c(with_stop({"世界"}), -1, 100);
  std::vector<std::string> out = feed(c, {"你好世", "界!"});
  EXPECT_EQ(joined(out), "你好");
  EXPECT_EQ(out[0], "你好");  // 世 is held back, whole
}

// Random texts over a tiny alphabet (so stop strings and their prefixes occur often), random
// splits, random stop strings, against a direct computation on the concatenated text.
TEST(StopChecker, RandomTextsMatchADirectComputation) {
  std::mt19937_64 rng(fresh_seed("RandomTextsMatchADirectComputation"));
  const std::string alphabet = "ab<";
  auto random_string = [&](size_t lo, size_t hi) {
    std::string s(std::uniform_int_distribution<size_t>(lo, hi)(rng), ' ');
    for (char& ch : s) ch = alphabet[rng() % alphabet.size()];
    return s;
  };
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<std::string> stops;
    for (size_t k = 1 + rng() % 3; k > 0; --k) stops.push_back(random_string(1, 5));
    const bool include = rng() % 2;
    std::vector<std::string> pieces;
    for (size_t k = rng() % 12; k > 0; --k) pieces.push_back(random_string(0, 4));
    const int64_t max_tokens = 1 + static_cast<int64_t>(rng() % 14);
    SCOPED_TRACE("trial " + std::to_string(trial));

    StopChecker c(with_stop(stops, include), -1, max_tokens);
    std::string streamed, so_far;
    for (size_t i = 0; i < pieces.size() && !c.finished(); ++i) {
      StopStep s = c.push(1, pieces[i]);
      streamed += s.text;
      so_far += pieces[i];
      if (c.finished()) break;
      // Held back: exactly the longest suffix that is a proper prefix of a stop string.
      size_t hold = 0;
      for (const std::string& st : stops)
        for (size_t k = 1; k < st.size() && k <= so_far.size(); ++k)
          if (so_far.compare(so_far.size() - k, k, st, 0, k) == 0) hold = std::max(hold, k);
      ASSERT_EQ(streamed, so_far.substr(0, so_far.size() - hold));
    }

    // Direct: the tokens allowed by max_tokens, the earliest match in their text.
    std::string text;
    for (size_t i = 0; i < pieces.size() && static_cast<int64_t>(i) < max_tokens; ++i) text += pieces[i];
    // The first occurrence to complete (smallest end, then smallest start).
    size_t best = std::string::npos, best_len = 0;
    for (const std::string& st : stops) {
      size_t at = text.find(st);
      if (at == std::string::npos) continue;
      if (best == std::string::npos || at + st.size() < best + best_len ||
          (at + st.size() == best + best_len && at < best)) {
        best = at;
        best_len = st.size();
      }
    }
    std::string want = best == std::string::npos ? text : text.substr(0, best + (include ? best_len : 0));
    bool ran_out = static_cast<int64_t>(pieces.size()) < max_tokens && best == std::string::npos;
    if (!ran_out) {
      ASSERT_TRUE(c.finished());
      EXPECT_EQ(c.finish_reason(), best == std::string::npos ? FinishReason::kLength : FinishReason::kStop);
    }
    EXPECT_EQ(c.text().substr(0, streamed.size()), streamed);
    if (c.finished()) {
      EXPECT_EQ(streamed, want);
      EXPECT_EQ(c.text(), want);
    }
  }
}

// With the real incremental detokenizer: a stop string that spans several tokens of a real vocab.
TEST(StopChecker, WithTheDetokenizer) {
  std::unique_ptr<Tokenizer> tok = Tokenizer::load(std::string(DI_TEST_DATA) + "/golden_dev/model");
  const std::string text = "The answer is 42.\n\nUser: thanks 😀";
  std::vector<int32_t> ids = tok->encode(text, false);
  StopChecker c(with_stop({"\n\nUser:"}), tok->eos_id(), 1000);
  Detokenizer detok(*tok, true);
  std::string streamed;
  bool stop_within_one_piece = false;
  for (int32_t id : ids) {
    std::string piece = detok.push(id);
    stop_within_one_piece |= piece.find("\n\nUser:") != std::string::npos;
    StopStep s = c.push(id, piece);
    streamed += s.text;
    if (s.finish != FinishReason::kNone) break;
  }
  EXPECT_EQ(c.finish_reason(), FinishReason::kStop);
  EXPECT_EQ(streamed, "The answer is 42.");
  EXPECT_EQ(c.text(), "The answer is 42.");
  EXPECT_FALSE(stop_within_one_piece);  // the match really spans tokens
}

}  // namespace
}  // namespace di
