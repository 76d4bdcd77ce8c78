// The public sampling parameters: the engine's own struct (greedy, temperature, top-k/p, min-p,
// penalties, stops, max tokens, logprobs, seed).
#pragma once

#include "sampling/sampling_params.h"
