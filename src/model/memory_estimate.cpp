#include "model/memory_estimate.h"

namespace di {

KvCacheBytes kv_cache_bytes(const ModelConfig& c) {
  KvCacheBytes k;
  const uint64_t dh = static_cast<uint64_t>(c.head_dim), di = static_cast<uint64_t>(c.index_head_dim);
  k.window_record = dh + dh / 32;
  k.compressed_record = dh / 2 + dh / 16;
  k.index_key_record = di / 2 + di / 32;
  for (const LayerSchedule& l : c.layers) {
    if (l.mode != AttnMode::kFull) continue;
    k.global_per_token += static_cast<double>(k.compressed_record + k.index_key_record) / l.ratio;
    if (l.ratio > 1) k.compressor_tail_per_request += 2ull * static_cast<uint64_t>(l.ratio) * dh * 4;
  }
  k.window_per_request = static_cast<uint64_t>(c.n_total_layers()) * static_cast<uint64_t>(c.window) * k.window_record;
  return k;
}

}  // namespace di
