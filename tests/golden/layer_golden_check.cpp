// Layer by layer against DeepSeek's official reference (tests/data/golden_dev_layers): in the
// prefill and in every decode step, each block gets the reference's input streams and pre mix, and
// its attention output, MoE output, output streams and mixes are compared with the reference's
// (Engram injections likewise). The DSpark drafter gets the reference's feature taps and is compared
// with the golden drafts. This checks every layer kind and the per-request caches without the
// amplification of ulp differences across layers that makes end-to-end rows diverge.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "model/model.h"
#include "layer_golden_check.h"

namespace di {
namespace {

const std::string kCase = std::string(DI_TEST_DATA) + "/golden_dev";
const std::string kLayers = std::string(DI_TEST_DATA) + "/golden_dev_layers";
// Bounds (measured worst values are printed). Block outputs include the residual streams; sublayer
// outputs do not, so one flipped FP8/FP4 rounding, tied top-k pick or near-tied expert choice shows
// more there. Such flips come from fp32 summation order alone (the reference itself moves as much
// when its fp32 GEMMs are summed in another order), so a few checks may exceed the tight bound:
// at least kTightShare of them must meet it, and every one the loose bound.
constexpr double kTightBlock = 0.005, kLooseBlock = 0.02;
constexpr double kTightSublayer = 0.02, kLooseSublayer = 0.1;
constexpr double kTightShare = 0.98;
constexpr double kTightDraft = 0.02, kLooseDraft = 0.1;  // tight = the golden README criterion
constexpr float kMargin = 0.05f;

// Counts checks against a tight and a loose bound.
struct Bound {
  double tight, loose;
  int n = 0, tight_ok = 0;
  void check(double e, const std::string& what) {
    ++n;
    if (e <= tight) ++tight_ok;
    EXPECT_LE(e, loose) << what;
  }
};

std::vector<float> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) ADD_FAILURE() << "missing " << path;
  std::vector<float> v(f ? static_cast<size_t>(f.tellg()) / 4 : 0);
  f.seekg(0);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
  return v;
}

// The packed reference values: name -> [file, offset, count] floats.
class LayerData {
 public:
  LayerData() {
    index_ = nlohmann::json::parse(std::ifstream(kLayers + "/index.json"));
    for (int p = 0; p < 5; ++p) blobs_["p" + std::to_string(p) + ".bin"] = read_file(kLayers + "/p" + std::to_string(p) + ".bin");
  }
  std::vector<float> get(const std::string& name) const {
    auto it = index_.find(name);
    if (it == index_.end()) {
      ADD_FAILURE() << "no reference value " << name;
      return {};
    }
    const std::vector<float>& blob = blobs_.at((*it)[0].get<std::string>());
    size_t off = (*it)[1], n = (*it)[2];
    return std::vector<float>(blob.begin() + off, blob.begin() + off + n);
  }

 private:
  nlohmann::json index_;
  std::map<std::string, std::vector<float>> blobs_;
};

double rel_l2(const float* a, const float* ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    num += (double(a[i]) - ref[i]) * (double(a[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& ref) {
  return a.size() == ref.size() ? rel_l2(a.data(), ref.data(), a.size()) : INFINITY;
}

float top1_margin(const float* v, int64_t n) {
  int64_t best = std::max_element(v, v + n) - v;
  float second = -INFINITY;
  for (int64_t i = 0; i < n; ++i)
    if (i != best) second = std::max(second, v[i]);
  return v[best] - second;
}

}  // namespace

void check_layers_against_reference(Backend& backend) {
  LayerData ref;
  Backend* be = &backend;
  std::unique_ptr<Model> model = Model::load(kCase + "/model", backend);  // the official decode behaviour
  const ModelConfig& cfg = model->config();
  const int64_t vocab = cfg.vocab_size, block = cfg.dspark_block_size;
  nlohmann::json info = nlohmann::json::parse(std::ifstream(kCase + "/golden.json"));
  std::map<std::string, double> worst;
  Bound blocks{kTightBlock, kLooseBlock}, sublayers{kTightSublayer, kLooseSublayer}, drafts{kTightDraft, kLooseDraft};
  Bound mixes{1e-3, 1e-2};
  auto note = [&](const std::string& key, double e) { worst[key] = std::max(worst[key], e); };

  for (size_t p = 0; p < info["prompts"].size(); ++p) {
    const auto& pr = info["prompts"][p];
    std::vector<int32_t> prompt = pr["prompt_ids"], forced = pr["forced_ids"];
    std::vector<float> g_draft = read_file(kCase + "/" + pr["draft_logits_file"].get<std::string>());
    std::vector<float> g_conf = read_file(kCase + "/" + pr["confidence_file"].get<std::string>());
    std::vector<std::vector<int32_t>> g_ids = nlohmann::json::parse(std::ifstream(kCase + "/" + pr["draft_ids_file"].get<std::string>()));
    int f = 0;       // forward call: 0 = prefill, k + 1 = decode of forced[k]
    int64_t n = 0;   // tokens in this call
    auto name = [&](int l, const std::string& what) {
      return "p" + std::to_string(p) + "_f" + std::to_string(f) + "_l" + std::to_string(l) + what;
    };
    auto kind = [&](int l) {
      const LayerSchedule& ls = cfg.layers[l];
      return std::string(attn_mode_name(ls.mode)) + "/r" + std::to_string(ls.ratio) + (f ? " decode" : " prefill");
    };
    auto where = [&](int l) { return "prompt " + std::to_string(p) + " call " + std::to_string(f) + " layer " + std::to_string(l); };

    ForwardHooks hooks;
    hooks.before_layer = [&](int l, Tensor& h, Tensor& pre) {
      if (l == 0) return;
      h = be->from_host_f32(ref.get(name(l - 1, "")), {n, cfg.hc_dim()});
      std::vector<float> ref_pre = ref.get(name(l - 1, "_premix")), mix(n * cfg.hc_mix_dim(), 0.0f);
      for (int64_t i = 0; i < n; ++i)
        for (int k = 0; k < cfg.hc_mult; ++k) mix[i * cfg.hc_mix_dim() + k] = ref_pre[i * cfg.hc_mult + k];
      pre = be->from_host_f32(mix, {n, cfg.hc_mix_dim()});
    };
    hooks.after_engram = [&](int l, Tensor& h) {
      std::vector<float> r = ref.get(name(l, "_engram"));
      double e = rel_l2(be->to_host_f32(h), r);
      note("engram" + std::string(f ? " decode" : " prefill"), e);
      blocks.check(e, where(l) + " engram");
      h = be->from_host_f32(r, {n, cfg.hc_dim()});  // the block gets the reference's input
    };
    auto sublayer = [&](const char* what) {
      return [&, what](int l, const Tensor& y) {
        double e = rel_l2(be->to_host_f32(y), ref.get(name(l, std::string("_") + what)));
        note(std::string(what) + " " + kind(l), e);
        sublayers.check(e, where(l) + " " + what);
      };
    };
    hooks.after_attention = sublayer("attn");
    hooks.after_ffn = sublayer("ffn");
    hooks.after_block = [&](int l, const Tensor& h, const Tensor& mix) {
      double e = rel_l2(be->to_host_f32(h), ref.get(name(l, "")));
      note("block " + kind(l), e);
      blocks.check(e, where(l));
      std::vector<float> m = be->to_host_f32(mix), pre(n * cfg.hc_mult);
      for (int64_t i = 0; i < n; ++i)
        for (int k = 0; k < cfg.hc_mult; ++k) pre[i * cfg.hc_mult + k] = m[i * cfg.hc_mix_dim() + k];
      mixes.check(rel_l2(pre, ref.get(name(l, "_premix"))), where(l) + " pre mix");
    };

    SequenceState st = model->new_sequence();
    auto step = [&](const std::vector<int32_t>& ids) {
      n = static_cast<int64_t>(ids.size());
      ForwardResult r = model->forward(st, ids, false, &hooks);
      double e = rel_l2(r.logits, ref.get("p" + std::to_string(p) + "_f" + std::to_string(f) + "_logits"));
      note("head", e);
      blocks.check(e, "prompt " + std::to_string(p) + " call " + std::to_string(f) + " logits");
      // the drafter is fed the reference's feature taps
      std::vector<float> feats = ref.get("p" + std::to_string(p) + "_f" + std::to_string(f) + "_mainhidden");
      model->dspark_seed(st, be->from_host_f32(feats, {n, static_cast<int64_t>(feats.size()) / n}));
    };
    step(prompt);
    for (size_t k = 0; k < forced.size(); ++k) {
      f = static_cast<int>(k) + 1;
      step({forced[k]});
      std::vector<float> ref_logits = ref.get("p" + std::to_string(p) + "_f" + std::to_string(f) + "_logits");
      int32_t next = k + 1 < forced.size()
                         ? forced[k + 1]
                         : static_cast<int32_t>(std::max_element(ref_logits.begin(), ref_logits.end()) - ref_logits.begin());
      DraftResult d = model->dspark_draft(st, next);
      // Row i is conditioned (Markov head) on the token drafted before it: compare the rows whose
      // preceding drafted ids agree with the reference's.
      int64_t rows = 0;
      while (rows < block && d.ids[rows] == g_ids[k][rows]) ++rows;
      for (int64_t i = 0; i < rows; ++i) {
        const float* g = g_draft.data() + (k * block + i) * vocab;
        double e = rel_l2(d.logits.data() + i * vocab, g, vocab);
        note("draft logits", e);
        drafts.check(e, "prompt " + std::to_string(p) + " step " + std::to_string(k) + " draft row " + std::to_string(i));
      }
      if (rows > 0) {
        double ec = rel_l2(d.confidence.data(), g_conf.data() + k * block, rows);
        note("draft confidence", ec);
        drafts.check(ec, "prompt " + std::to_string(p) + " step " + std::to_string(k) + " confidence");
      }
      EXPECT_EQ(d.ids[0], g_ids[k][0]);
      for (int64_t i = 0; i < block; ++i) {  // same ids while the reference drafter's margin allows
        if (top1_margin(g_draft.data() + (k * block + i) * vocab, vocab) < kMargin) break;
        EXPECT_EQ(d.ids[i + 1], g_ids[k][i + 1]) << "prompt " << p << " step " << k << " draft " << i;
        if (d.ids[i + 1] != g_ids[k][i + 1]) break;
      }
    }
  }
  for (const auto& [k, v] : worst)
    std::printf("[layer golden] %s: worst relative L2 %-26s %.6f\n", backend.name().c_str(), k.c_str(), v);
  std::printf("[layer golden] %s: within the tight bound: blocks %d/%d, sublayers %d/%d, drafts %d/%d\n",
              backend.name().c_str(), blocks.tight_ok, blocks.n, sublayers.tight_ok, sublayers.n, drafts.tight_ok,
              drafts.n);
  EXPECT_GE(drafts.tight_ok, kTightShare * drafts.n);
  EXPECT_GE(mixes.tight_ok, kTightShare * mixes.n);
  EXPECT_GE(blocks.tight_ok, kTightShare * blocks.n);
  EXPECT_GE(sublayers.tight_ok, kTightShare * sublayers.n);
}

}  // namespace di
