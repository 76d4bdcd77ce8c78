#include "model/model_weights.h"

#include <string>

#include "core/error.h"

namespace di {
namespace {

class Binder {
 public:
  Binder(const Checkpoint& ckpt, Backend& backend) : ckpt_(ckpt), backend_(backend) {}

  Weight bind(const std::string& name, WeightMode mode) {
    const TensorView& t = ckpt_.get(name);
    Weight w;
    w.mode = mode;
    w.dtype = t.dtype;
    w.data = t.data;
    w.rows = t.shape.size() >= 2 ? t.shape[0] : 1;
    w.cols = t.shape.empty() ? 1 : t.shape.back();
    if (mode == WeightMode::kFp8Block || mode == WeightMode::kFp4Expert) {
      std::string scale_name = name;
      if (scale_name.size() > 7 && scale_name.ends_with(".weight")) scale_name.replace(scale_name.size() - 7, 7, ".scale");
      const TensorView& s = ckpt_.get(scale_name);
      w.scale = s.data;
      w.scale_rows = s.shape.empty() ? 1 : s.shape[0];
      w.scale_cols = s.shape.size() >= 2 ? s.shape[1] : 1;
      if (mode == WeightMode::kFp4Expert) w.cols *= 2;  // two E2M1 codes per byte
    }
    backend_.prepare(w);
    return w;
  }

 private:
  const Checkpoint& ckpt_;
  Backend& backend_;
};

ExpertWeights bind_expert(Binder& b, const std::string& p, WeightMode mode) {
  return {b.bind(p + "w1.weight", mode), b.bind(p + "w2.weight", mode), b.bind(p + "w3.weight", mode)};
}

}  // namespace

ModelWeights bind_model_weights(const ModelConfig& cfg, const Checkpoint& ckpt, Backend& backend) {
  Binder b(ckpt, backend);
  constexpr auto kFp8 = WeightMode::kFp8Block;
  constexpr auto kBf16 = WeightMode::kBf16;
  constexpr auto kF32 = WeightMode::kF32;
  ModelWeights mw;
  mw.embed = b.bind("embed.weight", kBf16);
  mw.head = b.bind("head.weight", kF32);
  mw.norm = b.bind("norm.weight", kBf16);
  for (const LayerSchedule& ls : cfg.layers) {
    std::string p = ls.is_dspark ? "mtp." + std::to_string(ls.layer - cfg.n_layers) + "." : "layers." + std::to_string(ls.layer) + ".";
    LayerWeights lw;
    lw.attn_norm = b.bind(p + "attn_norm.weight", kBf16);
    lw.ffn_norm = b.bind(p + "ffn_norm.weight", kBf16);
    lw.hc_attn_fn = b.bind(p + "hc_attn_fn", kF32);
    lw.hc_attn_base = b.bind(p + "hc_attn_base", kF32);
    lw.hc_attn_scale = b.bind(p + "hc_attn_scale", kF32);
    lw.hc_ffn_fn = b.bind(p + "hc_ffn_fn", kF32);
    lw.hc_ffn_base = b.bind(p + "hc_ffn_base", kF32);
    lw.hc_ffn_scale = b.bind(p + "hc_ffn_scale", kF32);
    AttentionWeights& a = lw.attn;
    std::string ap = p + "attn.";
    a.wq_a = b.bind(ap + "wq_a.weight", kFp8);
    a.q_norm = b.bind(ap + "q_norm.weight", kBf16);
    a.wq_b = b.bind(ap + "wq_b.weight", kFp8);
    a.wkv = b.bind(ap + "wkv.weight", kFp8);
    a.kv_norm = b.bind(ap + "kv_norm.weight", kBf16);
    a.wo_a = b.bind(ap + "wo_a.weight", kFp8);
    a.wo_b = b.bind(ap + "wo_b.weight", kFp8);
    a.attn_sink = b.bind(ap + "attn_sink", kF32);
    if (ls.mode == AttnMode::kFull) {
      a.comp_wkv = b.bind(ap + "compressor.wkv.weight", ls.ratio > 1 ? kF32 : kBf16);
      if (ls.ratio > 1) a.comp_wgate = b.bind(ap + "compressor.wgate.weight", kF32);
      a.comp_norm = b.bind(ap + "compressor.norm.weight", kBf16);
      a.idx_wk = b.bind(ap + "indexer.wk.weight", kBf16);
      a.idx_k_norm = b.bind(ap + "indexer.k_norm.weight", kBf16);
    }
    if (ls.mode == AttnMode::kFull || ls.mode == AttnMode::kReindex) {
      a.idx_wq_b = b.bind(ap + "indexer.wq_b.weight", kFp8);
      a.idx_weights_proj = b.bind(ap + "indexer.weights_proj.weight", kBf16);
    }
    int n_experts = ls.is_dspark ? cfg.dspark_n_routed_experts : cfg.n_routed_experts;
    lw.gate = b.bind(p + "ffn.gate.weight", kF32);
    lw.gate_bias = b.bind(p + "ffn.gate.bias", kF32);
    for (int e = 0; e < n_experts; ++e)
      lw.experts.push_back(bind_expert(b, p + "ffn.experts." + std::to_string(e) + ".", WeightMode::kFp4Expert));
    lw.shared = bind_expert(b, p + "ffn.shared_experts.", kFp8);
    if (ls.engram_slot >= 0) {
      lw.engram_table = b.bind(p + "engram.embed.weight", kFp8);
      lw.engram_wkv = b.bind(p + "engram.wkv.weight", kFp8);
      lw.engram_q = b.bind(p + "engram.q_weight", kF32);
      lw.engram_k = b.bind(p + "engram.k_weight", kF32);
    }
    int stage = ls.layer - cfg.n_layers;
    if (ls.is_dspark && stage == 0) {
      lw.main_proj = b.bind(p + "main_proj.weight", kFp8);
      lw.main_norm = b.bind(p + "main_norm.weight", kBf16);
    }
    if (ls.is_dspark && stage == cfg.n_mtp_layers - 1) {
      lw.final_norm = b.bind(p + "norm.weight", kBf16);
      lw.markov_embed = b.bind(p + "markov_head.embed.weight", kBf16);
      lw.markov_head = b.bind(p + "markov_head.head.weight", kF32);
      lw.confidence = b.bind(p + "confidence_head.proj.weight", kF32);
    }
    mw.layers.push_back(std::move(lw));
  }
  return mw;
}

}  // namespace di
