// DEEPINFER_LAUNCH_LOG=FILE: every kernel launched through `launch` (pdl_launch.cuh) appends one line to FILE --
// its name, grid, block, dynamic shared memory, stream lane and each parameter's bytes in hex -- so that two
// decode steps' launches can be compared (bench/gpu/launch_diff.py): which parameters a graph of the step would
// have to take from device memory. Measuring only; off (one branch per launch) unless set.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>
#include <vector>

namespace di::cuda {

bool launch_log_on();  // read once by launch_switches()
void log_launch(const void* kernel, dim3 grid, dim3 block, size_t smem,
                const std::vector<std::pair<const void*, size_t>>& params);

}  // namespace di::cuda
