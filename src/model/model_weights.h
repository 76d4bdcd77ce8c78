// The checkpoint's tensors bound to the V4.1 module structure (spec §4), per layer, with the
// multiplication mode the reference uses for each (FP8 block, FP4 expert, bf16, promoted fp32).
#pragma once

#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "model/safetensors.h"

namespace di {

struct AttentionWeights {
  Weight wq_a, q_norm, wq_b, wkv, kv_norm, wo_a, wo_b, attn_sink;
  Weight comp_wkv, comp_wgate, comp_norm;                   // Full layers (wgate: ratio > 1)
  Weight idx_wq_b, idx_weights_proj, idx_wk, idx_k_norm;    // index sources (wk, k_norm: Full)
};

struct LayerWeights {
  Weight attn_norm, ffn_norm;
  Weight hc_attn_fn, hc_attn_base, hc_attn_scale, hc_ffn_fn, hc_ffn_base, hc_ffn_scale;
  AttentionWeights attn;
  Weight gate, gate_bias;
  std::vector<ExpertWeights> experts;
  ExpertWeights shared;
  Weight engram_table, engram_wkv, engram_q, engram_k;      // Engram layers
  Weight main_proj, main_norm;                              // DSpark stage 0
  Weight final_norm, markov_embed, markov_head, confidence; // DSpark last stage
};

struct ModelWeights {
  Weight embed, head, norm;
  std::vector<LayerWeights> layers;  // backbone layers then DSpark stages
};

// Binds every tensor the config implies; throws di::Error naming a missing tensor. Weights are
// prepared (uploaded) on `backend`.
ModelWeights bind_model_weights(const ModelConfig& cfg, const Checkpoint& ckpt, Backend& backend);

}  // namespace di
