// Pieces of the tokenizer: Split behaviours, the Oniguruma-to-PCRE2 rewrite, added-token flags,
// the two BPE merge strategies, the byte-level alphabet and UTF-8 helpers.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/regex.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace di {
namespace {

uint64_t fresh_seed(const char* what) {
  const auto seed = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  std::printf("[%s] seed %llu\n", what, static_cast<unsigned long long>(seed));
  return seed;
}

std::vector<std::string> words_of(const nlohmann::json& pre, const std::string& text) {
  PreTokenizer p(pre, "test");
  PreTokenizer::Scratch scratch(p);
  std::vector<Word> words;
  p.split(text, scratch, words);
  std::vector<std::string> out;
  for (const Word& w : words) {
    std::string s = w.prefix_space ? std::string(1, ' ') : std::string();
    s.append(text, w.begin, w.end - w.begin);
    out.push_back(s);
  }
  return out;
}

nlohmann::json split_then_bytes(const std::string& pattern_kind, const std::string& pattern,
                                const std::string& behavior, bool invert) {
  return nlohmann::json{{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Split"}, {"pattern", {{pattern_kind, pattern}}}, {"behavior", behavior}, {"invert", invert}},
                          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
}

TEST(TokenizerParts, SplitBehaviours) {
  // The examples of Hugging Face's SplitDelimiterBehavior documentation.
  const std::string text = "the-final--countdown";
  using V = std::vector<std::string>;
  EXPECT_EQ(words_of(split_then_bytes("String", "-", "Removed", false), text), (V{"the", "final", "countdown"}));
  EXPECT_EQ(words_of(split_then_bytes("String", "-", "Isolated", false), text),
            (V{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(words_of(split_then_bytes("String", "-", "MergedWithPrevious", false), text),
            (V{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(words_of(split_then_bytes("String", "-", "MergedWithNext", false), text),
            (V{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(words_of(split_then_bytes("String", "-", "Contiguous", false), text),
            (V{"the", "-", "final", "--", "countdown"}));
  // invert: the pattern describes the words and the gaps are the delimiters.
  EXPECT_EQ(words_of(split_then_bytes("Regex", "[a-z]+", "Removed", true), "ab, cd;e"), (V{"ab", "cd", "e"}));
  EXPECT_EQ(words_of(split_then_bytes("Regex", "[a-z]+", "Removed", false), "ab, cd;e"), (V{", ", ";"}));
  EXPECT_EQ(words_of(split_then_bytes("Regex", "\\S+", "Removed", true), "ab, cd;e"), (V{"ab,", "cd;e"}));
  EXPECT_EQ(words_of(split_then_bytes("Regex", "\\s+", "Removed", true), "ab, cd;e"), (V{" "}));
  // Regex metacharacters in a String pattern are literal.
  EXPECT_EQ(words_of(split_then_bytes("String", ".*", "Isolated", false), "a.*b.c"), (V{"a", ".*", "b.c"}));
}

TEST(TokenizerParts, ByteLevelPrefixSpaceAndGpt2Regex) {
  const nlohmann::json bl = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  using V = std::vector<std::string>;
  EXPECT_EQ(words_of(bl, "Hello world's 42!"), (V{" Hello", " world", "'s", " 42", "!"}));
  EXPECT_EQ(words_of(bl, " x  y"), (V{" x", " ", " y"}));
  const nlohmann::json no_prefix = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  EXPECT_EQ(words_of(no_prefix, "Hello world"), (V{"Hello", " world"}));
}

TEST(TokenizerParts, DeepSeekPreTokenizerWords) {
  // The pre-tokenizer of the DeepSeek tokenizer.json (golden case copy).
  const nlohmann::json pre = nlohmann::json::parse(R"({"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}"}, "behavior": "Isolated", "invert": false},
    {"type": "Split", "pattern": {"Regex": "[一-龥぀-ゟ゠-ヿ]+"}, "behavior": "Isolated", "invert": false},
    {"type": "Split", "pattern": {"Regex": "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"}, "behavior": "Isolated", "invert": false},
    {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]})");
  using V = std::vector<std::string>;
  EXPECT_EQ(words_of(pre, "Hello, world!"), (V{"Hello", ",", " world", "!"}));
  EXPECT_EQ(words_of(pre, "1234567 x"), (V{"123", "456", "7", " x"}));
  EXPECT_EQ(words_of(pre, "日本語のテキストabc"), (V{"日本語のテキスト", "abc"}));
  EXPECT_EQ(words_of(pre, "a  \n\n  b"), (V{"a", "  \n\n", " ", " b"}));
  EXPECT_EQ(words_of(pre, "x.y/z"), (V{"x", ".y", "/z"}));
  EXPECT_EQ(words_of(pre, "end.\n\nNext"), (V{"end", ".\n\n", "Next"}));
  EXPECT_EQ(words_of(pre, "a\u0085 b"), (V{"a", "\u0085", " b"}));
  EXPECT_EQ(words_of(pre, "e\u0301t\u00e9"), (V{"e\u0301t\u00e9"}));
}

TEST(TokenizerParts, OnigurumaEscapesRewritten) {
  EXPECT_EQ(translate_onig_pattern("a|b"), "a|b");
  const std::string s = translate_onig_pattern("\\s+(?!\\S)");
  EXPECT_NE(s.find("\\x{85}"), std::string::npos);
  EXPECT_EQ(translate_onig_pattern("[\\h]"), "[0-9a-fA-F]");
  EXPECT_EQ(translate_onig_pattern("[]\\s]"), std::string("[]") + std::string(translate_onig_pattern("[\\s]")).substr(1));
  EXPECT_EQ(translate_onig_pattern("\\\\s"), "\\\\s");  // an escaped backslash then 's'
  Regex ws("^\\s+$", "test");
  Regex::Matcher m(ws);
  size_t b = 0, e = 0;
  for (const char* yes : {" ", "\t\n\v\f\r", "\u0085", "\u00a0", "\u1680", "\u2000\u200a", "\u2028\u2029", "\u202f\u205f\u3000"})
    EXPECT_TRUE(m.find(yes, 0, &b, &e)) << yes;
  for (const char* no : {"\u200b", "\ufeff", "\u180e", "x"}) EXPECT_FALSE(m.find(no, 0, &b, &e)) << no;
  // Letters of Unicode 15.0 (newer than PCRE2 10.42's tables) count as \p{L}, as for Hugging Face.
  Regex letters("^\\p{L}+$", "test");
  Regex::Matcher lm(letters);
  EXPECT_TRUE(lm.find("a\U00031350\U0001E4D0", 0, &b, &e));
  Regex not_letters("^[^\\p{L}]+$", "test");
  Regex::Matcher nm(not_letters);
  EXPECT_FALSE(nm.find("\U00031350", 0, &b, &e));
  EXPECT_TRUE(nm.find("1 .", 0, &b, &e));
  // Such text is detected so that only it pays for the longer classes.
  EXPECT_FALSE(Regex::has_newer_chars("plain text, 中文, Ελληνικά, 😀"));
  EXPECT_TRUE(Regex::has_newer_chars("x \U00031350"));
  EXPECT_FALSE(lm.find("a\U00031350", 0, &b, &e, /*newer=*/false));  // the plain variant lacks them
}

TEST(TokenizerParts, AddedTokenFlags) {
  // Bytes-only vocab so the expected ids are easy: each byte b is its own token.
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level::encode(std::string(1, static_cast<char>(b)))] = b;
  auto make = [&](const std::string& flags) {
    nlohmann::json j = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}},
                        {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}};
    j["added_tokens"] = nlohmann::json::array({nlohmann::json::parse(R"({"id": 300, "content": "<m>", "special": true, )" + flags + "}")});
    return Tokenizer::from_json(j.dump(), "test");
  };
  using V = std::vector<int32_t>;
  auto plain = make(R"("normalized": false)");
  EXPECT_EQ(plain->encode("a <m> b"), (V{'a', ' ', 300, ' ', 'b'}));
  auto lstrip = make(R"("lstrip": true)");
  EXPECT_EQ(lstrip->encode("a \t<m> b"), (V{'a', 300, ' ', 'b'}));
  EXPECT_EQ(lstrip->encode("<m><m>"), (V{300, 300}));
  auto rstrip = make(R"("rstrip": true)");
  EXPECT_EQ(rstrip->encode("a <m> \n b"), (V{'a', ' ', 300, 'b'}));
  auto single = make(R"("single_word": true)");
  EXPECT_EQ(single->encode("x<m>"), (V{'x', '<', 'm', '>'}));
  EXPECT_EQ(single->encode("x <m>."), (V{'x', ' ', 300, '.'}));
  auto normalized = make(R"("normalized": true)");
  EXPECT_EQ(normalized->encode("<m>a<m"), (V{300, 'a', '<', 'm'}));
  EXPECT_EQ(normalized->decode({300, 'a'}), "<m>a");
}

TEST(TokenizerParts, LongestAddedTokenWins) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level::encode(std::string(1, static_cast<char>(b)))] = b;
  nlohmann::json j = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}},
                      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}},
                      {"added_tokens", {{{"id", 300}, {"content", "<a>"}}, {{"id", 301}, {"content", "<a><b>"}},
                                        {{"id", 302}, {"content", "b>"}}}}};
  auto t = Tokenizer::from_json(j.dump(), "test");
  EXPECT_EQ(t->encode("<a><b>"), (std::vector<int32_t>{301}));
  EXPECT_EQ(t->encode("<a><c>"), (std::vector<int32_t>{300, '<', 'c', '>'}));
  EXPECT_EQ(t->encode("<a>b>"), (std::vector<int32_t>{300, 302}));
  EXPECT_EQ(t->vocab_size(), 303);
}

TEST(TokenizerParts, MergeStrategiesAgree) {
  const std::string path = std::string(DI_TEST_DATA) + "/golden_dev/model/tokenizer.json";
  std::ifstream in(path);
  nlohmann::json j = nlohmann::json::parse(in);
  BpeModel model(j["model"], path);
  std::mt19937_64 rng(fresh_seed("TokenizerParts.MergeStrategiesAgree"));
  const std::string alphabet = "  ththeinonerarees\n\n--==aeiou.,";
  for (int i = 0; i < 3000; ++i) {
    std::string word;
    const size_t n = 2 + rng() % 63;
    for (size_t k = 0; k < n; ++k)
      word += rng() % 4 ? alphabet[rng() % alphabet.size()] : static_cast<char>(rng() % 256);
    std::vector<int32_t> a, b;
    model.encode_word_scan(word, a);
    model.encode_word_heap(word, b);
    ASSERT_EQ(a, b) << "word of " << word.size() << " bytes";
    std::string bytes;
    for (int32_t id : a) {
      const std::string* tok = model.token_text(id);
      ASSERT_NE(tok, nullptr);
      std::string raw;
      ASSERT_TRUE(byte_level::decode(*tok, raw));
      bytes += raw;
    }
    EXPECT_EQ(bytes, word);
  }
}

TEST(TokenizerParts, ByteLevelAlphabet) {
  EXPECT_EQ(byte_level::byte_to_char(' '), U'Ġ');
  EXPECT_EQ(byte_level::byte_to_char('\n'), U'Ċ');
  EXPECT_EQ(byte_level::byte_to_char('a'), U'a');
  EXPECT_EQ(byte_level::byte_to_char(0xAD), char32_t{0x143});
  for (int b = 0; b < 256; ++b) EXPECT_EQ(byte_level::char_to_byte(byte_level::byte_to_char(static_cast<unsigned char>(b))), b);
  EXPECT_EQ(byte_level::char_to_byte(U'中'), -1);
  std::string raw;
  EXPECT_TRUE(byte_level::decode("ĠhelloĊ", raw));
  EXPECT_EQ(raw, " hello\n");
  EXPECT_FALSE(byte_level::decode("<｜User｜>", raw));
}

TEST(Utf8, ValidationAndLossyDecoding) {
  EXPECT_EQ(utf8::first_invalid("plain ascii, 中文, 😀"), utf8::kValid);
  EXPECT_EQ(utf8::first_invalid("abc\xff"), 3u);
  EXPECT_EQ(utf8::first_invalid("\xe0\x80\x80"), 0u);      // overlong
  EXPECT_EQ(utf8::first_invalid("x\xed\xbf\xbf"), 1u);     // surrogate
  EXPECT_EQ(utf8::first_invalid("\xf4\x8f\xbf\xbf"), utf8::kValid);  // U+10FFFF
  EXPECT_EQ(utf8::first_invalid("\xf4\x90\x80\x80"), 0u);  // above U+10FFFF
  EXPECT_EQ(utf8::first_invalid("0123456789abcdef\xc3"), 16u);
  // Maximal subparts: one U+FFFD each (Unicode's recommended practice).
  EXPECT_EQ(utf8::to_valid_lossy("a\xf0\x9f\x98" "b"), "a\uFFFDb");
  EXPECT_EQ(utf8::to_valid_lossy("\xe0\x80\x80"), "\uFFFD\uFFFD\uFFFD");
  EXPECT_EQ(utf8::to_valid_lossy("\xff\xfe"), "\uFFFD\uFFFD");
  EXPECT_EQ(utf8::to_valid_lossy("ok"), "ok");
  char32_t cp = 0;
  EXPECT_EQ(utf8::scan("\xf0\x9f", 0, &cp), 0);   // incomplete, may continue
  EXPECT_EQ(utf8::scan("\xf0\x28", 0, &cp), -1);  // can never continue
  EXPECT_EQ(utf8::scan("\xe4\xb8\xad", 0, &cp), 3);
  EXPECT_EQ(cp, U'中');
}

}  // namespace
}  // namespace di
