// The engine under load on the CPU backend (tiny golden_dev model): 1,000 requests of mixed lengths,
// some sharing prefixes, submitted from several threads, with random cancellations and a KV capacity
// small enough to force preemptions. Every request must finish or be cancelled, nothing may leak
// (requests, KV bytes; the sanitizer build checks memory), and -- batch-invariant, exact prefix
// caching -- every output must equal the same request run alone (a cancelled one: a prefix of it).
//
// DEEPINFER_LOAD_REQUESTS overrides the count (the sanitizer run in tests/e2e/asan_load.sh uses
// fewer); DEEPINFER_LOAD_SEED replays a run.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <thread>

#include "runtime/engine_impl.h"

namespace di {
namespace {

const std::filesystem::path kModel = std::filesystem::path(DI_TEST_DATA) / "golden_dev" / "model";

int64_t env_or(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoll(v, nullptr, 10) : fallback;
}

std::vector<int32_t> random_tokens(std::mt19937_64& rng, int64_t n) {
  std::vector<int32_t> t(n);
  for (auto& x : t) x = 3 + static_cast<int32_t>(rng() % 500);
  return t;
}

std::vector<Request> make_requests(std::mt19937_64& rng, int64_t n) {
  std::vector<std::vector<int32_t>> prefixes;
  for (int i = 0; i < 6; ++i) prefixes.push_back(random_tokens(rng, 8 + rng() % 40));
  std::vector<Request> reqs;
  for (int64_t i = 0; i < n; ++i) {
    Request r;
    if (i < 6) {
      // first in line: long requests that outgrow the KV capacity together (forced preemptions)
      r.prompt_ids = random_tokens(rng, 40);
      r.sampling.max_tokens = 30;
      r.sampling.ignore_eos = true;
      r.sampling.seed = rng();
      reqs.push_back(std::move(r));
      continue;
    }
    if (rng() % 2) r.prompt_ids = prefixes[rng() % prefixes.size()];
    std::vector<int32_t> tail = random_tokens(rng, 1 + rng() % (rng() % 4 == 0 ? 60 : 16));
    r.prompt_ids.insert(r.prompt_ids.end(), tail.begin(), tail.end());
    // short outputs, and a few long ones that outgrow their pages (preemptions)
    r.sampling.max_tokens = rng() % 16 == 0 ? 16 + static_cast<int32_t>(rng() % 16) : 1 + static_cast<int32_t>(rng() % 6);
    r.sampling.temperature = rng() % 3 == 0 ? 0.0f : 0.6f + 0.1f * static_cast<float>(rng() % 6);
    r.sampling.top_k = rng() % 3 == 0 ? 40 : 0;
    r.sampling.seed = rng();
    r.sampling.logprobs = rng() % 4 == 0 ? 2 : -1;
    r.stream = rng() % 5 == 0;
    reqs.push_back(std::move(r));
  }
  return reqs;
}

TEST(EngineLoad, ThousandRequestsCancellationsPreemptions) {
  const uint64_t seed = static_cast<uint64_t>(
      env_or("DEEPINFER_LOAD_SEED", std::chrono::high_resolution_clock::now().time_since_epoch().count()));
  const int64_t n = env_or("DEEPINFER_LOAD_REQUESTS", 1000);
  std::printf("[EngineLoad] seed %llu, %lld requests\n", static_cast<unsigned long long>(seed), static_cast<long long>(n));
  std::mt19937_64 rng(seed);
  std::vector<Request> reqs = make_requests(rng, n);

  EngineOptions o;
  o.model_dir = kModel;
  o.batch_invariant = true;
  o.prefix_cache = PrefixCacheMode::kExact;
  o.prefix_block_tokens = 8;
  o.kv_page_tokens = 8;
  o.exact_snapshot_blocks = 1 + static_cast<int64_t>(rng() % 2);
  o.max_step_tokens = 48 + static_cast<int64_t>(rng() % 64);
  o.max_running = 8 + static_cast<int>(rng() % 16);
  o.async_scheduling = rng() % 4 != 0;
  o.prefix_cache_bytes = 2'000'000;
  auto engine = std::make_unique<EngineImpl>(o);
  // room for three requests' local state and 20 pages: three 40-token prompts take 15 pages and grow
  // to 27, so running requests outgrow it and get preempted
  KvLayout l = KvLayout::from_config(engine->config(), o.kv_page_tokens);
  o.kv_capacity_bytes = 3 * l.local_bytes + 20 * l.page_bytes;
  engine = std::make_unique<EngineImpl>(o);

  // submit from three threads in bursts; a fourth cancels about 8% of the requests at random times
  std::vector<RequestId> ids(n, 0);
  std::vector<std::atomic<bool>> submitted(n);
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t)
    threads.emplace_back([&, t] {
      std::mt19937_64 trng(seed + 1 + t);
      for (int64_t i = t; i < n; i += 3) {
        if (i == 6 + t) std::this_thread::sleep_for(std::chrono::milliseconds(5));  // the long ones first
        ids[i] = engine->submit(reqs[i]);
        submitted[i] = true;
        if (trng() % 50 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(trng() % 20));
      }
    });
  std::vector<bool> cancel_asked(n, false);
  for (int64_t i = 0; i < n; ++i) cancel_asked[i] = rng() % 12 == 0;
  threads.emplace_back([&] {
    std::mt19937_64 crng(seed + 9);
    for (int64_t i = 0; i < n; ++i) {
      if (!cancel_asked[i]) continue;
      while (!submitted[i]) std::this_thread::yield();
      if (crng() % 3) std::this_thread::sleep_for(std::chrono::microseconds(crng() % 3000));
      engine->cancel(ids[i]);
    }
  });
  for (auto& th : threads) th.join();

  // a few streamed requests are read event by event; the rest are waited for
  std::vector<RequestResult> got(n);
  for (int64_t i = 0; i < n; ++i) {
    if (reqs[i].stream && i % 2 == 0) {
      std::vector<int32_t> streamed;
      for (;;) {
        std::optional<TokenEvent> e = engine->next_event(ids[i], std::chrono::seconds(120));
        ASSERT_TRUE(e.has_value()) << "request " << i << " never finished";
        streamed.insert(streamed.end(), e->token_ids.begin(), e->token_ids.end());
        if (e->finished) break;
      }
      got[i] = engine->wait(ids[i]);
      EXPECT_EQ(streamed, got[i].token_ids) << "request " << i;
    } else {
      got[i] = engine->wait(ids[i]);
    }
  }

  int64_t finished = 0, cancelled = 0;
  for (int64_t i = 0; i < n; ++i) {
    const RequestResult& r = got[i];
    ASSERT_TRUE(r.finish_reason == "stop" || r.finish_reason == "length" || r.finish_reason == "cancelled")
        << "request " << i << ": " << r.finish_reason << " " << r.error;
    if (r.finish_reason == "cancelled") {
      EXPECT_TRUE(cancel_asked[i]) << "request " << i;
      ++cancelled;
    } else {
      ++finished;
    }
  }
  EngineStats s = engine->stats();
  std::printf("[EngineLoad] %lld finished, %lld cancelled; %lld steps, %lld preemptions, %lld prefix-hit tokens of "
              "%lld looked up, %lld tokens discarded; busy %.1f s, host gap %.1f us/step\n",
              static_cast<long long>(finished), static_cast<long long>(cancelled), static_cast<long long>(s.steps),
              static_cast<long long>(s.preemptions), static_cast<long long>(s.prefix_hit_tokens),
              static_cast<long long>(s.prefix_lookup_tokens), static_cast<long long>(s.discarded_tokens),
              s.busy_seconds, 1e6 * s.host_gap_seconds / std::max<int64_t>(1, s.host_gaps));
  EXPECT_EQ(finished + cancelled, n);
  EXPECT_EQ(s.requests_finished, finished);
  EXPECT_EQ(s.requests_cancelled, cancelled);
  EXPECT_EQ(s.requests_failed, 0);
  EXPECT_GT(s.preemptions, 0);
  EXPECT_GT(s.prefix_hit_tokens, 0);
  // nothing leaks: every request is dropped and its KV returned
  for (int k = 0; k < 200 && (engine->n_live() > 0 || engine->stats().running > 0); ++k)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  s = engine->stats();
  EXPECT_EQ(engine->n_live(), 0);
  EXPECT_EQ(s.running, 0);
  EXPECT_EQ(s.waiting, 0);
  EXPECT_EQ(s.kv_used_bytes, 0);
  // the pool's pages in use are the prefix cache's (its exact-mode bytes also count local state);
  // the stats are published just after the last request is dropped
  for (int k = 0; k < 2000 && s.kv_pages_in_use * engine->kv_page_bytes() > s.prefix_cache_bytes; ++k) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    s = engine->stats();
  }
  EXPECT_LE(s.kv_pages_in_use * engine->kv_page_bytes(), s.prefix_cache_bytes);
  engine.reset();

  // every output equals the request run alone (cold: no prefix cache); a cancelled one is a prefix
  EngineOptions alone_opt = o;
  alone_opt.prefix_cache = PrefixCacheMode::kOff;
  alone_opt.kv_capacity_bytes = 0;
  alone_opt.max_running = 1;
  EngineImpl alone(alone_opt);
  int64_t compared = 0;
  for (int64_t i = 0; i < n; ++i) {
    const RequestResult& r = got[i];
    if (r.finish_reason == "cancelled" && r.token_ids.empty()) continue;
    Request q = reqs[i];
    q.stream = false;
    RequestResult want = alone.wait(alone.submit(q));
    ASSERT_NE(want.finish_reason, "error") << want.error;
    if (r.finish_reason == "cancelled") {
      ASSERT_LE(r.token_ids.size(), want.token_ids.size()) << "request " << i;
      EXPECT_TRUE(std::equal(r.token_ids.begin(), r.token_ids.end(), want.token_ids.begin())) << "request " << i;
    } else {
      EXPECT_EQ(r.token_ids, want.token_ids) << "request " << i;
      EXPECT_EQ(r.text, want.text) << "request " << i;
      EXPECT_EQ(r.logprobs, want.logprobs) << "request " << i;
      EXPECT_EQ(r.finish_reason, want.finish_reason) << "request " << i;
    }
    ++compared;
    if (::testing::Test::HasFailure()) break;
  }
  std::printf("[EngineLoad] %lld outputs compared with runs alone\n", static_cast<long long>(compared));
}

}  // namespace
}  // namespace di
