// The pre-tokenizer of a byte-level BPE tokenizer.json: a Sequence of Split steps (regex or
// literal, with the five Hugging Face delimiter behaviours and `invert`) ending in ByteLevel. It cuts
// text into words, each one a byte range of the input, so the BPE model can run per word on raw
// bytes (ByteLevel's byte-to-char mapping is folded into the model's byte ids).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tokenizer/regex.h"

namespace di {

// One word: text[begin, end), preceded by a space that is not in the text when prefix_space
// (ByteLevel add_prefix_space).
struct Word {
  uint32_t begin;
  uint32_t end;
  bool prefix_space;
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

class PreTokenizer {
 public:
  // `pre` is the "pre_tokenizer" value of tokenizer.json. Throws di::Error naming `origin` and the
  // field for anything other than Sequence/Split/ByteLevel, or when ByteLevel is missing or not last.
  PreTokenizer(const nlohmann::json& pre, const std::string& origin);
  ~PreTokenizer();

  // Per-thread matching state (PCRE2 match data); bound to one PreTokenizer.
  class Scratch {
   public:
    explicit Scratch(const PreTokenizer& pre);
    ~Scratch();

   private:
    friend class PreTokenizer;
    std::vector<std::unique_ptr<Regex::Matcher>> matchers;
    std::vector<Word> next;
    std::string prefixed;
    struct Seg {
      uint32_t begin, end;
      bool is_match;
    };
    std::vector<Seg> segs;
  };

  // Replaces `out` with the words of `text` (valid UTF-8, < 4 GiB).
  void split(std::string_view text, Scratch& scratch, std::vector<Word>& out) const;

 private:
  struct Step {
    bool prefix_space = false;  // ByteLevel add_prefix_space instead of a split
    int regex = -1;             // index into regexes_
    SplitBehavior behavior = SplitBehavior::kIsolated;
    bool invert = false;
  };
  void add_step(const nlohmann::json& step, const std::string& where, bool last);
  // `newer`: text has characters newer than PCRE2's Unicode tables (Regex::has_newer_chars).
  void apply_split(const Step& step, std::string_view text, const Word& w, bool newer, Scratch& s,
                   std::vector<Word>& out) const;

  std::vector<Step> steps_;
  std::vector<std::unique_ptr<Regex>> regexes_;
  std::string origin_;
};

}  // namespace di
