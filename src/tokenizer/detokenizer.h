// Incremental detokenizer for streaming: feed ids one at a time, get back only complete UTF-8.
// A token may end inside a multi-byte character (an emoji is often split over 2-4 byte tokens), so
// an incomplete tail is held back until the bytes that complete it arrive. Bytes that can never
// become valid UTF-8 come out as U+FFFD (one per maximal ill-formed subpart), so every piece
// returned is valid UTF-8 and the concatenation of all pieces is to_valid_lossy(decode(ids)).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace di {

class Detokenizer {
 public:
  // `tokenizer` must outlive the detokenizer. skip_special drops special tokens (as decode does).
  explicit Detokenizer(const Tokenizer& tokenizer, bool skip_special = false);

  // The text that became complete with this token (possibly empty). Throws di::Error for an id
  // outside the vocabulary.
  std::string push(int32_t id);
  // Bytes, for callers that have raw token bytes already.
  std::string push_bytes(std::string_view bytes);
  // Ends the stream: an incomplete tail becomes U+FFFD. The detokenizer is then empty and reusable.
  std::string flush();
  // Bytes held back (0..3).
  size_t pending() const { return pending_.size(); }

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace di
