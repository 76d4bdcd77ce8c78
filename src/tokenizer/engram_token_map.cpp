#include "tokenizer/engram_token_map.h"

#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/uniset.h>
#include <unicode/unistr.h>
#include <unicode/ustring.h>

#include <algorithm>
#include <unordered_map>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/utf8.h"

namespace di {

namespace {

constexpr UChar32 kSentinel = 0xE000;  // private use: keeps a lone space through the strip

// NFKC and NFD restricted to characters assigned by Unicode 9.0, the tables of the
// unicode-normalization-alignments crate behind HF tokenizers' normalizers. Normalization data of
// an assigned character never changes between versions, so filtering on age reproduces it.
struct Unicode9 {
  UErrorCode status = U_ZERO_ERROR;
  icu::UnicodeSet assigned;
  const icu::Normalizer2* nfkc = nullptr;
  const icu::Normalizer2* nfd = nullptr;
  std::unique_ptr<icu::FilteredNormalizer2> nfkc9, nfd9;

  Unicode9() : assigned(icu::UnicodeString(u"[:age=9.0:]"), status) {
    if (U_FAILURE(status)) throw Error(std::string("ICU: cannot build the Unicode 9.0 set: ") + u_errorName(status));
    assigned.freeze();
    nfkc = icu::Normalizer2::getNFKCInstance(status);
    nfd = icu::Normalizer2::getNFDInstance(status);
    if (U_FAILURE(status)) throw Error(std::string("ICU: normalizer data unavailable: ") + u_errorName(status));
    nfkc9 = std::make_unique<icu::FilteredNormalizer2>(*nfkc, assigned);
    nfd9 = std::make_unique<icu::FilteredNormalizer2>(*nfd, assigned);
  }
};

const Unicode9& unicode9() {
  static const Unicode9 u;
  return u;
}

// StripAccents: general category Mn/Mc/Me as of Unicode 9.0.
bool is_mark_v9(UChar32 c) {
  if (!(U_GET_GC_MASK(c) & U_GC_M_MASK)) return false;
  return unicode9().assigned.contains(c);
}

// Rust's char::to_lowercase: the full (possibly multi-character) mapping of one character, with
// no context (so no final-sigma rule). Single-character ICU lowercasing in the root locale is that.
void append_lower(UChar32 c, std::u32string& out) {
  if (c < 0x80) {
    out.push_back(static_cast<char32_t>(c >= 'A' && c <= 'Z' ? c + 32 : c));
    return;
  }
  UChar src[2];
  int32_t n = 0;
  U16_APPEND_UNSAFE(src, n, c);
  UChar dst[8];
  UErrorCode st = U_ZERO_ERROR;
  const int32_t len = u_strToLower(dst, 8, src, n, "", &st);
  if (U_FAILURE(st) || len > 8) throw Error("ICU: lowercase mapping failed for U+" + std::to_string(c));
  for (int32_t i = 0; i < len;) {
    UChar32 lc;
    U16_NEXT(dst, i, len, lc);
    out.push_back(static_cast<char32_t>(lc));
  }
}

bool is_collapsed_space(char32_t c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

std::string to_utf8(const std::u32string& s) {
  std::string out;
  for (char32_t c : s) utf8::append(out, c);
  return out;
}

}  // namespace

std::string engram_normalize(std::string_view text) {
  std::u32string lowered;
  if (std::all_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; })) {
    // ASCII: NFKC and NFD are the identity and there are no marks.
    for (char c : text) append_lower(static_cast<unsigned char>(c), lowered);
  } else {
    const Unicode9& u9 = unicode9();
    UErrorCode st = U_ZERO_ERROR;
    const icu::UnicodeString s =
        icu::UnicodeString::fromUTF8(icu::StringPiece(text.data(), static_cast<int32_t>(text.size())));
    icu::UnicodeString nfkc, nfd;
    u9.nfkc9->normalize(s, nfkc, st);
    u9.nfd9->normalize(nfkc, nfd, st);
    if (U_FAILURE(st)) throw Error(std::string("ICU: normalization failed: ") + u_errorName(st));
    // StripAccents, then Lowercase.
    for (int32_t i = 0; i < nfd.length();) {
      const UChar32 c = nfd.char32At(i);
      i += U16_LENGTH(c);
      if (is_mark_v9(c)) continue;
      append_lower(c, lowered);
    }
  }
  // Replace(Regex("[ \t\r\n]+"), " ")
  std::u32string collapsed;
  for (size_t i = 0; i < lowered.size();) {
    if (is_collapsed_space(lowered[i])) {
      while (i < lowered.size() && is_collapsed_space(lowered[i])) ++i;
      collapsed.push_back(U' ');
    } else {
      collapsed.push_back(lowered[i++]);
    }
  }
  // Replace(Regex("^ $"), sentinel): no newline is left, so this is "the whole string is one space".
  if (collapsed == U" ") collapsed = std::u32string(1, static_cast<char32_t>(kSentinel));
  // Strip(): White_Space at both ends.
  size_t b = 0, e = collapsed.size();
  while (b < e && u_isUWhiteSpace(static_cast<UChar32>(collapsed[b]))) ++b;
  while (e > b && u_isUWhiteSpace(static_cast<UChar32>(collapsed[e - 1]))) --e;
  std::u32string stripped = collapsed.substr(b, e - b);
  // Replace(sentinel, " ")
  for (char32_t& c : stripped)
    if (c == static_cast<char32_t>(kSentinel)) c = U' ';
  return to_utf8(stripped);
}

std::string engram_token_key(const Tokenizer& tok, int32_t id) {
  const std::string bytes = tok.token_bytes(id);
  // The vocabulary string: a byte-level token spells its bytes; an added token is its content.
  std::string vocab_string = byte_level::encode(bytes);
  const auto found = tok.token_to_id(vocab_string);
  if (!found || *found != id) vocab_string = bytes;

  // What the ByteLevel decoder makes of that string alone: its bytes when every character is in
  // the byte alphabet, else the string unchanged; invalid UTF-8 decodes lossily to U+FFFD.
  std::string raw;
  const std::string text = byte_level::decode(vocab_string, raw) ? raw : vocab_string;
  if (utf8::first_invalid(text) != utf8::kValid || text.find("\xEF\xBF\xBD") != std::string::npos)
    return vocab_string;
  std::string normalized = engram_normalize(text);
  return normalized.empty() ? text : normalized;
}

EngramTokenMap build_engram_token_map(const Tokenizer& tok) {
  const int32_t n = tok.vocab_size();
  if (n <= 0) throw Error("engram token map: the tokenizer has no tokens");
  // [REF] walks range(len(tokenizer)), and len counts the ids that have a token. Ids without one
  // (holes) decode to "" there; ids at or past len are outside its map (it cannot hash them) and
  // get kEngramNoClass here. Released tokenizers have no holes.
  int32_t len = 0;
  for (int32_t id = 0; id < n; ++id) len += tok.token_bytes(id).empty() ? 0 : 1;
  EngramTokenMap m;
  m.token_map.assign(static_cast<size_t>(n), kEngramNoClass);
  std::unordered_map<std::string, int32_t> classes;
  classes.reserve(static_cast<size_t>(len));
  for (int32_t id = 0; id < len; ++id) {
    const auto it = classes.try_emplace(engram_token_key(tok, id), static_cast<int32_t>(classes.size())).first;
    m.token_map[static_cast<size_t>(id)] = it->second;
  }
  m.compressed_vocab_size = static_cast<int64_t>(classes.size());
  return m;
}

}  // namespace di
