// The CPU backend, layer by layer and step by step, against the official reference's own values
// (see layer_golden_check.cpp).
#include <gtest/gtest.h>

#include "backend/backend.h"
#include "layer_golden_check.h"

namespace di {

TEST(LayerGolden, PrefillDecodeAndDraftsMatchTheReferenceGivenTheirInputs) {
  std::unique_ptr<Backend> backend = make_cpu_backend();
  check_layers_against_reference(*backend);
}

}  // namespace di
