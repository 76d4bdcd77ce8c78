// Added tokens of tokenizer.json (special tokens like <｜begin▁of▁sentence｜> and others such as
// <｜User｜>): found in the raw text before pre-tokenization, leftmost-longest, as Hugging Face does:
// first the tokens with normalized=false over the whole text, then the normalized=true ones over
// the gaps (the normalizers supported here are the identity, so both passes see the same bytes).
// lstrip/rstrip swallow the whitespace beside a match; single_word requires non-word neighbours.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace di {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;
};

// A piece of the input: text[begin, end) is either an added token (id >= 0) or plain text (-1).
struct Segment {
  size_t begin;
  size_t end;
  int32_t id;
};

class AddedTokenSplitter {
 public:
  explicit AddedTokenSplitter(const std::vector<AddedToken>& tokens);
  bool empty() const { return tokens_.empty(); }
  // Replaces `out` with the segments of `text` (valid UTF-8); empty plain pieces are left out.
  void split(std::string_view text, std::vector<Segment>& out) const;

 private:
  // A byte trie over the contents of one pass's tokens.
  struct Trie {
    struct Node {
      int32_t token = -1;  // index into tokens_ when a token ends here
      std::vector<std::pair<unsigned char, int32_t>> children;  // sorted by byte
    };
    std::vector<Node> nodes{Node{}};
    bool first_byte[256] = {};
    void add(std::string_view s, int32_t token);
    int32_t child(int32_t node, unsigned char b) const;
  };
  // Leftmost-longest matches of `trie` in text[begin, end), treated as a string of its own.
  void find_in(const Trie& trie, std::string_view text, size_t begin, size_t end,
               std::vector<Segment>& out) const;

  std::vector<AddedToken> tokens_;
  Trie raw_;         // normalized == false
  Trie normalized_;  // normalized == true
  bool has_normalized_ = false;
};

}  // namespace di
