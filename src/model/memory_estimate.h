// Byte counts of a V4.1 deployment (spec §3.1, §6): weights per memory pool and KV-cache bytes in
// the packed deployment formats (FP8 window ring, FP4 compressed KV, FP4 index keys).
#pragma once

#include <cstdint>

#include "model/config.h"

namespace di {

struct KvCacheBytes {
  uint64_t window_record = 0;        // one window-KV row: head_dim e4m3 + head_dim/32 UE8M0 (528)
  uint64_t compressed_record = 0;    // one compressed row: head_dim/2 packed E2M1 + head_dim/16 e4m3 scales (288)
  uint64_t index_key_record = 0;     // one index key: index_head_dim/2 + index_head_dim/32 (68)
  double global_per_token = 0;       // sum over kv sources of (compressed + index key) / ratio (890)
  uint64_t window_per_request = 0;   // all layers (DSpark included) x window x window_record
  uint64_t compressor_tail_per_request = 0;  // ratio > 1 sources: kv + score fp32 [ratio, head_dim]
};

KvCacheBytes kv_cache_bytes(const ModelConfig& cfg);

}  // namespace di
