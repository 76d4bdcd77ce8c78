// The layer-by-layer check against DeepSeek's official reference (layer_golden_check.cpp), shared by
// the CPU golden tests and the GPU tests: GoogleTest expectations on any backend.
#pragma once

#include "backend/backend.h"

namespace di {

void check_layers_against_reference(Backend& backend);

}  // namespace di
