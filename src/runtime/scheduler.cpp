#include "runtime/scheduler.h"

#include <algorithm>

#include "core/error.h"

namespace di {

Scheduler::Scheduler(const SchedulerOptions& options, KvManager& kv) : opt_(options), kv_(kv) {
  if (opt_.max_step_tokens <= 0)
    throw Error("max_step_tokens: expected a positive token budget, got " + std::to_string(opt_.max_step_tokens));
  if (opt_.max_running <= 0)
    throw Error("max_running: expected a positive number of sequences, got " + std::to_string(opt_.max_running));
  if (opt_.align_tokens < 0) throw Error("scheduler align_tokens: expected >= 0, got " + std::to_string(opt_.align_tokens));
}

bool Scheduler::add(uint64_t id, int64_t n_known, int64_t n_max, std::string* why) {
  DI_CHECK(!contains(id));
  DI_CHECK(n_known >= 1 && n_max >= n_known);
  if (!kv_.fits_alone(n_max)) {
    if (why) {
      const KvLayout& l = kv_.layout();
      *why = "the request can reach " + std::to_string(n_max) + " tokens, which need " +
             std::to_string(l.request_bytes(n_max)) + " bytes of KV (" + std::to_string(l.local_bytes) +
             " of window rings and compressor tails + " + std::to_string(l.pages_for(n_max)) + " pages of " +
             std::to_string(l.page_bytes) + " bytes), more than the KV capacity of " +
             std::to_string(kv_.capacity_bytes()) + " bytes; lower max_tokens or the prompt length";
    }
    return false;
  }
  Req r;
  r.arrival = next_arrival_++;
  r.n_known = n_known;
  r.n_max = n_max;
  reqs_[id] = r;
  waiting_.push_back(id);
  return true;
}

void Scheduler::remove(uint64_t id) {
  auto it = reqs_.find(id);
  if (it == reqs_.end()) return;
  kv_.release(id);
  if (it->second.running) running_.erase(std::find(running_.begin(), running_.end(), id));
  else waiting_.erase(std::find(waiting_.begin(), waiting_.end(), id));
  reqs_.erase(it);
}

void Scheduler::append(uint64_t id, int64_t n) {
  Req& r = reqs_.at(id);
  DI_CHECK(n >= 0 && r.n_known + n <= r.n_max);
  r.n_known += n;
}

void Scheduler::set_drafts(uint64_t id, int64_t n_draft) {
  DI_CHECK(n_draft >= 0);
  Req& r = reqs_.at(id);
  DI_CHECK(r.n_known + n_draft <= r.n_max);
  r.n_draft = n_draft;
}

void Scheduler::rollback(uint64_t id, int64_t n_computed) {
  Req& r = reqs_.at(id);
  DI_CHECK(n_computed >= 0 && n_computed <= r.n_computed);
  r.n_computed = n_computed;
  if (r.running) kv_.shrink(id, std::max(n_computed, r.n_known));
}

bool Scheduler::is_running(uint64_t id) const {
  auto it = reqs_.find(id);
  return it != reqs_.end() && it->second.running;
}

int64_t Scheduler::chunk_size(const Req& r, int64_t budget) const {
  int64_t n = std::min(r.n_known - r.n_computed, budget);
  if (opt_.align_tokens > 0) {
    int64_t boundary = (r.n_computed / opt_.align_tokens + 1) * opt_.align_tokens;
    n = std::min(n, boundary - r.n_computed);
  }
  return n;
}

void Scheduler::hold(uint64_t id, bool held) { reqs_.at(id).held = held; }

void Scheduler::enqueue_waiting(uint64_t id) {
  uint64_t arrival = reqs_.at(id).arrival;
  auto pos = std::find_if(waiting_.begin(), waiting_.end(), [&](uint64_t w) { return reqs_.at(w).arrival > arrival; });
  waiting_.insert(pos, id);
}

void Scheduler::preempt(uint64_t id, StepPlan& plan) {
  Req& r = reqs_.at(id);
  kv_.release(id);
  running_.erase(std::find(running_.begin(), running_.end(), id));
  r.running = false;
  r.held = false;
  r.n_computed = 0;
  r.n_draft = 0;
  enqueue_waiting(id);
  plan.preempted.push_back(id);
  ++n_preemptions_;
}

StepPlan Scheduler::schedule(const PrefixProbe& probe) {
  StepPlan plan;
  int64_t budget = opt_.max_step_tokens;

  // 1. running requests, oldest admission first; preempt from the newest end when pages run out
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    uint64_t id = running_[i];
    Req& r = reqs_.at(id);
    int64_t n = r.held ? 0 : chunk_size(r, budget), n_draft = 0;
    if (n == 0) {
      ++i;
      continue;
    }
    if (r.n_computed + n == r.n_known && r.n_draft > 0 && r.n_draft <= budget - n) n_draft = r.n_draft;
    int64_t need = r.n_computed + n + n_draft;
    bool self = false;
    while (!kv_.can_grow(id, need)) {
      auto newest = std::find_if(running_.rbegin(), running_.rend(), [&](uint64_t v) { return !reqs_.at(v).held; });
      uint64_t victim = *newest;  // `id` itself is not held, so there is one
      self = victim == id;
      preempt(victim, plan);
      if (self) break;
    }
    if (self) continue;  // running_[i] is now the request after it
    kv_.grow(id, need);
    StepEntry e;
    e.id = id;
    e.begin = r.n_computed;
    e.n = n + n_draft;
    e.n_draft = n_draft;
    e.sample = r.n_computed + n == r.n_known;
    plan.entries.push_back(e);
    r.n_computed += e.n;
    r.n_draft = 0;
    budget -= e.n;
    ++i;
  }

  // 2. waiting requests in arrival order, while they fit
  while (plan.preempted.empty() && !waiting_.empty() && budget > 0 &&
         static_cast<int64_t>(running_.size()) < opt_.max_running) {
    uint64_t id = waiting_.front();
    Req& r = reqs_.at(id);
    const PrefixHit hit = probe ? probe(id, r.n_known) : PrefixHit{};
    if (!kv_.can_admit(r.n_known, hit.shared_tokens)) break;
    waiting_.pop_front();
    kv_.admit(id, r.n_known, hit.shared_tokens);
    running_.push_back(id);
    r.running = true;
    r.n_draft = 0;
    r.n_computed = std::clamp<int64_t>(hit.start, 0, r.n_known - 1);
    StepEntry e;
    e.id = id;
    e.begin = r.n_computed;
    e.n = chunk_size(r, budget);
    e.sample = r.n_computed + e.n == r.n_known;
    e.admitted = true;
    plan.entries.push_back(e);
    r.n_computed += e.n;
    budget -= e.n;
  }
  plan.n_tokens = opt_.max_step_tokens - budget;
  return plan;
}

}  // namespace di
