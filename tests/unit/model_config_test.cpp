// ModelConfig: parsing the released config files, the derived per-layer schedule (spec §1.3) and
// the errors for bad configs (each must name the field).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "core/error.h"
#include "model/config.h"
#include "model/engram_hash.h"
#include "model/json_field.h"
#include "test_util.h"

namespace di {
namespace {

using testing_util::fresh_seed;

const std::string kGoldenDir = std::string(DI_TEST_DATA) + "/golden_dev/model";
const std::string kFlashDir = std::string(DI_TEST_DATA) + "/configs/v41_flash";

std::string read(const std::string& p) { return read_text_file(p, 1 << 24); }

struct ConfigTexts {
  nlohmann::json top, inf;
};

ConfigTexts golden_json() {
  return {nlohmann::json::parse(read(kGoldenDir + "/config.json")),
          nlohmann::json::parse(read(kGoldenDir + "/inference/config.json"))};
}

ModelConfig parse(const ConfigTexts& t, bool with_inference = true) {
  return parse_model_config(t.top.dump(), with_inference ? t.inf.dump() : "", "/m");
}

// Expects parse to throw di::Error whose message contains every needle.
void expect_error(const ConfigTexts& t, const std::vector<std::string>& needles) {
  try {
    parse(t);
    ADD_FAILURE() << "expected an error mentioning " << needles[0];
  } catch (const Error& e) {
    std::string msg = e.what();
    for (const std::string& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
  }
}

void expect_error(std::function<void(ConfigTexts&)> mutate, const std::vector<std::string>& needles) {
  ConfigTexts t = golden_json();
  mutate(t);
  expect_error(t, needles);
}

TEST(ModelConfig, GoldenDevFields) {
  ModelConfig c = load_model_config(kGoldenDir);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.hidden_size, 256);
  EXPECT_EQ(c.n_layers, 7);
  EXPECT_EQ(c.n_mtp_layers, 3);
  EXPECT_EQ(c.n_heads, 4);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.rope_dim, 16);
  EXPECT_EQ(c.q_lora_rank, 64);
  EXPECT_EQ(c.o_lora_rank, 64);
  EXPECT_EQ(c.o_groups, 2);
  EXPECT_EQ(c.window, 16);
  EXPECT_DOUBLE_EQ(c.yarn_factor, 4);
  EXPECT_EQ(c.yarn_original_max_position, 32);
  EXPECT_EQ(c.max_position, 128);
  EXPECT_EQ(c.n_routed_experts, 8);
  EXPECT_EQ(c.n_activated_experts, 2);
  EXPECT_EQ(c.moe_inter_dim, 128);
  EXPECT_DOUBLE_EQ(c.route_scale, 1.5);
  EXPECT_DOUBLE_EQ(c.norm_eps, 1e-20);
  EXPECT_DOUBLE_EQ(c.hc_eps, 1e-6);
  EXPECT_EQ(c.engram_layer_ids, (std::vector<int>{1, 2}));
  EXPECT_EQ(c.engram_num_embeddings, (std::vector<int64_t>{660, 864}));
  EXPECT_EQ(c.engram_n_cols(), 6);
  EXPECT_EQ(c.dspark_target_layer_ids, (std::vector<int>{4, 5, 6}));
  EXPECT_EQ(c.layer_n_routed_experts(7), 4);
  EXPECT_EQ(c.layer_n_activated_experts(9), 2);
  EXPECT_EQ(c.layer_n_routed_experts(6), 8);
  EXPECT_EQ(c.image_token_id, 129264);  // from inference/config.json
  EXPECT_EQ(c.hc_mix_dim(), 24);
  EXPECT_EQ(c.hc_dim(), 1024);
  // Without inference/config.json the same values come from config.json alone.
  ConfigTexts t = golden_json();
  ModelConfig only = parse(t, false);
  EXPECT_EQ(only.compress_ratios, c.compress_ratios);
  EXPECT_EQ(only.n_mtp_layers, 3);
}

struct Row {
  int ratio;
  AttnMode mode;
  int kv, index;
  bool cand_source, uses_cand;
  int engram, tap;
};

void expect_schedule(const ModelConfig& c, int layer, const Row& r) {
  SCOPED_TRACE("layer " + std::to_string(layer));
  const LayerSchedule& s = c.layers.at(static_cast<size_t>(layer));
  EXPECT_EQ(s.layer, layer);
  EXPECT_EQ(s.ratio, r.ratio);
  EXPECT_EQ(s.mode, r.mode) << attn_mode_name(s.mode);
  EXPECT_EQ(s.kv_source, r.kv);
  EXPECT_EQ(s.index_source, r.index);
  EXPECT_EQ(s.is_candidate_source, r.cand_source);
  EXPECT_EQ(s.uses_candidates, r.uses_cand);
  EXPECT_EQ(s.engram_slot, r.engram);
  EXPECT_EQ(s.dspark_tap, r.tap);
  EXPECT_EQ(s.is_dspark, layer >= c.n_layers);
  EXPECT_DOUBLE_EQ(s.rope_theta, r.ratio > 0 ? c.compress_rope_theta : c.rope_theta);
  EXPECT_EQ(s.yarn, r.ratio > 0);
}

TEST(ModelConfig, GoldenDevSchedule) {
  ModelConfig c = load_model_config(kGoldenDir);
  ASSERT_EQ(c.layers.size(), 10u);
  using M = AttnMode;
  expect_schedule(c, 0, {0, M::kWindowOnly, -1, -1, false, false, -1, -1});
  expect_schedule(c, 1, {0, M::kWindowOnly, -1, -1, false, false, 0, -1});
  expect_schedule(c, 2, {2, M::kFull, 2, 2, false, false, 1, -1});
  expect_schedule(c, 3, {2, M::kReuse, 2, 2, false, false, -1, -1});
  expect_schedule(c, 4, {1, M::kFull, 4, 4, true, false, -1, 0});
  expect_schedule(c, 5, {1, M::kReuse, 4, 4, false, false, -1, 1});
  expect_schedule(c, 6, {1, M::kReindex, 4, 6, false, true, -1, 2});
  for (int l = 7; l < 10; ++l) expect_schedule(c, l, {0, M::kWindowOnly, -1, -1, false, false, -1, -1});
  EXPECT_EQ(layer_tensor_prefix(c, 6), "layers.6.");
  EXPECT_EQ(layer_tensor_prefix(c, 8), "mtp.1.");
}

// Spec §1.3, row by row.
TEST(ModelConfig, FlashScheduleMatchesSpecTable) {
  ModelConfig c = load_model_config(kFlashDir);
  ASSERT_EQ(c.n_total_layers(), 43);
  using M = AttnMode;
  expect_schedule(c, 0, {0, M::kWindowOnly, -1, -1, false, false, -1, -1});
  expect_schedule(c, 1, {0, M::kWindowOnly, -1, -1, false, false, 0, -1});
  for (int l = 2; l < 20; ++l) {
    int src = l < 8 ? 2 : l < 14 ? 8 : 14;
    bool full = l == 2 || l == 8 || l == 14;
    expect_schedule(c, l, {2, full ? M::kFull : M::kReuse, src, src, false, false, l == 14 ? 1 : -1, -1});
  }
  expect_schedule(c, 20, {1, M::kFull, 20, 20, true, false, -1, -1});
  for (int l = 21; l < 40; ++l) {
    int idx = l < 24 ? 20 : l - (l % 4);  // 24, 28, 32, 36 own indexers
    bool reindex = l >= 24 && l % 4 == 0;
    int tap = l >= 37 ? l - 37 : -1;
    expect_schedule(c, l, {1, reindex ? M::kReindex : M::kReuse, 20, idx, false, reindex, -1, tap});
  }
  for (int l = 40; l < 43; ++l) expect_schedule(c, l, {0, M::kWindowOnly, -1, -1, false, false, -1, -1});

  EXPECT_EQ(c.vocab_size, 129280);
  EXPECT_EQ(c.hidden_size, 5120);
  EXPECT_EQ(c.layer_n_routed_experts(41), 128);
  EXPECT_EQ(c.layer_n_activated_experts(41), 3);
  EXPECT_EQ(c.vision_n_layers, 32);
  EXPECT_EQ(c.engram_n_cols(), 24);
}

TEST(ModelConfig, FlashEngramRowsAreThePrimeSums) {
  ModelConfig c = load_model_config(kFlashDir);
  EngramLayout layout = make_engram_layout(c);
  ASSERT_EQ(layout.n_slots(), 2);
  EXPECT_EQ(layout.rows_used(0), 384006168);
  EXPECT_EQ(layout.rows_used(1), 384016682);
}

TEST(ModelConfig, ScheduleLineNamesEverything) {
  ModelConfig c = load_model_config(kGoldenDir);
  std::string line = format_layer_schedule(c.layers[6]);
  EXPECT_NE(line.find("reindex"), std::string::npos) << line;
  EXPECT_NE(line.find("L4"), std::string::npos) << line;
  EXPECT_NE(line.find("L6"), std::string::npos) << line;
  EXPECT_NE(line.find("uses"), std::string::npos) << line;
  EXPECT_NE(line.find("yarn"), std::string::npos) << line;
}

// ---------------------------------------------------------------------------------------------
// Errors: each names the field (and the file for parse errors).

TEST(ModelConfigErrors, MissingAndWrongType) {
  expect_error([](ConfigTexts& t) { t.top["text_config"].erase("hidden_size"); },
               {"/m/config.json", "missing field 'text_config.hidden_size'"});
  expect_error([](ConfigTexts& t) { t.top["text_config"]["hidden_size"] = "256"; },
               {"text_config.hidden_size", "\"256\"", "integer"});
  expect_error([](ConfigTexts& t) { t.top["text_config"]["hidden_size"] = 256.5; }, {"text_config.hidden_size", "256.5"});
  expect_error([](ConfigTexts& t) { t.top["text_config"]["vocab_size"] = 1e30; }, {"text_config.vocab_size"});
  expect_error([](ConfigTexts& t) { t.top["text_config"]["sliding_window"] = -16; }, {"text_config.sliding_window", "-16"});
  expect_error([](ConfigTexts& t) { t.top["text_config"]["norm_topk_prob"] = "true"; }, {"text_config.norm_topk_prob"});
  expect_error([](ConfigTexts& t) { t.top["text_config"]["rope_scaling"]["factor"] = "4"; },
               {"text_config.rope_scaling.factor"});
  expect_error([](ConfigTexts& t) { t.top["text_config"]["kv_source_layer_ids"] = {2, "x"}; },
               {"text_config.kv_source_layer_ids[1]", "\"x\""});
  expect_error([](ConfigTexts& t) { t.top["text_config"]["compress_ratios"] = 2; }, {"text_config.compress_ratios"});
  expect_error([](ConfigTexts& t) { t.top.erase("text_config"); }, {"missing field 'text_config'"});
  expect_error([](ConfigTexts& t) { t.top["text_config"] = nlohmann::json::array(); }, {"'text_config'", "object"});
  expect_error([](ConfigTexts& t) { t.top = nlohmann::json::array({1, 2}); }, {"top level", "object"});
  expect_error([](ConfigTexts& t) { t.top.erase("architectures"); }, {"architectures"});
  expect_error([](ConfigTexts& t) { t.top["architectures"] = {"DeepseekV3ForCausalLM"}; },
               {"architectures", "DeepseekV41ForCausalLM"});
  expect_error([](ConfigTexts& t) { t.top["text_config"]["num_key_value_heads"] = 2; }, {"num_key_value_heads"});
  expect_error([](ConfigTexts& t) { t.top["text_config"]["n_shared_experts"] = 2; }, {"n_shared_experts"});
  expect_error([](ConfigTexts& t) { t.top["text_config"]["hidden_act"] = "gelu"; }, {"hidden_act", "gelu"});
  expect_error([](ConfigTexts& t) { t.top["text_config"]["first_k_dense_replace"] = 3; }, {"first_k_dense_replace"});
  expect_error([](ConfigTexts& t) { t.top.erase("bos_token_id"); t.top["text_config"].erase("bos_token_id"); },
               {"bos_token_id"});
  expect_error([](ConfigTexts& t) { t.top["bos_token_id"] = 5; }, {"bos_token_id", "5"});
}

TEST(ModelConfigErrors, InvalidJson) {
  try {
    parse_model_config("{\"architectures\": [", "", "/m");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/m/config.json: not valid JSON"), std::string::npos) << e.what();
  }
  ConfigTexts t = golden_json();
  try {
    parse_model_config(t.top.dump(), "{\"dim\": }", "/m");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/m/inference/config.json"), std::string::npos) << e.what();
  }
}

TEST(ModelConfigErrors, Quantization) {
  expect_error([](ConfigTexts& t) { t.top["quantization_config"]["weight_block_size"] = {128, 128}; },
               {"quantization_config.weight_block_size", "[32, 32]"});
  expect_error([](ConfigTexts& t) { t.top["quantization_config"]["quant_method"] = "bf16"; },
               {"quantization_config.quant_method", "\"fp8\""});
  expect_error([](ConfigTexts& t) { t.top["quantization_config"]["scale_fmt"] = "fp32"; },
               {"quantization_config.scale_fmt"});
  expect_error([](ConfigTexts& t) { t.top["quantization_config"]["expert_dtype"] = "fp8"; },
               {"quantization_config.expert_dtype"});
  expect_error([](ConfigTexts& t) { t.top.erase("quantization_config"); }, {"quantization_config"});
  expect_error([](ConfigTexts& t) { t.inf["expert_dtype"] = "bf16"; }, {"inference/config.json", "expert_dtype"});
}

TEST(ModelConfigErrors, InferenceDisagrees) {
  expect_error([](ConfigTexts& t) { t.inf["dim"] = 512; },
               {"/m/config.json", "/m/inference/config.json", "text_config.hidden_size", "'dim'", "256", "512"});
  expect_error([](ConfigTexts& t) { t.inf["compress_ratios"][3] = 1; }, {"compress_ratios", "disagree"});
  expect_error([](ConfigTexts& t) { t.inf["rope_factor"] = 8; }, {"rope_scaling.factor", "rope_factor", "8"});
  expect_error([](ConfigTexts& t) { t.inf["n_mtp_layers"] = 1; }, {"num_nextn_predict_layers", "n_mtp_layers"});
  expect_error([](ConfigTexts& t) { t.inf["dim"] = "256"; }, {"inference/config.json", "'dim'"});
  expect_error([](ConfigTexts& t) { t.inf["engram_pad_id"] = 3; }, {"engram_pad_token_id", "engram_pad_id"});
}

TEST(ModelConfigErrors, InconsistentValues) {
  expect_error([](ConfigTexts& t) { t.top["text_config"]["hidden_size"] = 100; t.inf.erase("dim"); },
               {"hidden_size", "100", "multiple of 32"});
  expect_error([](ConfigTexts& t) { t.top["text_config"]["o_groups"] = 3; t.inf.erase("o_groups"); }, {"o_groups", "3"});
  expect_error([](ConfigTexts& t) { t.top["text_config"]["num_experts_per_tok"] = 9; t.inf.erase("n_activated_experts"); },
               {"num_experts_per_tok", "9"});
  expect_error([](ConfigTexts& t) { t.top["text_config"]["qk_rope_head_dim"] = 15; t.inf.erase("rope_head_dim"); },
               {"qk_rope_head_dim", "15"});
  expect_error([](ConfigTexts& t) { t.top["text_config"]["scoring_func"] = "softmax"; t.inf.erase("score_func"); },
               {"scoring_func", "softmax"});
  expect_error([](ConfigTexts& t) { t.top["text_config"]["dspark_noise_token_id"] = 512; t.inf.erase("dspark_noise_token_id"); },
               {"dspark_noise_token_id", "512"});
  expect_error([](ConfigTexts& t) {
    t.top["text_config"]["dspark_target_layer_ids"] = {5, 4, 6};
    t.inf.erase("dspark_target_layer_ids");
  }, {"dspark_target_layer_ids"});
  expect_error([](ConfigTexts& t) {
    t.top["text_config"]["engram_num_embeddings"] = {661, 864};
    t.inf.erase("engram_num_embeddings");
  }, {"engram_num_embeddings[0]", "661", "660"});
  expect_error([](ConfigTexts& t) { t.top["text_config"]["engram_layer_ids"] = {1, 7}; t.inf.erase("engram_layer_ids"); },
               {"engram_layer_ids", "7"});
  expect_error([](ConfigTexts& t) { t.top["text_config"]["engram_head_dim"] = 48; t.inf.erase("engram_head_dim"); },
               {"engram_head_dim", "48"});
}

// Replaces the schedule fields in both files (they must agree).
void set_schedule(ConfigTexts& t, const std::vector<int>& ratios, const std::vector<int>& kv,
                  const std::vector<int>& index, int candidate) {
  t.top["text_config"]["compress_ratios"] = ratios;
  t.top["text_config"]["kv_source_layer_ids"] = kv;
  t.top["text_config"]["index_source_layer_ids"] = index;
  t.top["text_config"]["candidate_source_layer_id"] = candidate;
  t.inf["compress_ratios"] = ratios;
  t.inf["kv_source_layers"] = kv;
  t.inf["index_source_layers"] = index;
  t.inf["candidate_source_layer"] = candidate;
}

TEST(ModelConfigErrors, Schedule) {
  // compress_ratios must have n_layers + n_mtp_layers entries.
  expect_error([](ConfigTexts& t) { set_schedule(t, {0, 0, 2, 2, 1, 1, 1, 0, 0}, {2, 4}, {2, 4, 6}, 4); },
               {"compress_ratios", "9 entries", "10 entries"});
  // DSpark entries must be 0.
  expect_error([](ConfigTexts& t) { set_schedule(t, {0, 0, 2, 2, 1, 1, 1, 0, 2, 0}, {2, 4}, {2, 4, 6}, 4); },
               {"compress_ratios[8]", "mtp.1"});
  expect_error([](ConfigTexts& t) { set_schedule(t, {0, 0, 2, 3, 1, 1, 1, 0, 0, 0}, {2, 4}, {2, 4, 6}, 4); },
               {"compress_ratios[3]", "3"});
  // A compressed layer with no kv source at or below it.
  expect_error([](ConfigTexts& t) { set_schedule(t, {0, 0, 2, 2, 1, 1, 1, 0, 0, 0}, {3, 4}, {3, 4, 6}, 4); },
               {"compress_ratios", "layer 2 has compress ratio 2", "no kv source layer <= 2"});
  // The latest kv source has another ratio.
  expect_error([](ConfigTexts& t) { set_schedule(t, {0, 0, 2, 2, 1, 1, 1, 0, 0, 0}, {2}, {2, 6}, -1); },
               {"compress_ratios", "layer 4 has compress ratio 1", "layer 2 with ratio 2"});
  // Sources with ratio 0, outside the backbone, repeated, kv source without indexer.
  expect_error([](ConfigTexts& t) { set_schedule(t, {0, 0, 2, 2, 1, 1, 1, 0, 0, 0}, {1, 2, 4}, {1, 2, 4, 6}, 4); },
               {"kv_source_layer_ids", "layer 1 has ratio 0"});
  expect_error([](ConfigTexts& t) { set_schedule(t, {0, 0, 2, 2, 1, 1, 1, 0, 0, 0}, {2, 4}, {0, 2, 4, 6}, 4); },
               {"index_source_layer_ids", "layer 0 has ratio 0"});
  expect_error([](ConfigTexts& t) { set_schedule(t, {0, 0, 2, 2, 1, 1, 1, 0, 0, 0}, {2, 4, 8}, {2, 4, 6, 8}, 4); },
               {"kv_source_layer_ids", "[0, num_hidden_layers = 7)"});
  expect_error([](ConfigTexts& t) { set_schedule(t, {0, 0, 2, 2, 1, 1, 1, 0, 0, 0}, {2, 4, 4}, {2, 4, 6}, 4); },
               {"kv_source_layer_ids", "repeat"});
  expect_error([](ConfigTexts& t) { set_schedule(t, {0, 0, 2, 2, 1, 1, 1, 0, 0, 0}, {2, 4}, {2, 6}, -1); },
               {"kv_source_layer_ids", "index_source_layer_ids"});
  // Candidate source must be a Full layer; its parameters positive.
  expect_error([](ConfigTexts& t) { set_schedule(t, {0, 0, 2, 2, 1, 1, 1, 0, 0, 0}, {2, 4}, {2, 4, 6}, 6); },
               {"candidate_source_layer_id", "6", "Full"});
  expect_error([](ConfigTexts& t) { set_schedule(t, {0, 0, 2, 2, 1, 1, 1, 0, 0, 0}, {2, 4}, {2, 4, 6}, 2); },
               {"candidate_source_layer_id", "layer 4 has ratio 1"});
  expect_error([](ConfigTexts& t) {
    t.top["text_config"]["candidate_topk_blocks"] = 0;
    t.inf["candidate_topk_blocks"] = 0;
  }, {"candidate_topk_blocks"});
}

// ---------------------------------------------------------------------------------------------
// Random schedules against an independent model of the reference's shared slots: layers run in
// order, a kv source publishes its compressed KV, an index source its top-k list, and every
// compressed layer reads whatever was published last.

TEST(ModelConfig, RandomSchedulesMatchReferenceSemantics) {
  std::mt19937_64 rng(fresh_seed("RandomSchedulesMatchReferenceSemantics"));
  int n_valid = 0;
  for (int iter = 0; iter < 400; ++iter) {
    ConfigTexts t = golden_json();
    const int n_layers = 2 + static_cast<int>(rng() % 14);
    const int n_mtp = static_cast<int>(rng() % 3);
    std::vector<int> ratios, kv, index;
    for (int l = 0; l < n_layers; ++l) ratios.push_back(static_cast<int>(rng() % 3));
    for (int l = 0; l < n_mtp; ++l) ratios.push_back(0);
    for (int l = 0; l < n_layers; ++l) {
      if (ratios[static_cast<size_t>(l)] == 0) continue;
      uint64_t r = rng() % 4;
      if (r == 0) kv.push_back(l);
      if (r <= 1) index.push_back(l);
    }
    int candidate = -1;
    if (!kv.empty() && rng() % 2) candidate = kv[rng() % kv.size()];
    t.top["text_config"]["num_hidden_layers"] = n_layers;
    t.top["text_config"]["num_nextn_predict_layers"] = n_mtp;
    t.top["text_config"]["engram_layer_ids"] = std::vector<int>{};
    t.top["text_config"]["dspark_target_layer_ids"] = std::vector<int>{n_layers - 1};
    set_schedule(t, ratios, kv, index, candidate);
    ModelConfig c;
    try {
      c = parse(t, false);
    } catch (const Error& e) {
      // Must be one of the schedule rules; then check it really is violated below.
      std::string msg = e.what();
      EXPECT_TRUE(msg.find("compress_ratios") != std::string::npos ||
                  msg.find("kv_source_layer_ids") != std::string::npos ||
                  msg.find("candidate_source_layer_id") != std::string::npos)
          << msg;
      continue;
    }
    ++n_valid;
    int pub_kv = -1, pub_idx = -1;
    for (int l = 0; l < n_layers + n_mtp; ++l) {
      const LayerSchedule& s = c.layers[static_cast<size_t>(l)];
      const int r = ratios[static_cast<size_t>(l)];
      const bool backbone = l < n_layers;
      const bool is_kv = backbone && std::count(kv.begin(), kv.end(), l);
      const bool is_idx = backbone && std::count(index.begin(), index.end(), l);
      if (r > 0) {
        if (is_kv) pub_kv = l;
        if (is_idx) pub_idx = l;
        ASSERT_GE(pub_kv, 0);
        EXPECT_EQ(ratios[static_cast<size_t>(pub_kv)], r);
        EXPECT_EQ(s.kv_source, pub_kv) << "layer " << l;
        EXPECT_EQ(s.index_source, pub_idx) << "layer " << l;
        EXPECT_EQ(s.mode, is_kv ? AttnMode::kFull : is_idx ? AttnMode::kReindex : AttnMode::kReuse);
        EXPECT_EQ(s.uses_candidates, is_idx && candidate >= 0 && candidate < l);
        EXPECT_EQ(s.is_candidate_source, l == candidate);
      } else {
        EXPECT_EQ(s.mode, AttnMode::kWindowOnly);
        EXPECT_EQ(s.kv_source, -1);
      }
    }
  }
  EXPECT_GT(n_valid, 10);
}

// Byte-level corruption of config.json: parse either succeeds or throws di::Error; never crashes.
TEST(ModelConfig, CorruptedTextNeverCrashes) {
  std::mt19937_64 rng(fresh_seed("CorruptedTextNeverCrashes"));
  const std::string base = read(kGoldenDir + "/config.json");
  const std::string inf = read(kGoldenDir + "/inference/config.json");
  int errors = 0;
  for (int iter = 0; iter < 300; ++iter) {
    std::string text = base;
    int n = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < n; ++k) {
      size_t pos = rng() % text.size();
      switch (rng() % 3) {
        case 0: text[pos] = static_cast<char>(rng() % 256); break;
        case 1: text.erase(pos, 1 + rng() % 20); break;
        default: text.insert(pos, std::string(1 + rng() % 3, "0123456789-[]{}\",."[rng() % 18])); break;
      }
    }
    try {
      parse_model_config(text, iter % 2 ? inf : "", "/m");
    } catch (const Error&) {
      ++errors;
    }
  }
  EXPECT_GT(errors, 0);
}

}  // namespace
}  // namespace di
