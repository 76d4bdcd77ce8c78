// Measurement procedure (per decode (context, batch) and for the prefill):
//  1. one step with the ProfilingBackend counting (no synchronisation): bytes and FLOPs per op and
//     per section (embed, layer l, head) -- also the warm-up;
//  2. `iters` plain steps, timed as a whole (median): the un-instrumented number;
//  3. profiled batches only: one step with a device synchronisation at every layer boundary (per-layer
//     times; a few syncs per layer, small next to a layer) and one with every op synchronised and
//     timed (per-op times; the sum exceeds a plain step by the sync and launch gaps, reported).
// A decode step feeds one random token to each sequence through Model::forward_batch (dense work
// once over the batch's rows, attention per sequence).
#include "runtime/bench_run.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <random>

#include "backend/device_tools.h"
#include "core/error.h"
#include "model/synthetic_checkpoint.h"
#include "runtime/cache_fill.h"
#include "runtime/memory_report.h"

namespace di {

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kEmbedSection = -1;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
double round_to(double x, double unit) { return std::round(x / unit) * unit; }

std::string section_name(int s, int n_layers) {
  if (s == ProfilingBackend::kNoSection) return "setup";  // outside a forward (e.g. a new sequence's caches)
  if (s == kEmbedSection) return "embed";
  if (s >= n_layers) return "head";
  return std::to_string(s);
}

// Attributes ops to sections through the forward's hooks and times each section: kSynced with a device
// synchronisation at its boundaries (each section starts on an idle device), kMarks with device events
// at its boundaries in an otherwise plain step (its share of that step: work it overlaps with, e.g. the
// next section's launches under PDL, is not counted twice). A block computes the next block's input
// (Model::block's next_x), so that work counts in the block before.
class SectionClock {
 public:
  enum class Timing { kNone, kSynced, kMarks };
  SectionClock(ProfilingBackend& pb, int n_layers, Timing timing) : pb_(pb), n_layers_(n_layers), timing_(timing) {
    hooks_.at_layer = [this](int l) { lap(l); };  // an observer: the step keeps its cross-layer fusions
    hooks_.after_block = [this](int l, const Tensor&, const Tensor&) {
      if (l == n_layers_ - 1) lap(n_layers_);  // the head follows the last block
    };
  }
  const ForwardHooks* hooks() const { return &hooks_; }
  void begin() {
    pb_.set_section(kEmbedSection);
    if (timing_ == Timing::kSynced) pb_.synchronize();
    if (timing_ == Timing::kMarks) {
      marks_.record();
      order_.push_back(kEmbedSection);
    }
    mark_ = Clock::now();
  }
  void end() {
    lap(ProfilingBackend::kNoSection);
    if (timing_ != Timing::kMarks) return;
    const std::vector<double> between = marks_.seconds_between();  // one per section in order_
    for (size_t i = 0; i < between.size(); ++i) seconds_[order_[i]] += between[i];
    order_.clear();
  }
  const std::map<int, double>& seconds() const { return seconds_; }
  // kMarks: the host's time to issue each section (its ops' launches; the device runs behind it)
  const std::map<int, double>& host_seconds() const { return host_seconds_; }

 private:
  void lap(int next) {
    if (timing_ == Timing::kSynced) {
      pb_.synchronize();
      const auto now = Clock::now();
      seconds_[pb_.section()] += std::chrono::duration<double>(now - mark_).count();
      mark_ = now;
    } else if (timing_ == Timing::kMarks) {
      marks_.record();
      if (next != ProfilingBackend::kNoSection) order_.push_back(next);
      const auto now = Clock::now();
      host_seconds_[pb_.section()] += std::chrono::duration<double>(now - mark_).count();
      mark_ = now;
    }
    pb_.set_section(next);
  }
  ProfilingBackend& pb_;
  int n_layers_;
  Timing timing_;
  ForwardHooks hooks_;
  Clock::time_point mark_;
  std::map<int, double> seconds_, host_seconds_;
  device::StreamMarks marks_;
  std::vector<int> order_;  // kMarks: the section each mark opens
};

double op_floor_s(const OpStats& s, const BenchCeilings& c) {
  double t = c.copy_tb_s > 0 ? s.bytes / (c.copy_tb_s * 1e12) : 0;
  const double peak = s.fp8 && c.fp8_tflop_s > 0 ? c.fp8_tflop_s : c.bf16_tflop_s;
  if (peak > 0) t = std::max(t, s.flops / (peak * 1e12));
  return t;
}

struct Cost {
  double bytes = 0, flops = 0, floor_s = 0;
  int64_t calls = 0;
};

std::map<int, Cost> section_costs(const ProfilingBackend& pb, const BenchCeilings& c, Cost* total) {
  std::map<int, Cost> out;
  for (const auto& [key, s] : pb.ops()) {
    for (Cost* x : {&out[key.first], total}) {
      x->bytes += s.bytes;
      x->flops += s.flops;
      x->floor_s += op_floor_s(s, c);
      x->calls += s.calls;
    }
  }
  return out;
}

// Rates and roofline efficiency of `seconds` for `cost`.
void add_rates(BenchRecord& r, double seconds, double bytes, double flops, double floor_s) {
  r["bytes"] = bytes;
  r["flops"] = flops;
  r["tb_s"] = seconds > 0 ? round_to(bytes / seconds / 1e12, 1e-5) : 0.0;
  r["tflop_s"] = seconds > 0 ? round_to(flops / seconds / 1e12, 1e-5) : 0.0;
  r["floor_us"] = round_to(floor_s * 1e6, 1e-3);
  r["efficiency"] = seconds > 0 ? round_to(floor_s / seconds, 1e-5) : 0.0;
}

struct Ctx {
  Model& model;
  ProfilingBackend& pb;
  const BenchOptions& o;
  const BenchCeilings& ceil;
  const BenchSink& sink;
  std::mt19937_64 rng;
  int n_layers() const { return model.config().n_layers; }
  std::string kind_of(int section) const {
    if (section < kEmbedSection) return "setup";
    if (section == kEmbedSection) return "embed";
    if (section >= n_layers()) return "head";
    return layer_kind(model.config().layers[static_cast<size_t>(section)]);
  }
};

BenchRecord base_record(const char* kind, const char* phase, int64_t context, int batch) {
  BenchRecord r;
  r["kind"] = kind;
  r["phase"] = phase;
  r["context"] = context;
  r["batch"] = batch;
  return r;
}

struct StepTimes {
  double step_s = 0;     // start to the device finishing (logits on the host); held: device time only
  double enqueue_s = 0;  // start to the host having issued the last layer (plain steps only)
};

// One decode step: one random token for every sequence, in one batched forward (as the engine's
// decode step). The token ids are drawn before the clock starts. A plain step (no clock) also
// records when the host has issued every layer: near the step time, the host is the bottleneck.
std::vector<BatchEntry> step_entries(Ctx& c, std::vector<SequenceState>& states) {
  const uint64_t vocab = static_cast<uint64_t>(c.model.config().vocab_size);
  std::vector<BatchEntry> entries(states.size());
  for (size_t i = 0; i < states.size(); ++i) {
    entries[i].state = &states[i];
    entries[i].ids = {static_cast<int32_t>(c.rng() % vocab)};
    entries[i].options.borrow_logits = true;  // as the engine's steps
  }
  return entries;
}

StepTimes decode_step(Ctx& c, std::vector<SequenceState>& states, SectionClock* clock, double hold_ms = 0) {
  std::vector<BatchEntry> entries = step_entries(c, states);
  c.pb.synchronize();
  StepTimes t;
  const auto t0 = Clock::now();
  ForwardHooks issued;
  issued.after_block = [&](int l, const Tensor&, const Tensor&) {
    if (l == c.n_layers() - 1) t.enqueue_s = seconds_since(t0);
  };
  device::StreamMarks held;  // hold_ms > 0: the device's start and end of the step
  if (hold_ms > 0) {
    device::hold(hold_ms);
    held.record();
  }
  if (clock) clock->begin();
  c.model.forward_batch(entries, clock ? clock->hooks() : &issued);
  if (clock) clock->end();
  if (hold_ms > 0) held.record();
  c.pb.synchronize();
  t.step_s = hold_ms > 0 ? held.seconds_between().at(0) : seconds_since(t0);
  return t;
}

// One traced step's kernels as CSV rows (context, batch, start and end in us from the step's first
// kernel, stream, CTAs, name), appended to `path`, with a header when the file is new.
void append_kernel_trace(const std::string& path, int64_t context, int batch, const std::vector<device::KernelRecord>& ks) {
  std::ifstream probe(path);
  const bool fresh = !probe.good() || probe.peek() == std::ifstream::traits_type::eof();
  probe.close();
  std::ofstream out(path, std::ios::app);
  if (!out) throw Error("bench --kernel-trace: cannot write " + path);
  if (fresh) out << "context,batch,start_us,end_us,stream,ctas,name\n";
  const int64_t t0 = ks.empty() ? 0 : ks.front().start_ns;
  char buf[96];
  for (const device::KernelRecord& k : ks) {
    std::snprintf(buf, sizeof buf, "%lld,%d,%.3f,%.3f,%u,%lld,", static_cast<long long>(context), batch,
                  (k.start_ns - t0) * 1e-3, (k.end_ns - t0) * 1e-3, k.stream, static_cast<long long>(k.ctas));
    std::string name = k.name;  // quoted: template arguments hold commas
    for (size_t i = name.find('"'); i != std::string::npos; i = name.find('"', i + 2)) name.insert(i, "\"");
    out << buf << '"' << name << "\"\n";
  }
}

// One decode step captured as a graph and replayed `iters` times: the median seconds per replay, the graph's nodes
// and the host's time to capture it. Every replay recomputes the captured step (same tokens, same positions). With
// a kernel trace path, one more replay is traced into PATH.graph.csv.
struct GraphTimes {
  double replay_s = 0, capture_s = 0;
  int64_t nodes = 0;
};
GraphTimes graph_steps(Ctx& c, std::vector<SequenceState>& states, int iters, int64_t context, int batch) {
  std::vector<BatchEntry> entries = step_entries(c, states);
  device::StepGraph graph([&] { c.model.forward_batch(entries, nullptr); });
  std::vector<double> times;
  graph.replay();  // the first launch of an instantiated graph pays for its setup
  for (int i = 0; i < iters; ++i) times.push_back(graph.replay());
  if (!c.o.kernel_trace.empty()) {
    device::kernel_trace_start();
    graph.replay();
    append_kernel_trace(c.o.kernel_trace + ".graph.csv", context, batch, device::kernel_trace_stop());
  }
  std::sort(times.begin(), times.end());
  return {times[times.size() / 2], graph.capture_seconds(), graph.nodes()};
}

// Decode steps issued as a chain of graphs of `layers` layers each (device::GraphPipeline), timed as plain steps
// (start to logits on the host): the median seconds, after two steps that instantiate the graphs.
double pipelined_steps(Ctx& c, std::vector<SequenceState>& states, int layers, int iters, BenchRecord& d) {
  device::GraphPipeline pipe;
  ForwardHooks cuts;
  cuts.at_layer = [&](int l) {
    if (l > 0 && l % layers == 0) pipe.cut();
  };
  std::vector<double> times;
  for (int i = 0; i < iters + 2; ++i) {
    std::vector<BatchEntry> entries = step_entries(c, states);
    c.pb.synchronize();
    const auto t0 = Clock::now();
    pipe.begin();
    c.model.forward_batch(entries, &cuts);
    pipe.finish();
    if (i >= 2) times.push_back(seconds_since(t0));
  }
  d["graph_pipeline_instantiations"] = pipe.instantiations();
  d["graph_pipeline_updates"] = pipe.updates();
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// One prefill of `tokens` in chunks; the state stays in `state` (for the memory report).
double prefill(Ctx& c, const std::vector<int32_t>& tokens, SectionClock* clock, SequenceState& state) {
  state = c.model.new_sequence();
  c.pb.synchronize();
  const auto t0 = Clock::now();
  const int64_t n = static_cast<int64_t>(tokens.size()), chunk = c.o.prefill_chunk > 0 ? c.o.prefill_chunk : n;
  for (int64_t off = 0; off < n; off += chunk) {
    const std::vector<int32_t> ids(tokens.begin() + off, tokens.begin() + std::min(n, off + chunk));
    if (clock) clock->begin();
    c.model.forward(state, ids, false, clock ? clock->hooks() : nullptr);
    if (clock) clock->end();
  }
  c.pb.synchronize();
  return seconds_since(t0);
}

void emit_memory(Ctx& c, const char* phase, int64_t context, int batch, const std::vector<const SequenceState*>& states) {
  const MemoryReport m = memory_report(c.pb, states);
  BenchRecord r = base_record("memory", phase, context, batch);
  r["weights_bytes"] = m.weights;
  r["cache_bytes"] = m.caches;
  r["workspace_peak_bytes"] = m.workspace_peak;
  if (m.has_device) {
    r["device_used_bytes"] = m.device_used;
    r["device_total_bytes"] = m.device_total;
    r["device_other_bytes"] = m.device_other;
  }
  c.sink(r);
}

// Each section's share of a plain step (device events at its boundaries) and the host's time to issue it.
struct InStep {
  std::map<int, double> device_s, host_s;
};

// Per-layer records from a section-timed pass and the counted costs, with each section's share of a plain
// step where `in_step` has it; returns the seconds per kind.
std::map<std::string, std::vector<double>> emit_layers(Ctx& c, const char* phase, int64_t context, int batch,
                                                       const SectionClock& clock, const std::map<int, Cost>& costs,
                                                       const InStep& in_step = {}) {
  std::map<std::string, std::vector<double>> by_kind;
  for (const auto& [section, secs] : clock.seconds()) {
    if (section == ProfilingBackend::kNoSection) continue;
    const auto it = costs.find(section);
    const Cost cost = it == costs.end() ? Cost{} : it->second;
    BenchRecord r = base_record("layer", phase, context, batch);
    r["layer"] = section_name(section, c.n_layers());
    r["layer_kind"] = c.kind_of(section);
    r["time_us"] = round_to(secs * 1e6, 1e-3);
    add_rates(r, secs, cost.bytes, cost.flops, cost.floor_s);
    if (const auto st = in_step.device_s.find(section); st != in_step.device_s.end()) {
      r["in_step_us"] = round_to(st->second * 1e6, 1e-3);
      r["in_step_efficiency"] = st->second > 0 ? round_to(cost.floor_s / st->second, 1e-5) : 0.0;
    }
    if (const auto h = in_step.host_s.find(section); h != in_step.host_s.end())
      r["host_issue_us"] = round_to(h->second * 1e6, 1e-3);
    c.sink(r);
    by_kind[c.kind_of(section)].push_back(secs);
  }
  return by_kind;
}

void emit_ops(Ctx& c, const char* phase, int64_t context, int batch) {
  for (const auto& [key, s] : c.pb.ops()) {
    BenchRecord r = base_record("op", phase, context, batch);
    r["layer"] = section_name(key.first, c.n_layers());
    r["layer_kind"] = c.kind_of(key.first);
    r["op"] = key.second;
    r["calls"] = s.calls;
    r["time_us"] = round_to(s.seconds * 1e6, 1e-3);
    r["host_us"] = round_to(s.host_seconds * 1e6, 1e-3);
    add_rates(r, s.seconds, s.bytes, s.flops, op_floor_s(s, c.ceil));
    c.sink(r);
  }
}

double sum_op_seconds(const ProfilingBackend& pb) {
  double t = 0;
  for (const auto& [key, s] : pb.ops()) t += s.seconds;
  return t;
}

// A step of the released 40-layer schedule estimated from the measured layers: embed + head + the
// mean time of a measured layer of each released layer's kind (an Engram layer missing from the
// subset: its base kind + the measured Engram cost, SWA+Engram - SWA). Empty when a kind is missing.
std::optional<double> projected_40_layers(const std::map<std::string, std::vector<double>>& by_kind) {
  auto mean = [&](const std::string& k) -> std::optional<double> {
    auto it = by_kind.find(k);
    if (it == by_kind.end() || it->second.empty()) return std::nullopt;
    double s = 0;
    for (double v : it->second) s += v;
    return s / static_cast<double>(it->second.size());
  };
  const ModelConfig released = synthetic_config("v41-tiny", 40);  // the released schedule (dims irrelevant)
  double total = mean("embed").value_or(0) + mean("head").value_or(0);
  for (const LayerSchedule& l : released.layers) {
    const std::string k = layer_kind(l);
    std::optional<double> t = mean(k);
    const std::string suffix = "+Engram";
    if (!t && k.size() > suffix.size() && k.ends_with(suffix)) {
      auto base = mean(k.substr(0, k.size() - suffix.size())), swa = mean("SWA"), swa_e = mean("SWA+Engram");
      if (base && swa && swa_e) t = *base + (*swa_e - *swa);
    }
    if (!t) return std::nullopt;
    total += *t;
  }
  return total;
}

// Each section's share of a plain decode step (device events at the layer boundaries, no
// synchronisation) and the host's time to issue it, the medians of three steps; empty off the CUDA backend.
// Where a section's host time reaches its device time, the device waits for the host there.
InStep in_step_seconds(Ctx& c, std::vector<SequenceState>& states) {
  InStep out;
  if (c.pb.name() != "cuda") return out;
  std::map<int, std::vector<double>> device_runs, host_runs;
  for (int i = 0; i < 3; ++i) {
    SectionClock marks(c.pb, c.n_layers(), SectionClock::Timing::kMarks);
    decode_step(c, states, &marks);
    for (const auto& [section, secs] : marks.seconds()) device_runs[section].push_back(secs);
    for (const auto& [section, secs] : marks.host_seconds()) host_runs[section].push_back(secs);
  }
  auto medians = [](std::map<int, std::vector<double>>& runs, std::map<int, double>& to) {
    for (auto& [section, v] : runs) {
      std::sort(v.begin(), v.end());
      to[section] = v[v.size() / 2];
    }
  };
  medians(device_runs, out.device_s);
  medians(host_runs, out.host_s);
  return out;
}

// One decode measurement at (context, batch).
void bench_decode(Ctx& c, const CacheFiller& filler, int batch) {
  const BenchOptions& o = c.o;
  const int64_t context = filler.context();
  std::vector<SequenceState> states;
  states.reserve(static_cast<size_t>(batch));
  GlobalKvPool& pool = c.model.kv_pool();  // grown once, not by doubling as the states fill
  pool.reserve(pool.used_pages() + batch * filler.pages_per_sequence());
  for (int b = 0; b < batch; ++b) {
    states.push_back(c.model.new_sequence());
    filler.fill(states.back());
  }
  c.pb.synchronize();
  c.pb.reset_peak();

  // 1. counted step (warm-up)
  c.pb.clear_ops();
  c.pb.set_mode(ProfilingBackend::Mode::kCount);
  SectionClock counter(c.pb, c.n_layers(), SectionClock::Timing::kNone);
  decode_step(c, states, &counter);
  c.pb.set_mode(ProfilingBackend::Mode::kOff);
  Cost total;
  const std::map<int, Cost> costs = section_costs(c.pb, c.ceil, &total);

  // 2. plain steps
  std::vector<double> times, enqueue;
  const int iters = std::max(1, o.decode_iters);
  for (int i = 0; i < iters; ++i) {
    const bool last = i == iters - 1;
    if (o.profiler_range && last) device::profiler_range(true);
    const StepTimes t = decode_step(c, states, nullptr, o.hold_ms);
    if (o.profiler_range && last) device::profiler_range(false);
    times.push_back(t.step_s);
    enqueue.push_back(t.enqueue_s);
  }
  // the kernel trace: one more plain step, outside the times (CUPTI slows the host's first launches)
  if (!o.kernel_trace.empty()) {
    device::kernel_trace_start();
    decode_step(c, states, nullptr, o.hold_ms);
    append_kernel_trace(o.kernel_trace, context, batch, device::kernel_trace_stop());
  }
  GraphTimes graph;
  if (o.graph) graph = graph_steps(c, states, iters, context, batch);
  std::sort(times.begin(), times.end());
  std::sort(enqueue.begin(), enqueue.end());
  const double med = times[times.size() / 2];
  BenchRecord d = base_record("decode", "decode", context, batch);
  d["mode"] = o.hold_ms > 0 ? "held" : "batched";
  d["iters"] = static_cast<int64_t>(times.size());
  d["step_ms"] = round_to(med * 1e3, 1e-4);
  d["step_ms_min"] = round_to(times.front() * 1e3, 1e-4);
  d["step_ms_max"] = round_to(times.back() * 1e3, 1e-4);
  d["enqueue_ms"] = round_to(enqueue[enqueue.size() / 2] * 1e3, 1e-4);
  d["tok_s"] = round_to(batch / med, 1e-3);
  if (o.graph) {
    d["graph_step_ms"] = round_to(graph.replay_s * 1e3, 1e-4);
    d["graph_capture_ms"] = round_to(graph.capture_s * 1e3, 1e-4);
    d["graph_nodes"] = graph.nodes;
  }
  if (o.graph_layers > 0)
    d["graph_pipeline_ms"] = round_to(pipelined_steps(c, states, o.graph_layers, iters, d) * 1e3, 1e-4);
  add_rates(d, med, total.bytes, total.flops, total.floor_s);
  c.sink(d);

  // 3. per layer, per op
  if (std::find(o.profile_batches.begin(), o.profile_batches.end(), batch) != o.profile_batches.end()) {
    SectionClock clock(c.pb, c.n_layers(), SectionClock::Timing::kSynced);
    const double t_layers = decode_step(c, states, &clock).step_s;
    const auto by_kind = emit_layers(c, "decode", context, batch, clock, costs, in_step_seconds(c, states));
    c.pb.clear_ops();
    c.pb.set_mode(ProfilingBackend::Mode::kTime);
    SectionClock attr(c.pb, c.n_layers(), SectionClock::Timing::kNone);
    const double t_ops = decode_step(c, states, &attr).step_s;
    c.pb.set_mode(ProfilingBackend::Mode::kOff);
    emit_ops(c, "decode", context, batch);
    BenchRecord p = base_record("profile", "decode", context, batch);
    p["step_ms"] = round_to(med * 1e3, 1e-4);
    p["step_ms_layer_synced"] = round_to(t_layers * 1e3, 1e-4);
    p["step_ms_op_synced"] = round_to(t_ops * 1e3, 1e-4);
    p["sum_op_ms"] = round_to(sum_op_seconds(c.pb) * 1e3, 1e-4);
    if (batch == 1)
      if (auto proj = projected_40_layers(by_kind)) p["projected_40_layer_step_ms"] = round_to(*proj * 1e3, 1e-4);
    c.sink(p);
  }
  std::vector<const SequenceState*> ptrs;
  for (const SequenceState& s : states) ptrs.push_back(&s);
  emit_memory(c, "decode", context, batch, ptrs);
}

void bench_prefill(Ctx& c) {
  const BenchOptions& o = c.o;
  const int64_t n = o.prefill_tokens;
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int32_t& t : tokens) t = static_cast<int32_t>(c.rng() % static_cast<uint64_t>(c.model.config().vocab_size));
  SequenceState state;

  c.pb.reset_peak();
  c.pb.clear_ops();
  c.pb.set_mode(ProfilingBackend::Mode::kCount);
  SectionClock counter(c.pb, c.n_layers(), SectionClock::Timing::kNone);
  prefill(c, tokens, &counter, state);
  c.pb.set_mode(ProfilingBackend::Mode::kOff);
  Cost total;
  const std::map<int, Cost> costs = section_costs(c.pb, c.ceil, &total);

  // Timed prefills: section boundaries synchronised (per-layer times at little cost next to a chunk).
  std::vector<double> times;
  std::vector<std::map<int, double>> per_layer;
  std::optional<SectionClock> last;
  for (int i = 0; i < std::max(1, o.prefill_iters); ++i) {
    last.emplace(c.pb, c.n_layers(), o.profile_prefill ? SectionClock::Timing::kSynced : SectionClock::Timing::kNone);
    times.push_back(prefill(c, tokens, o.profile_prefill ? &*last : nullptr, state));
  }
  std::sort(times.begin(), times.end());
  const double med = times[times.size() / 2];
  BenchRecord r = base_record("prefill", "prefill", n, 1);
  r["tokens"] = n;
  r["chunk"] = o.prefill_chunk > 0 ? o.prefill_chunk : n;
  r["iters"] = static_cast<int64_t>(times.size());
  r["time_ms"] = round_to(med * 1e3, 1e-3);
  r["tok_s"] = round_to(static_cast<double>(n) / med, 1e-3);
  r["layer_synced"] = o.profile_prefill;
  add_rates(r, med, total.bytes, total.flops, total.floor_s);
  c.sink(r);
  emit_memory(c, "prefill", n, 1, {&state});

  if (o.profile_prefill) {
    emit_layers(c, "prefill", n, 1, *last, costs);
    c.pb.clear_ops();
    c.pb.set_mode(ProfilingBackend::Mode::kTime);
    SectionClock attr(c.pb, c.n_layers(), SectionClock::Timing::kNone);
    const double t_ops = prefill(c, tokens, &attr, state);
    c.pb.set_mode(ProfilingBackend::Mode::kOff);
    emit_ops(c, "prefill", n, 1);
    BenchRecord p = base_record("profile", "prefill", n, 1);
    p["time_ms"] = round_to(med * 1e3, 1e-3);
    p["time_ms_op_synced"] = round_to(t_ops * 1e3, 1e-3);
    p["sum_op_ms"] = round_to(sum_op_seconds(c.pb) * 1e3, 1e-3);
    c.sink(p);
  }
}

}  // namespace

std::string layer_kind(const LayerSchedule& l) {
  std::string k;
  if (l.mode == AttnMode::kWindowOnly) {
    k = "SWA";
  } else {
    k = "r" + std::to_string(l.ratio) + " " +
        (l.mode == AttnMode::kFull ? "Full" : l.mode == AttnMode::kReindex ? "Reindex" : "Reuse");
    if (l.is_candidate_source) k += "+cand";
  }
  if (l.engram_slot >= 0) k += "+Engram";
  if (l.is_dspark) k += " (mtp)";
  return k;
}

BenchCeilings measure_bench_ceilings(const std::string& device, const BenchSink& sink) {
  BenchCeilings c;
  if (device == "cuda") {
    const device::Ceilings m = device::measure_ceilings(int64_t{4} << 30, 8192, 20);
    c = {m.copy_tb_s, m.bf16_tflop_s, m.fp8_tflop_s};
    sink({{"kind", "ceiling"}, {"name", "copy"}, {"tb_s", round_to(m.copy_tb_s, 1e-4)}, {"bytes", m.copy_bytes}});
    for (auto [name, v] : {std::pair{"gemm_bf16", m.bf16_tflop_s}, std::pair{"gemm_fp8", m.fp8_tflop_s}}) {
      BenchRecord r{{"kind", "ceiling"}, {"name", name}, {"tflop_s", round_to(v, 1e-2)}, {"m", m.gemm_m},
                    {"n", m.gemm_n}, {"k", m.gemm_k}};
      if (v <= 0) r["note"] = m.note;
      if (v > 0 && std::string(name) == "gemm_fp8") r["variant"] = m.fp8_variant;
      sink(r);
    }
    return c;
  }
  // host: memcpy of 256 MB, median of 5 (bytes read + written); no GEMM ceiling (0 = not measured)
  const size_t half = size_t{128} << 20;
  std::vector<uint8_t> a(half, 1), b(half, 2);
  std::vector<double> t;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), half);
    t.push_back(seconds_since(t0));
    a[static_cast<size_t>(i)] = b[half - 1 - static_cast<size_t>(i)];  // keep the copies observable
  }
  std::sort(t.begin(), t.end());
  c.copy_tb_s = 2.0 * half / t[2] / 1e12;
  sink({{"kind", "ceiling"}, {"name", "copy"}, {"tb_s", round_to(c.copy_tb_s, 1e-5)}, {"bytes", 2 * half}});
  for (const char* name : {"gemm_bf16", "gemm_fp8"})
    sink({{"kind", "ceiling"}, {"name", name}, {"tflop_s", 0.0}, {"note", "not measured on the CPU backend"}});
  return c;
}

void run_bench(Model& model, ProfilingBackend& backend, const BenchOptions& options, const BenchCeilings& ceilings,
               const BenchSink& sink) {
  DI_CHECK(&model.backend() == &backend);
  Ctx c{model, backend, options, ceilings, sink, std::mt19937_64(options.seed)};
  const int64_t longest = options.contexts.empty() ? 0 : *std::max_element(options.contexts.begin(), options.contexts.end());
  const int64_t headroom = options.decode_iters + 4;  // decode steps a measurement takes, and spare
  if (std::max(longest + headroom, options.prefill_tokens) > model.config().max_position)
    throw Error("bench: context " + std::to_string(longest) + " / prefill " + std::to_string(options.prefill_tokens) +
                " exceeds the model's max_position_embeddings " + std::to_string(model.config().max_position));
  emit_memory(c, "loaded", 0, 0, {});
  // Order: batch 1 at every context, the prefill, then the larger batches (smallest first), so that a
  // time budget cuts the least informative measurements.
  std::vector<int> batches = options.batches;
  std::sort(batches.begin(), batches.end());
  batches.erase(std::unique(batches.begin(), batches.end()), batches.end());
  struct Item {
    int batch;      // 0: the prefill
    int64_t context;
  };
  std::vector<Item> plan;
  for (size_t i = 0; i < batches.size(); ++i) {
    for (int64_t ctx : options.contexts) plan.push_back({batches[i], ctx});
    if (i == 0 && options.prefill_tokens > 0) plan.push_back({0, options.prefill_tokens});
  }
  if (batches.empty() && options.prefill_tokens > 0) plan.push_back({0, options.prefill_tokens});

  const auto start = Clock::now();
  std::map<int64_t, std::unique_ptr<CacheFiller>> fillers;  // one per context, shared by the batches
  for (const Item& it : plan) {
    const char* phase = it.batch == 0 ? "prefill" : "decode";
    if (options.time_budget_s > 0 && seconds_since(start) > options.time_budget_s) {
      BenchRecord r = base_record("skipped", phase, it.context, it.batch);
      r["reason"] = "time budget of " + std::to_string(options.time_budget_s) + " s spent";
      sink(r);
      continue;
    }
    try {
      if (it.batch == 0) {
        bench_prefill(c);
      } else {
        auto& f = fillers[it.context];
        if (!f) f = std::make_unique<CacheFiller>(model, it.context, headroom, options.seed + static_cast<uint64_t>(it.context));
        bench_decode(c, *f, it.batch);
      }
    } catch (const Error& e) {  // e.g. out of GPU memory: report it and go on with the next measurement
      backend.set_mode(ProfilingBackend::Mode::kOff);
      BenchRecord r = base_record("error", phase, it.context, it.batch);
      r["error"] = e.what();
      sink(r);
    }
  }
}

}  // namespace di
