#include "runtime/score_run.h"

#include <algorithm>

#include "core/error.h"

namespace di {

ScoreResult run_score(Model& model, const std::vector<int32_t>& prompt, const std::vector<int32_t>& forced,
                      int64_t chunk, bool drafts) {
  if (prompt.empty()) throw Error("--prompt-ids: at least one token is needed");
  if (drafts && !model.has_dspark()) throw Error("--draft-out: this model has no DSpark stages");
  ScoreResult r;
  r.vocab = model.config().vocab_size;
  SequenceState st = model.new_sequence();
  int64_t step = chunk > 0 ? chunk : static_cast<int64_t>(prompt.size());
  ForwardResult last;
  for (size_t b = 0; b < prompt.size(); b += step) {
    std::vector<int32_t> part(prompt.begin() + b, prompt.begin() + std::min(prompt.size(), b + step));
    last = model.forward(st, part);
    if (drafts) model.dspark_seed(st, last.features);
  }
  r.logits = last.logits;
  for (size_t k = 0; k < forced.size(); ++k) {
    ForwardResult f = model.forward(st, {forced[k]});
    r.logits.insert(r.logits.end(), f.logits.begin(), f.logits.end());
    if (!drafts) continue;
    model.dspark_seed(st, f.features);
    int32_t next = k + 1 < forced.size()
                       ? forced[k + 1]
                       : static_cast<int32_t>(std::max_element(f.logits.begin(), f.logits.end()) - f.logits.begin());
    DraftResult d = model.dspark_draft(st, next);
    r.draft_ids.push_back(d.ids);
    r.draft_logits.insert(r.draft_logits.end(), d.logits.begin(), d.logits.end());
    r.confidence.insert(r.confidence.end(), d.confidence.begin(), d.confidence.end());
  }
  return r;
}

}  // namespace di
