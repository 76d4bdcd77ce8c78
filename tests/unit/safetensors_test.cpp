// Safetensors reader: round trips of random tensors (single file and sharded), the golden checkpoint,
// and every malformed-input rule (each error names the file and the tensor). Never crashes on
// random corruption.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "model/safetensors.h"
#include "test_util.h"

namespace di {
namespace {

using testing_util::fresh_seed;
using testing_util::TempDir;

namespace fs = std::filesystem;

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string with_length_prefix(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>(n >> (8 * i));
  return out + header + data;
}

struct RandomTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

const std::vector<std::pair<std::string, size_t>> kDTypes = {
    {"F8_E4M3", 1}, {"F8_E8M0", 1}, {"I8", 1}, {"U8", 1}, {"BF16", 2},
    {"F16", 2},     {"F32", 4},     {"I32", 4}, {"I64", 8}};

std::vector<RandomTensor> random_tensors(std::mt19937_64& rng, int n, const std::string& prefix) {
  std::vector<RandomTensor> out;
  for (int i = 0; i < n; ++i) {
    RandomTensor t;
    t.name = prefix + "t" + std::to_string(i) + ".weight";
    auto [dt, size] = kDTypes[rng() % kDTypes.size()];
    t.dtype = dt;
    size_t rank = rng() % 4;
    size_t numel = 1;
    for (size_t r = 0; r < rank; ++r) {
      t.shape.push_back(static_cast<int64_t>(rng() % 9));  // zero-size dims included
      numel *= static_cast<size_t>(t.shape.back());
    }
    t.bytes.resize(numel * size);
    for (char& c : t.bytes) c = static_cast<char>(rng());
    out.push_back(std::move(t));
  }
  return out;
}

// Serializes tensors with optional gaps between them (holes are legal).
std::string serialize(const std::vector<RandomTensor>& ts, std::mt19937_64& rng) {
  nlohmann::json h = nlohmann::json::object();
  h["__metadata__"] = {{"format", "pt"}};
  std::string data;
  for (const RandomTensor& t : ts) {
    data.append(rng() % 3, 'x');  // hole
    uint64_t begin = data.size();
    data += t.bytes;
    h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {begin, data.size()}}};
  }
  return with_length_prefix(h.dump(), data);
}

void expect_tensors(const Checkpoint& ck, const std::vector<RandomTensor>& ts) {
  for (const RandomTensor& t : ts) {
    const TensorView* v = ck.find(t.name);
    ASSERT_NE(v, nullptr) << t.name;
    EXPECT_EQ(dtype_name(v->dtype), t.dtype);
    EXPECT_EQ(v->shape, t.shape);
    ASSERT_EQ(v->nbytes, t.bytes.size());
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(v->data), v->nbytes), t.bytes) << t.name;
  }
}

TEST(Safetensors, RandomRoundTripSingleFile) {
  std::mt19937_64 rng(fresh_seed("RandomRoundTripSingleFile"));
  TempDir dir;
  std::vector<RandomTensor> ts = random_tensors(rng, 40, "");
  write_bytes(dir.path() / "model.safetensors", serialize(ts, rng));
  std::unique_ptr<Checkpoint> ck = Checkpoint::open(dir.path());
  EXPECT_EQ(ck->tensors().size(), ts.size());
  expect_tensors(*ck, ts);
  EXPECT_THROW(ck->get("nope"), Error);
  EXPECT_EQ(ck->find("nope"), nullptr);
}

TEST(Safetensors, RandomRoundTripShardedWithIndex) {
  std::mt19937_64 rng(fresh_seed("RandomRoundTripShardedWithIndex"));
  TempDir dir;
  std::vector<RandomTensor> a = random_tensors(rng, 12, "a."), b = random_tensors(rng, 9, "b.");
  write_bytes(dir.path() / "s1.safetensors", serialize(a, rng));
  write_bytes(dir.path() / "s2.safetensors", serialize(b, rng));
  nlohmann::json idx;
  for (const auto& t : a) idx["weight_map"][t.name] = "s1.safetensors";
  for (const auto& t : b) idx["weight_map"][t.name] = "s2.safetensors";
  write_bytes(dir.path() / "model.safetensors.index.json", idx.dump());
  std::unique_ptr<Checkpoint> ck = Checkpoint::open(dir.path());
  EXPECT_EQ(ck->tensors().size(), a.size() + b.size());
  expect_tensors(*ck, a);
  expect_tensors(*ck, b);
  EXPECT_EQ(fs::path(ck->get(a[0].name).file).filename(), "s1.safetensors");
}

TEST(Safetensors, GoldenCheckpoint) {
  std::unique_ptr<Checkpoint> ck = Checkpoint::open(std::string(DI_TEST_DATA) + "/golden_dev/model");
  EXPECT_EQ(ck->tensors().size(), 738u);
  const TensorView& sink = ck->get("layers.0.attn.attn_sink");
  EXPECT_EQ(sink.dtype, DType::kF32);
  EXPECT_EQ(sink.shape, (std::vector<int64_t>{4}));
  EXPECT_EQ(sink.nbytes, 16u);
  const TensorView& w = ck->get("layers.1.engram.embed.weight");
  EXPECT_EQ(w.dtype, DType::kF8E4M3);
  EXPECT_EQ(w.shape, (std::vector<int64_t>{660, 32}));
  EXPECT_EQ(w.numel(), 660 * 32);
  EXPECT_EQ(ck->get("layers.0.ffn.experts.0.w2.weight").dtype, DType::kI8);
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_STREQ(dtype_name(DType::kF8E8M0), "F8_E8M0");
}

// ---------------------------------------------------------------------------------------------
// Malformed files: the message must contain every needle.

void expect_file_error(const std::string& bytes, const std::vector<std::string>& needles) {
  TempDir dir;
  fs::path p = dir.path() / "bad.safetensors";
  write_bytes(p, bytes);
  try {
    Checkpoint::open_file(p);
    ADD_FAILURE() << "expected an error mentioning " << needles[0];
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("bad.safetensors"), std::string::npos) << msg;
    for (const std::string& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
  }
}

void expect_header_error(const std::string& header, size_t data_bytes, const std::vector<std::string>& needles) {
  expect_file_error(with_length_prefix(header, std::string(data_bytes, '\0')), needles);
}

TEST(SafetensorsErrors, FileAndLength) {
  expect_file_error("", {"shorter than the 8-byte"});
  expect_file_error("abc", {"3 bytes"});
  expect_file_error(std::string("\x10\0\0\0\0\0\0\0{}", 10), {"header length 16", "past the end"});
  expect_file_error(std::string("\0\0\0\0\0\0\0\x40", 8), {"100 MB"});
  expect_file_error(std::string("\xff\xff\xff\xff\xff\xff\xff\xff", 8), {"100 MB"});
}

TEST(SafetensorsErrors, HeaderJson) {
  expect_header_error("{\"a\": ", 0, {"not valid JSON"});
  expect_header_error("", 0, {"not valid JSON"});
  expect_header_error("[1, 2]", 0, {"array", "object"});
  expect_header_error("42", 0, {"expected a JSON object"});
  expect_header_error("{\"a\": 1}", 0, {"\"a\"", "expected an object"});
  expect_header_error("{} trailing", 0, {"not valid JSON"});
  expect_header_error("{\"__metadata__\": {\"k\": [1]}}", 0, {"__metadata__"});
  expect_header_error(std::string(10000, '[') , 0, {"array"});
  expect_header_error("{\"a\": {\"dtype\": \"F32\", \"shape\": [[[[[[1]]]]]], \"data_offsets\": [0, 4]}}", 4,
                      {"\"a\"", "'shape'"});
}

TEST(SafetensorsErrors, Entries) {
  const auto entry = [](const std::string& body) { return "{\"w.x\": {" + body + "}}"; };
  expect_header_error(entry("\"shape\": [1], \"data_offsets\": [0, 4]"), 4, {"\"w.x\"", "missing 'dtype'"});
  expect_header_error(entry("\"dtype\": \"F32\", \"data_offsets\": [0, 4]"), 4, {"\"w.x\"", "missing 'shape'"});
  expect_header_error(entry("\"dtype\": \"F32\", \"shape\": [1]"), 4, {"\"w.x\"", "missing 'data_offsets'"});
  expect_header_error(entry("\"dtype\": \"F64\", \"shape\": [1], \"data_offsets\": [0, 8]"), 8,
                      {"\"w.x\"", "unknown dtype \"F64\""});
  expect_header_error(entry("\"dtype\": 5, \"shape\": [1], \"data_offsets\": [0, 4]"), 4, {"\"w.x\"", "'dtype'"});
  expect_header_error(entry("\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 4]"), 4,
                      {"\"w.x\"", "negative"});
  expect_header_error(entry("\"dtype\": \"F32\", \"shape\": [1.5], \"data_offsets\": [0, 4]"), 4,
                      {"\"w.x\"", "'shape'", "1.5"});
  expect_header_error(entry("\"dtype\": \"F32\", \"shape\": \"1\", \"data_offsets\": [0, 4]"), 4, {"\"w.x\"", "'shape'"});
  expect_header_error(entry("\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296], \"data_offsets\": [0, 4]"), 4,
                      {"\"w.x\"", "overflows"});
  expect_header_error(entry("\"dtype\": \"I64\", \"shape\": [1152921504606846976], \"data_offsets\": [0, 4]"), 4,
                      {"\"w.x\"", "overflows"});
  expect_header_error(entry("\"dtype\": \"F32\", \"shape\": [99999999999999999999], \"data_offsets\": [0, 4]"), 4,
                      {"\"w.x\""});
  expect_header_error(entry("\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]"), 4,
                      {"\"w.x\"", "past the data section of 4 bytes"});
  expect_header_error(entry("\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 4]"), 8,
                      {"\"w.x\"", "end before begin"});
  expect_header_error(entry("\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 4]"), 8,
                      {"\"w.x\"", "hold 4 bytes", "needs 8"});
  expect_header_error(entry("\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0]"), 4,
                      {"\"w.x\"", "data_offsets"});
  expect_header_error(entry("\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4, 8]"), 8,
                      {"\"w.x\"", "data_offsets"});
  expect_header_error(entry("\"dtype\": \"F32\", \"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]"), 4,
                      {"\"w.x\"", "twice"});
  expect_header_error(entry("\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4], \"extra\": 1"), 4,
                      {"\"w.x\"", "unexpected field \"extra\""});
  expect_header_error("{\"w.x\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}, "
                      "\"w.x\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}",
                      8, {"\"w.x\"", "appears twice"});
  expect_header_error("{\"\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 4, {"empty name"});
  // Overlap (holes are fine, see the round trips).
  expect_header_error("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}, "
                      "\"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}",
                      8, {"\"a\"", "\"b\"", "overlap"});
}

// Zero-size tensors may sit anywhere; a tensor may end exactly at the end of the data.
TEST(Safetensors, EdgeCasesThatAreValid) {
  TempDir dir;
  fs::path p = dir.path() / "ok.safetensors";
  write_bytes(p, with_length_prefix("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}, "
                                    "\"z\": {\"dtype\": \"BF16\", \"shape\": [0, 5], \"data_offsets\": [4, 4]}, "
                                    "\"__metadata__\": {\"format\": \"pt\"}}   ",
                                    std::string(8, '\1')));
  std::unique_ptr<Checkpoint> ck = Checkpoint::open_file(p);
  EXPECT_EQ(ck->tensors().size(), 2u);
  EXPECT_EQ(ck->get("z").nbytes, 0u);
}

// ---------------------------------------------------------------------------------------------
// Directories and indexes.

void expect_dir_error(const fs::path& dir, const std::vector<std::string>& needles) {
  try {
    Checkpoint::open(dir);
    ADD_FAILURE() << "expected an error mentioning " << needles[0];
  } catch (const Error& e) {
    std::string msg = e.what();
    for (const std::string& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
  }
}

TEST(SafetensorsErrors, Directories) {
  std::mt19937_64 rng(fresh_seed("SafetensorsErrors.Directories"));
  std::vector<RandomTensor> a = random_tensors(rng, 3, "a."), b = random_tensors(rng, 3, "b.");
  {
    TempDir dir;
    expect_dir_error(dir.path(), {"no model.safetensors"});
    expect_dir_error(dir.path() / "missing", {"not a directory"});
  }
  {  // Same tensor in two files without an index.
    TempDir dir;
    write_bytes(dir.path() / "x1.safetensors", serialize(a, rng));
    write_bytes(dir.path() / "x2.safetensors", serialize(a, rng));
    expect_dir_error(dir.path(), {a[0].name, "x1.safetensors", "x2.safetensors"});
  }
  const auto with_index = [&](const nlohmann::json& index, const std::vector<std::string>& needles) {
    TempDir dir;
    write_bytes(dir.path() / "s1.safetensors", serialize(a, rng));
    write_bytes(dir.path() / "s2.safetensors", serialize(b, rng));
    write_bytes(dir.path() / "model.safetensors.index.json", index.dump());
    expect_dir_error(dir.path(), needles);
  };
  nlohmann::json good;
  for (const auto& t : a) good["weight_map"][t.name] = "s1.safetensors";
  for (const auto& t : b) good["weight_map"][t.name] = "s2.safetensors";
  {
    nlohmann::json j = good;
    j["weight_map"][a[0].name] = "s3.safetensors";
    with_index(j, {"model.safetensors.index.json", "s3.safetensors", "does not exist"});
  }
  {
    nlohmann::json j = good;
    j["weight_map"]["ghost.weight"] = "s1.safetensors";
    with_index(j, {"\"ghost.weight\"", "missing from shard", "s1.safetensors"});
  }
  {
    nlohmann::json j = good;
    j["weight_map"].erase(b[1].name);
    with_index(j, {b[1].name, "not listed"});
  }
  {
    nlohmann::json j = good;
    j["weight_map"][a[0].name] = "s2.safetensors";
    with_index(j, {a[0].name, "s2.safetensors"});
  }
  {
    nlohmann::json j = good;
    j["weight_map"][a[0].name] = "../s1.safetensors";
    with_index(j, {"plain file name"});
  }
  with_index(nlohmann::json::object(), {"weight_map"});
  with_index(nlohmann::json{{"weight_map", {{"x", 3}}}}, {"\"x\"", "shard file name"});
  with_index(nlohmann::json{{"weight_map", nlohmann::json::object()}}, {"empty"});
  {
    TempDir dir;
    write_bytes(dir.path() / "model.safetensors.index.json", "{not json");
    expect_dir_error(dir.path(), {"model.safetensors.index.json", "not valid JSON"});
  }
}

// Random corruption of a valid file: open either succeeds or throws di::Error.
TEST(Safetensors, RandomCorruptionNeverCrashes) {
  std::mt19937_64 rng(fresh_seed("RandomCorruptionNeverCrashes"));
  TempDir dir;
  int errors = 0;
  for (int iter = 0; iter < 300; ++iter) {
    std::vector<RandomTensor> ts = random_tensors(rng, 1 + static_cast<int>(rng() % 6), "");
    std::string bytes = serialize(ts, rng);
    int n = 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < n && bytes.size() > 8; ++k) {
      const size_t header_end = std::min<size_t>(bytes.size(), 408);
      switch (rng() % 4) {
        case 0: bytes[rng() % header_end] = static_cast<char>(rng()); break;
        case 1: bytes.resize(rng() % bytes.size()); break;
        case 2: bytes[rng() % 8] = static_cast<char>(rng()); break;
        default: bytes.insert(8 + rng() % (header_end - 8 + 1), 1, "0123456789[]{},:\"-."[rng() % 19]); break;
      }
    }
    fs::path p = dir.path() / "c.safetensors";
    write_bytes(p, bytes);
    try {
      Checkpoint::open_file(p);
    } catch (const Error&) {
      ++errors;
    }
  }
  EXPECT_GT(errors, 100);
}

}  // namespace
}  // namespace di
