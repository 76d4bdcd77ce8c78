// Synthetic V4.1 checkpoints for benchmarks: a config with the released dimensions (or tiny ones)
// over a chosen subset of the 40 layers, and a Checkpoint whose tensors are random but valid
// (synthetic_fill.h) and bound by the normal Model::load path. The tensor bytes are materialised
// only where they are consumed: on the host for the CPU backend (small models), or directly in GPU
// memory when a backend prepares each weight (ProfilingBackend's prepare hook calls
// device::prepare_synthetic), so a 100 GB model loads in seconds and never sits in host memory.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/checkpoint_validate.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "model/synthetic_fill.h"
#include "tokenizer/engram_token_map.h"

namespace di {

// "v41-flash": spec §1.2 text_config dimensions (hidden 5120, 64 x 512 heads, 384 experts top-6,
// vocab 129280, ...); "v41-tiny": golden_dev-sized dimensions with the same schedule, for CPU tests.
// n_layers backbone layers are picked from the released 40-layer schedule (spec §1.3), in an order
// that covers every layer kind first: SWA-only (0), SWA + Engram (1), ratio-2 Full (2) and Reuse
// (3), ratio-1 Full + candidate source (20) and Reuse (21), Reindex (24) and a Reuse of its top-k
// (25), then more layers of the same groups. Sources and Engram follow the picked layers. No DSpark
// stages. The Engram table has a reduced row count (engram_vocab_size 40000 -> ~1M rows instead of
// 384M: a token reads 24 rows either way). n_layers in [1, 40].
ModelConfig synthetic_config(const std::string& preset, int n_layers);

// The released layer ids that synthetic_config(preset, n_layers) keeps, in order.
std::vector<int> synthetic_layer_ids(int n_layers);

struct SyntheticTensor {
  ExpectedTensor tensor;
  synthetic::FillSpec fill;
  uint64_t offset = 0;  // in the address reservation
  bool on_host = false; // bytes materialised in host memory
};

// The address range that backs a synthetic checkpoint's tensor views. Host placement: every tensor
// is filled in host memory. Device placement: the range is reserved but inaccessible (a stray host
// read faults instead of returning garbage), except the tensors a device backend still reads from
// the host view (Engram table row scales, see cuda_moe_engram.cu), which are filled on the host.
class SyntheticWeights {
 public:
  enum class Placement { kHost, kDevice };
  SyntheticWeights(const ModelConfig& cfg, uint64_t seed, Placement placement);
  ~SyntheticWeights();
  SyntheticWeights(const SyntheticWeights&) = delete;
  SyntheticWeights& operator=(const SyntheticWeights&) = delete;

  // The tensor whose bytes start at `p`, or nullptr when `p` is not one of ours.
  const SyntheticTensor* find(const void* p) const;
  std::vector<TensorView> views() const;
  uint64_t total_bytes() const { return size_; }
  Placement placement() const { return placement_; }

 private:
  std::vector<SyntheticTensor> tensors_;  // in address order
  uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  Placement placement_;
};

struct SyntheticModel {
  ModelConfig config;
  std::shared_ptr<const SyntheticWeights> weights;
  std::unique_ptr<Checkpoint> checkpoint;  // views into `weights` (keeps them alive)
  EngramTokenMap engram_map;               // token id -> id mod engram_compressed_vocab_size
};

SyntheticModel make_synthetic_model(const std::string& preset, int n_layers, uint64_t seed,
                                    SyntheticWeights::Placement placement);

}  // namespace di
