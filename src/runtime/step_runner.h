// One step's work on the model: set up the caches of newly admitted requests (fresh, or restored
// from a prefix-cache hit), the batched forward of every scheduled chunk, then per request the
// sampling of its next token (or the verification of its draft tokens, rolling its caches back to
// the accepted prefix) and the capture of completed blocks for the prefix cache.
//
// Runs on the step worker (async scheduling) or on the engine thread. It reads the token lists and
// writes the caches of the requests in the step; the engine thread leaves those caches alone until
// the step is over and only appends to the token lists (their storage is reserved up front, so it
// never moves). A sampled token is written into its placeholder in the token list right away, so the
// next step -- already queued -- feeds it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "deepinfer/engine.h"
#include "model/model.h"
#include "runtime/prefix_restore.h"
#include "sampling/sampler.h"

namespace di {

struct StepTask {
  RequestId id = 0;
  std::unique_ptr<SequenceState>* caches = nullptr;  // the request's caches
  // First chunk after admission: create the caches, from the prefix-cache hit when there is one.
  bool create = false;
  std::optional<PrefixCache::Hit> hit;
  bool exact_hit = false;    // restore_exact, else restore_replay from hit_start
  int64_t hit_start = 0;
  std::vector<int32_t>* tokens = nullptr;  // prompt + outputs; [begin, begin + n) is fed
  int64_t begin = 0, n = 0;
  std::vector<int32_t> drafts;  // fed after the chunk and verified (the chunk is then 1 token)
  ForwardOptions options;
  bool sample = false;       // sample the token at position begin + n (after the drafts: verify them)
  bool fill = false;         // write it into its placeholder (*tokens)[begin + n]
  RequestSampler* sampler = nullptr;
  int64_t n_prompt = 0;
  const LogitMask* mask = nullptr;  // may be null or empty
  // Prefix cache: capture blocks [capture_from, n_tokens / block) after the step (-1: none), with
  // the local state when the caches then end on a multiple of snapshot_tokens (exact mode; 0: never).
  int64_t capture_from = -1;
  int64_t snapshot_tokens = 0;
};

struct StepTaskResult {
  std::vector<SampledToken> sampled;  // 1 token; after a verify step the accepted drafts + 1
  int64_t first_block = 0;            // index of captured[0]
  std::vector<std::shared_ptr<CachedBlock>> captured;
  int64_t n_tokens_after = 0;         // the caches' positions after the step (and any rollback)
};

struct StepOutput {
  std::vector<StepTaskResult> results;  // one per task
  std::string error;                    // non-empty: the step failed as a whole (nothing is valid)
  double forward_seconds = 0;           // the forward pass
  std::chrono::steady_clock::time_point begin, end;  // of the whole step
};

// `started` (may be empty) is called once the step's clock has started.
StepOutput run_step(Model& model, std::vector<StepTask>& tasks, int64_t block_tokens,
                    const std::function<void()>& started = {});

}  // namespace di
