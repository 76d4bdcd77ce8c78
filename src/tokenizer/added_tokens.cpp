#include "tokenizer/added_tokens.h"

#include <algorithm>

#include <unicode/uchar.h>

#include "tokenizer/utf8.h"

namespace di {

namespace {

// Rust regex's Unicode \w: Alphabetic, marks, decimal digits, connector punctuation, join controls.
bool is_word_char(char32_t c) {
  const auto cp = static_cast<UChar32>(c);
  if (u_hasBinaryProperty(cp, UCHAR_ALPHABETIC) || u_hasBinaryProperty(cp, UCHAR_JOIN_CONTROL)) return true;
  switch (u_charType(cp)) {
    case U_NON_SPACING_MARK: case U_ENCLOSING_MARK: case U_COMBINING_SPACING_MARK:
    case U_DECIMAL_DIGIT_NUMBER: case U_CONNECTOR_PUNCTUATION:
      return true;
    default:
      return false;
  }
}

// The code point that ends just before `pos` (pos > 0, valid UTF-8).
char32_t cp_before(std::string_view s, size_t pos, size_t* start) {
  size_t i = pos - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  char32_t cp = 0;
  utf8::decode_valid(reinterpret_cast<const unsigned char*>(s.data()) + i, &cp);
  *start = i;
  return cp;
}

char32_t cp_at(std::string_view s, size_t pos, size_t* len) {
  char32_t cp = 0;
  *len = static_cast<size_t>(utf8::decode_valid(reinterpret_cast<const unsigned char*>(s.data()) + pos, &cp));
  return cp;
}

}  // namespace

void AddedTokenSplitter::Trie::add(std::string_view s, int32_t token) {
  int32_t node = 0;
  first_byte[static_cast<unsigned char>(s[0])] = true;
  for (char ch : s) {
    const auto b = static_cast<unsigned char>(ch);
    int32_t next = child(node, b);
    if (next < 0) {
      next = static_cast<int32_t>(nodes.size());
      nodes.emplace_back();
      auto& kids = nodes[static_cast<size_t>(node)].children;
      kids.insert(std::lower_bound(kids.begin(), kids.end(), std::make_pair(b, int32_t{0})), {b, next});
    }
    node = next;
  }
  nodes[static_cast<size_t>(node)].token = token;
}

int32_t AddedTokenSplitter::Trie::child(int32_t node, unsigned char b) const {
  const auto& kids = nodes[static_cast<size_t>(node)].children;
  auto it = std::lower_bound(kids.begin(), kids.end(), std::make_pair(b, int32_t{0}));
  return it != kids.end() && it->first == b ? it->second : -1;
}

AddedTokenSplitter::AddedTokenSplitter(const std::vector<AddedToken>& tokens) {
  for (const AddedToken& t : tokens) {
    if (t.content.empty()) continue;  // HF ignores empty added tokens
    const auto index = static_cast<int32_t>(tokens_.size());
    tokens_.push_back(t);
    if (t.normalized) {
      normalized_.add(t.content, index);
      has_normalized_ = true;
    } else {
      raw_.add(t.content, index);
    }
  }
}

void AddedTokenSplitter::find_in(const Trie& trie, std::string_view all, size_t begin, size_t end,
                                 std::vector<Segment>& out) const {
  const std::string_view text = all.substr(begin, end - begin);
  const size_t n = text.size();
  size_t start_offset = 0;  // end of the last emitted piece, relative to text
  size_t i = 0;
  while (i < n) {
    if (!trie.first_byte[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    // Longest token starting at i.
    int32_t node = 0, token = -1;
    size_t stop = i;
    for (size_t j = i; j < n; ++j) {
      node = trie.child(node, static_cast<unsigned char>(text[j]));
      if (node < 0) break;
      if (trie.nodes[static_cast<size_t>(node)].token >= 0) {
        token = trie.nodes[static_cast<size_t>(node)].token;
        stop = j + 1;
      }
    }
    if (token < 0) {
      ++i;
      continue;
    }
    const AddedToken& t = tokens_[static_cast<size_t>(token)];
    size_t start = i;
    if (t.single_word) {
      size_t at = 0, len = 0;
      const bool word_before = start > 0 && is_word_char(cp_before(text, start, &at));
      const bool word_after = stop < n && is_word_char(cp_at(text, stop, &len));
      if (word_before || word_after) {
        i = stop;  // the matcher moves past a discarded match, as HF's does
        continue;
      }
    }
    if (t.lstrip) {
      size_t at = start;
      while (at > start_offset) {
        size_t prev = 0;
        if (!utf8::is_white_space(cp_before(text, at, &prev))) break;
        at = prev;
      }
      start = at;
    }
    if (t.rstrip) {
      while (stop < n) {
        size_t len = 0;
        if (!utf8::is_white_space(cp_at(text, stop, &len))) break;
        stop += len;
      }
    }
    if (start > start_offset) out.push_back(Segment{begin + start_offset, begin + start, -1});
    out.push_back(Segment{begin + start, begin + stop, t.id});
    start_offset = stop;
    i = stop;
  }
  if (start_offset < n) out.push_back(Segment{begin + start_offset, end, -1});
}

void AddedTokenSplitter::split(std::string_view text, std::vector<Segment>& out) const {
  out.clear();
  if (text.empty()) return;
  find_in(raw_, text, 0, text.size(), out);
  if (!has_normalized_) return;
  std::vector<Segment> first;
  first.swap(out);
  for (const Segment& s : first) {
    if (s.id >= 0) {
      out.push_back(s);
    } else {
      find_in(normalized_, text, s.begin, s.end, out);
    }
  }
}

}  // namespace di
