// Counter-based random numbers for sampling: the uniform used for output token i of a request is a
// pure function of (seed, i, lane). There is no generator state to advance, so a request's draws do
// not depend on what else is batched with it, on the order requests are served, on preemption and
// recomputation, or on speculative tokens that were rolled back: re-sampling token i gives the same
// uniform. `lane` gives further independent numbers for the same token (e.g. the accept test of
// speculative decoding) without touching lane 0, the one the sampler uses.
//
// Construction: the splitmix64 finaliser (a bijection on 64-bit words with full avalanche) applied
// to a key derived from the seed plus the counter times an odd constant (the Weyl sequence of
// splitmix64), then once more with the lane folded in. The seed is hashed first so that nearby
// seeds (0, 1, 2, ...) give unrelated streams rather than shifted copies of one stream.
#pragma once

#include <cstdint>

#include "core/mix64.h"

namespace di {

// 64 random bits for (seed, index, lane).
inline constexpr uint64_t counter_bits(uint64_t seed, uint64_t index, uint64_t lane = 0) {
  constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ull;  // 2^64 / golden ratio, odd
  uint64_t key = mix64(seed ^ 0x5DEECE66Dull);
  uint64_t x = mix64(key + kGamma * (index + 1));
  return mix64(x ^ (lane * 0xD1B54A32D192ED03ull));
}

// A uniform double in [0, 1) with 53 random bits, for (seed, index, lane).
inline constexpr double counter_uniform(uint64_t seed, uint64_t index, uint64_t lane = 0) {
  return static_cast<double>(counter_bits(seed, index, lane) >> 11) * 0x1.0p-53;
}

}  // namespace di
