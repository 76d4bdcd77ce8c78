#include "model/numpy_pcg64.h"

#include <limits>

#include "core/error.h"

namespace di {

namespace {

// SeedSequence hashing constants (numpy bit_generator.pyx).
constexpr uint32_t kInitA = 0x43b0d7e5u;
constexpr uint32_t kMultA = 0x931e8875u;
constexpr uint32_t kInitB = 0x8b51f9ddu;
constexpr uint32_t kMultB = 0x58f38dedu;
constexpr uint32_t kMixMultL = 0xca01f9ddu;
constexpr uint32_t kMixMultR = 0x4973f715u;
constexpr int kXShift = 16;  // half the word size
constexpr size_t kPoolSize = 4;

// hashmix: the multiplier evolves with every call, so it is in/out.
uint32_t hashmix(uint32_t value, uint32_t& hash_const) {
  value ^= hash_const;
  hash_const *= kMultA;
  value *= hash_const;
  return value ^ (value >> kXShift);
}

uint32_t mix(uint32_t x, uint32_t y) {
  uint32_t r = kMixMultL * x - kMixMultR * y;
  return r ^ (r >> kXShift);
}

std::vector<uint32_t> seed_words(uint64_t seed) {
  std::vector<uint32_t> w{static_cast<uint32_t>(seed)};
  if (seed >> 32) w.push_back(static_cast<uint32_t>(seed >> 32));
  return w;
}

// PCG_DEFAULT_MULTIPLIER_128
constexpr Uint128 kPcgMult = (static_cast<Uint128>(2549297995355413924ull) << 64) | 4865540595714422341ull;

}  // namespace

NumpySeedSequence::NumpySeedSequence(uint64_t seed) : NumpySeedSequence(seed_words(seed)) {}

NumpySeedSequence::NumpySeedSequence(const std::vector<uint32_t>& entropy) {
  uint32_t hash_const = kInitA;
  // Entropy up to the pool size; an empty slot keeps running the hash on 0.
  for (size_t i = 0; i < kPoolSize; ++i) pool_[i] = hashmix(i < entropy.size() ? entropy[i] : 0u, hash_const);
  // Every word into every other, so late words reach early ones.
  for (size_t src = 0; src < kPoolSize; ++src)
    for (size_t dst = 0; dst < kPoolSize; ++dst)
      if (src != dst) pool_[dst] = mix(pool_[dst], hashmix(pool_[src], hash_const));
  // Entropy beyond the pool size is folded into each pool word.
  for (size_t src = kPoolSize; src < entropy.size(); ++src)
    for (size_t dst = 0; dst < kPoolSize; ++dst) pool_[dst] = mix(pool_[dst], hashmix(entropy[src], hash_const));
}

std::vector<uint32_t> NumpySeedSequence::generate_state_u32(int n_words) const {
  DI_CHECK(n_words >= 0);
  std::vector<uint32_t> out(static_cast<size_t>(n_words));
  uint32_t hash_const = kInitB;
  for (size_t i = 0; i < out.size(); ++i) {
    uint32_t v = pool_[i % kPoolSize] ^ hash_const;
    hash_const *= kMultB;
    v *= hash_const;
    out[i] = v ^ (v >> kXShift);
  }
  return out;
}

std::vector<uint64_t> NumpySeedSequence::generate_state_u64(int n_words) const {
  const std::vector<uint32_t> w = generate_state_u32(2 * n_words);
  std::vector<uint64_t> out(static_cast<size_t>(n_words));
  for (size_t i = 0; i < out.size(); ++i) out[i] = w[2 * i] | (static_cast<uint64_t>(w[2 * i + 1]) << 32);
  return out;
}

NumpyPcg64::NumpyPcg64(uint64_t seed) : NumpyPcg64(NumpySeedSequence(seed)) {}

NumpyPcg64::NumpyPcg64(const NumpySeedSequence& seq) {
  const std::vector<uint64_t> w = seq.generate_state_u64(4);
  const Uint128 init_state = (static_cast<Uint128>(w[0]) << 64) | w[1];
  const Uint128 init_seq = (static_cast<Uint128>(w[2]) << 64) | w[3];
  // pcg_setseq_128_srandom_r
  state_ = 0;
  inc_ = (init_seq << 1) | 1u;
  step();
  state_ += init_state;
  step();
}

void NumpyPcg64::step() { state_ = state_ * kPcgMult + inc_; }

uint64_t NumpyPcg64::next_u64() {
  step();
  // XSL-RR: xor the halves, rotate right by the top 6 bits
  const uint64_t x = static_cast<uint64_t>(state_ >> 64) ^ static_cast<uint64_t>(state_);
  const unsigned rot = static_cast<unsigned>(state_ >> 122);
  return (x >> rot) | (x << ((64u - rot) & 63u));
}

uint32_t NumpyPcg64::next_u32() {
  if (has_u32_) {
    has_u32_ = false;
    return u32_;
  }
  const uint64_t v = next_u64();
  has_u32_ = true;
  u32_ = static_cast<uint32_t>(v >> 32);
  return static_cast<uint32_t>(v);
}

double NumpyPcg64::next_double() { return static_cast<double>(next_u64() >> 11) * (1.0 / 9007199254740992.0); }

// Lemire's nearly-divisionless method: the high word of draw * (rng + 1), rejecting the few low
// words below 2^w mod (rng + 1). `rng` is the inclusive range width.
uint32_t NumpyPcg64::bounded_lemire_u32(uint32_t rng) {
  const uint32_t excl = rng + 1;
  uint64_t m = static_cast<uint64_t>(next_u32()) * excl;
  uint32_t left = static_cast<uint32_t>(m);
  if (left < excl) {
    const uint32_t threshold = (std::numeric_limits<uint32_t>::max() - rng) % excl;
    while (left < threshold) {
      m = static_cast<uint64_t>(next_u32()) * excl;
      left = static_cast<uint32_t>(m);
    }
  }
  return static_cast<uint32_t>(m >> 32);
}

uint64_t NumpyPcg64::bounded_lemire_u64(uint64_t rng) {
  const uint64_t excl = rng + 1;
  Uint128 m = static_cast<Uint128>(next_u64()) * excl;
  uint64_t left = static_cast<uint64_t>(m);
  if (left < excl) {
    const uint64_t threshold = (std::numeric_limits<uint64_t>::max() - rng) % excl;
    while (left < threshold) {
      m = static_cast<Uint128>(next_u64()) * excl;
      left = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

std::vector<int64_t> NumpyPcg64::integers(int64_t low, int64_t high, int64_t n) {
  if (low >= high) throw Error("integers: expected low < high, got low=" + std::to_string(low) +
                               " high=" + std::to_string(high));
  if (n < 0) throw Error("integers: negative size " + std::to_string(n));
  // numpy works on the closed interval [low, high - 1] in uint64 arithmetic.
  const uint64_t rng = static_cast<uint64_t>(high - 1) - static_cast<uint64_t>(low);
  const uint64_t off = static_cast<uint64_t>(low);
  std::vector<int64_t> out(static_cast<size_t>(n));
  for (auto& v : out) {
    uint64_t r = 0;
    if (rng == 0) {
      r = 0;  // no draw at all
    } else if (rng <= 0xFFFFFFFFull) {
      r = rng == 0xFFFFFFFFull ? next_u32() : bounded_lemire_u32(static_cast<uint32_t>(rng));
    } else if (rng == std::numeric_limits<uint64_t>::max()) {
      r = next_u64();
    } else {
      r = bounded_lemire_u64(rng);
    }
    v = static_cast<int64_t>(off + r);
  }
  return out;
}

}  // namespace di
