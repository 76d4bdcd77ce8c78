// Writes a random checkpoint in the released V4.1 format for any valid config: every tensor of
// expected_tensors(cfg) filled with plausible values (FP8 e4m3 codes with E8M0 block scales sized so
// that a layer's outputs stay O(1), packed E2M1 experts, norms around 1, small F32 hc/sink/bias
// tensors), streamed to disk in fixed-size chunks — memory use does not grow with the model (the
// real V4.1-Flash is 510 GB, its Engram tables 384M rows each). Values depend only on (seed, tensor
// name), not on sharding.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

#include "model/config.h"

namespace di {

struct CheckpointWriteOptions {
  uint64_t seed = 0;
  uint64_t shard_bytes = 10'000'000'000;  // a shard closes before it would exceed this (one big tensor may)
  std::function<void(const std::string&)> progress;  // optional: one line per shard
};

struct CheckpointWriteResult {
  size_t n_tensors = 0;
  size_t n_shards = 0;
  uint64_t data_bytes = 0;
};

// Writes OUT/model.safetensors (one shard) or OUT/model-0000i-of-0000N.safetensors plus
// OUT/model.safetensors.index.json. Creates OUT. Throws di::Error on I/O failure.
CheckpointWriteResult write_random_checkpoint(const ModelConfig& cfg, const std::filesystem::path& out_dir,
                                              const CheckpointWriteOptions& options);

// Copies a model's config into OUT: `config` is a model directory (config.json and, when present,
// inference/config.json) or a config.json file (then a sibling inference/config.json is copied too
// when present). Returns the directory the config was read from.
std::filesystem::path copy_model_config(const std::filesystem::path& config, const std::filesystem::path& out_dir);

// The model directory of `config` as copy_model_config interprets it, parsed and validated.
ModelConfig load_model_config_from(const std::filesystem::path& config);

}  // namespace di
