// Per-forward attention state handed down the layer stack (the reference's SharedAttentionRuntime):
// the top-k list of each index source and the candidate blocks of the candidate source.
#pragma once

#include <map>
#include <utility>

#include "model/model.h"

namespace di {

struct Model::ForwardScratch {
  std::map<int, Tensor> topk;  // index source layer -> [n, k] I32 (already offset)
  Tensor candidates;           // [n, T] U8 from the candidate source layer
  Tensor window_idx;           // [n, list] I32 window key lists: the same for every layer of a forward
  int64_t window_list_len = 0;
  // Unpacked compressed KV / index keys, (source layer, rows) -> [rows, dim]: the Reuse and Reindex
  // layers of one forward read the same source cache. Dropped when the source writes.
  std::map<std::pair<int, int64_t>, Tensor> comp_rows, index_keys;
  void invalidate(int layer) {
    for (auto* m : {&comp_rows, &index_keys})
      for (auto it = m->begin(); it != m->end();) it = it->first.first == layer ? m->erase(it) : std::next(it);
  }
};

}  // namespace di
