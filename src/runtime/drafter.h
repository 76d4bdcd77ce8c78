// Hook for speculative decoding: proposes draft tokens that the engine verifies in one step with the
// request's pending token, keeping the accepted prefix and rolling the caches back past it. A token is
// accepted when the sampler, drawing exactly as a plain decode would (same seed, same output index),
// picks it, so outputs do not depend on the drafts. DSpark plugs in here; tests use random drafts.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "deepinfer/engine.h"

namespace di {

class Drafter {
 public:
  virtual ~Drafter() = default;
  // Up to max_drafts tokens to follow `tokens` (the request's prompt + output; the last one is the
  // pending token). Called on the engine thread before each decode step of a running request.
  virtual std::vector<int32_t> propose(RequestId id, std::span<const int32_t> tokens, int64_t max_drafts) = 0;
};

}  // namespace di
