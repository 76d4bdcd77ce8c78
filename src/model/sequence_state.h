// Everything one request carries between forwards (spec §2.9, §3.1), in the packed deployment
// formats: window rings (FP8 rows + UE8M0 scales), ratio-2 compressor tails (fp32), compressed KV
// (FP4 + E4M3 scales) and index keys (FP4 + UE8M0 scales) of the Full layers, the Engram history,
// and the DSpark stages' own window rings.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"

namespace di {

struct LayerCache {
  Tensor window;                // [window, packed_row(Dh)] U8 ring, slot = position % window
  Tensor tail_kv, tail_score;   // [ratio, Dh] F32 pending compressor group (ratio > 1 Full layers)
  Tensor comp;                  // [capacity, packed_row(Dh)] U8 compressed KV (Full layers)
  Tensor index_keys;            // [capacity, packed_row(index_head_dim)] U8 (Full layers)
  int64_t n_comp = 0;           // compressed rows written
};

struct SequenceState {
  int64_t n_tokens = 0;                 // positions already in the caches
  std::vector<int32_t> engram_history;  // compressed ids of every position (Engram)
  std::vector<LayerCache> layers;       // backbone layers then DSpark stages
  int64_t dspark_seeded = 0;            // positions written into the DSpark rings
  // The Full layer whose index keys the reference's indexers read next: the last one that emitted
  // a compressed row, possibly in an earlier forward (see compressed_branch). -1: none yet.
  int index_keys_layer = -1;
};

SequenceState make_sequence_state(const ModelConfig& cfg, Backend& backend);

// Grows a Full layer's compressed caches to hold `rows` rows (doubling).
void reserve_compressed(LayerCache& cache, int64_t rows, Backend& backend);

}  // namespace di
