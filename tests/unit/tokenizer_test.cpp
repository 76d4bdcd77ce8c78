// The byte-level BPE tokenizer on the golden case's small DeepSeek-style tokenizer.json: hand cases
// (expected ids from Hugging Face tokenizers on the same file), errors, random round trips.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <random>
#include <thread>
#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace di {
namespace {

const std::string kModelDir = std::string(DI_TEST_DATA) + "/golden_dev/model";

const Tokenizer& golden() {
  static std::unique_ptr<Tokenizer> tok = Tokenizer::load(kModelDir);
  return *tok;
}

uint64_t fresh_seed(const char* what) {
  const auto seed = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  std::printf("[%s] seed %llu\n", what, static_cast<unsigned long long>(seed));
  return seed;
}

// Random valid UTF-8 drawn from scripts the pre-tokenizer treats differently.
std::string random_text(std::mt19937_64& rng, size_t max_cps) {
  static const std::vector<std::pair<char32_t, char32_t>> kRanges = {
      {0x20, 0x7E}, {0x20, 0x7E}, {0x30, 0x39}, {0x09, 0x0D}, {0x00, 0x1F}, {0x80, 0x24F},
      {0x300, 0x36F}, {0x391, 0x3C9}, {0x410, 0x44F}, {0x5D0, 0x5EA}, {0x621, 0x669}, {0x900, 0x97F},
      {0x2000, 0x206F}, {0x3000, 0x30FF}, {0x4E00, 0x9FFF}, {0xAC00, 0xD7A3}, {0xFF00, 0xFFEF},
      {0x1F300, 0x1F6FF}, {0x1F1E6, 0x1F1FF}, {0x20000, 0x2A6DF}, {0xE000, 0xF8FF}, {0x10000, 0x10FFFF}};
  static const char* kPieces[] = {"<｜User｜>", "<｜begin▁of▁sentence｜>", "<think>", "</think>", "\r\n",
                                  "   ", "\u200d", "\ufe0f", "\U0001F3FD", "'s", "<｜", "｜>"};
  std::string s;
  const size_t n = rng() % (max_cps + 1);
  for (size_t i = 0; i < n; ++i) {
    if (rng() % 16 == 0) {
      s += kPieces[rng() % std::size(kPieces)];
      continue;
    }
    const auto& r = kRanges[rng() % kRanges.size()];
    char32_t cp = r.first + static_cast<char32_t>(rng() % (r.second - r.first + 1));
    if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD;
    utf8::append(s, cp);
  }
  return s;
}

TEST(Tokenizer, GoldenHandCases) {
  const Tokenizer& t = golden();
  // Expected ids: Hugging Face tokenizers 0.23 on tests/data/golden_dev/model/tokenizer.json.
  const std::vector<std::pair<std::string, std::vector<int32_t>>> cases = {
      {"Hello, world!", {42, 445, 349, 14, 294, 266, 78, 70, 3}},
      {"The quick brown fox", {54, 436, 223, 358, 277, 77, 303, 287, 89, 80, 286, 81, 90}},
      {"  indented\n\tcode();", {223, 301, 70, 307, 275, 201, 200, 69, 483, 10, 11, 29}},
      {"12345678", {19, 20, 21, 22, 23, 24, 25, 26}},
      {"你好，世界！こんにちは", {163, 124, 257, 164, 101, 124, 174, 123, 237, 163, 119, 247, 166, 246, 237, 174, 123,
                                  226, 162, 226, 244, 162, 227, 244, 162, 226, 107, 162, 226, 97, 162, 226, 110}},
      {"😀👍🏽", {175, 256, 249, 225, 175, 256, 242, 238, 175, 256, 240, 124}},
      {"<｜User｜>hi<｜Assistant｜>", {504, 74, 75, 505}},
      {"don't stop", {70, 262, 9, 86, 280, 86, 81, 82}},
      {"a\u0085 b", {67, 129, 230, 303}},  // U+0085 is \s for Oniguruma (not for PCRE2's \s)
      {"", {}},
  };
  for (const auto& [text, ids] : cases) {
    EXPECT_EQ(t.encode(text), ids) << text;
    EXPECT_EQ(t.decode(ids), text) << text;
  }
}

TEST(Tokenizer, VocabAndSpecialTokens) {
  const Tokenizer& t = golden();
  EXPECT_EQ(t.vocab_size(), 512);
  EXPECT_EQ(t.bos_id(), 0);
  EXPECT_EQ(t.eos_id(), 1);
  EXPECT_EQ(t.token_to_id("<｜User｜>"), 504);
  EXPECT_EQ(t.token_to_id("Ġ"), 223);  // model tokens by their byte-level spelling
  EXPECT_EQ(t.token_to_id("no such token"), std::nullopt);
  EXPECT_EQ(t.token_bytes(223), " ");
  EXPECT_EQ(t.token_bytes(201), "\n");
  EXPECT_EQ(t.token_bytes(504), "<｜User｜>");
  EXPECT_TRUE(t.is_special(0));
  EXPECT_TRUE(t.is_special(504));
  EXPECT_FALSE(t.is_special(223));
  EXPECT_FALSE(t.is_special(-1));
  EXPECT_FALSE(t.is_special(100000));
  EXPECT_THROW(t.token_bytes(512), Error);
  EXPECT_THROW(t.token_bytes(-1), Error);
  EXPECT_THROW(t.decode({1, 9999}), Error);
  EXPECT_EQ(t.decode({504, 74, 75, 505}, /*skip_special=*/true), "hi");
}

TEST(Tokenizer, AllowSpecialFalseEncodesTokensAsText) {
  const Tokenizer& t = golden();
  const std::string text = "a<｜User｜>b<think>";
  const auto plain = t.encode(text, /*allow_special=*/false);
  for (int32_t id : plain) EXPECT_FALSE(t.is_special(id));
  EXPECT_EQ(t.decode(plain), text);
  const auto special = t.encode(text);
  EXPECT_EQ(special, (std::vector<int32_t>{67, 504, 68, 507}));
}

TEST(Tokenizer, InvalidUtf8IsAnError) {
  const Tokenizer& t = golden();
  for (const std::string& bad : {std::string("\xff"), std::string("ok\xc0\x80"), std::string("\xed\xa0\x80"),
                                std::string("tail\xe4\xbd"), std::string("\xf4\x90\x80\x80"), std::string("\x80")}) {
    try {
      t.encode(bad);
      ADD_FAILURE() << "no error for invalid UTF-8";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("UTF-8"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(t.encode(std::string("a\0b", 3)).size(), 3u);  // NUL is valid UTF-8
}

TEST(Tokenizer, RandomRoundTrips) {
  const Tokenizer& t = golden();
  std::mt19937_64 rng(fresh_seed("Tokenizer.RandomRoundTrips"));
  for (int i = 0; i < 400; ++i) {
    const std::string s = random_text(rng, i % 50 == 0 ? 2000 : 40);
    ASSERT_EQ(utf8::first_invalid(s), utf8::kValid);
    const auto ids = t.encode(s);
    EXPECT_EQ(t.decode(ids), s);
    const auto plain = t.encode(s, false);
    EXPECT_EQ(t.decode(plain), s);
    // Encoding is a function of the text: a second call (word cache warm) agrees.
    EXPECT_EQ(t.encode(s), ids);
  }
}

TEST(Tokenizer, LongInputs) {
  const Tokenizer& t = golden();
  // Long single words go through the heap merge; long whitespace runs through the regex.
  std::string letters(200000, 'a'), spaces(200000, ' '), digits(100000, '7');
  for (const std::string* s : {&letters, &spaces, &digits}) {
    auto ids = t.encode(*s + "x");
    EXPECT_EQ(t.decode(ids), *s + "x");
  }
}

TEST(Tokenizer, LoadErrorsNameTheProblem) {
  EXPECT_THROW(Tokenizer::load("/nonexistent/dir"), Error);
  EXPECT_THROW(Tokenizer::from_json("{not json", "test"), Error);
  EXPECT_THROW(Tokenizer::from_json("[]", "test"), Error);
  const std::string minimal_model =
      R"("model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]})";
  const std::string byte_level = R"("pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false})";
  // A working minimal tokenizer. Bytes without a token are dropped before merging, as HF's BPE does
  // without an unk token, so "acb" merges to "ab".
  auto ok = Tokenizer::from_json("{" + minimal_model + "," + byte_level + "}", "test");
  EXPECT_EQ(ok->encode("abab"), (std::vector<int32_t>{2, 2}));
  EXPECT_EQ(ok->encode("acb"), (std::vector<int32_t>{2}));
  EXPECT_EQ(ok->encode("ba"), (std::vector<int32_t>{1, 0}));
  try {
    Tokenizer::from_json(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]},)" + byte_level + "}", "x.json");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("merges[0]"), std::string::npos) << e.what();
  }
  try {
    Tokenizer::from_json("{" + minimal_model + R"(, "normalizer": {"type": "NFKC"},)" + byte_level + "}", "x.json");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("normalizer"), std::string::npos) << e.what();
  }
  try {
    Tokenizer::from_json("{" + minimal_model + R"(, "pre_tokenizer": {"type": "Whitespace"}})", "x.json");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pre_tokenizer"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Tokenizer::from_json("{" + minimal_model + R"(, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
      {"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated", "invert": false},
      {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]}})", "x.json"), Error);
  EXPECT_THROW(Tokenizer::from_json("{" + minimal_model + R"(, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
      {"type": "Split", "pattern": {"Regex": "a"}, "behavior": "Sideways", "invert": false},
      {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]}})", "x.json"), Error);
  EXPECT_THROW(Tokenizer::from_json(R"({"model": {"type": "WordPiece", "vocab": {}}, )" + byte_level + "}", "x.json"), Error);
  EXPECT_THROW(Tokenizer::from_json("{" + minimal_model + "," + byte_level +
                                    R"(, "added_tokens": [{"id": -4, "content": "x"}]})", "x.json"), Error);
}

TEST(Tokenizer, ThreadsShareOneTokenizer) {
  const Tokenizer& t = golden();
  std::mt19937_64 rng(fresh_seed("Tokenizer.ThreadsShareOneTokenizer"));
  std::vector<std::string> texts;
  for (int i = 0; i < 64; ++i) texts.push_back(random_text(rng, 60));
  std::vector<std::vector<int32_t>> expected;
  for (const auto& s : texts) expected.push_back(t.encode(s));
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (int rep = 0; rep < 20; ++rep)
        for (size_t i = 0; i < texts.size(); ++i)
          if (t.encode(texts[(i + static_cast<size_t>(k)) % texts.size()]) != expected[(i + static_cast<size_t>(k)) % texts.size()])
            ++mismatches;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

}  // namespace
}  // namespace di
