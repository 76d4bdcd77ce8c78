// `deepinfer write-checkpoint --config DIR_OR_FILE --out DIR [--seed S] [--shard-bytes N]`: writes a
// random checkpoint in the released V4.1 format for the given config (config files copied along),
// then re-opens it and validates it against the config.
#include <cstdio>
#include <string>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/error.h"
#include "model/checkpoint_validate.h"
#include "model/checkpoint_writer.h"
#include "model/config.h"
#include "model/safetensors.h"

namespace di::cli {

int cmd_write_checkpoint(const Argv& argv) {
  Args args(argv, {"config", "out", "seed", "shard-bytes"}, {"no-verify"});
  const std::string config = args.get("config");
  const std::string out = args.get("out");
  const long long seed = args.get_int_or("seed", 0);
  const long long shard_bytes = args.get_int_or("shard-bytes", 10'000'000'000LL);
  if (shard_bytes <= 0) throw Error("--shard-bytes must be positive, got " + std::to_string(shard_bytes));

  ModelConfig cfg = load_model_config_from(config);
  copy_model_config(config, out);
  CheckpointWriteOptions options;
  options.seed = static_cast<uint64_t>(seed);
  options.shard_bytes = static_cast<uint64_t>(shard_bytes);
  options.progress = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
  CheckpointWriteResult r = write_random_checkpoint(cfg, out, options);

  if (!args.flag("no-verify")) {
    ModelConfig reread = load_model_config(out);
    std::unique_ptr<Checkpoint> ckpt = Checkpoint::open(out);
    validate_checkpoint(reread, *ckpt, /*allow_unexpected=*/false);
  }
  std::printf("wrote %s: %zu tensors, %llu bytes in %zu shard%s (seed %lld)%s\n", out.c_str(), r.n_tensors,
              static_cast<unsigned long long>(r.data_bytes), r.n_shards, r.n_shards == 1 ? "" : "s", seed,
              args.flag("no-verify") ? "" : ", validated");
  return 0;
}

}  // namespace di::cli
