// Puts sequences at a context length without running the model over the context: for decode
// benchmarks at 4K-32K tokens x hundreds of sequences, prefilling each would cost far more than the
// measurement. The caches get valid random packed rows (random f32 rows, quantize-dequantized and
// packed by the backend's own ops, so every code and scale is one a forward could write) and the
// counters a prefill of `context` tokens leaves: window rings full, compressed KV and index keys of
// every Full layer (context / ratio rows, in pool pages taken for `headroom` more tokens as well, so
// decode steps do not take pages), the Engram history, and the index-key source the reference's decode reads next.
// All sequences share the same rows (copied device-side from one template); attention cost does not
// depend on the values.
#pragma once

#include <cstdint>

#include "model/model.h"

namespace di {

class CacheFiller {
 public:
  CacheFiller(Model& model, int64_t context, int64_t headroom, uint64_t seed);
  // `state` must be fresh (Model::new_sequence()).
  void fill(SequenceState& state) const;
  int64_t context() const { return context_; }
  // Global-KV pool pages one filled sequence holds.
  int64_t pages_per_sequence() const;

 private:
  Model& model_;
  int64_t context_, headroom_;
  uint64_t seed_;
  Tensor window_rows_;  // [window, packed FP8 row] U8
  Tensor comp_rows_;    // [context, packed FP4 row] U8 (a ratio-r layer takes the first context / r)
  Tensor key_rows_;     // [context, packed FP4 index key] U8
};

}  // namespace di
