#include "cli/engine_flags.h"

#include <limits>

#include "core/error.h"

namespace di::cli {

namespace {

PrefixCacheMode parse_prefix_cache(const std::string& text) {
  if (text == "off") return PrefixCacheMode::kOff;
  if (text == "replay") return PrefixCacheMode::kReplay;
  if (text == "exact") return PrefixCacheMode::kExact;
  throw Error("--prefix-cache: expected off, replay or exact, got '" + text + "'");
}

int64_t positive(const Args& args, const std::string& name, int64_t fallback) {
  long long v = args.get_int_or(name, fallback);
  if (v < 1) throw Error("--" + name + ": expected a positive integer, got " + std::to_string(v));
  return v;
}

}  // namespace

EngineOptions engine_options(const Args& args) {
  EngineOptions o;
  o.model_dir = args.get_or("model", default_model_dir().string());
  o.device = args.get_or("device", o.device);
  if (auto mode = args.get_opt("prefix-cache")) o.prefix_cache = parse_prefix_cache(*mode);
  o.max_running = static_cast<int>(
      std::min<int64_t>(positive(args, "max-running", o.max_running), std::numeric_limits<int>::max()));
  o.max_step_tokens = positive(args, "max-step-tokens", o.max_step_tokens);
  o.exact_snapshot_blocks = positive(args, "exact-snapshot-blocks", o.exact_snapshot_blocks);
  o.batch_invariant = args.flag("batch-invariant");
  o.fast_fp4_gemm = args.flag("fast-fp4-gemm");
  o.async_scheduling = !args.flag("no-async");
  return o;
}

SamplingParams sampling_options(const Args& args, int32_t default_max_tokens) {
  SamplingParams sp;
  int64_t max_tokens = positive(args, "max-tokens", default_max_tokens);
  if (max_tokens > std::numeric_limits<int32_t>::max())
    throw Error("--max-tokens: expected at most 2^31-1, got " + std::to_string(max_tokens));
  sp.max_tokens = static_cast<int32_t>(max_tokens);
  sp.temperature = static_cast<float>(args.get_double_or("temperature", sp.temperature));
  sp.top_p = static_cast<float>(args.get_double_or("top-p", sp.top_p));
  long long top_k = args.get_int_or("top-k", sp.top_k);
  if (top_k < 0 || top_k > std::numeric_limits<int32_t>::max())
    throw Error("--top-k: expected an integer >= 0, got " + std::to_string(top_k));
  sp.top_k = static_cast<int32_t>(top_k);
  if (args.has("seed")) {
    long long seed = args.get_int_or("seed", 0);
    if (seed < 0) throw Error("--seed: expected an integer >= 0, got " + std::to_string(seed));
    sp.seed = static_cast<uint64_t>(seed);
  }
  return sp;
}

std::set<std::string> with_options(std::set<std::string> own, const std::set<std::string>& more) {
  own.insert(more.begin(), more.end());
  return own;
}

}  // namespace di::cli
