// DeepSeek-V4.1-Flash model configuration: the released top-level config.json (text_config,
// quantization_config) and the flat inference/config.json, read into one validated struct, plus the
// per-layer schedule derived exactly as spec §1.3.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace di {

// How a layer's compressed (CSA2) attention branch is fed.
enum class AttnMode {
  kWindowOnly,  // ratio 0: sliding window only (layers 0, 1 and the DSpark stages)
  kFull,        // owns a Compressor and an Indexer with its key projection
  kReindex,     // owns an Indexer (wq_b, weights_proj) over the latest Full layer's keys and KV
  kReuse,       // owns nothing: compressed KV of the latest Full layer, top-k of the latest index source
};

const char* attn_mode_name(AttnMode mode);

struct LayerSchedule {
  int layer = 0;              // 0..n_layers-1 backbone, n_layers.. DSpark stages (mtp.0..)
  bool is_dspark = false;     // an `mtp.*` draft stage
  int ratio = 0;              // compress ratio: 0, 1 or 2
  AttnMode mode = AttnMode::kWindowOnly;
  int kv_source = -1;         // layer whose compressed KV this layer attends to (-1: none)
  int index_source = -1;      // layer whose top-k list this layer uses (-1: none)
  bool is_candidate_source = false;  // computes the two-level candidate blocks (layer 20)
  bool uses_candidates = false;      // restricts its own top-k to the candidate blocks
  int engram_slot = -1;       // index into engram tables (0, 1) or -1
  int dspark_tap = -1;        // index of this layer's feature in the DSpark input, or -1
  double rope_theta = 0;      // plain (ratio 0) or compress rope theta (ratio > 0)
  bool yarn = false;          // YaRN frequency blend (ratio > 0)
};

struct ModelConfig {
  // --- text_config -----------------------------------------------------------------------------
  int vocab_size = 0;
  int hidden_size = 0;        // D
  int n_layers = 0;           // backbone layers (40)
  int n_heads = 0;            // H
  int n_kv_heads = 1;
  int head_dim = 0;           // Dh (512)
  int rope_dim = 0;           // qk_rope_head_dim (64), the trailing dims of each head
  int q_lora_rank = 0;
  int o_lora_rank = 0;
  int o_groups = 0;
  double rope_theta = 0;
  double compress_rope_theta = 0;
  double yarn_factor = 1;
  double yarn_beta_fast = 32;
  double yarn_beta_slow = 1;
  int64_t yarn_original_max_position = 0;
  int64_t max_position = 0;
  int window = 0;                          // sliding_window (128)
  std::vector<int> compress_ratios;        // n_layers + n_mtp_layers entries
  std::vector<int> kv_source_layers;
  std::vector<int> index_source_layers;
  int candidate_source_layer = -1;
  int candidate_topk_blocks = 0;
  int candidate_block_size = 0;
  int index_n_heads = 0;
  int index_head_dim = 0;
  int index_topk = 0;
  int n_routed_experts = 0;
  int n_activated_experts = 0;
  int n_shared_experts = 0;
  int moe_inter_dim = 0;
  double route_scale = 1;
  double gate_temp = 1;
  double swiglu_limit = 0;
  std::string score_func = "sqrtsoftplus";  // the only router scoring V4.1 uses
  bool norm_topk_prob = true;
  int hc_mult = 0;
  int hc_sinkhorn_iters = 0;
  double hc_eps = 0;
  double norm_eps = 0;
  // Engram
  std::vector<int> engram_layer_ids;
  std::vector<int64_t> engram_num_embeddings;  // rows per table, one per engram layer
  int engram_max_ngram = 0;
  int64_t engram_vocab_size = 0;
  int engram_n_heads = 0;
  int engram_head_dim = 0;
  int engram_pad_id = 0;
  int64_t engram_compressed_vocab_size = 0;
  // DSpark
  int n_mtp_layers = 0;
  int dspark_block_size = 0;
  int dspark_noise_token_id = 0;
  std::vector<int> dspark_target_layer_ids;
  int dspark_markov_rank = 0;
  int dspark_n_routed_experts = 0;
  int dspark_n_activated_experts = 0;
  // special tokens
  int bos_token_id = 0;
  int eos_token_id = 1;
  int pad_token_id = 2;
  int image_token_id = -1;
  int vision_n_layers = 0;                 // inference/config.json; > 0: checkpoint has vision.*
  // --- quantization_config ---------------------------------------------------------------------
  int weight_block = 32;                   // FP8 weight blocks are weight_block x weight_block
  std::string scale_fmt = "ue8m0";
  std::string expert_dtype = "fp4";

  // --- derived ---------------------------------------------------------------------------------
  std::vector<LayerSchedule> layers;       // n_layers + n_mtp_layers entries

  int n_total_layers() const { return n_layers + n_mtp_layers; }
  int hc_dim() const { return hc_mult * hidden_size; }
  int hc_mix_dim() const { return (2 + hc_mult) * hc_mult; }
  bool is_dspark(int layer) const { return layer >= n_layers; }
  // Routed experts / experts per token of a layer (DSpark stages have their own counts).
  int layer_n_routed_experts(int layer) const {
    return is_dspark(layer) && dspark_n_routed_experts > 0 ? dspark_n_routed_experts : n_routed_experts;
  }
  int layer_n_activated_experts(int layer) const {
    return is_dspark(layer) && dspark_n_activated_experts > 0 ? dspark_n_activated_experts
                                                               : n_activated_experts;
  }
  int engram_n_cols() const { return (engram_max_ngram - 1) * engram_n_heads; }  // hash columns (24)
};

// Checkpoint name prefix of a layer: "layers.7." for the backbone, "mtp.1." for DSpark stage 1.
std::string layer_tensor_prefix(const ModelConfig& cfg, int layer);

// One line per layer, used by `inspect`: index, ratio, mode, sources, candidates, engram, rope.
std::string format_layer_schedule(const LayerSchedule& l);

// Reads DIR/config.json (and DIR/inference/config.json when present; both must agree), validates
// every field and derives the schedule. Throws di::Error naming file, field, value and expectation.
ModelConfig load_model_config(const std::filesystem::path& model_dir);

// Same, from JSON text already in memory (`origin` names the source in errors). `inference_json` may
// be empty.
ModelConfig parse_model_config(const std::string& config_json, const std::string& inference_json,
                               const std::string& origin);

// Validates the fields and (re)derives `layers`. Throws di::Error.
void derive_schedule(ModelConfig& cfg);

}  // namespace di
