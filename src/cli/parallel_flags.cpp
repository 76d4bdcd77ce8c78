#include "cli/parallel_flags.h"

#include <limits>

#include "core/error.h"
#include "parallel/nccl_communicator.h"

namespace di::cli {

parallel::ParallelOptions parallel_options(const Args& args, const std::string& device) {
  auto value = [&](const char* name) {
    long long v = args.get_int_or(name, 1);
    if (v < 1 || v > std::numeric_limits<int>::max())
      throw Error(std::string("--") + name + ": expected a positive integer, got " + std::to_string(v));
    return static_cast<int>(v);
  };
  parallel::ParallelOptions o{value("dp"), value("ep")};
  const int world = parallel::parallel_world_size(o);
  parallel::check_parallel_resources(o, device, parallel::cuda_device_count(), parallel::bootstrap_from_env());
  if (world > 1)
    throw Error("--dp/--ep " + std::to_string(world) +
                ": the expert-parallel layer, its NCCL transport and the placement tables exist (src/parallel), but "
                "the engine does not run ranks yet; see docs/multi_gpu.md");
  return o;
}

}  // namespace di::cli
