#include "tokenizer/detokenizer.h"

#include "tokenizer/utf8.h"

namespace di {

Detokenizer::Detokenizer(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(tokenizer), skip_special_(skip_special) {}

std::string Detokenizer::push(int32_t id) {
  std::string bytes = tokenizer_.token_bytes(id);  // validates the id
  if (skip_special_ && tokenizer_.is_special(id)) return std::string();
  return push_bytes(bytes);
}

std::string Detokenizer::push_bytes(std::string_view bytes) {
  pending_.append(bytes);
  std::string out;
  const std::string_view s = pending_;
  size_t i = 0;
  while (i < s.size()) {
    // Copy the ASCII run in one go.
    size_t j = i;
    while (j < s.size() && static_cast<unsigned char>(s[j]) < 0x80) ++j;
    out.append(s.substr(i, j - i));
    i = j;
    if (i >= s.size()) break;
    char32_t cp;
    const int r = utf8::scan(s, i, &cp);
    if (r > 0) {
      out.append(s.substr(i, static_cast<size_t>(r)));
      i += static_cast<size_t>(r);
    } else if (r == 0) {
      break;  // incomplete tail: wait for more bytes
    } else {
      utf8::append(out, utf8::kReplacement);
      i += static_cast<size_t>(-r);
    }
  }
  pending_.erase(0, i);
  return out;
}

std::string Detokenizer::flush() {
  std::string out = utf8::to_valid_lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace di
