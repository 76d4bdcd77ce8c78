// Incremental detokenizer: complete UTF-8 only, partial characters held back across tokens,
// U+FFFD for bytes that can never be valid.
#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace di {
namespace {

const Tokenizer& golden() {
  static std::unique_ptr<Tokenizer> tok = Tokenizer::load(std::string(DI_TEST_DATA) + "/golden_dev/model");
  return *tok;
}

TEST(Detokenizer, EmojiSplitAcrossTokens) {
  const Tokenizer& t = golden();
  // The small vocab spells 😀 as byte tokens: F0 9F 98 80 -> 175, 256, 249, 225 (see hand cases).
  Detokenizer d(t);
  EXPECT_EQ(d.push(175), "");
  EXPECT_EQ(d.push(256), "");
  EXPECT_EQ(d.push(249), "");
  EXPECT_EQ(d.pending(), 3u);
  EXPECT_EQ(d.push(225), "😀");
  EXPECT_EQ(d.pending(), 0u);
  EXPECT_EQ(d.flush(), "");
}

TEST(Detokenizer, StreamsWholeTextsPieceByPiece) {
  const Tokenizer& t = golden();
  const std::string text = "héllo 😀👍🏽 世界 👨‍👩‍👧‍👦 🇯🇵<｜User｜>done\n";
  Detokenizer d(t);
  std::string out;
  for (int32_t id : t.encode(text)) {
    std::string piece = d.push(id);
    EXPECT_EQ(utf8::first_invalid(piece), utf8::kValid);
    out += piece;
  }
  out += d.flush();
  EXPECT_EQ(out, text);
}

TEST(Detokenizer, InvalidBytesBecomeReplacementCharacters) {
  const Tokenizer& t = golden();
  Detokenizer d(t);
  EXPECT_EQ(d.push_bytes("\xff" "a"), "\uFFFD" "a");  // never valid: replaced at once
  EXPECT_EQ(d.push_bytes("\xe4\xbd"), "");
  EXPECT_EQ(d.push_bytes("A"), "\uFFFD" "A");        // the partial char can no longer complete
  EXPECT_EQ(d.push_bytes("\xf0\x9f\x98"), "");
  EXPECT_EQ(d.flush(), "\uFFFD");                     // flushed incomplete tail
  EXPECT_EQ(d.push_bytes("ok"), "ok");                // reusable after flush
  EXPECT_THROW(d.push(-1), Error);
  EXPECT_THROW(d.push(t.vocab_size()), Error);
}

TEST(Detokenizer, SkipSpecial) {
  const Tokenizer& t = golden();
  Detokenizer d(t, /*skip_special=*/true);
  std::string out;
  for (int32_t id : t.encode("<｜begin▁of▁sentence｜>hi<｜Assistant｜>")) out += d.push(id);
  EXPECT_EQ(out + d.flush(), "hi");
}

TEST(Detokenizer, RandomIdsMatchLossyDecode) {
  const Tokenizer& t = golden();
  const auto seed = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  std::printf("[Detokenizer.RandomIdsMatchLossyDecode] seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  for (int round = 0; round < 300; ++round) {
    std::vector<int32_t> ids;
    const size_t n = rng() % 40;
    for (size_t i = 0; i < n; ++i) {
      // Mostly the byte tokens of high bytes (partial UTF-8), some whole tokens.
      ids.push_back(rng() % 3 ? static_cast<int32_t>(97 + rng() % 162) : static_cast<int32_t>(rng() % t.vocab_size()));
    }
    Detokenizer d(t);
    std::string out;
    for (int32_t id : ids) {
      std::string piece = d.push(id);
      ASSERT_EQ(utf8::first_invalid(piece), utf8::kValid);
      ASSERT_LE(d.pending(), 3u);
      out += piece;
    }
    out += d.flush();
    EXPECT_EQ(out, utf8::to_valid_lossy(t.decode(ids)));
  }
}

}  // namespace
}  // namespace di
