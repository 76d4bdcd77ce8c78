// A compiled PCRE2 pattern (UTF + UCP, JIT when available) for the pre-tokenizer. Patterns in
// tokenizer.json are written for Oniguruma (what Hugging Face tokenizers runs); the few escapes
// whose meaning differs in PCRE2 are rewritten first (see translate_onig_pattern).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace di {

// Rewrites an Oniguruma pattern for PCRE2: \s and \S become the Unicode White_Space set (PCRE2's
// \s lacks U+0085), \h and \H mean hex digits as in Oniguruma, and \p{..} classes gain the
// characters assigned after PCRE2's Unicode version that ICU knows (PCRE2 10.42 has Unicode 14,
// Hugging Face's Oniguruma a newer one: CJK Extension H letters, for one) unless !newer_unicode.
std::string translate_onig_pattern(std::string_view pattern, bool newer_unicode = true);

class Regex {
 public:
  // Throws di::Error naming `origin` when the pattern does not compile.
  Regex(std::string_view pattern, const std::string& origin);
  ~Regex();
  Regex(const Regex&) = delete;

  // True when `text` (valid UTF-8) holds a code point assigned after PCRE2's Unicode version (but
  // known to ICU). Only such text needs the pattern variant with the added ranges, which is slower
  // (the JIT checks the ranges one by one); other text matches identically with PCRE2's tables.
  static bool has_newer_chars(std::string_view text);
  Regex& operator=(const Regex&) = delete;

  // Scratch state for matching; one per thread (not shareable).
  class Matcher {
   public:
    explicit Matcher(const Regex& re);
    ~Matcher();
    Matcher(const Matcher&) = delete;
    Matcher& operator=(const Matcher&) = delete;
    // Finds the first match in subject[offset..) treating `subject` as the whole string (so
    // look-arounds stop at its ends). Subject must be valid UTF-8. Returns false when none.
    // `newer`: the subject may hold characters newer than PCRE2's tables (see has_newer_chars).
    bool find(std::string_view subject, size_t offset, size_t* begin, size_t* end, bool newer = true);

   private:
    const Regex& re_;
    void* match_data_ = nullptr;
    // Created on the first JIT stack overflow (long backtracking runs); never shared by threads.
    void* match_context_ = nullptr;
    void* jit_stack_ = nullptr;
  };

 private:
  friend class Matcher;
  void* code_ = nullptr;        // with the newer-Unicode ranges
  void* plain_code_ = nullptr;  // without them; null when the pattern has none
  bool jit_ = false;
  bool plain_jit_ = false;
  std::string origin_;
};

}  // namespace di
