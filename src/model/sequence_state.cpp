#include "model/sequence_state.h"

#include <algorithm>

namespace di {

SequenceState make_sequence_state(const ModelConfig& cfg, Backend& backend) {
  SequenceState st;
  for (const LayerSchedule& ls : cfg.layers) {
    LayerCache c;
    c.window = backend.zeros(TType::kU8, {cfg.window, packed_row_bytes(RowFormat::kFp8Ue8m0, cfg.head_dim)});
    if (ls.mode == AttnMode::kFull) {
      if (ls.ratio > 1) {
        c.tail_kv = backend.zeros(TType::kF32, {ls.ratio, cfg.head_dim});
        c.tail_score = backend.zeros(TType::kF32, {ls.ratio, cfg.head_dim});
      }
      c.comp = backend.zeros(TType::kU8, {0, packed_row_bytes(RowFormat::kFp4E4m3, cfg.head_dim)});
      c.index_keys = backend.zeros(TType::kU8, {0, packed_row_bytes(RowFormat::kFp4Ue8m0, cfg.index_head_dim)});
    }
    st.layers.push_back(std::move(c));
  }
  return st;
}

void reserve_compressed(LayerCache& cache, int64_t rows, Backend& backend) {
  if (rows <= cache.comp.rows()) return;
  int64_t cap = std::max<int64_t>(rows, std::max<int64_t>(64, cache.comp.rows() * 2));
  auto grow = [&](Tensor& t) {
    Tensor n = backend.zeros(TType::kU8, {cap, t.row_size()});
    if (cache.n_comp > 0) backend.copy_rows(n, 0, t, 0, cache.n_comp);
    t = std::move(n);
  };
  grow(cache.comp);
  grow(cache.index_keys);
}

}  // namespace di
