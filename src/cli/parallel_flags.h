// --dp N --ep N for the commands that run the Engine: parsed and checked against this machine
// before the model loads (docs/multi_gpu.md).
#pragma once

#include <set>
#include <string>

#include "cli/args.h"
#include "parallel/parallel_config.h"

namespace di::cli {

inline const std::set<std::string> kParallelValueOptions = {"dp", "ep"};

// The layout from the flags; throws di::Error when this machine or build cannot run it, and for a
// layout of more than one rank until the engine runs multi-GPU (no silent single-GPU fallback).
parallel::ParallelOptions parallel_options(const Args& args, const std::string& device);

}  // namespace di::cli
