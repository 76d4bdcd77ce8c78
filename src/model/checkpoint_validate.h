// The tensors a V4.1 config implies (spec §4.2, §4.3) and the check of a checkpoint against them:
// every expected tensor present with its shape and dtype, nothing unexpected.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/safetensors.h"

namespace di {

// Which memory pool a tensor belongs to (inspect's memory summary).
enum class TensorGroup {
  kBackbone,     // embed, head, norm and layers.* except the Engram tables
  kEngramTable,  // layers.L.engram.embed.{weight,scale}: row-gathered, may live in host memory
  kDSpark,       // mtp.*
};

// What a tensor holds, so a writer can fill it with plausible values.
enum class TensorKind {
  kFp8Weight,     // F8_E4M3 [out, in], paired with a kBlockScale
  kBlockScale,    // F8_E8M0 [ceil(out/32), ceil(in/32)]
  kFp4Weight,     // I8 [out, in/2], two E2M1 codes per byte (even column in the low nibble)
  kFp4Scale,      // F8_E8M0 [out, in/32]
  kEngramTable,   // F8_E4M3 [rows, engram_head_dim]
  kEngramScale,   // F8_E8M0 [rows, engram_head_dim/32]
  kNorm,          // BF16 RMSNorm weight, around 1
  kEmbedding,     // BF16 [vocab, dim] lookup table
  kMatrix,        // BF16 or F32 dense weight [out, in]
  kHcFn,          // F32 [mix, hc*dim]
  kHcBase,        // F32 [mix]
  kHcScale,       // F32 [3]
  kAttnSink,      // F32 [heads]
  kRouterBias,    // F32 [experts]
  kEngramGate,    // BF16 [hc, dim] engram q_weight / k_weight, around 1
};

struct ExpectedTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  TensorGroup group = TensorGroup::kBackbone;
  TensorKind kind = TensorKind::kMatrix;
  int64_t fan_in = 0;      // input features of the (logical) weight matrix, for value magnitudes
  bool optional = false;   // may be absent (ffn.gate.bias_vl: only checkpoints with vision)

  uint64_t numel() const;
  uint64_t nbytes() const;
};

const char* tensor_group_name(TensorGroup g);

// Every tensor the config implies, in a stable order (top-level, then layer by layer).
std::vector<ExpectedTensor> expected_tensors(const ModelConfig& cfg);

// True for names of the vision tower (vision.*, aligner.*, image_*), which a text-only engine
// ignores but the released checkpoint ships.
bool is_vision_tensor(const std::string& name);

struct ValidationReport {
  size_t n_expected_found = 0;
  size_t n_optional_missing = 0;
  size_t n_vision_ignored = 0;
  size_t n_unexpected = 0;            // only non-zero with allow_unexpected
};

// Throws di::Error listing (up to 20) problems: missing tensors with their expected shape/dtype,
// wrong shape or dtype (expected vs found, with the file), and tensors the config does not
// imply unless allow_unexpected.
ValidationReport validate_checkpoint(const ModelConfig& cfg, const Checkpoint& ckpt, bool allow_unexpected);

std::string shape_string(const std::vector<int64_t>& shape);  // "[64, 256]"

}  // namespace di
