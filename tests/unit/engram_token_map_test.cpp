#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/engram_token_map.h"
#include "tokenizer/tokenizer.h"

namespace di {
namespace {

// A tokenizer that only knows its vocabulary: byte-level spelled tokens plus added tokens.
class VocabOnlyTokenizer : public Tokenizer {
 public:
  VocabOnlyTokenizer(std::vector<std::string> vocab, std::set<int32_t> added)
      : vocab_(std::move(vocab)), added_(std::move(added)) {
    for (size_t i = 0; i < vocab_.size(); ++i) ids_[vocab_[i]] = static_cast<int32_t>(i);
  }
  std::vector<int32_t> encode(std::string_view, bool) const override { return {}; }
  std::string decode(const std::vector<int32_t>&, bool) const override { return {}; }
  std::string token_bytes(int32_t id) const override {
    const std::string& s = vocab_.at(static_cast<size_t>(id));
    std::string bytes;
    if (added_.count(id) || !byte_level::decode(s, bytes)) return s;
    return bytes;
  }
  std::optional<int32_t> token_to_id(std::string_view t) const override {
    auto it = ids_.find(std::string(t));
    if (it == ids_.end()) return std::nullopt;
    return it->second;
  }
  bool is_special(int32_t id) const override { return added_.count(id) > 0; }
  int32_t vocab_size() const override { return static_cast<int32_t>(vocab_.size()); }
  int32_t bos_id() const override { return 0; }
  int32_t eos_id() const override { return 1; }

 private:
  std::vector<std::string> vocab_;
  std::set<int32_t> added_;
  std::map<std::string, int32_t> ids_;
};

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(EngramTokenMap, NormalizerRules) {
  EXPECT_EQ(engram_normalize("The"), "the");
  EXPECT_EQ(engram_normalize(" The"), "the");
  EXPECT_EQ(engram_normalize("THE"), "the");
  EXPECT_EQ(engram_normalize(" a \t\r\n b  "), "a b");
  // A token that is only [ \t\r\n] collapses to the single-space class instead of "".
  EXPECT_EQ(engram_normalize(" "), " ");
  EXPECT_EQ(engram_normalize("\t"), " ");
  EXPECT_EQ(engram_normalize("  \n\n"), " ");
  EXPECT_EQ(engram_normalize("\u3000"), " ");  // NFKC: ideographic space -> " "
  EXPECT_EQ(engram_normalize("\u00a0"), " ");
  EXPECT_EQ(engram_normalize("\x0b"), "");         // White_Space but not collapsed: stripped
  EXPECT_EQ(engram_normalize("\u2028"), "");
  EXPECT_EQ(engram_normalize(" \x0b"), "");        // " " + VT is not a lone space
  EXPECT_EQ(engram_normalize("Café"), "cafe");
  EXPECT_EQ(engram_normalize("x\u0301"), "x");
  EXPECT_EQ(engram_normalize("\ufb01"), "fi");      // NFKC ligature
  EXPECT_EQ(engram_normalize("\uff21\uff5c"), "a|");  // fullwidth
  EXPECT_EQ(engram_normalize("\u2460"), "1");       // circled digit
  EXPECT_EQ(engram_normalize("\u01c5"), "dz");      // Dž -> D z caron -> dz
  EXPECT_EQ(engram_normalize("\u0130"), "i");       // NFD splits off the dot before lowercasing
  EXPECT_EQ(engram_normalize("\u1fb3"), "\u03b1");  // ypogegrammeni is a mark
  EXPECT_EQ(engram_normalize("\u1e9e"), "\u00df");  // capital sharp s
  // Per-character lowercase: no final-sigma rule.
  EXPECT_EQ(engram_normalize("\u039f\u0394\u039f\u03a3"), "\u03bf\u03b4\u03bf\u03c3");
  EXPECT_EQ(engram_normalize("<\uff5cbegin\u2581of\u2581sentence\uff5c>"), "<|begin\u2581of\u2581sentence|>");
  // Unicode 9.0 tables: RAISED MC SIGN (6.1) decomposes, RAISED MR SIGN (12.0) passes through.
  EXPECT_EQ(engram_normalize("\U0001F16A"), "mc");
  EXPECT_EQ(engram_normalize("\U0001F16C"), "\U0001F16C");
  // The sentinel itself becomes a space.
  EXPECT_EQ(engram_normalize("a\ue000b"), "a b");
}

TEST(EngramTokenMap, KeysOfByteLevelAndAddedTokens) {
  const std::vector<std::string> vocab = {
      "<\uff5cbegin\u2581of\u2581sentence\uff5c>",  // 0 added
      "\u0120the",                                  // 1 " the"
      "The",                                        // 2
      "\u00e2\u0136",                               // 3 E2 94: partial UTF-8
      "\u0120",                                     // 4 " "
      "\u010a\u010a",                               // 5 "\n\n"
      "\u010b",                                     // 6 VT: normalizes to "" -> raw text
      "\u00ef\u00bf\u00bd",                         // 7 EF BF BD: a real U+FFFD, keyed raw
      "<think>",                                    // 8 added, plain ASCII
      "\u0120The",                                  // 9
  };
  VocabOnlyTokenizer tok(vocab, {0, 8});
  EXPECT_EQ(engram_token_key(tok, 0), "<|begin\u2581of\u2581sentence|>");
  EXPECT_EQ(engram_token_key(tok, 1), "the");
  EXPECT_EQ(engram_token_key(tok, 2), "the");
  EXPECT_EQ(engram_token_key(tok, 3), "\u00e2\u0136");
  EXPECT_EQ(engram_token_key(tok, 4), " ");
  EXPECT_EQ(engram_token_key(tok, 5), " ");
  EXPECT_EQ(engram_token_key(tok, 6), "\x0b");
  EXPECT_EQ(engram_token_key(tok, 7), "\u00ef\u00bf\u00bd");
  EXPECT_EQ(engram_token_key(tok, 8), "<think>");
  const EngramTokenMap m = build_engram_token_map(tok);
  EXPECT_EQ(m.token_map, (std::vector<int32_t>{0, 1, 1, 2, 3, 3, 4, 5, 6, 1}));
  EXPECT_EQ(m.compressed_vocab_size, 7);
}

// The golden_dev tokenizer's vocabulary (read straight from tokenizer.json) against the map the
// official reference built from it.
TEST(EngramTokenMap, GoldenDevVocabulary) {
  const auto tj = nlohmann::json::parse(read_file(DI_TEST_DATA "/golden_dev/model/tokenizer.json"));
  std::map<int32_t, std::string> by_id;
  for (const auto& [s, id] : tj["model"]["vocab"].items()) by_id[id.get<int32_t>()] = s;
  std::set<int32_t> added;
  for (const auto& a : tj["added_tokens"]) {
    by_id[a["id"].get<int32_t>()] = a["content"].get<std::string>();
    added.insert(a["id"].get<int32_t>());
  }
  std::vector<std::string> vocab;
  for (const auto& [id, s] : by_id) {
    ASSERT_EQ(id, static_cast<int32_t>(vocab.size()));
    vocab.push_back(s);
  }
  const EngramTokenMap m = build_engram_token_map(VocabOnlyTokenizer(vocab, added));
  const auto golden = nlohmann::json::parse(read_file(DI_TEST_DATA "/golden_dev/engram_token_map.json"));
  EXPECT_EQ(m.token_map, golden["token_map"].get<std::vector<int32_t>>());
  EXPECT_EQ(m.compressed_vocab_size, golden["compressed_vocab_size"].get<int64_t>());
}

// The final check: the real tokenizer loaded from the golden_dev model directory.
TEST(EngramTokenMap, GoldenDevRealTokenizer) {
  const auto tok = Tokenizer::load(DI_TEST_DATA "/golden_dev/model");
  const EngramTokenMap m = build_engram_token_map(*tok);
  const auto golden = nlohmann::json::parse(read_file(DI_TEST_DATA "/golden_dev/engram_token_map.json"));
  EXPECT_EQ(m.token_map, golden["token_map"].get<std::vector<int32_t>>());
  EXPECT_EQ(m.compressed_vocab_size, golden["compressed_vocab_size"].get<int64_t>());
  EXPECT_EQ(m.compressed_vocab_size, 413);
}

// Ids without a token: inside len(tokenizer) they decode to "" (their own class), past it the
// reference has no entry.
TEST(EngramTokenMap, IdHoles) {
  VocabOnlyTokenizer tok({"a", "", "A", "b", ""}, {});
  const EngramTokenMap m = build_engram_token_map(tok);
  // len = 3 ids with a token, so the reference maps ids 0..2 only.
  EXPECT_EQ(m.token_map, (std::vector<int32_t>{0, 1, 0, kEngramNoClass, kEngramNoClass}));
  EXPECT_EQ(m.compressed_vocab_size, 2);
}

}  // namespace
}  // namespace di
