// The step scheduler: continuous batching with chunked prefill under a token budget, prefills and
// decodes in one step, admission by KV capacity, preemption (free and recompute) when memory runs
// out. Pure logic over request sizes and a KvManager: it never sees tokens, tensors or a model, so
// its decisions are unit-tested as step-by-step timelines.
//
// A request is a sequence of n_known tokens (prompt + committed outputs) of which n_computed are in
// its KV cache. A step gives each scheduled request a chunk [n_computed, n_computed + n); when the
// chunk reaches n_known its last position's logits produce the next token (`sample`). After the
// step the engine reports the new token with append(); a finished or cancelled request is remove()d.
//
// Policy, each step:
//  1. running requests in admission order take min(pending, budget) tokens (1 for a decode, more
//     for a prefill chunk or a verify step with drafts); when a request's pages cannot grow, the most
//     recently admitted running request is preempted (its KV freed, n_computed reset, back to the
//     front of the waiting queue) until it fits -- possibly the request itself;
//  2. waiting requests in arrival order are admitted while the budget, max_running and the KV
//     capacity (pages for all their known tokens) allow; the first that does not fit stops admission
//     (no overtaking) and nothing is admitted in a step that preempted.
// A held request (its next tokens are not known yet: a verify step in flight, or its last token is
// being sampled) keeps its KV but is not scheduled, and is never chosen for preemption.
// Requests that could never fit the capacity (even alone, at their largest size) are refused by add().
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/kv_manager.h"

namespace di {

struct SchedulerOptions {
  int64_t max_step_tokens = 2048;  // token budget of one step
  int max_running = 64;            // requests holding KV at once
  // > 0: a prefill chunk ends at the first multiple of align_tokens after its start, so the request's
  // caches stop at every block end (exact prefix caching snapshots its local state there).
  int64_t align_tokens = 0;
};

struct StepEntry {
  uint64_t id = 0;
  int64_t begin = 0;    // first position of the chunk (= n_computed before the step)
  int64_t n = 0;        // tokens in the chunk
  int64_t n_draft = 0;  // of which trailing draft tokens to verify (not yet known tokens)
  bool sample = false;  // the chunk reaches the known end: its logits give the next token
  bool admitted = false;  // first chunk since admission (the engine sets up the request's caches)
};

struct StepPlan {
  std::vector<StepEntry> entries;
  std::vector<uint64_t> preempted;  // lost their KV this step (in preemption order)
  int64_t n_tokens = 0;
  bool empty() const { return entries.empty(); }
};

class Scheduler {
 public:
  Scheduler(const SchedulerOptions& options, KvManager& kv);

  // A new request at the back of the waiting queue. n_max: the most tokens it can reach (prompt +
  // max_tokens, clamped to the context). Returns false (and keeps nothing) when it could never fit;
  // `why` then says so with the numbers.
  bool add(uint64_t id, int64_t n_known, int64_t n_max, std::string* why = nullptr);
  // Forgets a request (finished, cancelled or failed) and frees its KV.
  void remove(uint64_t id);
  // n new committed tokens (the sampled token; after a verify step, the accepted ones).
  void append(uint64_t id, int64_t n = 1);
  // Drafts to verify in the request's next decode chunk (cleared when scheduled).
  void set_drafts(uint64_t id, int64_t n_draft);
  // After a verify step: only n_computed positions stay in the caches (the rejected drafts' rows are
  // rolled back); pages beyond them are returned.
  void rollback(uint64_t id, int64_t n_computed);
  // Holds / releases a request (see above).
  void hold(uint64_t id, bool held = true);

  // Called when a waiting request is about to be admitted: `start`, how many of its tokens are
  // already available (a prefix-cache hit; at most n_known - 1 are used), and `shared_tokens`, the
  // leading positions whose KV pages it will share with the cache instead of taking its own (not
  // charged to it: KvManager::admit). Empty: none.
  struct PrefixHit {
    int64_t start = 0;
    int64_t shared_tokens = 0;
  };
  using PrefixProbe = std::function<PrefixHit(uint64_t id, int64_t n_known)>;
  StepPlan schedule(const PrefixProbe& probe = {});

  bool contains(uint64_t id) const { return reqs_.count(id) != 0; }
  bool is_running(uint64_t id) const;
  int64_t n_running() const { return static_cast<int64_t>(running_.size()); }
  int64_t n_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t n_computed(uint64_t id) const { return reqs_.at(id).n_computed; }
  int64_t n_known(uint64_t id) const { return reqs_.at(id).n_known; }
  int64_t n_preemptions() const { return n_preemptions_; }
  const KvManager& kv() const { return kv_; }

 private:
  struct Req {
    uint64_t arrival = 0;  // order of add(); the waiting queue is kept in this order
    int64_t n_known = 0, n_computed = 0, n_max = 0, n_draft = 0;
    bool running = false, held = false;
  };
  int64_t chunk_size(const Req& r, int64_t budget) const;
  void preempt(uint64_t id, StepPlan& plan);
  void enqueue_waiting(uint64_t id);

  SchedulerOptions opt_;
  KvManager& kv_;
  std::unordered_map<uint64_t, Req> reqs_;
  std::vector<uint64_t> running_;  // admission order
  std::deque<uint64_t> waiting_;   // arrival order
  uint64_t next_arrival_ = 0;
  int64_t n_preemptions_ = 0;
};

}  // namespace di
