// numpy's default generator, reproduced bit for bit: `np.random.default_rng(seed)` is
// PCG64(SeedSequence(seed)), and Engram's hash multipliers come from
// `default_rng(10007 * layer_id).integers(0, bound, size, dtype=np.int64)` (spec §2.7).
//
// Pieces (numpy/random/bit_generator.pyx, src/pcg64/pcg64.h, src/distributions/distributions.c):
//  - SeedSequence: the seed as little-endian uint32 words, hashed into a 4-word pool, then
//    generate_state() hashes the pool into as many words as asked for.
//  - PCG64: 128-bit LCG, state advanced before each XSL-RR output; seeded with
//    state = w0:w1, increment = w2:w3 of generate_state(4, uint64).
//  - integers(): ranges up to 2^32 use Lemire's method on 32-bit draws (two per 64-bit output, low
//    half first), wider ranges Lemire's method on 64-bit draws.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace di {

__extension__ typedef unsigned __int128 Uint128;  // GCC/Clang; -Wpedantic needs __extension__

// numpy.random.SeedSequence with the default pool size 4 and no spawn key.
class NumpySeedSequence {
 public:
  // entropy: the seed as uint32 words, least significant first (numpy: an int n > 0 becomes its
  // base-2^32 digits, 0 becomes [0]).
  explicit NumpySeedSequence(const std::vector<uint32_t>& entropy);
  // A non-negative integer seed.
  explicit NumpySeedSequence(uint64_t seed);

  const std::array<uint32_t, 4>& pool() const { return pool_; }
  std::vector<uint32_t> generate_state_u32(int n_words) const;
  // Pairs of uint32 words, low word first (numpy views the uint32 array as uint64).
  std::vector<uint64_t> generate_state_u64(int n_words) const;

 private:
  std::array<uint32_t, 4> pool_{};
};

// numpy.random.PCG64 plus the Generator methods the engine needs.
class NumpyPcg64 {
 public:
  // np.random.default_rng(seed) for a non-negative integer seed.
  explicit NumpyPcg64(uint64_t seed);
  explicit NumpyPcg64(const NumpySeedSequence& seq);

  uint64_t next_u64();
  // Buffered: one 64-bit output serves two calls, low half first.
  uint32_t next_u32();
  // Generator.random(): 53 random bits in [0, 1).
  double next_double();

  // Generator.integers(low, high, size=n, dtype=np.int64), high exclusive. Requires low < high.
  std::vector<int64_t> integers(int64_t low, int64_t high, int64_t n);

  Uint128 state() const { return state_; }
  Uint128 increment() const { return inc_; }

 private:
  void step();
  uint32_t bounded_lemire_u32(uint32_t rng);
  uint64_t bounded_lemire_u64(uint64_t rng);

  Uint128 state_ = 0;
  Uint128 inc_ = 0;
  bool has_u32_ = false;
  uint32_t u32_ = 0;
};

}  // namespace di
