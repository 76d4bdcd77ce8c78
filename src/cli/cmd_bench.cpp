// deepinfer bench (--model DIR | --synthetic v41-flash|v41-tiny [--layers N]) [--device cpu|cuda]
//                 [--batch 1,8,64,256] [--context 4096,32768] [--prefill 8192] [--prefill-chunk 2048]
//                 [--iters 3] [--prefill-iters 1] [--profile-batch 1] [--no-profile] [--no-ceilings]
//                 [--time-budget SECONDS] [--seed S] [--batch-invariant] [--fast-fp4-gemm] [--profiler-range]
//                 [--kernel-trace FILE] [--hold-ms MS] [--graph] [--graph-layers K] [--json]
// Decode steps and prefill timed as a whole, per layer and per op, with bytes, FLOPs and roofline
// efficiency against ceilings measured in the same run (runtime/bench_run.h). --synthetic builds a
// random checkpoint with the released dimensions (model/synthetic_checkpoint.h), generated straight
// into GPU memory with --device cuda. --json prints every measurement as one JSON object per line
// (lines starting with '{'), then the tables. --time-budget skips the measurements that would start
// after that many seconds (batch 1 and the prefill run first). The model runs with the engine's defaults
// (reference decode quirks off: device-side top-k). --batch-invariant: the backend's batch-invariant
// mode (EngineOptions::batch_invariant), to measure what it costs; --fast-fp4-gemm likewise
// (EngineOptions::fast_fp4_gemm), to measure what it gains. --profiler-range: the last timed
// decode step of each batch runs inside cudaProfilerStart / Stop, so that
// `ncu --profile-from-start off` times that step's kernels alone. --kernel-trace FILE: the kernels of one more
// plain step after the timed ones (not in the times), as the device ran them (start, end, stream; CUPTI,
// device_tools.h), appended to FILE as CSV (bench/gpu/trace_summary.py reads it). --hold-ms MS: every plain
// decode step (and the traced one) starts behind a device wait of MS ms, during which the host issues it, and
// is timed on the device from the wait's end: the step as the device runs it when the host is never late.
// --graph: one more decode step of each batch captured as a CUDA graph and replayed --iters times (host launch to
// device done, as a plain step): what the step costs issued as one graph instead of kernel by kernel; with
// --kernel-trace FILE one more replay is traced into FILE.graph.csv. --graph-layers K: decode steps issued as a
// chain of CUDA graphs of K layers each, captured every step and updated in place, each launched as soon as
// captured (device::GraphPipeline): what capturing instead of launching gives when the host still runs the forward.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/device_tools.h"
#include "backend/profiling_backend.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "core/error.h"
#include "model/model.h"
#include "model/synthetic_checkpoint.h"
#include "runtime/bench_report.h"
#include "runtime/bench_run.h"
#include "runtime/memory_report.h"

namespace di::cli {

namespace {

std::vector<int64_t> to_i64(const std::vector<int>& v) { return {v.begin(), v.end()}; }

// Synthetic weights on the GPU: each weight is generated in device memory when the model binds it.
ProfilingBackend::PrepareHook synthetic_device_hook(std::shared_ptr<const SyntheticWeights> weights) {
  return [weights](Weight& w) -> int64_t {
    const SyntheticTensor* data = weights->find(w.data);
    if (!data) return -1;
    const SyntheticTensor* scale = w.scale ? weights->find(w.scale) : nullptr;
    if (w.scale && !scale) throw Error("synthetic weight " + data->tensor.name + ": its scale is not synthetic");
    return device::prepare_synthetic(w, data->fill, scale ? &scale->fill : nullptr);
  };
}

}  // namespace

int cmd_bench(const Argv& argv) {
  Args args(argv,
            {"model", "synthetic", "layers", "device", "batch", "context", "prefill", "prefill-chunk", "iters",
             "prefill-iters", "profile-batch", "seed", "time-budget", "kernel-trace", "hold-ms", "graph-layers"},
            {"json", "no-profile", "no-ceilings", "batch-invariant", "profiler-range", "fast-fp4-gemm", "graph"});
  const std::string device_name = args.get_or("device", "cpu");
  if (args.has("model") == args.has("synthetic")) throw Error("bench: give exactly one of --model DIR or --synthetic PRESET");

  BenchOptions o;
  if (args.has("batch")) o.batches = parse_int_list("batch", args.get("batch"));
  if (args.has("context")) o.contexts = to_i64(parse_int_list("context", args.get("context")));
  o.prefill_tokens = args.get_int_or("prefill", o.prefill_tokens);
  o.prefill_chunk = args.get_int_or("prefill-chunk", o.prefill_chunk);
  o.decode_iters = static_cast<int>(args.get_int_or("iters", o.decode_iters));
  o.prefill_iters = static_cast<int>(args.get_int_or("prefill-iters", o.prefill_iters));
  if (args.has("profile-batch")) o.profile_batches = parse_int_list("profile-batch", args.get("profile-batch"));
  o.seed = static_cast<uint64_t>(args.get_int_or("seed", 1));
  o.time_budget_s = args.get_double_or("time-budget", 0);
  o.profiler_range = args.flag("profiler-range");
  o.kernel_trace = args.get_or("kernel-trace", "");
  if (!o.kernel_trace.empty() && device_name != "cuda") throw Error("bench: --kernel-trace needs --device cuda");
  o.hold_ms = args.get_double_or("hold-ms", 0);
  if (o.hold_ms < 0 || o.hold_ms > 1000) throw Error("bench: --hold-ms must be within [0, 1000]");
  if (o.hold_ms > 0 && device_name != "cuda") throw Error("bench: --hold-ms needs --device cuda");
  o.graph = args.flag("graph");
  o.graph_layers = static_cast<int>(args.get_int_or("graph-layers", 0));
  if (o.graph_layers < 0) throw Error("bench: --graph-layers must be >= 0");
  if ((o.graph || o.graph_layers > 0) && device_name != "cuda")
    throw Error("bench: --graph and --graph-layers need --device cuda");
  if (args.flag("no-profile")) {
    o.profile_batches.clear();
    o.profile_prefill = false;
  }
  for (int b : o.batches)
    if (b < 1) throw Error("--batch: batch sizes must be >= 1");
  for (int64_t c : o.contexts)
    if (c < 1) throw Error("--context: context lengths must be >= 1");
  if (o.prefill_tokens < 0 || o.prefill_chunk < 0 || o.decode_iters < 1 || o.prefill_iters < 1)
    throw Error("bench: --prefill and --prefill-chunk must be >= 0, --iters and --prefill-iters >= 1");

  const bool json = args.flag("json");
  std::vector<BenchRecord> records;
  const BenchSink sink = [&](const BenchRecord& r) {
    records.push_back(r);
    if (json) {
      std::printf("%s\n", r.dump().c_str());
      std::fflush(stdout);
    }
  };

  std::string command = "deepinfer bench";
  for (const std::string& a : argv) command += " " + a;
  std::unique_ptr<Backend> inner = make_backend(device_name);
  ProfilingBackend pb(*inner);
  pb.set_batch_invariant(args.flag("batch-invariant"));
  pb.set_fast_fp4_gemm(args.flag("fast-fp4-gemm"));
  const std::string dev = device_name == "cuda" ? device::name() : "cpu";
  std::printf("command: %s\ndevice: %s\n", command.c_str(), dev.c_str());
  std::fflush(stdout);

  BenchCeilings ceilings;
  if (!args.flag("no-ceilings")) ceilings = measure_bench_ceilings(device_name, sink);

  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<Model> model;
  ModelOptions mo;
  mo.reference_decode_quirks = false;
  if (args.has("synthetic")) {
    const int layers = static_cast<int>(args.get_int_or("layers", 8));
    const bool on_device = device_name == "cuda";
    SyntheticModel sm = make_synthetic_model(args.get("synthetic"), layers, o.seed,
                                             on_device ? SyntheticWeights::Placement::kDevice
                                                       : SyntheticWeights::Placement::kHost);
    if (on_device) pb.set_prepare_hook(synthetic_device_hook(sm.weights));
    model = Model::load(std::move(sm.config), std::move(sm.checkpoint), pb, mo, &sm.engram_map);
    pb.set_prepare_hook({});
  } else {
    model = Model::load(args.get("model"), pb, mo);
  }
  pb.synchronize();
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const ModelConfig& cfg = model->config();
  std::printf("model: %s, %d layers (hidden %d, %d heads x %d, %d experts top-%d, vocab %d), loaded in %.2f s\n",
              args.has("synthetic") ? ("synthetic " + args.get("synthetic")).c_str() : args.get("model").c_str(),
              cfg.n_layers, cfg.hidden_size, cfg.n_heads, cfg.head_dim, cfg.n_routed_experts, cfg.n_activated_experts,
              cfg.vocab_size, load_s);
  std::printf("schedule:\n");
  for (const LayerSchedule& l : cfg.layers)
    std::printf("  %-16s %s\n", layer_kind(l).c_str(), format_layer_schedule(l).c_str());
  std::printf("memory after load: %s\n", format_memory_report(memory_report(pb, {})).c_str());
  std::fflush(stdout);

  run_bench(*model, pb, o, ceilings, sink);
  print_bench_tables(records, stdout);
  return 0;
}

}  // namespace di::cli
