// One step's work on the model: the batched forward of every scheduled chunk, then per request the
// sampling of its next token (or the verification of its draft tokens, rolling its caches back to
// the accepted prefix) and the capture of completed blocks for the prefix cache. Runs on the step
// worker (async scheduling) or on the engine thread; it touches only the states, samplers and token
// lists its job names, which the engine thread leaves alone until the step is over.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "deepinfer/engine.h"
#include "model/model.h"
#include "runtime/prefix_restore.h"
#include "sampling/sampler.h"

namespace di {

struct StepTask {
  RequestId id = 0;
  SequenceState* state = nullptr;
  std::vector<int32_t> ids;  // the chunk: positions state->n_tokens..; for a verify step the pending token + drafts
  ForwardOptions options;
  int64_t n_draft = 0;       // trailing tokens of ids that are drafts to verify
  bool sample = false;       // sample the next token from the chunk's last row (or verify)
  RequestSampler* sampler = nullptr;
  const std::vector<int32_t>* tokens = nullptr;  // prompt + output so far (read only)
  int64_t n_prompt = 0;
  const LogitMask* mask = nullptr;               // may be null or empty
  // Prefix cache: capture blocks [capture_from, n_tokens / block) after the step (-1: none), and the
  // local state when the state then ends on a block end (exact mode).
  int64_t capture_from = -1;
  bool capture_local = false;
};

struct StepTaskResult {
  std::vector<SampledToken> sampled;  // 1 token; after a verify step the accepted drafts + 1
  int64_t first_block = 0;            // index of captured[0]
  std::vector<std::shared_ptr<CachedBlock>> captured;
  int64_t n_tokens_after = 0;         // the state's positions after the step (and any rollback)
};

struct StepOutput {
  std::vector<StepTaskResult> results;  // one per task
  std::string error;                    // non-empty: the step failed as a whole (nothing is valid)
  double forward_seconds = 0;           // the forward pass
  double seconds = 0;                   // forward + sampling + captures
  std::chrono::steady_clock::time_point begin, end;  // of the whole step
};

StepOutput run_step(Model& model, std::vector<StepTask>& tasks, int64_t block_tokens);

}  // namespace di
