// Teacher-forced scoring in the golden layout: prefill the prompt (optionally in chunks), then feed
// each forced token; collect one logits row per step and, optionally, the DSpark drafts per step.
#pragma once

#include <cstdint>
#include <vector>

#include "model/model.h"

namespace di {

struct ScoreResult {
  int64_t vocab = 0;
  std::vector<float> logits;                    // [1 + F, vocab]
  std::vector<std::vector<int32_t>> draft_ids;  // [F][block + 1]
  std::vector<float> draft_logits;              // [F, block, vocab]
  std::vector<float> confidence;                // [F, block]
};

// chunk <= 0: the whole prompt in one prefill. drafts: run DSpark after every forced step with the
// next token = forced[k + 1] (argmax of the last row for the last step), as the golden files do.
ScoreResult run_score(Model& model, const std::vector<int32_t>& prompt, const std::vector<int32_t>& forced,
                      int64_t chunk, bool drafts);

}  // namespace di
