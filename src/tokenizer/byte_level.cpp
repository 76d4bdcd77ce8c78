#include "tokenizer/byte_level.h"

#include "tokenizer/utf8.h"

namespace di::byte_level {

namespace {

struct Tables {
  std::array<char32_t, 256> to_char{};
  std::array<short, 324> to_byte{};  // code points stay below 256 + 68

  Tables() {
    to_byte.fill(-1);
    // Printable Latin-1 bytes stand for themselves; the other 68 map to 256, 257, ... in order.
    auto keeps_itself = [](int b) {
      return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      char32_t c = keeps_itself(b) ? static_cast<char32_t>(b) : static_cast<char32_t>(next++);
      to_char[static_cast<size_t>(b)] = c;
      to_byte[c] = static_cast<short>(b);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

char32_t byte_to_char(unsigned char b) { return tables().to_char[b]; }

int char_to_byte(char32_t c) { return c < tables().to_byte.size() ? tables().to_byte[c] : -1; }

std::string encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char ch : bytes) utf8::append(out, byte_to_char(static_cast<unsigned char>(ch)));
  return out;
}

bool decode(std::string_view token, std::string& out) {
  out.clear();
  size_t i = 0;
  while (i < token.size()) {
    char32_t cp;
    int len = utf8::decode(token, i, &cp);
    if (len <= 0) return false;
    int b = char_to_byte(cp);
    if (b < 0) return false;
    out.push_back(static_cast<char>(b));
    i += static_cast<size_t>(len);
  }
  return true;
}

}  // namespace di::byte_level
