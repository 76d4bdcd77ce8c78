// UTF-8 helpers shared by the tokenizer pieces: validation (Unicode Table 3-7: no overlongs, no
// surrogates, nothing above U+10FFFF), decoding one code point, appending one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace di::utf8 {

inline constexpr size_t kValid = static_cast<size_t>(-1);
inline constexpr char32_t kReplacement = 0xFFFD;

// Byte offset of the first ill-formed sequence in `s`, or kValid.
size_t first_invalid(std::string_view s);

// Length (1..4) of the well-formed sequence starting at s[i], or 0 when it is ill-formed or
// truncated. Writes the code point to *cp when well-formed.
int decode(std::string_view s, size_t i, char32_t* cp);

// Decodes a code point that is known to be well-formed (validated input). Returns its length.
inline int decode_valid(const unsigned char* p, char32_t* cp) {
  unsigned c = p[0];
  if (c < 0x80) { *cp = c; return 1; }
  if (c < 0xE0) { *cp = ((c & 0x1Fu) << 6) | (p[1] & 0x3Fu); return 2; }
  if (c < 0xF0) { *cp = ((c & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu); return 3; }
  *cp = ((c & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) | (p[3] & 0x3Fu);
  return 4;
}

// Length of the code point whose lead byte is `lead` (validated input).
inline int lead_length(unsigned char lead) {
  return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}

// Classifies the bytes at s[i]: > 0 is the length of a well-formed sequence (code point in *cp);
// 0 means a well-formed but truncated prefix that runs to the end of `s` (more bytes may complete
// it); < 0 is minus the length of the maximal ill-formed subpart (each one becomes one U+FFFD).
int scan(std::string_view s, size_t i, char32_t* cp);

void append(std::string& out, char32_t cp);

// Copy of `s` with every maximal ill-formed subpart replaced by U+FFFD (the Unicode / WHATWG
// "maximal subpart" practice, the same as Rust's String::from_utf8_lossy).
std::string to_valid_lossy(std::string_view s);

// Unicode White_Space property (what Oniguruma's and Rust's \s match).
bool is_white_space(char32_t cp);

}  // namespace di::utf8
