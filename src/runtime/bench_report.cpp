#include "runtime/bench_report.h"

#include <algorithm>
#include <map>
#include <string>
#include <tuple>

#include "runtime/memory_report.h"

namespace di {

namespace {

double num(const BenchRecord& r, const char* key) { return r.contains(key) && r[key].is_number() ? r[key].get<double>() : 0.0; }
std::string str(const BenchRecord& r, const char* key) {
  if (!r.contains(key)) return "";
  return r[key].is_string() ? r[key].get<std::string>() : r[key].dump();
}
std::vector<const BenchRecord*> of_kind(const std::vector<BenchRecord>& rs, const char* kind) {
  std::vector<const BenchRecord*> out;
  for (const BenchRecord& r : rs)
    if (str(r, "kind") == kind) out.push_back(&r);
  return out;
}

// A profiled pass: (phase, context, batch).
using PassKey = std::tuple<std::string, int64_t, int64_t>;
PassKey pass_of(const BenchRecord& r) {
  return {str(r, "phase"), static_cast<int64_t>(num(r, "context")), static_cast<int64_t>(num(r, "batch"))};
}
std::string pass_name(const PassKey& k) {
  const auto& [phase, context, batch] = k;
  if (phase == "prefill") return "prefill of " + std::to_string(context) + " tokens";
  return "decode, context " + std::to_string(context) + ", batch " + std::to_string(batch);
}

}  // namespace

void print_bench_tables(const std::vector<BenchRecord>& rs, std::FILE* out, int top_ops) {
  std::fprintf(out, "\nceilings (measured in this run)\n");
  for (const BenchRecord* r : of_kind(rs, "ceiling")) {
    if (str(*r, "name") == "copy") {
      std::fprintf(out, "  %-10s %8.3f TB/s (%s per copy, read + written)\n", "copy", num(*r, "tb_s"),
                   format_bytes(num(*r, "bytes")).c_str());
    } else if (num(*r, "tflop_s") > 0) {
      std::fprintf(out, "  %-10s %8.1f TFLOP/s (%lld^3)\n", str(*r, "name").c_str(), num(*r, "tflop_s"),
                   static_cast<long long>(num(*r, "m")));
    } else {
      std::fprintf(out, "  %-10s not measured: %s\n", str(*r, "name").c_str(), str(*r, "note").c_str());
    }
  }

  const auto decode = of_kind(rs, "decode");
  if (!decode.empty()) {
    std::fprintf(out, "\ndecode steps (one token per sequence; median of plain steps; issued: when the host had\n"
                      "issued the last layer -- near the step time, the host is the bottleneck)\n");
    std::fprintf(out, "  %8s %6s %11s %10s %10s %10s %8s %9s %7s  %s\n", "context", "batch", "step ms", "issued ms",
                 "tok/s", "MB/step", "TB/s", "TFLOP/s", "eff %", "mode");
    for (const BenchRecord* r : decode)
      std::fprintf(out, "  %8lld %6lld %11.3f %10.3f %10.1f %10.1f %8.3f %9.3f %7.2f  %s\n",
                   static_cast<long long>(num(*r, "context")), static_cast<long long>(num(*r, "batch")),
                   num(*r, "step_ms"), r->contains("enqueue_ms") ? num(*r, "enqueue_ms") : 0.0, num(*r, "tok_s"), num(*r, "bytes") / 1e6, num(*r, "tb_s"), num(*r, "tflop_s"),
                   100 * num(*r, "efficiency"), str(*r, "mode").c_str());
    for (const BenchRecord* r : decode) {
      if (r->contains("graph_step_ms"))
        std::fprintf(out, "  context %lld, batch %lld: the step as one CUDA graph (%lld nodes, captured in %.3f ms), "
                          "replayed: %.3f ms\n",
                     static_cast<long long>(num(*r, "context")), static_cast<long long>(num(*r, "batch")),
                     static_cast<long long>(num(*r, "graph_nodes")), num(*r, "graph_capture_ms"),
                     num(*r, "graph_step_ms"));
      if (r->contains("graph_pipeline_ms"))
        std::fprintf(out, "  context %lld, batch %lld: the step as a chain of graphs, captured and updated: %.3f ms "
                          "(%lld updates, %lld instantiations)\n",
                     static_cast<long long>(num(*r, "context")), static_cast<long long>(num(*r, "batch")),
                     num(*r, "graph_pipeline_ms"), static_cast<long long>(num(*r, "graph_pipeline_updates")),
                     static_cast<long long>(num(*r, "graph_pipeline_instantiations")));
    }
  }
  for (const BenchRecord* r : of_kind(rs, "prefill")) {
    std::fprintf(out, "\nprefill: %lld tokens in chunks of %lld: %.1f ms, %.1f tok/s, %.2f TFLOP/s, %.3f TB/s, "
                 "efficiency %.2f%%\n",
                 static_cast<long long>(num(*r, "tokens")), static_cast<long long>(num(*r, "chunk")), num(*r, "time_ms"),
                 num(*r, "tok_s"), num(*r, "tflop_s"), num(*r, "tb_s"), 100 * num(*r, "efficiency"));
  }
  for (const BenchRecord* r : of_kind(rs, "profile")) {
    std::fprintf(out, "\nprofile, %s: plain %.3f ms", pass_name(pass_of(*r)).c_str(),
                 r->contains("step_ms") ? num(*r, "step_ms") : num(*r, "time_ms"));
    if (r->contains("step_ms_layer_synced")) std::fprintf(out, ", layer-synced %.3f ms", num(*r, "step_ms_layer_synced"));
    std::fprintf(out, ", op-synced %.3f ms (sum of ops %.3f ms)",
                 r->contains("step_ms_op_synced") ? num(*r, "step_ms_op_synced") : num(*r, "time_ms_op_synced"),
                 num(*r, "sum_op_ms"));
    if (r->contains("projected_40_layer_step_ms"))
      std::fprintf(out, "; 40-layer step projected from the layer kinds: %.3f ms", num(*r, "projected_40_layer_step_ms"));
    std::fprintf(out, "\n");
  }

  // per layer, per profiled pass
  std::map<PassKey, std::vector<const BenchRecord*>> layers, ops;
  for (const BenchRecord* r : of_kind(rs, "layer")) layers[pass_of(*r)].push_back(r);
  for (const BenchRecord* r : of_kind(rs, "op")) ops[pass_of(*r)].push_back(r);
  for (const auto& [key, list] : layers) {
    std::fprintf(out, "\nlayers, %s\n", pass_name(key).c_str());
    // time: the layer between two synchronisations; in step: its share of a plain step (device events);
    // host: the host's time to issue it in that step (near or past in step, the device waits for the host)
    std::fprintf(out, "  %-6s %-16s %11s %10s %10s %8s %9s %11s %7s %11s %7s %9s\n", "layer", "kind", "time us", "MB",
                 "GFLOP", "TB/s", "TFLOP/s", "floor us", "eff %", "in step us", "eff %", "host us");
    for (const BenchRecord* r : list) {
      std::fprintf(out, "  %-6s %-16s %11.1f %10.2f %10.3f %8.3f %9.3f %11.1f %7.2f", str(*r, "layer").c_str(),
                   str(*r, "layer_kind").c_str(), num(*r, "time_us"), num(*r, "bytes") / 1e6, num(*r, "flops") / 1e9,
                   num(*r, "tb_s"), num(*r, "tflop_s"), num(*r, "floor_us"), 100 * num(*r, "efficiency"));
      if (r->contains("in_step_us"))
        std::fprintf(out, " %11.1f %7.2f", num(*r, "in_step_us"), 100 * num(*r, "in_step_efficiency"));
      else
        std::fprintf(out, " %11s %7s", "-", "-");
      if (r->contains("host_issue_us"))
        std::fprintf(out, " %9.1f\n", num(*r, "host_issue_us"));
      else
        std::fprintf(out, " %9s\n", "-");
    }
  }
  for (const auto& [key, list] : ops) {
    struct Agg {
      double t = 0, host = 0, bytes = 0, flops = 0, floor = 0;
      int64_t calls = 0;
    };
    std::map<std::string, Agg> agg;
    double total = 0, host_total = 0;
    for (const BenchRecord* r : list) {
      Agg& a = agg[str(*r, "op")];
      a.t += num(*r, "time_us");
      a.host += num(*r, "host_us");
      host_total += num(*r, "host_us");
      a.bytes += num(*r, "bytes");
      a.flops += num(*r, "flops");
      a.floor += num(*r, "floor_us");
      a.calls += static_cast<int64_t>(num(*r, "calls"));
      total += num(*r, "time_us");
    }
    std::vector<std::pair<std::string, Agg>> sorted(agg.begin(), agg.end());
    std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.second.t > b.second.t; });
    std::fprintf(out, "\nops, %s (all layers; op-synced total %.1f us, of it %.1f us issuing on the host; top %d)\n",
                 pass_name(key).c_str(), total, host_total, top_ops);
    std::fprintf(out, "  %-44s %6s %11s %6s %9s %10s %8s %9s %7s\n", "op", "calls", "time us", "%", "host us", "MB", "TB/s",
                 "TFLOP/s", "eff %");
    int shown = 0;
    for (const auto& [name, a] : sorted) {
      if (shown++ >= top_ops) break;
      const double s = a.t * 1e-6;
      std::fprintf(out, "  %-44s %6lld %11.1f %6.1f %9.1f %10.2f %8.3f %9.3f %7.2f\n", name.c_str(),
                   static_cast<long long>(a.calls), a.t, total > 0 ? 100 * a.t / total : 0.0, a.host, a.bytes / 1e6,
                   s > 0 ? a.bytes / s / 1e12 : 0.0, s > 0 ? a.flops / s / 1e12 : 0.0, a.t > 0 ? 100 * a.floor / a.t : 0.0);
    }
  }

  const auto mem = of_kind(rs, "memory");
  if (!mem.empty()) {
    std::fprintf(out, "\nmemory\n  %-8s %8s %6s %12s %12s %12s %12s %12s\n", "phase", "context", "batch", "weights",
                 "caches", "workspace pk", "device used", "other");
    for (const BenchRecord* r : mem) {
      const bool dev = r->contains("device_used_bytes");
      std::fprintf(out, "  %-8s %8lld %6lld %12s %12s %12s %12s %12s\n", str(*r, "phase").c_str(),
                   static_cast<long long>(num(*r, "context")), static_cast<long long>(num(*r, "batch")),
                   format_bytes(num(*r, "weights_bytes")).c_str(), format_bytes(num(*r, "cache_bytes")).c_str(),
                   format_bytes(num(*r, "workspace_peak_bytes")).c_str(),
                   dev ? format_bytes(num(*r, "device_used_bytes")).c_str() : "-",
                   dev ? format_bytes(num(*r, "device_other_bytes")).c_str() : "-");
    }
  }
}

}  // namespace di
