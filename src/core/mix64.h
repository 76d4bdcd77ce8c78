// The splitmix64 finaliser: a bijection on 64-bit words with full avalanche, for hashing (prefix
// cache block keys) and counter-based random numbers (sampling).
#pragma once

#include <cstdint>

namespace di {

inline constexpr uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}

}  // namespace di
