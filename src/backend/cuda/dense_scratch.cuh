// The dense ops' per-call scratch: the shared stream-ordered scratch of cuda_scratch.cuh.
#pragma once

#include "backend/cuda/cuda_scratch.cuh"

namespace di::cuda::dense {

using cuda::Scratch;
using cuda::upload;

}  // namespace di::cuda::dense
