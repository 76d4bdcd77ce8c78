// config.json (+ inference/config.json) → ModelConfig. The released top-level config is the
// authority (text_config, quantization_config); the flat inference/config.json read by DeepSeek's
// reference code is optional, but every value it shares with text_config must agree.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>

#include "core/error.h"
#include "model/config.h"
#include "model/json_field.h"

namespace di {
namespace {

constexpr uint64_t kMaxConfigBytes = 16u << 20;
constexpr int64_t kMaxDim = 1 << 20;        // any width / rank / count of the model
constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kMaxTokenId = (int64_t{1} << 31) - 1;
constexpr size_t kMaxList = 4096;

std::string value_text(int64_t v) { return std::to_string(v); }
std::string value_text(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}
std::string value_text(bool v) { return v ? "true" : "false"; }
std::string value_text(const std::string& v) {
  return nlohmann::json(v).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}
std::string value_text(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ", ";
    if (i == 16) {
      s += "... (" + std::to_string(v.size()) + " entries)";
      break;
    }
    s += std::to_string(v[i]);
  }
  return s + "]";
}

// Reads text_config fields and checks the matching inference/config.json key when it is present.
class DualReader {
 public:
  explicit DualReader(const std::optional<JsonObject>& inference) : inference_(inference) {}

  template <class T, class Read>
  T read(const JsonObject& src, std::string_view key, const char* infer_key, Read read_fn) {
    T value = read_fn(src, key);
    if (infer_key && inference_ && inference_->has(infer_key)) {
      T other = read_fn(*inference_, infer_key);
      if (!(other == value)) {
        throw Error(src.file() + " and " + inference_->file() + " disagree: '" + src.field_path(key) +
                    "' = " + value_text(value) + " but '" + infer_key + "' = " + value_text(other));
      }
    }
    return value;
  }

  int64_t i(const JsonObject& s, std::string_view key, const char* ik, int64_t lo, int64_t hi) {
    return read<int64_t>(s, key, ik, [&](const JsonObject& o, std::string_view k) {
      return o.get_int(k, lo, hi);
    });
  }
  double d(const JsonObject& s, std::string_view key, const char* ik, double lo, double hi) {
    return read<double>(s, key, ik, [&](const JsonObject& o, std::string_view k) {
      return o.get_number(k, lo, hi);
    });
  }
  bool b(const JsonObject& s, std::string_view key, const char* ik) {
    return read<bool>(s, key, ik, [&](const JsonObject& o, std::string_view k) { return o.get_bool(k); });
  }
  std::string str(const JsonObject& s, std::string_view key, const char* ik) {
    return read<std::string>(s, key, ik,
                             [&](const JsonObject& o, std::string_view k) { return o.get_string(k); });
  }
  std::vector<int64_t> list(const JsonObject& s, std::string_view key, const char* ik, int64_t lo,
                            int64_t hi) {
    return read<std::vector<int64_t>>(s, key, ik, [&](const JsonObject& o, std::string_view k) {
      return o.get_int_list(k, lo, hi, kMaxList);
    });
  }

 private:
  const std::optional<JsonObject>& inference_;
};

std::vector<int> to_ints(const std::vector<int64_t>& v) { return {v.begin(), v.end()}; }

// A token id given at the top level and/or in text_config: both must agree when both are present.
int read_token_id(const JsonObject& top, const JsonObject& text, const char* key, int fallback,
                  bool required) {
  std::optional<int64_t> a, b;
  if (top.has(key)) a = top.get_int(key, 0, kMaxTokenId);
  if (text.has(key)) b = text.get_int(key, 0, kMaxTokenId);
  if (a && b && *a != *b) {
    throw Error(top.file() + ": '" + std::string(key) + "' = " + std::to_string(*a) + " but 'text_config." +
                key + "' = " + std::to_string(*b));
  }
  if (a) return static_cast<int>(*a);
  if (b) return static_cast<int>(*b);
  if (required) top.fail(key, int_range_text(0, kMaxTokenId));
  return fallback;
}

void check_equals(const JsonObject& o, std::string_view key, const std::string& want) {
  if (o.get_string(key) != want) o.fail(key, "\"" + want + "\"");
}

void parse_quantization(const JsonObject& top, const std::optional<JsonObject>& inference,
                        ModelConfig& cfg) {
  JsonObject q = top.get_object("quantization_config");
  check_equals(q, "quant_method", "fp8");
  check_equals(q, "scale_fmt", "ue8m0");
  check_equals(q, "expert_dtype", "fp4");
  if (q.has("activation_scheme")) check_equals(q, "activation_scheme", "dynamic");
  std::vector<int64_t> block = q.get_int_list("weight_block_size", 1, 1 << 16, 2);
  if (block != std::vector<int64_t>{32, 32}) q.fail("weight_block_size", "[32, 32] (V4.1 FP8 blocks)");
  cfg.weight_block = 32;
  cfg.scale_fmt = "ue8m0";
  cfg.expert_dtype = "fp4";
  if (inference) {
    if (inference->has("dtype")) check_equals(*inference, "dtype", "fp8");
    if (inference->has("expert_dtype")) check_equals(*inference, "expert_dtype", "fp4");
  }
}

void parse_text_config(const JsonObject& t, const std::optional<JsonObject>& inf, ModelConfig& c) {
  DualReader r(inf);
  if (t.has("model_type")) check_equals(t, "model_type", "deepseek_v41_text");
  c.vocab_size = static_cast<int>(r.i(t, "vocab_size", "vocab_size", 1, kMaxTokenId));
  c.hidden_size = static_cast<int>(r.i(t, "hidden_size", "dim", 1, kMaxDim));
  c.n_layers = static_cast<int>(r.i(t, "num_hidden_layers", "n_layers", 1, kMaxLayers));
  c.n_heads = static_cast<int>(r.i(t, "num_attention_heads", "n_heads", 1, kMaxDim));
  c.n_kv_heads = static_cast<int>(t.get_int("num_key_value_heads", 1, 1));
  c.head_dim = static_cast<int>(r.i(t, "head_dim", "head_dim", 1, kMaxDim));
  c.rope_dim = static_cast<int>(r.i(t, "qk_rope_head_dim", "rope_head_dim", 2, kMaxDim));
  c.q_lora_rank = static_cast<int>(r.i(t, "q_lora_rank", "q_lora_rank", 1, kMaxDim));
  c.o_lora_rank = static_cast<int>(r.i(t, "o_lora_rank", "o_lora_rank", 1, kMaxDim));
  c.o_groups = static_cast<int>(r.i(t, "o_groups", "o_groups", 1, kMaxDim));
  c.rope_theta = r.d(t, "rope_theta", "rope_theta", 1.0, 1e12);
  c.compress_rope_theta = r.d(t, "compress_rope_theta", "compress_rope_theta", 1.0, 1e12);

  if (t.has("rope_scaling")) {
    JsonObject rs = t.get_object("rope_scaling");
    check_equals(rs, "rope_type", "yarn");
    c.yarn_factor = r.d(rs, "factor", "rope_factor", 1.0, 1e6);
    c.yarn_beta_fast = r.d(rs, "beta_fast", "beta_fast", 1e-6, 1e6);
    c.yarn_beta_slow = r.d(rs, "beta_slow", "beta_slow", 1e-6, 1e6);
    c.yarn_original_max_position =
        r.i(rs, "original_max_position_embeddings", "original_seq_len", 1, int64_t{1} << 40);
  } else {
    c.yarn_factor = 1;
    c.yarn_original_max_position = 0;
    if (inf && inf->has("original_seq_len") && inf->get_int("original_seq_len", 0, 0) != 0) {
      inf->fail("original_seq_len", "0 (text_config has no rope_scaling)");
    }
  }
  c.max_position = t.get_int("max_position_embeddings", 1, int64_t{1} << 40);
  c.window = static_cast<int>(r.i(t, "sliding_window", "window_size", 1, kMaxDim));

  c.compress_ratios = to_ints(r.list(t, "compress_ratios", "compress_ratios", 0, 1 << 20));
  c.kv_source_layers = to_ints(r.list(t, "kv_source_layer_ids", "kv_source_layers", 0, kMaxLayers));
  c.index_source_layers =
      to_ints(r.list(t, "index_source_layer_ids", "index_source_layers", 0, kMaxLayers));
  c.candidate_source_layer =
      static_cast<int>(r.i(t, "candidate_source_layer_id", "candidate_source_layer", -1, kMaxLayers));
  c.candidate_topk_blocks =
      static_cast<int>(r.i(t, "candidate_topk_blocks", "candidate_topk_blocks", 0, kMaxTokenId));
  c.candidate_block_size =
      static_cast<int>(r.i(t, "candidate_block_size", "candidate_block_size", 0, kMaxDim));
  c.index_n_heads = static_cast<int>(r.i(t, "index_n_heads", "index_n_heads", 1, kMaxDim));
  c.index_head_dim = static_cast<int>(r.i(t, "index_head_dim", "index_head_dim", 1, kMaxDim));
  c.index_topk = static_cast<int>(r.i(t, "index_topk", "index_topk", 1, kMaxTokenId));

  c.n_routed_experts = static_cast<int>(r.i(t, "n_routed_experts", "n_routed_experts", 1, kMaxDim));
  c.n_activated_experts =
      static_cast<int>(r.i(t, "num_experts_per_tok", "n_activated_experts", 1, kMaxDim));
  c.n_shared_experts = static_cast<int>(r.i(t, "n_shared_experts", "n_shared_experts", 1, 1));
  c.moe_inter_dim = static_cast<int>(r.i(t, "moe_intermediate_size", "moe_inter_dim", 1, kMaxDim));
  c.score_func = r.str(t, "scoring_func", "score_func");
  if (t.has("topk_method")) check_equals(t, "topk_method", "noaux_tc");
  c.norm_topk_prob = r.b(t, "norm_topk_prob", "norm_topk_prob");
  c.route_scale = r.d(t, "routed_scaling_factor", "route_scale", 0.0, 1e6);
  c.gate_temp = r.d(t, "gate_temp", "gate_temp", 1e-6, 1e6);
  c.swiglu_limit = r.d(t, "swiglu_limit", "swiglu_limit", 0.0, 1e6);
  if (t.has("first_k_dense_replace")) t.get_int("first_k_dense_replace", 0, 0);
  if (t.has("num_hash_layers")) t.get_int("num_hash_layers", 0, 0);
  if (t.has("hidden_act")) check_equals(t, "hidden_act", "silu");

  c.hc_mult = static_cast<int>(r.i(t, "hc_mult", "hc_mult", 1, 64));
  c.hc_sinkhorn_iters = static_cast<int>(r.i(t, "hc_sinkhorn_iters", "hc_sinkhorn_iters", 1, 1000));
  c.hc_eps = r.d(t, "hc_eps", "hc_eps", 0.0, 1.0);
  c.norm_eps = r.d(t, "rms_norm_eps", "norm_eps", 0.0, 1.0);

  c.engram_layer_ids = to_ints(r.list(t, "engram_layer_ids", "engram_layer_ids", 0, kMaxLayers));
  if (!c.engram_layer_ids.empty()) {
    c.engram_num_embeddings =
        r.list(t, "engram_num_embeddings", "engram_num_embeddings", 1, int64_t{1} << 40);
    c.engram_max_ngram = static_cast<int>(r.i(t, "engram_max_ngram_size", "engram_max_ngram_size", 2, 16));
    c.engram_vocab_size = r.i(t, "engram_vocab_size", "engram_vocab_size", 2, int64_t{1} << 40);
    c.engram_n_heads = static_cast<int>(r.i(t, "engram_n_heads", "engram_n_heads", 1, 256));
    c.engram_head_dim = static_cast<int>(r.i(t, "engram_head_dim", "engram_head_dim", 1, kMaxDim));
    c.engram_pad_id = static_cast<int>(r.i(t, "engram_pad_token_id", "engram_pad_id", 0, kMaxTokenId));
    c.engram_compressed_vocab_size = r.i(t, "engram_compressed_vocab_size",
                                         "engram_compressed_vocab_size", 1, kMaxTokenId);
  }

  c.n_mtp_layers = static_cast<int>(r.i(t, "num_nextn_predict_layers", "n_mtp_layers", 0, 64));
  if (c.n_mtp_layers > 0) {
    c.dspark_block_size = static_cast<int>(r.i(t, "dspark_block_size", "dspark_block_size", 1, 1024));
    c.dspark_noise_token_id =
        static_cast<int>(r.i(t, "dspark_noise_token_id", "dspark_noise_token_id", 0, kMaxTokenId));
    c.dspark_target_layer_ids =
        to_ints(r.list(t, "dspark_target_layer_ids", "dspark_target_layer_ids", 0, kMaxLayers));
    c.dspark_markov_rank = static_cast<int>(r.i(t, "dspark_markov_rank", "dspark_markov_rank", 1, kMaxDim));
    c.dspark_n_routed_experts =
        static_cast<int>(r.i(t, "dspark_n_routed_experts", "dspark_n_routed_experts", 0, kMaxDim));
    c.dspark_n_activated_experts = static_cast<int>(
        r.i(t, "dspark_num_experts_per_tok", "dspark_n_activated_experts", 0, kMaxDim));
  }
}

}  // namespace

ModelConfig parse_model_config(const std::string& config_json, const std::string& inference_json,
                               const std::string& origin) {
  namespace fs = std::filesystem;
  const std::string config_file = (fs::path(origin) / "config.json").string();
  const std::string inference_file = (fs::path(origin) / "inference" / "config.json").string();

  nlohmann::json top_json = parse_json_text(config_json, config_file);
  nlohmann::json inf_json;
  std::optional<JsonObject> inference;
  if (!inference_json.empty()) {
    inf_json = parse_json_text(inference_json, inference_file);
    inference.emplace(inf_json, inference_file, "");
  }
  JsonObject top(top_json, config_file, "");

  std::vector<std::string> archs = top.get_string_list("architectures", 64);
  bool found = false;
  for (const std::string& a : archs) found = found || a == "DeepseekV41ForCausalLM";
  if (!found) top.fail("architectures", "a list containing \"DeepseekV41ForCausalLM\"");
  if (top.has("model_type")) check_equals(top, "model_type", "deepseek_v41");
  if (top.has("tie_word_embeddings") && top.get_bool("tie_word_embeddings")) {
    top.fail("tie_word_embeddings", "false (V4.1 has a separate head.weight)");
  }

  ModelConfig cfg;
  JsonObject text = top.get_object("text_config");
  parse_text_config(text, inference, cfg);
  parse_quantization(top, inference, cfg);

  cfg.bos_token_id = read_token_id(top, text, "bos_token_id", 0, true);
  cfg.eos_token_id = read_token_id(top, text, "eos_token_id", 1, true);
  cfg.pad_token_id = read_token_id(top, text, "pad_token_id", 2, false);
  cfg.image_token_id = read_token_id(top, text, "image_token_id", -1, false);
  if (inference && inference->has("image_token_id")) {
    int64_t v = inference->get_int("image_token_id", 0, kMaxTokenId);
    if (cfg.image_token_id < 0) {
      cfg.image_token_id = static_cast<int>(v);
    } else if (v != cfg.image_token_id) {
      throw Error(config_file + " and " + inference_file + " disagree: 'image_token_id' = " +
                  std::to_string(cfg.image_token_id) + " but 'image_token_id' = " + std::to_string(v));
    }
  }
  if (inference && inference->has("vision_n_layers")) {
    cfg.vision_n_layers = static_cast<int>(inference->get_int("vision_n_layers", 0, kMaxLayers));
  }

  try {
    derive_schedule(cfg);
  } catch (const Error& e) {
    throw Error(config_file + ": " + e.what());
  }
  return cfg;
}

ModelConfig load_model_config(const std::filesystem::path& model_dir) {
  namespace fs = std::filesystem;
  fs::path config = model_dir / "config.json";
  fs::path inference = model_dir / "inference" / "config.json";
  std::error_code ec;
  if (!fs::is_regular_file(config, ec)) {
    throw Error(model_dir.string() + ": no config.json (expected the released DeepSeek-V4.1 model directory)");
  }
  std::string config_text = read_text_file(config.string(), kMaxConfigBytes);
  std::string inference_text;
  if (fs::exists(inference, ec)) inference_text = read_text_file(inference.string(), kMaxConfigBytes);
  if (fs::exists(inference, ec) && inference_text.empty()) {
    throw Error(inference.string() + ": file is empty (expected a JSON object)");
  }
  return parse_model_config(config_text, inference_text, model_dir.string());
}

}  // namespace di
