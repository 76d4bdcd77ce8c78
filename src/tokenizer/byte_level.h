// The GPT-2 byte-level alphabet: every byte 0..255 stands for one printable code point, so BPE
// vocabularies can spell arbitrary bytes as text (space is 'Ġ' U+0120, newline 'Ċ' U+010A).
#pragma once

#include <array>
#include <string>
#include <string_view>

namespace di::byte_level {

// The code point that byte b stands for.
char32_t byte_to_char(unsigned char b);

// The byte that code point c stands for, or -1 when c is not in the alphabet.
int char_to_byte(char32_t c);

// UTF-8 of the byte-level spelling of raw bytes ("a b" -> "aĠb").
std::string encode(std::string_view bytes);

// Raw bytes of a byte-level spelled token. Returns false (out unspecified) when the token holds a
// character outside the alphabet or is not valid UTF-8.
bool decode(std::string_view token, std::string& out);

}  // namespace di::byte_level
