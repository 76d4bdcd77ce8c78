// A submitted Request -> its prompt token ids, checked: exactly one input, valid UTF-8 and chat JSON,
// ids in the vocabulary, room for at least one generated token in the context, sampling fields in
// range. Throws di::Error naming what was wrong (the engine turns it into finish_reason "error").
#pragma once

#include <cstdint>
#include <vector>

#include "deepinfer/engine.h"
#include "model/config.h"
#include "tokenizer/tokenizer.h"

namespace di {

struct PreparedInput {
  std::vector<int32_t> prompt;  // token ids
  int64_t max_tokens = 0;       // the generation cap: sampling.max_tokens capped by the context left
};

PreparedInput prepare_input(const Request& request, const Tokenizer& tokenizer, const ModelConfig& cfg);

}  // namespace di
