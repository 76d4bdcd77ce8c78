// Engram n-gram hashing (spec §2.7; official inference/engram.py `EngramLayout`,
// `compute_hash_multipliers`, `NgramHashState`).
//
// Every position is hashed, per Engram table ("slot"), into n_cols = (max_ngram - 1) * n_heads row
// indices: for each n-gram size n = 2..max_ngram (the n-gram ending at this position) and each head,
// the XOR of (compressed id at shift s) * multiplier[s] over s = 0..n-1, modulo that (n, head)'s
// prime, plus the (n, head)'s offset into the table. Order of the columns: n-gram size major, head
// minor — the order the rows are concatenated before the Engram `wkv` projection.
//
// The hash reads the compressed ids of the previous max_ngram - 1 positions, so the caller keeps a
// per-request history of compressed ids (token map applied; kEngramDead for image-span tokens).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/config.h"

namespace di {

// History entry of a token that takes no part in any n-gram (inside an image span).
inline constexpr int32_t kEngramDead = -1;

struct EngramLayout {
  std::vector<int> layer_ids;           // [n_slots] backbone layer of each table
  std::vector<int64_t> num_embeddings;  // [n_slots] table rows (rows >= this read as zero in [REF])
  int max_ngram = 0;                    // n-gram sizes 2..max_ngram
  int n_heads = 0;
  int head_dim = 0;                     // table row width
  int64_t compressed_vocab_size = 0;    // the multipliers derive from it
  std::vector<int64_t> primes;          // [n_slots][max_ngram - 1][n_heads] bucket moduli
  std::vector<int64_t> offsets;         // [n_slots][n_cols] first row of each bucket range
  std::vector<int64_t> multipliers;     // [n_slots][max_ngram] odd, one per look-back shift

  int n_slots() const { return static_cast<int>(layer_ids.size()); }
  int n_cols() const { return (max_ngram - 1) * n_heads; }
  // Slot of a backbone layer, or -1 when the layer has no Engram.
  int slot_of_layer(int layer) const;
  // Sum of a slot's primes: the rows its hashes can reach (equals num_embeddings in released configs).
  int64_t rows_used(int slot) const;
};

// Primes, offsets and multipliers from the config's engram_* fields. No Engram layers: n_slots 0.
// Throws di::Error for inconsistent fields.
EngramLayout make_engram_layout(const ModelConfig& cfg);

// One odd multiplier per (layer, shift): 2 * default_rng(10007 * layer).integers(0, bound, max_ngram)
// + 1 with bound = max(1, (INT64_MAX // compressed_vocab_size) // 2). [n_layers][max_ngram].
std::vector<int64_t> engram_hash_multipliers(const std::vector<int>& layer_ids, int max_ngram,
                                             int64_t compressed_vocab_size);

// Deterministic primality for 64-bit values (sympy.isprime's answers).
bool engram_is_prime(uint64_t n);

// Checks the token map against the config (size == compressed vocab, as [REF] asserts) and returns
// the compressed id of engram_pad_id, which fills n-gram slots with no history. Throws di::Error.
int32_t engram_pad_compressed(const ModelConfig& cfg, const std::vector<int32_t>& token_map,
                              int64_t compressed_vocab_size);

// History entry for a token id: token_map[id], or kEngramDead inside an image span. Throws
// di::Error when id is outside the map.
int32_t engram_compress(const std::vector<int32_t>& token_map, int64_t token_id, bool in_image_span = false);

// Row indices of table `slot` for the token at position `pos`. history[0..pos] are the compressed ids
// of positions 0..pos of the request (history[pos] is this token). Shifts that reach before position
// 0 or reach a dead token (and every larger shift after it) use `pad`. out: [n_cols].
void engram_hash_columns(const EngramLayout& layout, int slot, std::span<const int32_t> history, int64_t pos,
                         int32_t pad, int64_t* out);

// All slots for a batch of positions of one request. out: [n_tokens][n_slots][n_cols], the layout of
// [REF]'s hash tensor (per token, per Engram layer, 24 columns).
void engram_hash_tokens(const EngramLayout& layout, std::span<const int32_t> history,
                        std::span<const int64_t> positions, int32_t pad, int64_t* out);

}  // namespace di
