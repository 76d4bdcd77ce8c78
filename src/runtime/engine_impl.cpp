#include "runtime/engine_impl.h"

#include <algorithm>
#include <deque>
#include <numeric>
#include <random>

#include "core/error.h"
#include "runtime/default_model.h"
#include "runtime/kv_budget.h"
#include "runtime/request_input.h"
#include "sampling/counter_rng.h"

namespace di {
namespace {

// Contexts longer than this do not size the default KV capacity (a 1M-token context would ask for
// 0.9 GB per request on V4.1-Flash).
constexpr int64_t kDefaultCapacityContext = 131072;

bool is_stop_id(const SamplingParams& p, int32_t eos, int32_t id) {
  if (id == eos && !p.ignore_eos) return true;
  return std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), id) != p.stop_token_ids.end();
}

}  // namespace

std::unique_ptr<Engine> Engine::create(const EngineOptions& options) { return std::make_unique<EngineImpl>(options); }

EngineImpl::EngineImpl(const EngineOptions& options, EngineHooks hooks) : opt_(options), hooks_(std::move(hooks)) {
  if (opt_.prefix_cache == PrefixCacheMode::kExact && opt_.decoder_replay)
    throw Error("decoder_replay is an approximation (the decoder layers see only the last window of a prefill "
                "chunk); it cannot be combined with prefix_cache = kExact");
  if (opt_.batch_invariant && opt_.reference_decode_quirks)
    throw Error("batch_invariant needs reference_decode_quirks = false: the reference's decode makes a "
                "request's logits depend on how its prompt was chunked");
  if (opt_.kv_capacity_bytes < 0) throw Error("kv_capacity_bytes: expected >= 0, got " + std::to_string(opt_.kv_capacity_bytes));
  std::filesystem::path dir = opt_.model_dir.empty() ? default_model_dir() : opt_.model_dir;
  backend_ = make_backend(opt_.device);
  backend_->set_batch_invariant(opt_.batch_invariant);  // reduction orders independent of the batch
  backend_->set_fast_fp4_gemm(opt_.fast_fp4_gemm);
  ModelOptions mo;
  mo.reference_decode_quirks = opt_.reference_decode_quirks;
  mo.kv_page_tokens = opt_.kv_page_tokens;
  model_ = Model::load(dir, *backend_, mo);
  tok_ = Tokenizer::load(dir);
  const ModelConfig& cfg = model_->config();
  eos_id_ = tok_->eos_id() >= 0 ? tok_->eos_id() : cfg.eos_token_id;

  for (const LayerSchedule& ls : cfg.layers)
    if (ls.ratio > 0) replay_align_ = std::lcm(replay_align_, static_cast<int64_t>(ls.ratio));
  if (opt_.prefix_block_tokens <= 0 || opt_.prefix_block_tokens % replay_align_ != 0)
    throw Error("prefix_block_tokens: expected a positive multiple of every compress ratio (" +
                std::to_string(replay_align_) + "), got " + std::to_string(opt_.prefix_block_tokens));
  if (opt_.exact_snapshot_blocks <= 0)
    throw Error("exact_snapshot_blocks: expected a positive number of blocks, got " +
                std::to_string(opt_.exact_snapshot_blocks));
  if (opt_.prefix_block_tokens % opt_.kv_page_tokens != 0)  // a cached block is whole pages, shared
    throw Error("prefix_block_tokens: expected a multiple of kv_page_tokens (" + std::to_string(opt_.kv_page_tokens) +
                "), got " + std::to_string(opt_.prefix_block_tokens));

  KvLayout layout = KvLayout::from_config(cfg, opt_.kv_page_tokens);
  int64_t capacity = opt_.kv_capacity_bytes;
  if (capacity == 0)  // what the requests could use, within what the device has free after the weights
    capacity = default_kv_budget(
                   opt_.max_running * layout.request_bytes(std::min<int64_t>(cfg.max_position, kDefaultCapacityContext)),
                   layout.request_bytes(layout.page_tokens), opt_.device)
                   .capacity_bytes;
  kv_ = std::make_unique<KvManager>(layout, capacity);
  SchedulerOptions so;
  so.max_step_tokens = opt_.max_step_tokens;
  so.max_running = opt_.max_running;
  // exact prefix caching snapshots the local state at block ends: prefill chunks stop on them
  if (opt_.prefix_cache == PrefixCacheMode::kExact) so.align_tokens = snapshot_tokens();
  sched_ = std::make_unique<Scheduler>(so, *kv_);
  int64_t cache_bytes = opt_.prefix_cache_bytes > 0 ? opt_.prefix_cache_bytes : capacity;
  if (opt_.prefix_cache == PrefixCacheMode::kOff) cache_bytes = 0;
  cache_ = std::make_unique<PrefixCache>(opt_.prefix_block_tokens, cache_bytes);
  if (opt_.async_scheduling) worker_ = std::make_unique<StepWorker>();
  seed_base_ = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  st_.kv_capacity_bytes = capacity;
  stats_ = st_;
  thread_ = std::thread([this] { loop(); });
}

EngineImpl::~EngineImpl() {
  {
    std::lock_guard<std::mutex> lock(inbox_mu_);
    stop_ = true;
  }
  inbox_cv_.notify_all();
  thread_.join();
}

// ---- any thread ---------------------------------------------------------------------------------

RequestId EngineImpl::submit(Request request) {
  const RequestId id = next_id_++;
  auto channel = std::make_shared<RequestChannel>(id, request.stream);
  {
    std::lock_guard<std::mutex> lock(channels_mu_);
    channels_[id] = channel;
  }
  ++submitted_;
  auto r = std::make_unique<RequestState>();
  try {
    PreparedInput in = prepare_input(request, *tok_, model_->config());
    r->id = id;
    r->request = std::move(request);
    r->request.prompt_ids.clear();
    r->request.prompt.reset();
    r->request.chat_json.reset();
    if (!r->request.sampling.seed) r->request.sampling.seed = mix64(seed_base_ + id);
    r->n_prompt = static_cast<int64_t>(in.prompt.size());
    r->max_tokens = in.max_tokens;
    r->tokens = std::move(in.prompt);
    // room for every output, and the drafts of a verify step, without reallocating (see RequestState)
    r->tokens.reserve(static_cast<size_t>(r->n_max() + hooks_.max_drafts + 1));
    r->sampler.emplace(r->request.sampling, model_->config().vocab_size, std::span<const int32_t>(r->tokens));
    r->stop.emplace(r->request.sampling, eos_id_, r->max_tokens);
    r->detok.emplace(*tok_, /*skip_special=*/true);
    r->channel = channel;
  } catch (const std::exception& e) {
    ++failed_at_submit_;
    RequestResult res;
    res.finish_reason = "error";
    res.error = e.what();
    channel->finish(std::move(res), TokenEvent{});
    return id;
  }
  prompt_tokens_ += r->n_prompt;
  {
    std::lock_guard<std::mutex> lock(inbox_mu_);
    inbox_new_.push_back(std::move(r));
  }
  inbox_cv_.notify_all();
  return id;
}

std::optional<TokenEvent> EngineImpl::next_event(RequestId id, std::chrono::milliseconds timeout) {
  std::shared_ptr<RequestChannel> ch;
  {
    std::lock_guard<std::mutex> lock(channels_mu_);
    auto it = channels_.find(id);
    if (it == channels_.end()) return std::nullopt;
    ch = it->second;
  }
  return ch->next_event(timeout);
}

RequestResult EngineImpl::wait(RequestId id) {
  std::shared_ptr<RequestChannel> ch;
  {
    std::lock_guard<std::mutex> lock(channels_mu_);
    auto it = channels_.find(id);
    if (it == channels_.end()) {
      RequestResult r;
      r.id = id;
      r.finish_reason = "error";
      r.error = "unknown request id " + std::to_string(id) + " (never submitted, or already waited for)";
      return r;
    }
    ch = it->second;
  }
  RequestResult r = ch->wait();
  std::lock_guard<std::mutex> lock(channels_mu_);
  channels_.erase(id);
  return r;
}

void EngineImpl::cancel(RequestId id) {
  {
    std::lock_guard<std::mutex> lock(inbox_mu_);
    inbox_cancel_.push_back(id);
  }
  inbox_cv_.notify_all();
}

EngineStats EngineImpl::stats() const {
  EngineStats s;
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    s = stats_;
  }
  s.requests_submitted = submitted_.load();
  s.requests_failed += failed_at_submit_.load();
  s.prompt_tokens = prompt_tokens_.load();
  return s;
}

std::vector<int32_t> EngineImpl::tokenize(const std::string& text, bool add_bos) const {
  std::vector<int32_t> ids;
  if (add_bos && tok_->bos_id() >= 0) ids.push_back(tok_->bos_id());
  std::vector<int32_t> body = tok_->encode(text, /*allow_special=*/true);
  ids.insert(ids.end(), body.begin(), body.end());
  return ids;
}

std::string EngineImpl::detokenize(const std::vector<int32_t>& ids) const { return tok_->decode(ids); }

// ---- engine thread ------------------------------------------------------------------------------

void EngineImpl::loop() {
  const size_t depth = worker_ ? 2 : 1;  // steps in flight at most
  std::deque<std::unique_ptr<Job>> jobs;
  std::optional<Posted> pending;  // a committed step whose post-processing overlaps the next forward
  bool idle = false;
  for (;;) {
    try {
      if (drain_inbox(idle && jobs.empty() && !pending)) break;
      idle = false;
      drop_finished();
      bool queued = false;
      if (jobs.size() < depth) {
        if (hooks_.drafter) propose_drafts();
        StepPlan plan = sched_->schedule([this](uint64_t id, int64_t n_known) { return probe_prefix(id, n_known); });
        for (uint64_t id : plan.preempted) {
          RequestState& r = *live_.at(id);
          r.phase = RequestPhase::kWaiting;
          r.pending_hit.reset();
          r.drafts.clear();
          release_caches(r);  // now, or when its step in flight is committed
        }
        if (!plan.empty()) {
          jobs.push_back(build_job(std::move(plan)));
          Job* job = jobs.back().get();
          if (worker_)
            job->ticket = worker_->enqueue([this, job](const std::function<void()>& started) {
              if (step_failed_) {
                job->out.error = "an earlier step failed";
                return;
              }
              job->out = run_step(*model_, job->tasks, opt_.prefix_block_tokens, started);
              if (!job->out.error.empty()) step_failed_ = true;
            });
          queued = true;
        }
      }
      if (jobs.empty()) {
        if (pending) post_process(*pending);
        pending.reset();
        drop_finished();
        last_step_end_.reset();
        idle = true;
        publish_stats();
        continue;
      }
      if (pending) {  // overlaps the forward of the steps in flight
        post_process(*pending);
        pending.reset();
      }
      if (queued && jobs.size() < depth) continue;  // queue the next step before waiting for this one
      Job& job = *jobs.front();
      if (worker_) worker_->wait(job.ticket);
      else job.out = run_step(*model_, job.tasks, opt_.prefix_block_tokens);
      if (last_step_end_) {
        st_.host_gap_seconds += std::chrono::duration<double>(job.out.begin - *last_step_end_).count();
        ++st_.host_gaps;
      }
      last_step_end_ = job.out.end;
      ++st_.steps;
      st_.busy_seconds += job.out.forward_seconds;
      Posted p = commit(job);
      jobs.pop_front();
      if (jobs.empty()) step_failed_ = false;
      if (worker_) pending = std::move(p);
      else post_process(p);
      publish_stats();
    } catch (const std::exception& ex) {
      // a bug of ours: fail what is live rather than take the process down
      for (auto& j : jobs)
        if (worker_) worker_->wait(j->ticket);
      jobs.clear();
      pending.reset();
      for (auto& [id, r] : live_) {
        r->in_flight = 0;
        fail(*r, std::string("engine error: ") + ex.what());
      }
      drop_finished();
    }
  }
  for (auto& j : jobs)
    if (worker_) worker_->wait(j->ticket);
  for (auto& [id, r] : live_) r->in_flight = 0;
  if (pending) post_process(*pending);
  for (auto& [id, r] : live_) end_request(*r, "cancelled");
  live_.clear();
  n_live_ = 0;
  publish_stats();
}

bool EngineImpl::drain_inbox(bool block) {
  std::vector<std::unique_ptr<RequestState>> news;
  std::vector<RequestId> cancels;
  bool stop;
  {
    std::unique_lock<std::mutex> lock(inbox_mu_);
    if (block) {
      last_step_end_.reset();  // an idle engine is not a host gap
      inbox_cv_.wait(lock, [&] { return stop_ || !inbox_new_.empty() || !inbox_cancel_.empty(); });
    }
    news.swap(inbox_new_);
    cancels.swap(inbox_cancel_);
    stop = stop_;
  }
  for (auto& r : news) {
    if (stop) {
      end_request(*r, "cancelled");
      continue;
    }
    admit_new(std::move(r));
  }
  for (RequestId id : cancels) {
    auto it = live_.find(id);
    if (it == live_.end()) continue;
    RequestState& r = *it->second;
    if (r.phase == RequestPhase::kWaiting || r.phase == RequestPhase::kRunning) end_request(r, "cancelled");
  }
  return stop;
}

void EngineImpl::admit_new(std::unique_ptr<RequestState> r) {
  std::string why;
  if (!sched_->add(r->id, static_cast<int64_t>(r->tokens.size()), r->n_max(), &why)) {
    fail(*r, why);
    return;
  }
  RequestId id = r->id;
  live_[id] = std::move(r);
  n_live_ = static_cast<int64_t>(live_.size());
}

void EngineImpl::propose_drafts() {
  const int64_t window = model_->config().window;
  for (auto& [id, r] : live_) {
    if (r->phase != RequestPhase::kRunning || r->in_flight > 0 || !sched_->is_running(id)) continue;
    if (sched_->n_computed(id) != sched_->n_known(id) - 1) continue;  // not decoding
    // a verify step feeds 1 + drafts tokens (at most a window: the rollback keeps a window of rows)
    int64_t room = std::min({hooks_.max_drafts, r->n_max() - sched_->n_known(id), window - 1});
    r->drafts.clear();
    if (room <= 0) continue;
    std::vector<int32_t> d = hooks_.drafter->propose(id, r->tokens, room);
    if (static_cast<int64_t>(d.size()) > room) d.resize(room);
    for (int32_t t : d)
      if (t < 0 || t >= model_->config().vocab_size) d.clear();
    r->drafts = std::move(d);
    sched_->set_drafts(id, static_cast<int64_t>(r->drafts.size()));
  }
}

Scheduler::PrefixHit EngineImpl::probe_prefix(RequestId id, int64_t n_known) {
  RequestState& r = *live_.at(id);
  r.pending_hit.reset();
  // a request preempted while its step is in flight gets fresh caches only once that step is over
  if (opt_.prefix_cache == PrefixCacheMode::kOff || r.in_flight > 0) return {};
  auto has_local = [](const PrefixCache::Payload& p) { return static_cast<const CachedBlock&>(p).local != nullptr; };
  const int64_t final_tokens = r.n_prompt + r.n_committed;  // a lookup reads no placeholder
  const int64_t limit = std::min(n_known - 1, final_tokens);
  PrefixCache::Hit hit = exact() ? cache_->lookup(r.tokens, limit, has_local) : cache_->lookup(r.tokens, limit);
  const int64_t h = hit.n_tokens, window = model_->config().window;
  if (h == 0) return {};
  int64_t start = h;
  if (!exact()) {
    if (h <= window) return {};  // the replay would cost as much as the hit saves
    start = (h - window) / replay_align_ * replay_align_;
  }
  r.pending_hit = std::move(hit);
  r.pending_start = start;
  return {start, h};  // the request maps the hit's pages [0, h)
}

uint64_t EngineImpl::block_key(RequestState& r, int64_t block) {
  const int64_t bt = opt_.prefix_block_tokens;
  DI_CHECK((block + 1) * bt <= r.n_prompt + r.n_committed);  // final ids only
  while (static_cast<int64_t>(r.block_keys.size()) <= block) {
    int64_t j = static_cast<int64_t>(r.block_keys.size());
    uint64_t parent = j == 0 ? 0 : r.block_keys.back();
    r.block_keys.push_back(PrefixCache::block_key(parent, std::span<const int32_t>(r.tokens.data() + j * bt, bt)));
  }
  return r.block_keys[block];
}

std::unique_ptr<EngineImpl::Job> EngineImpl::build_job(StepPlan plan) {
  auto job = std::make_unique<Job>();
  const int64_t bt = opt_.prefix_block_tokens;
  for (const StepEntry& e : plan.entries) {
    RequestState& r = *live_.at(e.id);
    StepTask t;
    t.id = e.id;
    t.caches = &r.seq;
    if (e.admitted) {
      DI_CHECK(r.in_flight == 0);
      t.create = true;
      r.keep_global_before = 0;
      r.n_blocks_done = 0;
      if (opt_.prefix_cache != PrefixCacheMode::kOff) st_.prefix_lookup_tokens += sched_->n_known(e.id);
      if (r.pending_hit && r.pending_start == e.begin) {
        const int64_t h = r.pending_hit->n_tokens;
        t.exact_hit = exact();
        t.hit_start = r.pending_start;
        // held while the request holds the hit's pages: the cache keeps blocks in use (their pages
        // are charged to its budget, not to the request's)
        r.adopted = r.pending_hit->blocks;
        t.hit = std::move(r.pending_hit);
        if (!exact()) r.keep_global_before = h;
        r.n_blocks_done = h / bt;
        if (r.n_committed == 0) r.cached_tokens = t.hit_start;
        st_.prefix_hit_tokens += t.hit_start;
        st_.prefix_replay_tokens += h - t.hit_start;
      } else {
        DI_CHECK(e.begin == 0);
      }
      r.pending_hit.reset();
      r.phase = RequestPhase::kRunning;
    }
    t.tokens = &r.tokens;
    t.begin = e.begin;
    t.n = e.n - e.n_draft;
    if (e.n_draft > 0) {
      DI_CHECK(static_cast<int64_t>(r.drafts.size()) >= e.n_draft && t.n == 1);
      t.drafts.assign(r.drafts.begin(), r.drafts.begin() + e.n_draft);
      st_.draft_tokens += e.n_draft;
    }
    if (e.begin < r.keep_global_before) t.options.keep_global_before = r.keep_global_before;
    t.options.decoder_window_only = opt_.decoder_replay && e.n_draft == 0 && e.n > 1;
    t.sample = e.sample;
    t.sampler = &*r.sampler;
    t.n_prompt = r.n_prompt;
    t.mask = &r.request.logit_mask;
    if (opt_.prefix_cache != PrefixCacheMode::kOff) {
      // skip blocks another request already cached (with a snapshot where this step would take one);
      // only blocks of final ids can be checked here
      const int64_t end = e.begin + t.n, final_tokens = r.n_prompt + r.n_committed;
      while (r.n_blocks_done < end / bt && (r.n_blocks_done + 1) * bt <= final_tokens) {
        const auto* p = static_cast<const CachedBlock*>(cache_->find(block_key(r, r.n_blocks_done)));
        bool needs_local = exact() && (r.n_blocks_done + 1) * bt == end && end % snapshot_tokens() == 0;
        if (!p || (needs_local && !p->local)) break;
        ++r.n_blocks_done;
      }
      t.capture_from = r.n_blocks_done;
      t.snapshot_tokens = exact() ? snapshot_tokens() : 0;
    }
    // what this step will sample is not known until it is over: a placeholder the worker fills, so
    // the next step can be scheduled now; or, when drafts are verified (or may be proposed next) and
    // for the last token the request may have, nothing more is scheduled until the step is committed
    if (e.sample) {
      if (e.n_draft == 0 && !hooks_.drafter) {
        t.fill = true;
        r.tokens.push_back(-1);
        sched_->append(e.id, 1);
        if (r.n_output() >= r.max_tokens) sched_->hold(e.id);
      } else {
        sched_->hold(e.id);
      }
    }
    ++r.in_flight;
    job->tasks.push_back(std::move(t));
  }
  job->plan = std::move(plan);
  return job;
}

void EngineImpl::release_caches(RequestState& r) {
  if (r.in_flight > 0) return;
  r.seq.reset();
  r.adopted.clear();
}

EngineImpl::Posted EngineImpl::commit(Job& job) {
  Posted p;
  const StepPlan& plan = job.plan;
  StepOutput& out = job.out;
  for (size_t i = 0; i < plan.entries.size(); ++i) {
    const StepEntry& e = plan.entries[i];
    RequestState& r = *live_.at(e.id);
    --r.in_flight;
    if (!out.error.empty()) {
      if (r.phase == RequestPhase::kRunning || r.phase == RequestPhase::kWaiting) fail(r, "step failed: " + out.error);
      release_caches(r);  // possibly half-written
      continue;
    }
    StepTaskResult& res = out.results[i];
    // preempted while the step ran: the token it sampled from its (still valid) caches stands, and it
    // recomputes from there; finished or cancelled: the step's work is discarded
    const bool preempted = r.phase == RequestPhase::kWaiting;
    if (!preempted && r.phase != RequestPhase::kRunning) {
      st_.discarded_tokens += static_cast<int64_t>(res.sampled.size());
      release_caches(r);
      continue;
    }
    if (preempted) {
      DI_CHECK(!e.sample || job.tasks[i].fill);  // held requests are not preempted
      release_caches(r);
    } else if (!res.captured.empty()) {
      r.n_blocks_done = res.first_block + static_cast<int64_t>(res.captured.size());
      p.captures.push_back({e.id, res.first_block, std::move(res.captured)});
    }
    if (!e.sample) continue;
    const SamplingParams& sp = r.request.sampling;
    if (!job.tasks[i].fill) {
      // held (a verify step, or a drafter in use): its tokens are appended now that they are known
      const int64_t keep = static_cast<int64_t>(res.sampled.size());  // the fed token + accepted drafts
      st_.accepted_draft_tokens += keep - 1;
      if (e.n_draft > 0) sched_->rollback(e.id, e.begin + keep);
      sched_->hold(e.id, false);
      r.drafts.clear();
      DI_CHECK(res.n_tokens_after == e.begin + e.n - e.n_draft + keep - 1);
      for (const SampledToken& s : res.sampled) {
        if (r.n_output() >= r.max_tokens) break;
        r.tokens.push_back(s.id);
        sched_->append(e.id, 1);
      }
    } else {
      DI_CHECK(r.tokens[e.begin + e.n] == res.sampled[0].id);
    }
    for (const SampledToken& s : res.sampled) {
      if (r.n_committed >= r.n_output()) break;  // verify tokens past max_tokens
      ++r.n_committed;
      ++st_.generated_tokens;
      if (sp.logprobs >= 0) {
        r.logprobs.push_back(s.logprob);
        std::vector<TokenLogprob> top;
        for (const TopLogprob& t : s.top) top.push_back({t.id, t.logprob});
        r.top_logprobs.push_back(std::move(top));
      }
      if (r.n_committed >= r.max_tokens || is_stop_id(sp, eos_id_, s.id)) {
        // finished by id or length: free its KV now; the final event comes from post-processing
        r.phase = RequestPhase::kStopping;
        sched_->remove(e.id);
        release_caches(r);
        break;
      }
    }
    p.ids.push_back(e.id);
  }
  return p;
}

void EngineImpl::post_process(const Posted& p) {
  for (RequestId id : p.ids) {
    auto it = live_.find(id);
    if (it == live_.end()) continue;
    RequestState& r = *it->second;
    if (r.phase == RequestPhase::kFinished) continue;
    TokenEvent ev;
    ev.id = id;
    const bool want_logprobs = r.request.sampling.logprobs >= 0;
    bool done = false;
    while (r.n_posted < r.n_committed && !done) {
      int32_t tok = r.tokens[r.n_prompt + r.n_posted];
      StopStep step = r.stop->push(tok, r.detok->push(tok));
      ev.token_ids.push_back(tok);
      ev.text += step.text;
      if (want_logprobs) {
        ev.logprobs.push_back(r.logprobs[r.n_posted]);
        ev.top_logprobs.push_back(r.top_logprobs[r.n_posted]);
      }
      ++r.n_posted;
      done = step.finish != FinishReason::kNone;
    }
    if (done) {
      ev.text += r.stop->flush_tail(r.detok->flush());
      end_request(r, finish_reason_name(r.stop->finish_reason()), {}, std::move(ev));
      continue;
    }
    DI_CHECK_MSG(r.phase != RequestPhase::kStopping, "commit finished a request the stop checker did not");
    if (r.request.stream && !ev.token_ids.empty()) r.channel->push(std::move(ev));
  }
  for (const Capture& c : p.captures) {
    auto it = live_.find(c.id);
    if (it != live_.end()) insert_blocks(*it->second, c);
  }
}

void EngineImpl::insert_blocks(RequestState& r, const Capture& c) {
  const int64_t bt = opt_.prefix_block_tokens;
  for (size_t k = 0; k < c.blocks.size(); ++k) {
    const int64_t j = c.first_block + static_cast<int64_t>(k);
    if (r.n_prompt + r.n_committed < (j + 1) * bt) break;
    const CachedBlock& blk = *c.blocks[k];
    uint64_t key = block_key(r, j);
    const auto* old = static_cast<const CachedBlock*>(cache_->find(key));
    if (old && old->local && !blk.local) continue;  // keep the snapshot already there
    uint64_t parent = j == 0 ? 0 : block_key(r, j - 1);
    cache_->insert(parent, std::span<const int32_t>(r.tokens.data() + j * bt, bt), c.blocks[k], cached_block_bytes(blk));
  }
}

void EngineImpl::end_request(RequestState& r, const std::string& reason, const std::string& error, TokenEvent last) {
  if (r.phase == RequestPhase::kFinished) return;
  if (sched_->contains(r.id)) sched_->remove(r.id);
  RequestResult res;
  res.id = r.id;
  res.token_ids.assign(r.tokens.begin() + r.n_prompt, r.tokens.begin() + r.n_prompt + r.n_posted);
  if (r.stop) res.text = r.stop->text();
  if (r.request.sampling.logprobs >= 0) {
    res.logprobs.assign(r.logprobs.begin(), r.logprobs.begin() + r.n_posted);
    res.top_logprobs.assign(r.top_logprobs.begin(), r.top_logprobs.begin() + r.n_posted);
  }
  res.finish_reason = reason;
  res.error = error;
  res.prompt_tokens = r.n_prompt;
  res.completion_tokens = r.n_posted;
  res.cached_tokens = r.cached_tokens;
  if (reason == "error") ++st_.requests_failed;
  else if (reason == "cancelled") ++st_.requests_cancelled;
  else ++st_.requests_finished;
  r.phase = RequestPhase::kFinished;
  release_caches(r);
  publish_stats();  // before the waiter wakes, so its stats() counts this request
  if (r.channel) r.channel->finish(std::move(res), std::move(last));
}

void EngineImpl::drop_finished() {
  for (auto it = live_.begin(); it != live_.end();) {
    if (it->second->phase == RequestPhase::kFinished && it->second->in_flight == 0) it = live_.erase(it);
    else ++it;
  }
  n_live_ = static_cast<int64_t>(live_.size());
}

void EngineImpl::publish_stats() {
  st_.running = sched_->n_running();
  st_.waiting = sched_->n_waiting();
  st_.preemptions = sched_->n_preemptions();
  st_.kv_used_bytes = kv_->used_bytes();
  st_.kv_capacity_bytes = kv_->capacity_bytes();
  st_.prefix_cache_bytes = cache_->bytes();
  st_.kv_pages_in_use = model_->kv_pool().used_pages();
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_ = st_;
}

}  // namespace di
