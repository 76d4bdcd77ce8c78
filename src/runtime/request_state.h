// Everything the engine thread keeps about one request, from submission to its final event. Only the
// engine thread touches it, except while steps that include it are queued or running: the step worker
// then reads `tokens` and fills the placeholders of the tokens it samples, uses `sampler` and writes
// `seq` (see step_runner.h); the engine thread leaves `seq` alone and only appends to `tokens`.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "deepinfer/engine.h"
#include "model/sequence_state.h"
#include "runtime/prefix_cache.h"
#include "runtime/request_channel.h"
#include "sampling/sampler.h"
#include "sampling/stop_checker.h"
#include "tokenizer/detokenizer.h"

namespace di {

// Where a request is, in chronological order.
enum class RequestPhase {
  kWaiting,   // queued (new, or preempted: its caches were freed and will be recomputed)
  kRunning,   // holds KV; prefilling or decoding
  kStopping,  // its last token is committed (stop id / length); the final event is still to be sent
  kFinished,  // the final event is sent; dropped once no step holds it
};

struct RequestState {
  RequestId id = 0;
  Request request;                  // sampling.seed resolved
  // prompt + outputs; the outputs of steps still in flight are placeholders (-1) until the worker
  // samples them. Reserved for the longest it can get, so appending never moves it.
  std::vector<int32_t> tokens;
  int64_t n_committed = 0;          // outputs whose step is over (their ids are final)
  int64_t n_prompt = 0;
  int64_t max_tokens = 0;           // generation cap (sampling.max_tokens capped by the context)
  std::optional<RequestSampler> sampler;
  std::optional<StopChecker> stop;
  std::optional<Detokenizer> detok;
  std::shared_ptr<RequestChannel> channel;
  RequestPhase phase = RequestPhase::kWaiting;
  int in_flight = 0;                // queued or running steps that include it

  std::unique_ptr<SequenceState> seq;  // its caches while running (created by its first step)
  int64_t keep_global_before = 0;   // replay hit end: chunks below it keep the cached global rows

  // prefix cache
  std::optional<PrefixCache::Hit> pending_hit;  // looked up at admission, applied right after
  std::vector<std::shared_ptr<const PrefixCache::Payload>> adopted;  // the applied hit's blocks, while `seq` maps their pages
  int64_t pending_start = 0;
  std::vector<uint64_t> block_keys;  // chained keys of its complete blocks so far (computed lazily)
  int64_t n_blocks_done = 0;         // its blocks known to be in the cache (or captured)
  int64_t cached_tokens = 0;

  // output bookkeeping
  int64_t n_posted = 0;             // outputs through stop checks and events
  std::vector<float> logprobs;      // per committed output (when requested)
  std::vector<std::vector<TokenLogprob>> top_logprobs;
  std::vector<int32_t> drafts;      // proposed for its next verify step

  int64_t n_output() const { return static_cast<int64_t>(tokens.size()) - n_prompt; }  // placeholders included
  int64_t n_max() const { return n_prompt + max_tokens; }
};

}  // namespace di
