// `deepinfer generate --prompts IN.jsonl --output OUT.jsonl`: offline batch generation through the
// Engine. Every line is checked before the model loads (a bad line is an error naming it); results
// are written in input order; a progress line and, at the end, a one-line JSON summary go to stderr.
#pragma once

#include "cli/args.h"

namespace di::cli {

int generate_jsonl(const Args& args);

}  // namespace di::cli
