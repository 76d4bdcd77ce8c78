// The Engine on the CPU with the tiny golden_dev model: submit / wait / stream / cancel, errors that
// fail one request alone, determinism under concurrency, batch invariance, the prefix cache modes,
// async scheduling on and off, verify steps with rollback, logit masks.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <thread>

#include "backend/backend.h"
#include "model/model.h"
#include "runtime/engine_impl.h"
#include "test_util.h"

namespace di {
namespace {

const std::filesystem::path kModel = std::filesystem::path(DI_TEST_DATA) / "golden_dev" / "model";

EngineOptions base_options() {
  EngineOptions o;
  o.model_dir = kModel;
  o.prefix_block_tokens = 8;
  o.kv_page_tokens = 8;
  return o;
}

std::vector<int32_t> random_prompt(std::mt19937_64& rng, int64_t n) {
  std::uniform_int_distribution<int32_t> tok(3, 500);  // avoid bos / eos / pad
  std::vector<int32_t> p(n);
  for (auto& t : p) t = tok(rng);
  return p;
}

Request greedy(std::vector<int32_t> prompt, int32_t max_tokens) {
  Request r;
  r.prompt_ids = std::move(prompt);
  r.sampling.temperature = 0;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  return r;
}

// Greedy decode straight on the model (quirks off), the reference for the engine's greedy output.
std::vector<int32_t> model_greedy(const std::vector<int32_t>& prompt, int n) {
  std::unique_ptr<Backend> b = make_backend("cpu");
  ModelOptions mo;
  mo.reference_decode_quirks = false;
  std::unique_ptr<Model> m = Model::load(kModel, *b, mo);
  SequenceState st = m->new_sequence();
  ForwardResult f = m->forward(st, prompt);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    int32_t t = static_cast<int32_t>(std::max_element(f.logits.begin(), f.logits.end()) - f.logits.begin());
    out.push_back(t);
    if (i + 1 < n) f = m->forward(st, {t});
  }
  return out;
}

TEST(Engine, GreedyMatchesTheModel) {
  std::mt19937_64 rng(testing_util::fresh_seed("Engine.GreedyMatchesTheModel"));
  auto engine = Engine::create(base_options());
  std::vector<int32_t> prompt = random_prompt(rng, 5 + rng() % 30);
  RequestResult r = engine->wait(engine->submit(greedy(prompt, 12)));
  EXPECT_EQ(r.finish_reason, "length") << r.error;
  EXPECT_EQ(r.token_ids, model_greedy(prompt, 12));
  EXPECT_EQ(r.prompt_tokens, static_cast<int64_t>(prompt.size()));
  EXPECT_EQ(r.completion_tokens, 12);
  EXPECT_FALSE(r.text.empty());
}

TEST(Engine, StreamedEventsAddUpToTheResult) {
  std::mt19937_64 rng(testing_util::fresh_seed("Engine.StreamedEventsAddUpToTheResult"));
  auto engine = Engine::create(base_options());
  Request req;
  req.prompt = "Once upon a time";
  req.sampling.max_tokens = 20;
  req.sampling.seed = rng();
  req.sampling.logprobs = 2;
  req.stream = true;
  RequestId id = engine->submit(req);
  std::vector<int32_t> ids;
  std::string text;
  int n_events = 0;
  for (;;) {
    std::optional<TokenEvent> e = engine->next_event(id, std::chrono::seconds(30));
    ASSERT_TRUE(e.has_value());
    ++n_events;
    ids.insert(ids.end(), e->token_ids.begin(), e->token_ids.end());
    text += e->text;
    EXPECT_EQ(e->logprobs.size(), e->token_ids.size());
    if (e->finished) break;
  }
  RequestResult r = engine->wait(id);
  EXPECT_EQ(ids, r.token_ids);
  EXPECT_EQ(text, r.text);
  EXPECT_GT(n_events, 1);
  ASSERT_EQ(r.top_logprobs.size(), r.token_ids.size());
  for (const auto& top : r.top_logprobs) EXPECT_EQ(top.size(), 2u);
  EXPECT_EQ(engine->wait(id).finish_reason, "error");  // forgotten after wait
}

TEST(Engine, CancelEndsARequest) {
  auto engine = Engine::create(base_options());
  Request req = greedy({0, 5, 6, 7}, 120);
  RequestId id = engine->submit(req);
  engine->cancel(id);
  RequestResult r = engine->wait(id);
  EXPECT_EQ(r.finish_reason, "cancelled");
  EXPECT_LT(r.completion_tokens, 120);
  EXPECT_EQ(engine->stats().requests_cancelled, 1);
}

TEST(Engine, BadRequestsFailAlone) {
  EngineOptions o = base_options();
  auto engine = Engine::create(o);
  Request good = greedy({0, 9, 10}, 4);
  RequestId g = engine->submit(good);
  Request bad_utf8;
  bad_utf8.prompt = std::string("abc\xff\xfe");
  Request too_long = greedy(std::vector<int32_t>(128, 7), 4);
  Request bad_id = greedy({0, 512}, 4);
  Request two_inputs = greedy({0, 5}, 4);
  two_inputs.prompt = "x";
  Request bad_sampling = greedy({0, 5}, 4);
  bad_sampling.sampling.top_p = 0;
  Request bad_chat;
  bad_chat.chat_json = "{\"messages\": 3}";
  for (Request* r : {&bad_utf8, &too_long, &bad_id, &two_inputs, &bad_sampling, &bad_chat}) {
    RequestResult res = engine->wait(engine->submit(*r));
    EXPECT_EQ(res.finish_reason, "error");
    EXPECT_FALSE(res.error.empty());
  }
  EXPECT_EQ(engine->wait(g).finish_reason, "length");
  EXPECT_EQ(engine->stats().requests_failed, 6);
}

TEST(Engine, RequestThatCanNeverFitIsRejected) {
  EngineOptions o = base_options();
  auto probe = Engine::create(o);
  // capacity for about one 40-token request
  KvLayout l = KvLayout::from_config(static_cast<EngineImpl&>(*probe).config(), o.kv_page_tokens);
  o.kv_capacity_bytes = l.request_bytes(40);
  auto engine = Engine::create(o);
  RequestResult big = engine->wait(engine->submit(greedy(std::vector<int32_t>(30, 7), 30)));
  EXPECT_EQ(big.finish_reason, "error");
  EXPECT_NE(big.error.find("KV capacity"), std::string::npos) << big.error;
  RequestResult ok = engine->wait(engine->submit(greedy(std::vector<int32_t>(20, 7), 20)));
  EXPECT_EQ(ok.finish_reason, "length") << ok.error;
}

}  // namespace
}  // namespace di
