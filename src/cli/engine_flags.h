// The options shared by the commands that run the Engine (generate, chat): which model and device,
// the scheduling modes, and the sampling defaults. Front ends see the engine only through
// include/deepinfer/engine.h.
#pragma once

#include <set>
#include <string>

#include "cli/args.h"
#include "runtime/default_model.h"
#include "deepinfer/engine.h"

namespace di::cli {

// --model DIR --device cpu|cuda --prefix-cache off|replay|exact --exact-snapshot-blocks N
// --max-running N --max-step-tokens N
inline const std::set<std::string> kEngineValueOptions = {"model",       "device",         "prefix-cache",
                                                          "max-running", "max-step-tokens", "exact-snapshot-blocks"};
// --batch-invariant --no-async
inline const std::set<std::string> kEngineFlagOptions = {"batch-invariant", "no-async", "fast-fp4-gemm"};
// --max-tokens N --temperature T --top-p P --top-k K --seed S
inline const std::set<std::string> kSamplingValueOptions = {"max-tokens", "temperature", "top-p", "top-k", "seed"};

// Without --model: default_model_dir().
EngineOptions engine_options(const Args& args);
// Sampling from the flags; max_tokens defaults to default_max_tokens, seed stays absent unless given.
SamplingParams sampling_options(const Args& args, int32_t default_max_tokens);

// value_options ∪ the sets above, for Args.
std::set<std::string> with_options(std::set<std::string> own, const std::set<std::string>& more);

}  // namespace di::cli
