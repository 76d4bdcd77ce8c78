// The job layout asked for by `--dp N --ep N` (and, across processes or nodes, DEEPINFER_WORLD_SIZE):
// one rank per GPU, each an attention data-parallel rank and an expert-parallel rank. Checked
// against the machine before anything loads: no silent fallback to one device.
#pragma once

#include <optional>
#include <string>

#include "parallel/bootstrap.h"

namespace di::parallel {

struct ParallelOptions {
  int dp = 1;  // attention data-parallel ranks (each its own scheduler, KV pool, prefix cache)
  int ep = 1;  // expert-parallel ranks (routed experts split over them)
};

// The number of ranks (GPUs). --dp and --ep must agree when both exceed 1 (one DP rank per EP rank);
// one of them alone sets both. Throws di::Error for values < 1 or a mismatch.
int parallel_world_size(const ParallelOptions& options);

// Throws di::Error saying what is needed when this process cannot run the layout: world > 1 needs
// `--device cuda`, a CUDA build, and `world` CUDA devices on this node -- or, launched one process
// per GPU (DEEPINFER_WORLD_SIZE set), a world size equal to it and one visible device.
void check_parallel_resources(const ParallelOptions& options, const std::string& device, int cuda_devices,
                              const std::optional<BootstrapConfig>& launch);

}  // namespace di::parallel
