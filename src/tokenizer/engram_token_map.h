// Engram's compressed token map (official inference/engram.py `build_compressed_token_map`; spec
// §2.7): every token id maps to the class of tokens that normalize alike (" The", "the", "THE"),
// numbered in order of first appearance over ids 0, 1, 2, ...
//
// A token's key, exactly as the reference computes it with the HF `tokenizers` backend:
//  - text = the token decoded alone (ByteLevel decoder, special tokens kept, no clean-up);
//  - text holding U+FFFD (a partial UTF-8 byte token): key = the token's vocabulary string
//    (its byte-level spelling, e.g. "âĶ", or an added token's content);
//  - otherwise key = normalize(text), or text itself when that normalizes to "".
// normalize = NFKC, NFD, strip marks (general category M), per-character full lowercase, runs of
// [ \t\r\n] -> one space, a lone " " survives, strip White_Space at both ends. NFKC/NFD/mark tables
// are Unicode 9.0 (the `unicode-normalization-alignments` crate HF tokenizers uses): characters
// assigned later pass through untouched.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace di {

// Map entry of an id the reference's map does not cover (only when the tokenizer has id holes);
// equal to kEngramDead, so such a token hashes like an image-span token instead of failing.
inline constexpr int32_t kEngramNoClass = -1;

struct EngramTokenMap {
  std::vector<int32_t> token_map;     // [tokenizer vocab_size()] token id -> compressed id
  int64_t compressed_vocab_size = 0;  // number of classes (99092 for the released tokenizer)
};

EngramTokenMap build_engram_token_map(const Tokenizer& tok);

// The normalizer sequence above, on valid UTF-8.
std::string engram_normalize(std::string_view text);

// The key of one token id (see above).
std::string engram_token_key(const Tokenizer& tok, int32_t id);

}  // namespace di
