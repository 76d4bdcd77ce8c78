// The Engine behind include/deepinfer/engine.h: one engine thread owns the model's request states,
// the scheduler, the KV accounting and the prefix cache; submit / cancel post to its inbox; results
// travel back through per-request channels.
//
// One iteration of the engine thread:
//   inbox (new requests, cancels) -> drafts -> schedule step N (admission with prefix lookup,
//   chunking, preemption) -> queue step N -> post-process step N - 2 (detokenize, stop strings,
//   events, prefix-cache inserts) -> wait for step N - 1 -> commit it (sampled ids become final;
//   finish on stop ids / length).
// Without async scheduling a step is scheduled, run on the engine thread, committed and
// post-processed in turn. With it, steps run on a worker and step N is scheduled and queued while
// step N - 1 runs: each token step N - 1 will sample is a placeholder the worker fills before step N
// feeds it, so the worker goes from one forward to the next at once. A request that turns out to
// have finished (a stop id at commit, a stop string at post-processing) may by then be in the next
// step or two: that work is discarded and its caches dropped. A request whose next tokens are not
// known yet (a verify step in flight, or its last token being sampled) is held out of scheduling.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "deepinfer/engine.h"
#include "model/model.h"
#include "runtime/drafter.h"
#include "runtime/kv_manager.h"
#include "runtime/prefix_cache.h"
#include "runtime/request_state.h"
#include "runtime/scheduler.h"
#include "runtime/step_runner.h"
#include "runtime/step_worker.h"
#include "tokenizer/tokenizer.h"

namespace di {

// Internal extension points (tests, and what comes next).
struct EngineHooks {
  std::shared_ptr<Drafter> drafter;  // verify steps with its drafts
  int64_t max_drafts = 4;
};

class EngineImpl final : public Engine {
 public:
  EngineImpl(const EngineOptions& options, EngineHooks hooks = {});
  ~EngineImpl() override;

  RequestId submit(Request request) override;
  std::optional<TokenEvent> next_event(RequestId id, std::chrono::milliseconds timeout) override;
  RequestResult wait(RequestId id) override;
  void cancel(RequestId id) override;
  EngineStats stats() const override;
  std::vector<int32_t> tokenize(const std::string& text, bool add_bos) const override;
  std::string detokenize(const std::vector<int32_t>& ids) const override;

  const ModelConfig& config() const { return model_->config(); }
  // Bytes of one page of the model's global-KV pool (fixed at load).
  int64_t kv_page_bytes() const { return model_->kv_pool().page_bytes(); }
  // Requests the engine thread still holds (0 once everything has finished and been dropped).
  int64_t n_live() const { return n_live_.load(); }

 private:
  // what post-processing of a step needs: the requests with new tokens, and captured blocks
  struct Capture {
    RequestId id;
    int64_t first_block;
    std::vector<std::shared_ptr<CachedBlock>> blocks;
  };
  struct Posted {
    std::vector<RequestId> ids;
    std::vector<Capture> captures;
  };
  struct Job {
    StepPlan plan;
    std::vector<StepTask> tasks;
    StepOutput out;
    uint64_t ticket = 0;  // on the worker
  };

  void loop();
  bool drain_inbox(bool block);
  void admit_new(std::unique_ptr<RequestState> r);
  void propose_drafts();
  Scheduler::PrefixHit probe_prefix(RequestId id, int64_t n_known);
  std::unique_ptr<Job> build_job(StepPlan plan);
  Posted commit(Job& job);
  void release_caches(RequestState& r);
  void post_process(const Posted& p);
  void insert_blocks(RequestState& r, const Capture& c);
  void end_request(RequestState& r, const std::string& reason, const std::string& error = {}, TokenEvent last = {});
  void fail(RequestState& r, const std::string& error) { end_request(r, "error", error); }
  bool exact() const { return opt_.prefix_cache == PrefixCacheMode::kExact; }
  int64_t snapshot_tokens() const { return opt_.prefix_block_tokens * opt_.exact_snapshot_blocks; }
  void drop_finished();
  void publish_stats();
  uint64_t block_key(RequestState& r, int64_t block);

  EngineOptions opt_;
  EngineHooks hooks_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tok_;
  int32_t eos_id_ = -1;
  uint64_t seed_base_ = 0;
  int64_t replay_align_ = 1;  // lcm of the compress ratios

  // engine thread only
  std::unique_ptr<KvManager> kv_;
  std::unique_ptr<Scheduler> sched_;
  std::unique_ptr<PrefixCache> cache_;
  std::unordered_map<RequestId, std::unique_ptr<RequestState>> live_;
  std::unique_ptr<StepWorker> worker_;
  std::atomic<bool> step_failed_{false};  // a failed step poisons the step queued after it
  EngineStats st_;  // the engine thread's copy
  std::optional<std::chrono::steady_clock::time_point> last_step_end_;

  // inbox
  std::mutex inbox_mu_;
  std::condition_variable inbox_cv_;
  std::vector<std::unique_ptr<RequestState>> inbox_new_;
  std::vector<RequestId> inbox_cancel_;
  bool stop_ = false;

  // channels (any thread)
  std::mutex channels_mu_;
  std::unordered_map<RequestId, std::shared_ptr<RequestChannel>> channels_;

  mutable std::mutex stats_mu_;
  EngineStats stats_;  // published copy
  std::atomic<int64_t> submitted_{0}, failed_at_submit_{0}, prompt_tokens_{0};
  std::atomic<RequestId> next_id_{1};
  std::atomic<int64_t> n_live_{0};

  std::thread thread_;
};

}  // namespace di
