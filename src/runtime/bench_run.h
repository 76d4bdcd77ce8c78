// `deepinfer bench`: decode steps and prefill on a loaded model, timed as a whole and per layer and
// per op (through a ProfilingBackend), with bytes moved and FLOPs from the op cost model, against
// ceilings measured in the same run. Every measurement is one JSON record (BenchRecord), handed to a
// sink as it is made; bench_report.h turns the records into tables.
//
// Record kinds ("kind" field): "ceiling", "memory", "decode", "prefill", "layer", "op", "profile", and
// "skipped" (time budget) / "error" (e.g. out of memory) for a measurement that did not run.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/profiling_backend.h"
#include "model/model.h"

namespace di {

using BenchRecord = nlohmann::json;
using BenchSink = std::function<void(const BenchRecord&)>;

struct BenchOptions {
  std::vector<int> batches = {1, 8, 64, 256};          // decode batch sizes
  std::vector<int64_t> contexts = {4096, 32768};       // decode context lengths
  int64_t prefill_tokens = 8192;                       // one sequence; 0: no prefill measurement
  int64_t prefill_chunk = 2048;                        // the engine's step budget (engine.h max_step_tokens)
  int decode_iters = 3;                                // timed steps per (context, batch), median reported
  int prefill_iters = 1;                               // timed prefills
  std::vector<int> profile_batches = {1};              // decode batches also profiled per layer and per op
  bool profile_prefill = true;                         // prefill profiled per layer and per op
  uint64_t seed = 1;
  double time_budget_s = 0;                            // > 0: skip what would start after this long
  bool profiler_range = false;                         // the last timed decode step of each batch inside
                                                       // device::profiler_range (ncu --profile-from-start off)
  std::string kernel_trace;                            // non-empty: one more decode step of each batch, after
                                                       // the timed ones, traced (device::kernel_trace_*), CSV
                                                       // rows appended here
  double hold_ms = 0;                                  // > 0: plain and traced decode steps start behind a
                                                       // device wait this long (device::hold) and are timed
                                                       // on the device from its end
  bool graph = false;                                  // also one decode step of each batch captured as a CUDA
                                                       // graph (device::StepGraph) and replayed `decode_iters`
                                                       // times: graph_step_ms in the decode record
  int graph_layers = 0;                                // > 0: also decode steps issued as a chain of graphs of
                                                       // this many layers each (device::GraphPipeline), captured
                                                       // and updated every step: graph_pipeline_ms
};

struct BenchCeilings {
  double copy_tb_s = 0;     // device (or host) copy, bytes read + written
  double bf16_tflop_s = 0;  // 0: not measured
  double fp8_tflop_s = 0;
};

// Measures the ceilings of `device` ("cuda": device copy + cuBLASLt bf16 / FP8 GEMMs; "cpu": host
// memcpy only) and emits one "ceiling" record each.
BenchCeilings measure_bench_ceilings(const std::string& device, const BenchSink& sink);

// A layer's kind as the tables name it: "SWA", "SWA+Engram", "r2 Full", "r2 Reuse", "r1 Full+cand",
// "r1 Reuse", "r1 Reindex", ... (ratio, mode, candidate source, Engram).
std::string layer_kind(const LayerSchedule& l);

// Runs the decode and prefill measurements. `backend` must be the backend `model` was loaded on.
void run_bench(Model& model, ProfilingBackend& backend, const BenchOptions& options, const BenchCeilings& ceilings,
               const BenchSink& sink);

}  // namespace di
