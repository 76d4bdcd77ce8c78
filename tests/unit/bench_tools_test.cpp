// The pieces of `deepinfer bench` on the CPU backend: the ProfilingBackend decorator (forwards
// exactly, counts bytes / FLOPs, accounts memory), synthetic checkpoints (released dims and
// schedule, valid codes, deterministic fills, loadable through Model::load), the cache filler and the
// forward's observer hook (at_layer) that the bench marks layers with.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "backend/profiling_backend.h"
#include "model/model.h"
#include "model/synthetic_checkpoint.h"
#include "runtime/bench_run.h"
#include "runtime/cache_fill.h"
#include "runtime/memory_report.h"
#include "test_util.h"

namespace di {
namespace {

// A synthetic v41-tiny model of `layers` layers with host weights, loaded on `backend`.
std::unique_ptr<Model> load_tiny_model(int layers, uint64_t seed, Backend& backend) {
  SyntheticModel sm = make_synthetic_model("v41-tiny", layers, seed, SyntheticWeights::Placement::kHost);
  return Model::load(std::move(sm.config), std::move(sm.checkpoint), backend, {}, &sm.engram_map);
}

std::vector<float> random_floats(std::mt19937_64& rng, size_t n) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

TEST(ProfilingBackend, ForwardsExactlyAndCountsLinear) {
  std::mt19937_64 rng(testing_util::fresh_seed("ProfilingBackend.ForwardsExactlyAndCountsLinear"));
  SyntheticModel sm = make_synthetic_model("v41-tiny", 1, rng(), SyntheticWeights::Placement::kHost);
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  ProfilingBackend pb(*cpu);
  const TensorView& v = sm.checkpoint->get("layers.0.attn.wq_a.weight");
  const TensorView& sc = sm.checkpoint->get("layers.0.attn.wq_a.scale");
  Weight w;
  w.mode = WeightMode::kFp8Block;
  w.dtype = v.dtype;
  w.data = v.data;
  w.rows = v.shape[0];
  w.cols = v.shape[1];
  w.scale = sc.data;
  w.scale_rows = sc.shape[0];
  w.scale_cols = sc.shape[1];
  pb.prepare(w);
  EXPECT_EQ(pb.memory().weights, w.rows * w.cols + w.scale_rows * w.scale_cols);

  const int64_t s = 1 + static_cast<int64_t>(rng() % 5);
  std::vector<float> xv = random_floats(rng, static_cast<size_t>(s * w.cols));
  Tensor x = pb.from_host_f32(xv, {s, w.cols});
  pb.set_mode(ProfilingBackend::Mode::kCount);
  pb.set_section(3);
  Tensor y = pb.linear(x, w);
  pb.set_mode(ProfilingBackend::Mode::kOff);
  const std::vector<float> want = cpu->to_host_f32(cpu->linear(cpu->from_host_f32(xv, {s, w.cols}), w));
  EXPECT_EQ(pb.to_host_f32(y), want);  // bit for bit: the decorator only forwards

  ASSERT_EQ(pb.ops().size(), 1u);
  const auto& [key, st] = *pb.ops().begin();
  EXPECT_EQ(key.first, 3);
  EXPECT_EQ(key.second, "linear fp8 [" + std::to_string(w.rows) + " x " + std::to_string(w.cols) + "]");
  EXPECT_EQ(st.calls, 1);
  EXPECT_TRUE(st.fp8);
  EXPECT_DOUBLE_EQ(st.flops, 2.0 * s * w.rows * w.cols);
  EXPECT_DOUBLE_EQ(st.bytes, static_cast<double>(w.rows * w.cols + w.scale_rows * w.scale_cols) +
                                 4.0 * s * w.cols + 4.0 * s * w.rows);
  EXPECT_EQ(st.seconds, 0.0);  // counted, not timed
}

// The fused mHC site op: off, the inner backend's op as it runs (the CPU's default: its three ops);
// counted, its three ops one by one -- the same values either way.
TEST(ProfilingBackend, FusedSiteOpForwardsExactlyAndCountsItsThreeOps) {
  std::mt19937_64 rng(testing_util::fresh_seed("ProfilingBackend.FusedSiteOpForwardsExactlyAndCountsItsThreeOps"));
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  ProfilingBackend pb(*cpu);
  const int hc = 4;
  const int64_t s = 1 + static_cast<int64_t>(rng() % 4), d = 32 + static_cast<int64_t>(rng() % 300);
  const int64_t mw = (2 + hc) * hc;
  const std::vector<float> yv = random_floats(rng, static_cast<size_t>(s * d));
  const std::vector<float> rv = random_floats(rng, static_cast<size_t>(s * hc * d));
  const std::vector<float> post = random_floats(rng, static_cast<size_t>(s * mw));
  const std::vector<float> pre = random_floats(rng, static_cast<size_t>(s * mw));
  std::vector<float> norm_values = random_floats(rng, static_cast<size_t>(d));
  Weight norm;
  norm.mode = WeightMode::kF32;
  norm.dtype = DType::kF32;
  norm.data = reinterpret_cast<const uint8_t*>(norm_values.data());
  norm.rows = 1;
  norm.cols = d;
  pb.prepare(norm);
  // the inputs uploaded and the outputs read back outside the op (transfers are counted too)
  const Tensor y = pb.from_host_f32(yv, {s, d}), res = pb.from_host_f32(rv, {s, hc * d});
  const Tensor post_mix = pb.from_host_f32(post, {s, mw}), pre_mix = pb.from_host_f32(pre, {s, mw});
  auto run = [&](ProfilingBackend::Mode mode) {
    pb.set_mode(mode);
    auto [h, x] = pb.hc_post_pre_norm(y, res, post_mix, pre_mix, hc, norm, 1e-6f);
    pb.set_mode(ProfilingBackend::Mode::kOff);
    return std::make_pair(pb.to_host_f32(h), pb.to_host_f32(x));
  };
  const Tensor h_want = cpu->hc_post(cpu->from_host_f32(yv, {s, d}), cpu->from_host_f32(rv, {s, hc * d}),
                                     cpu->from_host_f32(post, {s, mw}), hc);
  const std::vector<float> x_want =
      cpu->to_host_f32(cpu->rmsnorm(cpu->hc_pre(h_want, cpu->from_host_f32(pre, {s, mw}), hc), norm, 1e-6f));
  const auto off = run(ProfilingBackend::Mode::kOff);
  EXPECT_EQ(off.first, cpu->to_host_f32(h_want));
  EXPECT_EQ(off.second, x_want);
  EXPECT_TRUE(pb.ops().empty());
  const auto counted = run(ProfilingBackend::Mode::kCount);
  EXPECT_EQ(counted.first, off.first);
  EXPECT_EQ(counted.second, off.second);
  std::vector<std::string> labels;
  for (const auto& [key, st] : pb.ops()) {
    labels.push_back(key.second);
    EXPECT_EQ(st.calls, 1) << key.second;
  }
  EXPECT_EQ(labels, (std::vector<std::string>{"hc_post", "hc_pre", "rmsnorm"}));
}

TEST(ProfilingBackend, AccountsLiveAndPeakTensorBytes) {
  std::mt19937_64 rng(testing_util::fresh_seed("ProfilingBackend.AccountsLiveAndPeakTensorBytes"));
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  ProfilingBackend pb(*cpu);
  const int64_t a = 1 + static_cast<int64_t>(rng() % 100), b = 1 + static_cast<int64_t>(rng() % 100);
  {
    Tensor t1 = pb.alloc(TType::kF32, {a, 3});
    Tensor t2 = pb.zeros(TType::kU8, {b, 5});
    EXPECT_EQ(pb.memory().tensors, a * 12 + b * 5);
    Tensor t3 = pb.concat_cols(t1, t1);  // a result tensor is tracked too
    EXPECT_EQ(pb.memory().tensors, a * 12 + b * 5 + a * 24);
    Tensor copy = t3;  // the same storage: counted once
    EXPECT_EQ(pb.memory().tensors, a * 12 + b * 5 + a * 24);
  }
  EXPECT_EQ(pb.memory().tensors, 0);
  EXPECT_EQ(pb.memory().tensors_peak, a * 12 + b * 5 + a * 24);
  pb.reset_peak();
  EXPECT_EQ(pb.memory().tensors_peak, 0);
}

TEST(SyntheticCheckpoint, FlashConfigHasReleasedDimsAndEveryLayerKind) {
  const ModelConfig c = synthetic_config("v41-flash", 8);
  EXPECT_EQ(c.hidden_size, 5120);
  EXPECT_EQ(c.n_heads, 64);
  EXPECT_EQ(c.head_dim, 512);
  EXPECT_EQ(c.n_routed_experts, 384);
  EXPECT_EQ(c.vocab_size, 129280);
  std::vector<std::string> kinds;
  for (const LayerSchedule& l : c.layers) kinds.push_back(layer_kind(l));
  EXPECT_EQ(kinds, (std::vector<std::string>{"SWA", "SWA+Engram", "r2 Full", "r2 Reuse", "r1 Full+cand", "r1 Reuse",
                                              "r1 Reindex", "r1 Reuse"}));
  EXPECT_EQ(c.layers[7].index_source, 6);  // the last Reuse reads the Reindex layer's top-k
  // all 40 layers: the released schedule
  const ModelConfig full = synthetic_config("v41-flash", 40);
  EXPECT_EQ(full.kv_source_layers, (std::vector<int>{2, 8, 14, 20}));
  EXPECT_EQ(full.index_source_layers, (std::vector<int>{2, 8, 14, 20, 24, 28, 32, 36}));
  EXPECT_EQ(full.engram_layer_ids, (std::vector<int>{1, 14}));
  EXPECT_EQ(full.candidate_source_layer, 20);
}

TEST(SyntheticCheckpoint, FillsAreValidAndDeterministic) {
  const uint64_t seed = testing_util::fresh_seed("SyntheticCheckpoint.FillsAreValidAndDeterministic");
  SyntheticModel a = make_synthetic_model("v41-tiny", 3, seed, SyntheticWeights::Placement::kHost);
  SyntheticModel b = make_synthetic_model("v41-tiny", 3, seed, SyntheticWeights::Placement::kHost);
  SyntheticModel c = make_synthetic_model("v41-tiny", 3, seed + 1, SyntheticWeights::Placement::kHost);
  size_t differ = 0;
  for (const auto& [name, v] : a.checkpoint->tensors()) {
    const TensorView& w = b.checkpoint->get(name);
    ASSERT_EQ(std::memcmp(v.data, w.data, v.nbytes), 0) << name;
    differ += std::memcmp(v.data, c.checkpoint->get(name).data, v.nbytes) != 0;
    for (uint64_t i = 0; i < v.nbytes; ++i) {
      const uint8_t x = v.data[i];
      if (v.dtype == DType::kF8E4M3) {
        ASSERT_NE(x & 0x7f, 0x7f) << name << " holds a NaN code";
      }
      if (v.dtype == DType::kF8E8M0) {
        ASSERT_TRUE(x >= 107 && x <= 127) << name << " scale byte " << int(x);
      }
    }
    if (v.dtype == DType::kF32) {
      for (uint64_t i = 0; i < v.nbytes / 4; ++i) {
        float f;
        std::memcpy(&f, v.data + 4 * i, 4);
        ASSERT_TRUE(std::isfinite(f) && std::fabs(f) < 2) << name;
      }
    }
  }
  EXPECT_EQ(differ, a.checkpoint->tensors().size());  // another seed: other values everywhere
}

// A tiny synthetic model, its caches filled to `context` without a prefill, decodes finite logits,
// and decode steps within the headroom take no more pool pages.
TEST(CacheFiller, DecodesFromAFilledContext) {
  std::mt19937_64 rng(testing_util::fresh_seed("CacheFiller.DecodesFromAFilledContext"));
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  ProfilingBackend pb(*cpu);
  std::unique_ptr<Model> m = load_tiny_model(8, rng(), pb);
  const int64_t context = 40 + static_cast<int64_t>(rng() % 60), headroom = 3;
  CacheFiller filler(*m, context, headroom, rng());
  SequenceState s = m->new_sequence();
  filler.fill(s);
  EXPECT_EQ(s.n_tokens, context);
  EXPECT_EQ(static_cast<int64_t>(s.engram_history.size()), context);
  const int64_t page_tokens = m->kv_pool().page_tokens();
  EXPECT_EQ(static_cast<int64_t>(s.pages.size()), (context + headroom + page_tokens - 1) / page_tokens);
  EXPECT_EQ(filler.pages_per_sequence(), static_cast<int64_t>(s.pages.size()));
  for (const LayerSchedule& l : m->config().layers) {
    if (l.mode != AttnMode::kFull) continue;
    EXPECT_EQ(s.layers[static_cast<size_t>(l.layer)].n_comp, context / l.ratio) << "layer " << l.layer;
  }
  EXPECT_GT(local_state_bytes(s), 0);
  const int64_t pages_in_use = m->kv_pool().used_pages();
  for (int step = 0; step < headroom; ++step) {
    ForwardResult r = m->forward(s, {static_cast<int32_t>(rng() % static_cast<uint64_t>(m->config().vocab_size))});
    ASSERT_EQ(static_cast<int64_t>(r.logits.size()), m->config().vocab_size);
    for (float x : r.logits) ASSERT_TRUE(std::isfinite(x));
  }
  EXPECT_EQ(m->kv_pool().used_pages(), pages_in_use);
  // the filled rows are valid packed codes: they unpack to finite values
  const LayerCache& full = s.layers[2];
  ASSERT_GT(full.ratio, 0);
  const std::vector<int64_t> slots = global_slots(s, 2, 0, full.n_comp);
  for (float x : pb.to_host_f32(pb.unpack_rows(m->kv_pool().comp(2), RowFormat::kFp4E4m3, m->config().head_dim, slots)))
    ASSERT_TRUE(std::isfinite(x));
}

// The bench marks layers with ForwardHooks::at_layer, an observer: a step with it gives the same
// logits as a step without hooks, it sees every layer once, in order, and the forward keeps computing
// a block's input inside the block before it (hc_post_pre_norm: its hc_pre is counted in the earlier
// layer's section). before_layer, which may replace the streams, turns that off (the same logits).
TEST(ForwardHooks, AtLayerObservesWithoutChangingTheStep) {
  std::mt19937_64 rng(testing_util::fresh_seed("ForwardHooks.AtLayerObservesWithoutChangingTheStep"));
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  ProfilingBackend pb(*cpu);
  std::unique_ptr<Model> m = load_tiny_model(4, rng(), pb);
  const int n_layers = m->config().n_layers;
  std::vector<int32_t> prompt(5 + rng() % 20);
  for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(m->config().vocab_size));
  const int32_t next = static_cast<int32_t>(rng() % static_cast<uint64_t>(m->config().vocab_size));
  // one decode step after the prompt; hc_pre calls per section (the layer the hooks last set)
  auto step = [&](const ForwardHooks* hooks, std::map<int, int64_t>* hc_pre_calls) {
    SequenceState s = m->new_sequence();
    m->forward(s, prompt);
    pb.clear_ops();
    pb.set_mode(ProfilingBackend::Mode::kCount);
    pb.set_section(-1);
    ForwardResult r = m->forward(s, {next}, false, hooks);
    pb.set_mode(ProfilingBackend::Mode::kOff);
    if (hc_pre_calls)
      for (const auto& [key, st] : pb.ops())
        if (key.second == "hc_pre") (*hc_pre_calls)[key.first] += st.calls;
    return r.logits;
  };
  const std::vector<float> plain = step(nullptr, nullptr);
  std::vector<int> seen;
  ForwardHooks observer;
  observer.at_layer = [&](int l) {
    seen.push_back(l);
    pb.set_section(l);
  };
  std::map<int, int64_t> observed, replaced;
  EXPECT_EQ(step(&observer, &observed), plain);
  ASSERT_EQ(static_cast<int>(seen.size()), n_layers);
  for (int l = 0; l < n_layers; ++l) EXPECT_EQ(seen[static_cast<size_t>(l)], l);
  ForwardHooks replacer;
  replacer.before_layer = [&](int l, Tensor&, Tensor&) { pb.set_section(l); };
  EXPECT_EQ(step(&replacer, &replaced), plain);
  // a layer whose successor has no Engram computes that successor's input: one hc_pre moves from the
  // successor's section into its own
  auto carries_out = [&](int l) {
    return l + 1 < n_layers && m->config().layers[static_cast<size_t>(l + 1)].engram_slot < 0;
  };
  int carried = 0;
  for (int l = 0; l < n_layers; ++l) {
    const int64_t moved = (carries_out(l) ? 1 : 0) - (l > 0 && carries_out(l - 1) ? 1 : 0);
    EXPECT_EQ(observed[l], replaced[l] + moved) << "layer " << l;
    carried += carries_out(l) ? 1 : 0;
  }
  EXPECT_GT(carried, 0);
}
}  // namespace
}  // namespace di
