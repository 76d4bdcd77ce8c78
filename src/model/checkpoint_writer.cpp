#include "model/checkpoint_writer.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/error.h"
#include "model/checkpoint_validate.h"
#include "model/json_field.h"

namespace di {

namespace {

constexpr size_t kChunkBytes = 4u << 20;

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// A fast generator for bulk bytes: xoshiro256** seeded through splitmix64.
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    for (uint64_t& s : s_) s = splitmix64(seed);
  }
  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }       // [0, 1)
  float uniform(double lo, double hi) { return static_cast<float>(lo + (hi - lo) * uniform()); }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);  // round to nearest even (inputs are finite)
  return static_cast<uint16_t>(u >> 16);
}

// e4m3 codes with exponent field 5..8: |value| in [0.25, 3.75], RMS ~1.6; never the NaN codes.
struct Fp8Codes {
  uint8_t code[64];
  Fp8Codes() {
    for (int i = 0; i < 64; ++i) {
      int sign = i >> 5, exp = 5 + ((i >> 3) & 3), mant = i & 7;
      code[i] = static_cast<uint8_t>((sign << 7) | (exp << 3) | mant);
    }
  }
};
const Fp8Codes kFp8Codes;

constexpr double kFp8CodeRms = 1.6;
constexpr double kFp4CodeRms = 2.93;  // RMS of the 16 E2M1 values

// E8M0 exponent byte so that code_rms * 2^e ~ 1/sqrt(fan_in) (a dot product of fan_in O(1)
// inputs then comes out O(1)), with a little jitter between blocks.
uint8_t scale_byte(Rng& rng, int64_t fan_in, double code_rms) {
  double target = -std::log2(code_rms * std::sqrt(static_cast<double>(std::max<int64_t>(fan_in, 1))));
  int e = static_cast<int>(std::lround(target)) - static_cast<int>(rng.next() % 2);
  e = std::max(-20, std::min(e, 0));
  return static_cast<uint8_t>(127 + e);
}

// Fills buf with `n_elems` elements of tensor `t`, continuing the tensor's random stream.
void fill(const ExpectedTensor& t, Rng& rng, uint8_t* buf, size_t n_elems) {
  const double inv_sqrt_fan = 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(t.fan_in, 1)));
  auto put_float = [&](size_t i, float v) {
    if (t.dtype == DType::kBF16) {
      uint16_t h = to_bf16(v);
      std::memcpy(buf + 2 * i, &h, 2);
    } else {
      std::memcpy(buf + 4 * i, &v, 4);
    }
  };
  switch (t.kind) {
    case TensorKind::kFp8Weight:
    case TensorKind::kEngramTable:
      for (size_t i = 0; i < n_elems; i += 8) {
        uint64_t r = rng.next();
        for (size_t j = 0; j < 8 && i + j < n_elems; ++j) buf[i + j] = kFp8Codes.code[(r >> (8 * j)) & 63];
      }
      return;
    case TensorKind::kFp4Weight:  // every nibble is a valid E2M1 code
      for (size_t i = 0; i < n_elems; i += 8) {
        uint64_t r = rng.next();
        std::memcpy(buf + i, &r, std::min<size_t>(8, n_elems - i));
      }
      return;
    case TensorKind::kBlockScale:
      for (size_t i = 0; i < n_elems; ++i) buf[i] = scale_byte(rng, t.fan_in, kFp8CodeRms);
      return;
    case TensorKind::kFp4Scale:
      for (size_t i = 0; i < n_elems; ++i) buf[i] = scale_byte(rng, t.fan_in, kFp4CodeRms);
      return;
    case TensorKind::kEngramScale:  // table rows dequantize to O(1) values: 2^-2 .. 2^-1
      for (size_t i = 0; i < n_elems; ++i) buf[i] = static_cast<uint8_t>(125 + rng.next() % 2);
      return;
    case TensorKind::kNorm:
      for (size_t i = 0; i < n_elems; ++i) put_float(i, rng.uniform(0.9, 1.1));
      return;
    case TensorKind::kEngramGate:
      for (size_t i = 0; i < n_elems; ++i) put_float(i, rng.uniform(0.8, 1.2));
      return;
    case TensorKind::kEmbedding:  // unit variance
      for (size_t i = 0; i < n_elems; ++i) put_float(i, rng.uniform(-1.7320508, 1.7320508));
      return;
    case TensorKind::kMatrix:
    case TensorKind::kHcFn: {  // variance 1/fan_in
      const double a = std::sqrt(3.0) * inv_sqrt_fan;
      for (size_t i = 0; i < n_elems; ++i) put_float(i, rng.uniform(-a, a));
      return;
    }
    case TensorKind::kHcBase:
      for (size_t i = 0; i < n_elems; ++i) put_float(i, rng.uniform(-0.5, 0.5));
      return;
    case TensorKind::kHcScale:
      for (size_t i = 0; i < n_elems; ++i) put_float(i, rng.uniform(0.1, 1.0));
      return;
    case TensorKind::kAttnSink:
      for (size_t i = 0; i < n_elems; ++i) put_float(i, rng.uniform(-1.0, 1.0));
      return;
    case TensorKind::kRouterBias:
      for (size_t i = 0; i < n_elems; ++i) put_float(i, rng.uniform(-0.1, 0.1));
      return;
  }
}

class OutFile {
 public:
  explicit OutFile(const std::filesystem::path& path) : path_(path.string()) {
    f_ = std::fopen(path_.c_str(), "wb");
    if (!f_) throw Error(path_ + ": cannot create: " + std::strerror(errno));
  }
  ~OutFile() {
    if (f_) std::fclose(f_);
  }
  void write(const void* data, size_t n) {
    if (n && std::fwrite(data, 1, n, f_) != n) throw Error(path_ + ": write failed: " + std::strerror(errno));
  }
  void close() {
    FILE* f = f_;
    f_ = nullptr;
    if (std::fclose(f) != 0) throw Error(path_ + ": close failed: " + std::strerror(errno));
  }

 private:
  std::string path_;
  FILE* f_ = nullptr;
};

struct Shard {
  std::string file;
  std::vector<size_t> tensors;  // indices into the expected list
  uint64_t bytes = 0;
};

std::string shard_file_name(size_t i, size_t n) {
  if (n == 1) return "model.safetensors";
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

void write_shard(const Shard& shard, const std::vector<ExpectedTensor>& all, const std::filesystem::path& dir,
                 uint64_t seed, std::vector<uint8_t>& chunk) {
  nlohmann::json header = nlohmann::json::object();
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (size_t idx : shard.tensors) {
    const ExpectedTensor& t = all[idx];
    header[t.name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keep the data section 8-byte aligned
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));

  OutFile out(dir / shard.file);
  out.write(len, 8);
  out.write(text.data(), text.size());
  for (size_t idx : shard.tensors) {
    const ExpectedTensor& t = all[idx];
    Rng rng(seed ^ fnv1a(t.name));
    const size_t esize = dtype_size(t.dtype);
    const size_t per_chunk = chunk.size() / esize;
    for (uint64_t done = 0, n = t.numel(); done < n;) {
      size_t m = static_cast<size_t>(std::min<uint64_t>(per_chunk, n - done));
      fill(t, rng, chunk.data(), m);
      out.write(chunk.data(), m * esize);
      done += m;
    }
  }
  out.close();
}

}  // namespace

CheckpointWriteResult write_random_checkpoint(const ModelConfig& cfg, const std::filesystem::path& out_dir,
                                              const CheckpointWriteOptions& options) {
  namespace fs = std::filesystem;
  if (options.shard_bytes == 0) throw Error("shard size must be positive");
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) throw Error(out_dir.string() + ": cannot create directory: " + ec.message());

  std::vector<ExpectedTensor> all = expected_tensors(cfg);
  std::vector<Shard> shards;
  CheckpointWriteResult result;
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i].optional) continue;
    const uint64_t nb = all[i].nbytes();
    if (shards.empty() || (shards.back().bytes > 0 && shards.back().bytes + nb > options.shard_bytes)) {
      shards.emplace_back();
    }
    shards.back().tensors.push_back(i);
    shards.back().bytes += nb;
    result.data_bytes += nb;
    ++result.n_tensors;
  }
  for (size_t i = 0; i < shards.size(); ++i) shards[i].file = shard_file_name(i, shards.size());
  result.n_shards = shards.size();

  // A stale index or shard set from an earlier run would make the directory ambiguous.
  fs::remove(out_dir / "model.safetensors.index.json", ec);
  if (shards.size() > 1) fs::remove(out_dir / "model.safetensors", ec);
  std::vector<fs::path> stale;
  for (const fs::directory_entry& e : fs::directory_iterator(out_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() == 32 && name.rfind("model-", 0) == 0 && name.find("-of-") == 11 &&
        e.path().extension() == ".safetensors") {
      stale.push_back(e.path());
    }
  }
  for (const fs::path& p : stale) fs::remove(p, ec);

  std::vector<uint8_t> chunk(kChunkBytes);
  for (size_t i = 0; i < shards.size(); ++i) {
    write_shard(shards[i], all, out_dir, options.seed, chunk);
    if (options.progress) {
      options.progress("wrote " + shards[i].file + ": " + std::to_string(shards[i].tensors.size()) + " tensors, " +
                       std::to_string(shards[i].bytes) + " bytes");
    }
  }
  if (shards.size() > 1) {
    nlohmann::json index;
    index["metadata"] = {{"total_size", result.data_bytes}};
    nlohmann::json map = nlohmann::json::object();
    for (const Shard& s : shards) {
      for (size_t idx : s.tensors) map[all[idx].name] = s.file;
    }
    index["weight_map"] = std::move(map);
    std::string text = index.dump(2) + "\n";
    OutFile out(out_dir / "model.safetensors.index.json");
    out.write(text.data(), text.size());
    out.close();
  }
  return result;
}

namespace {

struct ConfigSource {
  std::filesystem::path config;     // config.json
  std::filesystem::path inference;  // inference/config.json or empty
};

ConfigSource locate_config(const std::filesystem::path& p) {
  namespace fs = std::filesystem;
  std::error_code ec;
  ConfigSource s;
  fs::path dir;
  if (fs::is_directory(p, ec)) {
    dir = p;
    s.config = p / "config.json";
  } else if (fs::is_regular_file(p, ec)) {
    dir = p.parent_path();
    s.config = p;
  } else {
    throw Error(p.string() + ": no such config file or model directory");
  }
  if (!fs::is_regular_file(s.config, ec)) throw Error(dir.string() + ": no config.json");
  fs::path inf = dir / "inference" / "config.json";
  if (fs::is_regular_file(inf, ec)) s.inference = inf;
  return s;
}

}  // namespace

ModelConfig load_model_config_from(const std::filesystem::path& config) {
  ConfigSource s = locate_config(config);
  std::string text = read_text_file(s.config.string(), 16u << 20);
  std::string inf = s.inference.empty() ? std::string() : read_text_file(s.inference.string(), 16u << 20);
  return parse_model_config(text, inf, s.config.parent_path().string());
}

std::filesystem::path copy_model_config(const std::filesystem::path& config, const std::filesystem::path& out_dir) {
  namespace fs = std::filesystem;
  ConfigSource s = locate_config(config);
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) throw Error(out_dir.string() + ": cannot create directory: " + ec.message());
  auto copy = [&](const fs::path& from, const fs::path& to) {
    if (fs::exists(to, ec) && fs::equivalent(from, to, ec)) return;
    fs::copy_file(from, to, fs::copy_options::overwrite_existing, ec);
    if (ec) throw Error("cannot copy " + from.string() + " to " + to.string() + ": " + ec.message());
  };
  copy(s.config, out_dir / "config.json");
  if (!s.inference.empty()) {
    fs::create_directories(out_dir / "inference", ec);
    copy(s.inference, out_dir / "inference" / "config.json");
  } else {
    fs::remove(out_dir / "inference" / "config.json", ec);
  }
  return s.config.parent_path();
}

}  // namespace di
