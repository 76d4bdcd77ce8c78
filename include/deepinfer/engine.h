// DeepInfer's public C++ API: one Engine owns a model and one engine thread that holds all inference
// state; any thread submits requests, streams or collects their results, cancels them and reads stats.
//
//   auto engine = di::Engine::create({.model_dir = "models/x"});
//   di::RequestId id = engine->submit({.prompt = "Once upon a time", .sampling = {.max_tokens = 32}});
//   di::RequestResult r = engine->wait(id);
//
// A request that is invalid (bad UTF-8, bad chat JSON, prompt longer than the context, sampling field
// out of range) or that can never fit the KV capacity finishes alone with finish_reason "error" and a
// message naming what was wrong; other requests are not affected.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "deepinfer/sampling_params.h"

namespace di {

enum class PrefixCacheMode {
  kOff,
  // SWA bounded replay (spec §3.4): only the global rows (compressed KV + index keys) are cached; a hit
  // ending at H re-runs [H - window, H) to rebuild window rings and compressor tails. Not bit-identical.
  kReplay,
  // Global rows plus the per-layer local state at block ends: a warm hit gives bit-identical logits.
  kExact,
};

struct EngineOptions {
  std::filesystem::path model_dir;      // empty: the embedded default model
  std::string device = "cpu";           // "cpu" | "cuda"
  int64_t max_step_tokens = 2048;       // token budget of one step (prefill chunks + decodes)
  int max_running = 64;                 // sequences in one step at most
  // KV memory for running requests; 0: what max_running requests of up to 128K positions could use,
  // capped at 45% of the device's free memory after the weights, less a workspace reserve
  // (runtime/kv_budget.h)
  int64_t kv_capacity_bytes = 0;
  PrefixCacheMode prefix_cache = PrefixCacheMode::kReplay;
  int64_t prefix_cache_bytes = 0;       // 0: as much as kv_capacity_bytes
  bool decoder_replay = false;          // decoder-side SWA bounded replay in prefill (approximate)
  bool batch_invariant = false;         // a request's logits independent of batch and chunking
  // CUDA: the MXFP4 expert GEMMs sum each 32-wide K block on the FP8 wgmma tensor cores (~14-bit block
  // sums, as DeepGEMM's FP8 GEMMs) instead of exactly: a faster MoE at batch >= 8, logits no longer
  // the CPU reference's to rounding (bench/RESULTS.md). Deterministic; combines with batch_invariant.
  bool fast_fp4_gemm = false;
  bool async_scheduling = true;         // prepare step N+1 while step N runs
  bool reference_decode_quirks = false; // reproduce the official reference's decode (tests only)
  int64_t kv_page_tokens = 64;          // positions per KV page (a multiple of every compress ratio)
  // Prefix-cache block: a multiple of kv_page_tokens (its pages are shared with the requests that hit
  // it, not copied) and of every compress ratio. A replay hit is adopted only when it is
  // longer than the sliding window, so blocks much shorter than the window only matter in kExact.
  int64_t prefix_block_tokens = 64;
  // kExact: a snapshot of the local state (window rings and compressor tails, ~2.9 MB on V4.1-Flash,
  // 50x a block's global rows) every this many blocks. A hit resumes at the last snapshot it covers,
  // and prefill chunks end on snapshots: 1 (default) hits at any block but prefills 64 tokens a step;
  // 8 snapshots every 512 positions (8x less snapshot memory, 8x fewer prefill steps).
  int64_t exact_snapshot_blocks = 1;
};

using RequestId = uint64_t;

// A per-request logit mask: given the tokens generated so far, fills `allowed` (one bit per token
// id: bit id % 32 of word id / 32; every bit starts set) and returns true to apply it (false: no
// mask for this token). Called on the engine's step worker, once per sampled position, never
// concurrently for one request; it must not block. For structured outputs.
using LogitMask = std::function<bool(std::span<const int32_t> output, std::span<uint32_t> allowed)>;

struct Request {
  // Exactly one of these three is the input.
  std::vector<int32_t> prompt_ids;      // token ids, used as given (no BOS added)
  std::optional<std::string> prompt;    // text: BOS + its tokens
  std::optional<std::string> chat_json; // an OpenAI chat-completions body (messages, tools, thinking...)
  SamplingParams sampling;
  bool stream = false;                  // deliver TokenEvents as tokens are produced
  LogitMask logit_mask;                 // optional
};

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0.0f;
};

struct TokenEvent {
  RequestId id = 0;
  std::vector<int32_t> token_ids;       // new tokens since the last event
  std::string text;                     // new complete UTF-8 text (held back while it may start a stop string)
  std::vector<float> logprobs;          // per new token (when requested)
  std::vector<std::vector<TokenLogprob>> top_logprobs;
  bool finished = false;
  std::string finish_reason;            // when finished: "stop" | "length" | "cancelled" | "error"
  std::string error;                    // when finish_reason == "error"
};

struct RequestResult {
  RequestId id = 0;
  std::string text;
  std::vector<int32_t> token_ids;       // generated tokens
  std::vector<float> logprobs;
  std::vector<std::vector<TokenLogprob>> top_logprobs;
  std::string finish_reason;            // "stop" | "length" | "cancelled" | "error"
  std::string error;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;            // prompt tokens served from the prefix cache
};

struct EngineStats {
  int64_t steps = 0;
  int64_t requests_submitted = 0, requests_finished = 0, requests_cancelled = 0, requests_failed = 0;
  int64_t running = 0, waiting = 0;
  int64_t prompt_tokens = 0, generated_tokens = 0;
  int64_t prefix_hit_tokens = 0;        // prompt tokens whose forward a prefix-cache hit skipped
  int64_t prefix_lookup_tokens = 0;     // prompt tokens looked up (at each admission)
  int64_t prefix_replay_tokens = 0;     // tokens of hits re-run by SWA bounded replay
  int64_t draft_tokens = 0, accepted_draft_tokens = 0;  // verify steps
  int64_t discarded_tokens = 0;         // sampled for requests that had finished (async scheduling)
  int64_t preemptions = 0;
  int64_t kv_used_bytes = 0, kv_capacity_bytes = 0, prefix_cache_bytes = 0;
  int64_t kv_pages_in_use = 0;          // global-KV pool pages held by requests and the prefix cache (shared once)
  double busy_seconds = 0;              // time spent in forward passes
  double host_gap_seconds = 0;          // device idle between steps (async scheduling shrinks it)
  int64_t host_gaps = 0;                // gaps measured (back-to-back steps)
};

class Engine {
 public:
  // Loads the model and starts the engine thread. Throws di::Error for a bad model or options.
  static std::unique_ptr<Engine> create(const EngineOptions& options);
  virtual ~Engine() = default;  // cancels what is pending and joins the engine thread

  // Thread-safe. Never throws for a bad request: the request finishes with finish_reason "error".
  virtual RequestId submit(Request request) = 0;
  // Streaming: the next event of a request submitted with stream = true; nullopt on timeout (or an
  // unknown id). After the event with finished = true there are no more. A request that is not
  // streamed has one event, the finished one, carrying the whole output.
  virtual std::optional<TokenEvent> next_event(RequestId id, std::chrono::milliseconds timeout) = 0;
  // Blocks until the request finishes; returns its whole result (also for streamed requests) and
  // forgets the request (a second wait, or an unknown id, gives finish_reason "error").
  virtual RequestResult wait(RequestId id) = 0;
  virtual void cancel(RequestId id) = 0;
  virtual EngineStats stats() const = 0;
  // Tokenizer access for front ends (chat encoding, counting). Special tokens in `text` are matched.
  virtual std::vector<int32_t> tokenize(const std::string& text, bool add_bos) const = 0;
  virtual std::string detokenize(const std::vector<int32_t>& ids) const = 0;
};

}  // namespace di
