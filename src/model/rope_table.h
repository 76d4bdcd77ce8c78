// RoPE frequencies of a layer (spec §2.4): plain theta for ratio-0 layers, compress theta with the
// YaRN blend for compressed layers. Computed in fp32 as the reference's precompute_freqs_cis.
#pragma once

#include "backend/backend.h"
#include "model/config.h"

namespace di {

RopeTable make_rope_table(int rope_dim, double base, bool yarn, const ModelConfig& cfg);
inline RopeTable rope_table_for(const LayerSchedule& ls, const ModelConfig& cfg) {
  return make_rope_table(cfg.rope_dim, ls.rope_theta, ls.yarn, cfg);
}

}  // namespace di
