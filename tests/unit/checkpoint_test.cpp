// The expected tensor list (spec §4), validation of checkpoints against it, and the random
// checkpoint writer (written, re-opened and validated; sharded; plausible values).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "model/checkpoint_validate.h"
#include "model/checkpoint_writer.h"
#include "model/config.h"
#include "model/memory_estimate.h"
#include "model/safetensors.h"
#include "test_util.h"

namespace di {
namespace {

using testing_util::fresh_seed;
using testing_util::TempDir;

namespace fs = std::filesystem;

const std::string kGoldenDir = std::string(DI_TEST_DATA) + "/golden_dev/model";
const std::string kFlashDir = std::string(DI_TEST_DATA) + "/configs/v41_flash";

const ExpectedTensor* find(const std::vector<ExpectedTensor>& v, const std::string& name) {
  for (const ExpectedTensor& e : v) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

void expect_shape(const std::vector<ExpectedTensor>& v, const std::string& name, DType dt,
                  std::vector<int64_t> shape) {
  const ExpectedTensor* e = find(v, name);
  ASSERT_NE(e, nullptr) << name;
  EXPECT_EQ(e->dtype, dt) << name;
  EXPECT_EQ(e->shape, shape) << name;
}

TEST(CheckpointManifest, GoldenValidatesExactly) {
  ModelConfig cfg = load_model_config(kGoldenDir);
  std::unique_ptr<Checkpoint> ck = Checkpoint::open(kGoldenDir);
  ValidationReport r = validate_checkpoint(cfg, *ck, false);
  EXPECT_EQ(r.n_expected_found, ck->tensors().size());
  EXPECT_EQ(r.n_optional_missing, 10u);  // gate.bias_vl of 7 layers + 3 stages
  EXPECT_EQ(r.n_unexpected, 0u);
  std::vector<ExpectedTensor> exp = expected_tensors(cfg);
  size_t required = 0;
  for (const ExpectedTensor& e : exp) required += !e.optional;
  EXPECT_EQ(required, ck->tensors().size());
}

// Shapes confirmed against the real shard headers (spec §4 [HDR]).
TEST(CheckpointManifest, FlashShapesMatchSpec) {
  ModelConfig cfg = load_model_config(kFlashDir);
  std::vector<ExpectedTensor> v = expected_tensors(cfg);
  expect_shape(v, "embed.weight", DType::kBF16, {129280, 5120});
  expect_shape(v, "head.weight", DType::kBF16, {129280, 5120});
  expect_shape(v, "layers.0.attn.wq_a.weight", DType::kF8E4M3, {1280, 5120});
  expect_shape(v, "layers.0.attn.wq_b.scale", DType::kF8E8M0, {1024, 40});
  expect_shape(v, "layers.0.attn.wo_a.weight", DType::kF8E4M3, {8192, 4096});
  expect_shape(v, "layers.0.attn.wo_a.scale", DType::kF8E8M0, {256, 128});
  expect_shape(v, "layers.0.attn.wo_b.weight", DType::kF8E4M3, {5120, 8192});
  expect_shape(v, "layers.0.attn.attn_sink", DType::kF32, {64});
  expect_shape(v, "layers.5.hc_attn_fn", DType::kF32, {24, 20480});
  expect_shape(v, "layers.5.hc_ffn_scale", DType::kF32, {3});
  expect_shape(v, "layers.2.attn.compressor.wgate.weight", DType::kBF16, {512, 5120});
  EXPECT_EQ(find(v, "layers.20.attn.compressor.wgate.weight"), nullptr);
  expect_shape(v, "layers.20.attn.compressor.wkv.weight", DType::kBF16, {512, 5120});
  expect_shape(v, "layers.24.attn.indexer.wq_b.weight", DType::kF8E4M3, {4096, 1280});
  expect_shape(v, "layers.24.attn.indexer.weights_proj.weight", DType::kBF16, {32, 5120});
  EXPECT_EQ(find(v, "layers.24.attn.indexer.wk.weight"), nullptr);
  expect_shape(v, "layers.20.attn.indexer.wk.weight", DType::kBF16, {128, 512});
  EXPECT_EQ(find(v, "layers.25.attn.indexer.wq_b.weight"), nullptr);
  EXPECT_EQ(find(v, "layers.3.attn.compressor.wkv.weight"), nullptr);
  expect_shape(v, "layers.7.ffn.gate.weight", DType::kBF16, {384, 5120});
  expect_shape(v, "layers.7.ffn.gate.bias", DType::kF32, {384});
  EXPECT_TRUE(find(v, "layers.7.ffn.gate.bias_vl")->optional);
  expect_shape(v, "layers.7.ffn.experts.383.w1.weight", DType::kI8, {2304, 2560});
  expect_shape(v, "layers.7.ffn.experts.0.w1.scale", DType::kF8E8M0, {2304, 160});
  expect_shape(v, "layers.7.ffn.experts.0.w2.weight", DType::kI8, {5120, 1152});
  expect_shape(v, "layers.7.ffn.experts.0.w2.scale", DType::kF8E8M0, {5120, 72});
  EXPECT_EQ(find(v, "layers.7.ffn.experts.384.w1.weight"), nullptr);
  expect_shape(v, "layers.7.ffn.shared_experts.w2.weight", DType::kF8E4M3, {5120, 2304});
  expect_shape(v, "layers.1.engram.embed.weight", DType::kF8E4M3, {384006168, 256});
  expect_shape(v, "layers.14.engram.embed.scale", DType::kF8E8M0, {384016682, 8});
  expect_shape(v, "layers.14.engram.wkv.weight", DType::kF8E4M3, {25600, 6144});
  expect_shape(v, "layers.1.engram.q_weight", DType::kBF16, {4, 5120});
  EXPECT_EQ(find(v, "layers.2.engram.wkv.weight"), nullptr);
  expect_shape(v, "mtp.0.ffn.experts.127.w1.weight", DType::kI8, {2304, 2560});
  EXPECT_EQ(find(v, "mtp.0.ffn.experts.128.w1.weight"), nullptr);
  expect_shape(v, "mtp.0.ffn.gate.weight", DType::kBF16, {128, 5120});
  expect_shape(v, "mtp.0.main_proj.weight", DType::kF8E4M3, {5120, 15360});
  expect_shape(v, "mtp.0.main_norm.weight", DType::kBF16, {5120});
  EXPECT_EQ(find(v, "mtp.1.main_proj.weight"), nullptr);
  expect_shape(v, "mtp.2.markov_head.embed.weight", DType::kBF16, {129280, 256});
  expect_shape(v, "mtp.2.markov_head.head.weight", DType::kBF16, {129280, 256});
  expect_shape(v, "mtp.2.confidence_head.proj.weight", DType::kBF16, {1, 5376});
  expect_shape(v, "mtp.2.norm.weight", DType::kBF16, {5120});
  EXPECT_EQ(find(v, "mtp.0.norm.weight"), nullptr);
  EXPECT_EQ(find(v, "mtp.1.attn.compressor.wkv.weight"), nullptr);

  // Byte totals against spec §6.1: backbone ~298.6 GB, Engram tables 202.8 GB, DSpark ~7.9 GB,
  // ~510 GB in all (vision excluded).
  std::map<TensorGroup, double> gb;
  size_t n = 0;
  for (const ExpectedTensor& e : v) {
    if (e.optional) continue;
    gb[e.group] += static_cast<double>(e.nbytes()) / 1e9;
    ++n;
  }
  EXPECT_NEAR(gb[TensorGroup::kBackbone], 298.6, 3.0);
  EXPECT_NEAR(gb[TensorGroup::kEngramTable], 202.8, 0.5);
  EXPECT_NEAR(gb[TensorGroup::kDSpark], 7.9, 0.2);
  // 96,085 tensors in the release, which also holds vision tensors and 43 gate.bias_vl.
  EXPECT_GT(n, 95000u);
  EXPECT_LT(n, 96085u);

  KvCacheBytes kv = kv_cache_bytes(cfg);
  EXPECT_EQ(kv.window_record, 528u);
  EXPECT_EQ(kv.compressed_record, 288u);
  EXPECT_EQ(kv.index_key_record, 68u);
  EXPECT_DOUBLE_EQ(kv.global_per_token, 890.0);  // spec §3.1 / model card
  EXPECT_EQ(kv.window_per_request, 43u * 128u * 528u);
}

// Rewrites the golden file with `mutate` applied to its header (data section unchanged).
// `append` zero bytes are added after the data section (for new tensors).
fs::path mutated_golden(const TempDir& dir, const std::function<void(nlohmann::json&)>& mutate, size_t append = 0) {
  std::ifstream in(kGoldenDir + "/model.safetensors", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[static_cast<size_t>(i)]);
  nlohmann::json h = nlohmann::json::parse(bytes.substr(8, n));
  mutate(h);
  std::string header = h.dump();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>(header.size() >> (8 * i));
  out += header + bytes.substr(8 + n) + std::string(append, '\0');
  fs::path model = dir.path() / "model";
  fs::create_directories(model);
  std::ofstream(model / "model.safetensors", std::ios::binary).write(out.data(), static_cast<std::streamsize>(out.size()));
  return model;
}

void expect_invalid(const std::function<void(nlohmann::json&)>& mutate, bool allow_unexpected,
                    const std::vector<std::string>& needles) {
  TempDir dir;
  fs::path model = mutated_golden(dir, mutate);
  ModelConfig cfg = load_model_config(kGoldenDir);
  std::unique_ptr<Checkpoint> ck = Checkpoint::open(model);
  try {
    validate_checkpoint(cfg, *ck, allow_unexpected);
    ADD_FAILURE() << "expected a validation error mentioning " << needles[0];
  } catch (const Error& e) {
    std::string msg = e.what();
    for (const std::string& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
  }
}

TEST(CheckpointValidate, Problems) {
  expect_invalid([](nlohmann::json& h) { h.erase("layers.3.attn.wq_a.weight"); }, false,
                 {"missing tensor 'layers.3.attn.wq_a.weight'", "F8_E4M3 [64, 256]"});
  expect_invalid([](nlohmann::json& h) { h.erase("layers.3.attn.wq_a.weight"); }, true, {"missing tensor"});
  expect_invalid([](nlohmann::json& h) { h["layers.0.attn.wkv.weight"]["shape"] = {256, 64}; }, false,
                 {"'layers.0.attn.wkv.weight'", "model.safetensors", "F8_E4M3 [256, 64]", "expected F8_E4M3 [64, 256]"});
  expect_invalid([](nlohmann::json& h) { h["layers.0.attn.wkv.weight"]["dtype"] = "I8"; }, false,
                 {"'layers.0.attn.wkv.weight'", "is I8 [64, 256]", "expected F8_E4M3 [64, 256]"});
  expect_invalid([](nlohmann::json& h) { h["layers.9.attn.extra"] = {{"dtype", "F32"}, {"shape", {0}}, {"data_offsets", {0, 0}}}; },
                 false, {"unexpected tensor 'layers.9.attn.extra'", "--allow-unexpected"});
  // A wrong-shaped optional tensor is still an error.
  expect_invalid([](nlohmann::json& h) {
    h["layers.0.ffn.gate.bias_vl"] = {{"dtype", "F32"}, {"shape", {0, 8}}, {"data_offsets", {0, 0}}};
  }, false, {"'layers.0.ffn.gate.bias_vl'", "expected F32 [8]"});
  // Many problems are listed, then counted.
  expect_invalid([](nlohmann::json& h) {
    for (int e = 0; e < 8; ++e) h.erase("layers.0.ffn.experts." + std::to_string(e) + ".w1.weight");
    for (int e = 0; e < 8; ++e) h.erase("layers.1.ffn.experts." + std::to_string(e) + ".w1.weight");
    for (int e = 0; e < 8; ++e) h.erase("layers.2.ffn.experts." + std::to_string(e) + ".w1.weight");
  }, false, {"24 problems", "and 4 more"});
}

TEST(CheckpointValidate, AllowedExtras) {
  TempDir dir;
  fs::path model = mutated_golden(dir, [](nlohmann::json& h) {
    h["layers.9.attn.extra"] = {{"dtype", "F32"}, {"shape", {0}}, {"data_offsets", {0, 0}}};
    h["vision.blocks.0.attn.qkv.weight"] = {{"dtype", "BF16"}, {"shape", {0}}, {"data_offsets", {0, 0}}};
    const uint64_t end = 9045284;  // golden data section size
    h["layers.0.ffn.gate.bias_vl"] = {{"dtype", "F32"}, {"shape", {8}}, {"data_offsets", {end, end + 32}}};
  }, 32);
  ModelConfig cfg = load_model_config(kGoldenDir);
  std::unique_ptr<Checkpoint> ck = Checkpoint::open(model);
  EXPECT_THROW(validate_checkpoint(cfg, *ck, false), Error);  // the extra tensor
  ValidationReport r = validate_checkpoint(cfg, *ck, true);
  EXPECT_EQ(r.n_unexpected, 1u);
  EXPECT_EQ(r.n_vision_ignored, 1u);
  EXPECT_EQ(r.n_optional_missing, 9u);
}

// ---------------------------------------------------------------------------------------------
// Writer.

float bf16_to_float(const uint8_t* p) {
  uint32_t u = static_cast<uint32_t>(p[0] | (p[1] << 8)) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

double e4m3_value(uint8_t c) {
  int sign = c >> 7, exp = (c >> 3) & 15, mant = c & 7;
  double v = exp == 0 ? std::ldexp(mant / 8.0, -6) : std::ldexp(1 + mant / 8.0, exp - 7);
  return sign ? -v : v;
}

TEST(CheckpointWriter, GoldenConfigRoundTrip) {
  const uint64_t seed = fresh_seed("CheckpointWriter.GoldenConfigRoundTrip");
  TempDir dir;
  fs::path out = dir.path() / "model";
  copy_model_config(kGoldenDir, out);
  EXPECT_TRUE(fs::exists(out / "config.json"));
  EXPECT_TRUE(fs::exists(out / "inference" / "config.json"));
  ModelConfig cfg = load_model_config(out);
  CheckpointWriteOptions opt;
  opt.seed = seed;
  CheckpointWriteResult r = write_random_checkpoint(cfg, out, opt);
  EXPECT_EQ(r.n_shards, 1u);
  EXPECT_TRUE(fs::exists(out / "model.safetensors"));
  EXPECT_FALSE(fs::exists(out / "model.safetensors.index.json"));

  std::unique_ptr<Checkpoint> ck = Checkpoint::open(out);
  validate_checkpoint(cfg, *ck, false);
  // Same names, shapes and dtypes as the official golden checkpoint.
  std::unique_ptr<Checkpoint> golden = Checkpoint::open(kGoldenDir);
  ASSERT_EQ(ck->tensors().size(), golden->tensors().size());
  for (const auto& [name, g] : golden->tensors()) {
    const TensorView* v = ck->find(name);
    ASSERT_NE(v, nullptr) << name;
    EXPECT_EQ(v->shape, g.shape) << name;
    EXPECT_EQ(v->dtype, g.dtype) << name;
  }
  EXPECT_EQ(r.n_tensors, ck->tensors().size());

  // Plausible values: no NaN codes, FP8 weights dequantize to RMS ~ 1/sqrt(fan_in), norms ~1.
  for (const auto& [name, v] : ck->tensors()) {
    if (v.dtype == DType::kF8E4M3) {
      for (uint64_t i = 0; i < v.nbytes; ++i) ASSERT_NE(v.data[i] & 0x7f, 0x7f) << name;
    }
    if (v.dtype == DType::kF8E8M0) {
      for (uint64_t i = 0; i < v.nbytes; ++i) ASSERT_LE(v.data[i], 127) << name;  // scales <= 1
    }
    if (v.dtype == DType::kF32) {
      for (uint64_t i = 0; i < v.nbytes; i += 4) {
        float f;
        std::memcpy(&f, v.data + i, 4);
        ASSERT_TRUE(std::isfinite(f) && std::fabs(f) < 2) << name;
      }
    }
  }
  const TensorView& w = ck->get("layers.3.attn.wq_a.weight");   // [64, 256]
  const TensorView& s = ck->get("layers.3.attn.wq_a.scale");    // [2, 8]
  double sum2 = 0;
  for (int64_t rI = 0; rI < 64; ++rI) {
    for (int64_t c = 0; c < 256; ++c) {
      double x = e4m3_value(w.data[rI * 256 + c]) * std::ldexp(1.0, s.data[(rI / 32) * 8 + c / 32] - 127);
      sum2 += x * x;
    }
  }
  double rms = std::sqrt(sum2 / (64 * 256));
  EXPECT_GT(rms, 0.25 / 16);
  EXPECT_LT(rms, 4.0 / 16);  // 1/sqrt(256) = 1/16
  const TensorView& norm = ck->get("layers.2.attn_norm.weight");
  for (int64_t i = 0; i < 256; ++i) {
    float f = bf16_to_float(norm.data + 2 * i);
    EXPECT_GT(f, 0.85f);
    EXPECT_LT(f, 1.15f);
  }
}

TEST(CheckpointWriter, ShardedAndDeterministic) {
  const uint64_t seed = fresh_seed("CheckpointWriter.ShardedAndDeterministic");
  TempDir dir;
  ModelConfig cfg = load_model_config(kGoldenDir);
  fs::path one = dir.path() / "one", many = dir.path() / "many", other = dir.path() / "other";
  CheckpointWriteOptions opt;
  opt.seed = seed;
  copy_model_config(kGoldenDir, one);
  write_random_checkpoint(cfg, one, opt);
  opt.shard_bytes = 700'000;
  copy_model_config(kGoldenDir, many);
  CheckpointWriteResult r = write_random_checkpoint(cfg, many, opt);
  EXPECT_GT(r.n_shards, 5u);
  EXPECT_TRUE(fs::exists(many / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(many / "model.safetensors"));
  opt.seed = seed + 1;
  copy_model_config(kGoldenDir, other);
  write_random_checkpoint(cfg, other, opt);

  std::unique_ptr<Checkpoint> a = Checkpoint::open(one), b = Checkpoint::open(many), c = Checkpoint::open(other);
  validate_checkpoint(load_model_config(many), *b, false);
  std::set<std::string> files;
  size_t n_diff = 0;
  for (const auto& [name, va] : a->tensors()) {
    const TensorView& vb = b->get(name);
    files.insert(vb.file);
    ASSERT_EQ(va.nbytes, vb.nbytes);
    EXPECT_EQ(std::memcmp(va.data, vb.data, va.nbytes), 0) << name << ": values must not depend on sharding";
    const TensorView& vc = c->get(name);
    n_diff += va.nbytes > 8 && std::memcmp(va.data, vc.data, va.nbytes) != 0;
  }
  EXPECT_EQ(files.size(), r.n_shards);
  EXPECT_GT(n_diff, a->tensors().size() / 2);  // another seed gives other values

  // Re-writing with one shard into the sharded directory leaves no stale shards or index behind.
  opt.shard_bytes = 1ull << 40;
  write_random_checkpoint(cfg, many, opt);
  EXPECT_FALSE(fs::exists(many / "model.safetensors.index.json"));
  size_t n_files = 0;
  for (const auto& e : fs::directory_iterator(many)) n_files += e.path().extension() == ".safetensors";
  EXPECT_EQ(n_files, 1u);
  validate_checkpoint(cfg, *Checkpoint::open(many), false);
}

TEST(CheckpointWriter, ConfigFileArgument) {
  TempDir dir;
  ModelConfig cfg = load_model_config_from(fs::path(kFlashDir) / "config.json");
  EXPECT_EQ(cfg.n_layers, 40);
  fs::path src = copy_model_config(fs::path(kFlashDir) / "config.json", dir.path() / "out");
  EXPECT_EQ(fs::weakly_canonical(src), fs::weakly_canonical(kFlashDir));
  EXPECT_TRUE(fs::exists(dir.path() / "out" / "inference" / "config.json"));
  EXPECT_THROW(load_model_config_from(dir.path() / "nothing"), Error);
}

}  // namespace
}  // namespace di
