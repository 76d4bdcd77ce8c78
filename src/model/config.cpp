// ModelConfig validation and the per-layer schedule (spec §1.3, reference `Attention.__init__`,
// `Indexer.__init__`, `SharedAttentionRuntime`). In the reference, layers run in order and each
// source publishes into one shared slot, so a layer reads the compressed KV of the most recent kv
// source at or below it and the top-k list of the most recent index source at or below it.
#include <algorithm>
#include <cstdio>
#include <set>

#include "core/error.h"
#include "model/config.h"
#include "model/engram_hash.h"

namespace di {

const char* attn_mode_name(AttnMode mode) {
  switch (mode) {
    case AttnMode::kWindowOnly: return "window";
    case AttnMode::kFull: return "full";
    case AttnMode::kReindex: return "reindex";
    case AttnMode::kReuse: return "reuse";
  }
  return "?";
}

std::string layer_tensor_prefix(const ModelConfig& cfg, int layer) {
  if (layer < cfg.n_layers) return "layers." + std::to_string(layer) + ".";
  return "mtp." + std::to_string(layer - cfg.n_layers) + ".";
}

namespace {

[[noreturn]] void bad(const std::string& field, const std::string& value, const std::string& expected) {
  throw Error("field '" + field + "' = " + value + ": expected " + expected);
}

std::string list_text(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size() && i < 48; ++i) {
    if (i) s += ", ";
    s += std::to_string(v[i]);
  }
  if (v.size() > 48) s += ", ...";
  return s + "]";
}

void check_positive(const char* field, int64_t v) {
  if (v < 1) bad(field, std::to_string(v), "a positive integer");
}

void check_multiple(const char* field, int64_t v, int64_t m, const char* why) {
  if (v % m != 0) bad(field, std::to_string(v), "a multiple of " + std::to_string(m) + " (" + why + ")");
}

void check_token(const char* field, int64_t v, int vocab) {
  if (v < 0 || v >= vocab) bad(field, std::to_string(v), "a token id in [0, vocab_size = " + std::to_string(vocab) + ")");
}

// Layer ids: unique, inside [0, n_layers).
void check_layer_list(const char* field, const std::vector<int>& ids, int n_layers) {
  std::set<int> seen;
  for (int id : ids) {
    if (id < 0 || id >= n_layers) {
      bad(field, list_text(ids), "backbone layer ids in [0, num_hidden_layers = " + std::to_string(n_layers) + ")");
    }
    if (!seen.insert(id).second) bad(field, list_text(ids), "no repeated layer ids (" + std::to_string(id) + " repeats)");
  }
}

bool contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

void validate_fields(const ModelConfig& c) {
  check_positive("vocab_size", c.vocab_size);
  check_positive("hidden_size", c.hidden_size);
  check_positive("num_hidden_layers", c.n_layers);
  check_positive("num_attention_heads", c.n_heads);
  check_positive("head_dim", c.head_dim);
  check_positive("q_lora_rank", c.q_lora_rank);
  check_positive("o_lora_rank", c.o_lora_rank);
  check_positive("o_groups", c.o_groups);
  check_positive("sliding_window", c.window);
  check_positive("index_n_heads", c.index_n_heads);
  check_positive("index_head_dim", c.index_head_dim);
  check_positive("index_topk", c.index_topk);
  check_positive("n_routed_experts", c.n_routed_experts);
  check_positive("num_experts_per_tok", c.n_activated_experts);
  check_positive("moe_intermediate_size", c.moe_inter_dim);
  check_positive("hc_mult", c.hc_mult);
  check_positive("hc_sinkhorn_iters", c.hc_sinkhorn_iters);
  if (c.n_mtp_layers < 0) bad("num_nextn_predict_layers", std::to_string(c.n_mtp_layers), "a count >= 0");
  if (c.weight_block != 32) bad("quantization_config.weight_block_size", std::to_string(c.weight_block), "32");
  if (c.scale_fmt != "ue8m0") bad("quantization_config.scale_fmt", "\"" + c.scale_fmt + "\"", "\"ue8m0\"");
  if (c.expert_dtype != "fp4") bad("quantization_config.expert_dtype", "\"" + c.expert_dtype + "\"", "\"fp4\"");

  const char* kBlocks = "FP8 weights use 32x32 blocks and activations one scale per 32 channels";
  check_multiple("hidden_size", c.hidden_size, 32, kBlocks);
  check_multiple("q_lora_rank", c.q_lora_rank, 32, kBlocks);
  check_multiple("moe_intermediate_size", c.moe_inter_dim, 32, "FP4 experts have one scale per 32 inputs");
  check_multiple("head_dim", c.head_dim, 32, "window KV has one FP8 scale per 32 dims");
  check_multiple("index_head_dim", c.index_head_dim, 32, "index keys have one FP4 scale per 32 dims");
  if (c.n_kv_heads != 1) bad("num_key_value_heads", std::to_string(c.n_kv_heads), "1 (one shared latent, K = V)");
  if (c.rope_dim % 2 != 0 || c.rope_dim > c.head_dim || c.rope_dim > c.index_head_dim) {
    bad("qk_rope_head_dim", std::to_string(c.rope_dim),
        "an even number <= head_dim (" + std::to_string(c.head_dim) + ") and <= index_head_dim (" +
            std::to_string(c.index_head_dim) + ")");
  }
  if (c.n_heads % c.o_groups != 0) {
    bad("o_groups", std::to_string(c.o_groups), "a divisor of num_attention_heads = " + std::to_string(c.n_heads));
  }
  check_multiple("o_lora_rank", int64_t{c.o_groups} * c.o_lora_rank, 32, "o_groups * o_lora_rank is an FP8 GEMM input");
  if (c.n_activated_experts > c.n_routed_experts) {
    bad("num_experts_per_tok", std::to_string(c.n_activated_experts),
        "at most n_routed_experts = " + std::to_string(c.n_routed_experts));
  }
  if (c.n_shared_experts != 1) bad("n_shared_experts", std::to_string(c.n_shared_experts), "1");
  if (c.score_func != "sqrtsoftplus") bad("scoring_func", "\"" + c.score_func + "\"", "\"sqrtsoftplus\"");
  if (!c.norm_topk_prob) bad("norm_topk_prob", "false", "true");
  if (!(c.norm_eps >= 0 && c.norm_eps < 1)) bad("rms_norm_eps", std::to_string(c.norm_eps), "a number in [0, 1)");
  if (!(c.hc_eps >= 0 && c.hc_eps < 1)) bad("hc_eps", std::to_string(c.hc_eps), "a number in [0, 1)");
  if (!(c.rope_theta > 0)) bad("rope_theta", std::to_string(c.rope_theta), "a positive number");
  if (!(c.compress_rope_theta > 0)) {
    bad("compress_rope_theta", std::to_string(c.compress_rope_theta), "a positive number");
  }
  if (c.yarn_original_max_position > 0) {
    if (!(c.yarn_factor >= 1)) bad("rope_scaling.factor", std::to_string(c.yarn_factor), "a number >= 1");
    if (!(c.yarn_beta_slow > 0 && c.yarn_beta_fast > c.yarn_beta_slow)) {
      bad("rope_scaling.beta_fast", std::to_string(c.yarn_beta_fast),
          "a number > beta_slow = " + std::to_string(c.yarn_beta_slow) + " > 0");
    }
  }
  if (!(c.route_scale > 0)) bad("routed_scaling_factor", std::to_string(c.route_scale), "a positive number");
  if (!(c.gate_temp > 0)) bad("gate_temp", std::to_string(c.gate_temp), "a positive number");
  if (!(c.swiglu_limit >= 0)) bad("swiglu_limit", std::to_string(c.swiglu_limit), "a number >= 0");
  check_token("bos_token_id", c.bos_token_id, c.vocab_size);
  check_token("eos_token_id", c.eos_token_id, c.vocab_size);
  check_token("pad_token_id", c.pad_token_id, c.vocab_size);

  // Engram.
  check_layer_list("engram_layer_ids", c.engram_layer_ids, c.n_layers);
  if (!c.engram_layer_ids.empty()) {
    if (c.engram_num_embeddings.size() != c.engram_layer_ids.size()) {
      bad("engram_num_embeddings", std::to_string(c.engram_num_embeddings.size()) + " entries",
          std::to_string(c.engram_layer_ids.size()) + " entries, one per engram_layer_ids entry");
    }
    if (c.engram_max_ngram < 2 || c.engram_max_ngram > 16) {
      bad("engram_max_ngram_size", std::to_string(c.engram_max_ngram), "an integer in [2, 16]");
    }
    if (c.engram_n_heads < 1 || c.engram_n_heads > 256) {
      bad("engram_n_heads", std::to_string(c.engram_n_heads), "an integer in [1, 256]");
    }
    check_positive("engram_head_dim", c.engram_head_dim);
    check_multiple("engram_head_dim", c.engram_head_dim, 32, "engram rows have one E8M0 scale per 32 columns");
    if (c.engram_vocab_size < 2 || c.engram_vocab_size > (int64_t{1} << 40)) {
      bad("engram_vocab_size", std::to_string(c.engram_vocab_size), "an integer in [2, 2^40]");
    }
    check_token("engram_pad_token_id", c.engram_pad_id, c.vocab_size);
    check_positive("engram_compressed_vocab_size", c.engram_compressed_vocab_size);
    int64_t n_primes = int64_t{c.engram_max_ngram - 1} * c.engram_n_heads *
                       static_cast<int64_t>(c.engram_layer_ids.size());
    if (n_primes > (1 << 16)) {
      bad("engram_layer_ids", list_text(c.engram_layer_ids),
          "at most 65536 hash buckets in total ((engram_max_ngram_size - 1) * engram_n_heads per layer)");
    }
    // The table must hold exactly the rows the hash can reach (spec §2.7: released totals equal).
    const EngramLayout layout = make_engram_layout(c);
    for (int s = 0; s < layout.n_slots(); ++s) {
      const int64_t rows = layout.rows_used(s);
      if (c.engram_num_embeddings[static_cast<size_t>(s)] != rows) {
        bad("engram_num_embeddings[" + std::to_string(s) + "]",
            std::to_string(c.engram_num_embeddings[static_cast<size_t>(s)]),
            std::to_string(rows) + " (the sum of the " + std::to_string(layout.n_cols()) +
                " hash-bucket primes of engram layer " + std::to_string(c.engram_layer_ids[static_cast<size_t>(s)]) + ")");
      }
    }
  }

  // DSpark.
  if (c.n_mtp_layers > 0) {
    check_positive("dspark_block_size", c.dspark_block_size);
    check_token("dspark_noise_token_id", c.dspark_noise_token_id, c.vocab_size);
    check_positive("dspark_markov_rank", c.dspark_markov_rank);
    if (c.dspark_target_layer_ids.empty()) {
      bad("dspark_target_layer_ids", "[]", "at least one backbone layer (DSpark stages need target features)");
    }
    check_layer_list("dspark_target_layer_ids", c.dspark_target_layer_ids, c.n_layers);
    if (!std::is_sorted(c.dspark_target_layer_ids.begin(), c.dspark_target_layer_ids.end())) {
      bad("dspark_target_layer_ids", list_text(c.dspark_target_layer_ids),
          "increasing layer ids (features are concatenated in layer order)");
    }
    if (c.dspark_n_routed_experts < 0 || c.dspark_n_activated_experts < 0) {
      bad("dspark_n_routed_experts", std::to_string(c.dspark_n_routed_experts), "a count >= 0");
    }
    int routed = c.layer_n_routed_experts(c.n_layers);
    int active = c.layer_n_activated_experts(c.n_layers);
    if (active > routed) {
      bad("dspark_num_experts_per_tok", std::to_string(active),
          "at most dspark_n_routed_experts = " + std::to_string(routed));
    }
  }
}

}  // namespace

void derive_schedule(ModelConfig& c) {
  validate_fields(c);
  const int n_total = c.n_total_layers();
  if (static_cast<int>(c.compress_ratios.size()) != n_total) {
    bad("compress_ratios", std::to_string(c.compress_ratios.size()) + " entries",
        std::to_string(n_total) + " entries (num_hidden_layers " + std::to_string(c.n_layers) +
            " + num_nextn_predict_layers " + std::to_string(c.n_mtp_layers) + ")");
  }
  for (int l = 0; l < n_total; ++l) {
    int r = c.compress_ratios[static_cast<size_t>(l)];
    if (r < 0 || r > 2) {
      bad("compress_ratios[" + std::to_string(l) + "]", std::to_string(r), "0, 1 or 2 (the V4.1 compress ratios)");
    }
    if (l >= c.n_layers && r != 0) {
      bad("compress_ratios[" + std::to_string(l) + "]", std::to_string(r),
          "0 (entry " + std::to_string(l) + " is DSpark stage mtp." + std::to_string(l - c.n_layers) +
              ", which is sliding-window only)");
    }
  }
  check_layer_list("kv_source_layer_ids", c.kv_source_layers, c.n_layers);
  check_layer_list("index_source_layer_ids", c.index_source_layers, c.n_layers);
  for (int s : c.kv_source_layers) {
    if (c.compress_ratios[static_cast<size_t>(s)] == 0) {
      bad("kv_source_layer_ids", list_text(c.kv_source_layers),
          "layers with compress ratio > 0 (layer " + std::to_string(s) + " has ratio 0)");
    }
    if (!contains(c.index_source_layers, s)) {
      bad("kv_source_layer_ids", list_text(c.kv_source_layers),
          "every kv source also in index_source_layer_ids (layer " + std::to_string(s) +
              " compresses KV, so it must own the indexer that publishes its index keys)");
    }
  }
  for (int s : c.index_source_layers) {
    if (c.compress_ratios[static_cast<size_t>(s)] == 0) {
      bad("index_source_layer_ids", list_text(c.index_source_layers),
          "layers with compress ratio > 0 (layer " + std::to_string(s) + " has ratio 0)");
    }
  }

  c.layers.assign(static_cast<size_t>(n_total), LayerSchedule{});
  int latest_kv = -1, latest_index = -1;
  for (int l = 0; l < n_total; ++l) {
    LayerSchedule& s = c.layers[static_cast<size_t>(l)];
    s.layer = l;
    s.is_dspark = l >= c.n_layers;
    s.ratio = c.compress_ratios[static_cast<size_t>(l)];
    const bool is_kv = !s.is_dspark && contains(c.kv_source_layers, l);
    const bool is_index = !s.is_dspark && contains(c.index_source_layers, l);
    if (is_kv) latest_kv = l;
    if (is_index) latest_index = l;
    s.rope_theta = s.ratio > 0 ? c.compress_rope_theta : c.rope_theta;
    s.yarn = s.ratio > 0 && c.yarn_original_max_position > 0;
    if (s.ratio == 0) {
      s.mode = AttnMode::kWindowOnly;
    } else {
      s.mode = is_kv ? AttnMode::kFull : is_index ? AttnMode::kReindex : AttnMode::kReuse;
      const std::string where = "layer " + std::to_string(l) + " has compress ratio " + std::to_string(s.ratio);
      if (latest_kv < 0) {
        bad("compress_ratios", list_text(c.compress_ratios),
            "a kv source for every compressed layer, but " + where + " and no kv source layer <= " +
                std::to_string(l) + " (kv_source_layer_ids = " + list_text(c.kv_source_layers) + ")");
      }
      int kv_ratio = c.compress_ratios[static_cast<size_t>(latest_kv)];
      if (kv_ratio != s.ratio) {
        bad("compress_ratios", list_text(c.compress_ratios),
            "each compressed layer to share the ratio of its kv source, but " + where +
                " while the latest kv source layer <= " + std::to_string(l) + " is layer " +
                std::to_string(latest_kv) + " with ratio " + std::to_string(kv_ratio));
      }
      s.kv_source = latest_kv;
      s.index_source = latest_index;  // >= latest_kv, since every kv source is an index source
    }
    if (!s.is_dspark) {
      auto e = std::find(c.engram_layer_ids.begin(), c.engram_layer_ids.end(), l);
      if (e != c.engram_layer_ids.end()) s.engram_slot = static_cast<int>(e - c.engram_layer_ids.begin());
      if (c.n_mtp_layers > 0) {
        auto t = std::find(c.dspark_target_layer_ids.begin(), c.dspark_target_layer_ids.end(), l);
        if (t != c.dspark_target_layer_ids.end()) s.dspark_tap = static_cast<int>(t - c.dspark_target_layer_ids.begin());
      }
    }
  }

  // Two-level top-k: the candidate source is a Full layer; every later index owner masks with it.
  if (c.candidate_source_layer >= 0) {
    int cs = c.candidate_source_layer;
    if (cs >= c.n_layers || c.layers[static_cast<size_t>(cs)].mode != AttnMode::kFull) {
      bad("candidate_source_layer_id", std::to_string(cs),
          "-1 or a Full layer (one in kv_source_layer_ids = " + list_text(c.kv_source_layers) + ")");
    }
    check_positive("candidate_topk_blocks", c.candidate_topk_blocks);
    check_positive("candidate_block_size", c.candidate_block_size);
    c.layers[static_cast<size_t>(cs)].is_candidate_source = true;
    for (int l = cs + 1; l < c.n_layers; ++l) {
      LayerSchedule& s = c.layers[static_cast<size_t>(l)];
      if (s.mode != AttnMode::kFull && s.mode != AttnMode::kReindex) continue;
      if (s.ratio != c.layers[static_cast<size_t>(cs)].ratio) {
        bad("candidate_source_layer_id", std::to_string(cs),
            "a layer with the ratio of every later index source layer, but layer " + std::to_string(l) +
                " has ratio " + std::to_string(s.ratio) + " and the candidate source ratio " +
                std::to_string(c.layers[static_cast<size_t>(cs)].ratio));
      }
      s.uses_candidates = true;
    }
  } else if (c.candidate_source_layer != -1) {
    bad("candidate_source_layer_id", std::to_string(c.candidate_source_layer), "-1 or a Full layer");
  }
}

std::string format_layer_schedule(const LayerSchedule& l) {
  char name[32];
  if (l.is_dspark) {
    std::snprintf(name, sizeof name, "%d (mtp)", l.layer);
  } else {
    std::snprintf(name, sizeof name, "%d", l.layer);
  }
  char kv[24] = "-", idx[24] = "-", engram[24] = "-", tap[24] = "-";
  if (l.kv_source >= 0) std::snprintf(kv, sizeof kv, "L%d", l.kv_source);
  if (l.index_source >= 0) std::snprintf(idx, sizeof idx, "L%d", l.index_source);
  if (l.engram_slot >= 0) std::snprintf(engram, sizeof engram, "table %d", l.engram_slot);
  if (l.dspark_tap >= 0) std::snprintf(tap, sizeof tap, "tap %d", l.dspark_tap);
  const char* cand = l.is_candidate_source ? "source" : l.uses_candidates ? "uses" : "-";
  char rope[48];
  std::snprintf(rope, sizeof rope, "%g%s", l.rope_theta, l.yarn ? "+yarn" : "");
  char line[256];
  std::snprintf(line, sizeof line, "%-9s ratio %d  %-8s kv %-4s index %-4s cand %-6s engram %-8s dspark %-6s rope %s",
                name, l.ratio, attn_mode_name(l.mode), kv, idx, cand, engram, tap, rope);
  return line;
}

}  // namespace di
