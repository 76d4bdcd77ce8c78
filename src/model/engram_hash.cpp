#include "model/engram_hash.h"

#include <algorithm>
#include <limits>
#include <set>
#include <string>

#include "core/error.h"
#include "model/numpy_pcg64.h"

namespace di {

namespace {

uint64_t mul_mod(uint64_t a, uint64_t b, uint64_t m) {
  return static_cast<uint64_t>(static_cast<Uint128>(a) * b % m);
}

uint64_t pow_mod(uint64_t b, uint64_t e, uint64_t m) {
  uint64_t r = 1 % m;
  for (b %= m; e; e >>= 1, b = mul_mod(b, b, m))
    if (e & 1) r = mul_mod(r, b, m);
  return r;
}

// find_next_prime: the smallest prime above `start` not handed out yet.
int64_t next_unused_prime(int64_t start, const std::set<int64_t>& seen) {
  int64_t c = start + 1;
  while (c < 2 || !engram_is_prime(static_cast<uint64_t>(c)) || seen.count(c)) ++c;
  return c;
}

// Python's `%` (torch.remainder): the result takes the divisor's sign.
int64_t floor_mod(int64_t a, int64_t m) {
  int64_t r = a % m;
  return (r != 0 && ((r < 0) != (m < 0))) ? r + m : r;
}

}  // namespace

bool engram_is_prime(uint64_t n) {
  if (n < 2) return false;
  for (uint64_t p : {2ull, 3ull, 5ull, 7ull, 11ull, 13ull, 17ull, 19ull, 23ull, 29ull, 31ull, 37ull}) {
    if (n % p == 0) return n == p;
  }
  uint64_t d = n - 1;
  int s = 0;
  for (; (d & 1) == 0; d >>= 1) ++s;
  // These 12 bases decide every n < 2^64 (Miller-Rabin, deterministic).
  for (uint64_t a : {2ull, 3ull, 5ull, 7ull, 11ull, 13ull, 17ull, 19ull, 23ull, 29ull, 31ull, 37ull}) {
    uint64_t x = pow_mod(a, d, n);
    if (x == 1 || x == n - 1) continue;
    bool composite = true;
    for (int i = 1; i < s && composite; ++i) {
      x = mul_mod(x, x, n);
      if (x == n - 1) composite = false;
    }
    if (composite) return false;
  }
  return true;
}

std::vector<int64_t> engram_hash_multipliers(const std::vector<int>& layer_ids, int max_ngram,
                                             int64_t compressed_vocab_size) {
  if (compressed_vocab_size <= 0)
    throw Error("engram_compressed_vocab_size: expected > 0, got " + std::to_string(compressed_vocab_size));
  const int64_t bound = std::max<int64_t>(1, (std::numeric_limits<int64_t>::max() / compressed_vocab_size) / 2);
  std::vector<int64_t> out;
  for (int layer : layer_ids) {
    NumpyPcg64 rng(static_cast<uint64_t>(10007) * static_cast<uint64_t>(layer));
    for (int64_t v : rng.integers(0, bound, max_ngram)) out.push_back(v * 2 + 1);
  }
  return out;
}

int EngramLayout::slot_of_layer(int layer) const {
  for (int s = 0; s < n_slots(); ++s)
    if (layer_ids[static_cast<size_t>(s)] == layer) return s;
  return -1;
}

int64_t EngramLayout::rows_used(int slot) const {
  DI_CHECK(slot >= 0 && slot < n_slots());
  const auto begin = primes.begin() + static_cast<ptrdiff_t>(slot) * n_cols();
  int64_t sum = 0;
  for (auto it = begin; it != begin + n_cols(); ++it) sum += *it;
  return sum;
}

EngramLayout make_engram_layout(const ModelConfig& cfg) {
  EngramLayout L;
  if (cfg.engram_layer_ids.empty()) return L;
  const auto fail = [](const std::string& what) { throw Error("engram config: " + what); };
  if (cfg.engram_num_embeddings.size() != cfg.engram_layer_ids.size())
    fail("engram_num_embeddings has " + std::to_string(cfg.engram_num_embeddings.size()) +
         " entries, expected one per engram_layer_ids entry (" + std::to_string(cfg.engram_layer_ids.size()) + ")");
  if (cfg.engram_max_ngram < 2) fail("engram_max_ngram_size must be >= 2, got " + std::to_string(cfg.engram_max_ngram));
  if (cfg.engram_n_heads < 1) fail("engram_n_heads must be >= 1, got " + std::to_string(cfg.engram_n_heads));
  if (cfg.engram_head_dim < 1) fail("engram_head_dim must be >= 1, got " + std::to_string(cfg.engram_head_dim));
  if (cfg.engram_vocab_size < 0 || cfg.engram_vocab_size > (int64_t{1} << 60))
    fail("engram_vocab_size out of range: " + std::to_string(cfg.engram_vocab_size));
  for (size_t i = 0; i < cfg.engram_layer_ids.size(); ++i) {
    if (cfg.engram_layer_ids[i] < 0) fail("engram_layer_ids holds a negative layer " + std::to_string(cfg.engram_layer_ids[i]));
    for (size_t j = 0; j < i; ++j)
      if (cfg.engram_layer_ids[j] == cfg.engram_layer_ids[i])
        fail("engram_layer_ids lists layer " + std::to_string(cfg.engram_layer_ids[i]) + " twice");
  }

  L.layer_ids = cfg.engram_layer_ids;
  L.num_embeddings = cfg.engram_num_embeddings;
  L.max_ngram = cfg.engram_max_ngram;
  L.n_heads = cfg.engram_n_heads;
  L.head_dim = cfg.engram_head_dim;
  L.compressed_vocab_size = cfg.engram_compressed_vocab_size;

  // Per layer, per n-gram size, per head: the next unused prime, each n-gram size restarting its
  // search at engram_vocab_size - 1 (so in effect one increasing run of primes).
  std::set<int64_t> seen;
  for (int s = 0; s < L.n_slots(); ++s) {
    int64_t running = 0;
    for (int n = 0; n < L.max_ngram - 1; ++n) {
      int64_t current = cfg.engram_vocab_size - 1;
      for (int h = 0; h < L.n_heads; ++h) {
        current = next_unused_prime(current, seen);
        seen.insert(current);
        L.primes.push_back(current);
        L.offsets.push_back(running);  // cumsum([0, *sizes[:-1]]) over the slot's flat primes
        running += current;
      }
    }
  }
  L.multipliers = engram_hash_multipliers(L.layer_ids, L.max_ngram, L.compressed_vocab_size);
  return L;
}

int32_t engram_pad_compressed(const ModelConfig& cfg, const std::vector<int32_t>& token_map,
                              int64_t compressed_vocab_size) {
  if (compressed_vocab_size != cfg.engram_compressed_vocab_size)
    throw Error("engram: the tokenizer's compressed vocab has " + std::to_string(compressed_vocab_size) +
                " classes but config engram_compressed_vocab_size is " +
                std::to_string(cfg.engram_compressed_vocab_size) +
                " (every hash multiplier derives from it; wrong tokenizer.json?)");
  const int32_t pad = engram_compress(token_map, cfg.engram_pad_id);
  if (pad < 0) throw Error("engram: engram_pad_id " + std::to_string(cfg.engram_pad_id) + " has no compressed class");
  return pad;
}

int32_t engram_compress(const std::vector<int32_t>& token_map, int64_t token_id, bool in_image_span) {
  if (token_id < 0 || token_id >= static_cast<int64_t>(token_map.size()))
    throw Error("engram: token id " + std::to_string(token_id) + " is outside the tokenizer's " +
                std::to_string(token_map.size()) + " ids");
  return in_image_span ? kEngramDead : token_map[static_cast<size_t>(token_id)];
}

void engram_hash_columns(const EngramLayout& L, int slot, std::span<const int32_t> history, int64_t pos,
                         int32_t pad, int64_t* out) {
  DI_CHECK(slot >= 0 && slot < L.n_slots());
  DI_CHECK(pos >= 0 && pos < static_cast<int64_t>(history.size()));
  DI_CHECK(L.max_ngram >= 2 && L.max_ngram <= 64);
  const int64_t* mult = L.multipliers.data() + static_cast<size_t>(slot) * static_cast<size_t>(L.max_ngram);
  const int64_t* primes = L.primes.data() + static_cast<size_t>(slot) * static_cast<size_t>(L.n_cols());
  const int64_t* offsets = L.offsets.data() + static_cast<size_t>(slot) * static_cast<size_t>(L.n_cols());

  bool blocked = false;  // sticky: once the look-back hits the start or a dead token, it stays padded
  uint64_t rolling = 0;
  for (int shift = 0; shift < L.max_ngram; ++shift) {
    const int32_t src = history[static_cast<size_t>(std::max<int64_t>(pos - shift, 0))];
    blocked = blocked || pos < shift || src == kEngramDead;
    const int64_t tok = blocked ? pad : src;
    // int64 product and XOR with two's-complement wraparound, as torch does
    const uint64_t product = static_cast<uint64_t>(tok) * static_cast<uint64_t>(mult[shift]);
    rolling = shift == 0 ? product : rolling ^ product;
    if (shift == 0) continue;
    const int64_t h = static_cast<int64_t>(rolling);
    for (int head = 0; head < L.n_heads; ++head) {
      const int col = (shift - 1) * L.n_heads + head;
      out[col] = floor_mod(h, primes[col]) + offsets[col];
    }
  }
}

void engram_hash_tokens(const EngramLayout& L, std::span<const int32_t> history, std::span<const int64_t> positions,
                        int32_t pad, int64_t* out) {
  const size_t stride = static_cast<size_t>(L.n_slots()) * static_cast<size_t>(L.n_cols());
  for (size_t t = 0; t < positions.size(); ++t)
    for (int s = 0; s < L.n_slots(); ++s)
      engram_hash_columns(L, s, history, positions[t], pad,
                          out + t * stride + static_cast<size_t>(s) * static_cast<size_t>(L.n_cols()));
}

}  // namespace di
