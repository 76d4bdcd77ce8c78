#include "parallel/parallel_config.h"

#include "core/error.h"

namespace di::parallel {

int parallel_world_size(const ParallelOptions& o) {
  if (o.dp < 1) throw Error("--dp: expected a positive integer, got " + std::to_string(o.dp));
  if (o.ep < 1) throw Error("--ep: expected a positive integer, got " + std::to_string(o.ep));
  if (o.dp > 1 && o.ep > 1 && o.dp != o.ep)
    throw Error("--dp " + std::to_string(o.dp) + " --ep " + std::to_string(o.ep) +
                ": DeepInfer runs one attention data-parallel rank per expert-parallel rank (one per GPU); "
                "give equal values, or one of them");
  return o.dp > 1 ? o.dp : o.ep;
}

void check_parallel_resources(const ParallelOptions& o, const std::string& device, int cuda_devices,
                              const std::optional<BootstrapConfig>& launch) {
  const int world = parallel_world_size(o);
  const std::string flag = o.ep > 1 ? "--ep " + std::to_string(o.ep) : "--dp " + std::to_string(o.dp);
  if (launch && launch->world_size > 1) {
    if (launch->world_size != world)
      throw Error("DEEPINFER_WORLD_SIZE=" + std::to_string(launch->world_size) + " but " + flag + " asks for " +
                  std::to_string(world) + " ranks");
  }
  if (world == 1) return;
  if (device != "cuda")
    throw Error(flag + " needs --device cuda and " + std::to_string(world) + " CUDA devices (got --device " + device +
                "); the CPU backend runs one rank");
  const bool per_process = launch && launch->world_size > 1;
  const int needed = per_process ? 1 : world;
  if (cuda_devices < needed)
    throw Error(flag + " needs " + std::to_string(needed) + " CUDA device" + (needed > 1 ? "s" : "") +
                (per_process ? " per process" : "") + "; this machine has " + std::to_string(cuda_devices));
}

}  // namespace di::parallel
