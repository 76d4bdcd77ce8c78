// Per-forward attention state handed down the layer stack (the reference's SharedAttentionRuntime):
// the top-k list of each index source and the candidate blocks of the candidate source.
#pragma once

#include <map>

#include "model/model.h"

namespace di {

struct Model::ForwardScratch {
  std::map<int, Tensor> topk;  // index source layer -> [n, k] I32 (already offset)
  Tensor candidates;           // [n, T] U8 from the candidate source layer
};

}  // namespace di
