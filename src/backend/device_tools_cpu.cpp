// device_tools.h for builds without the CUDA backend (the CUDA build implements it in
// src/backend/cuda/ceilings.cu and synthetic_fill.cu).
#ifndef DEEPINFER_HAVE_CUDA

#include "backend/device_tools.h"
#include "core/error.h"

namespace di::device {

bool available() { return false; }
std::string name() { return ""; }
void synchronize() {}
void profiler_range(bool) {}
void hold(double) { throw Error("device hold: this build has no CUDA backend"); }
void kernel_trace_start() { throw Error("kernel trace: this build has no CUDA backend"); }
std::vector<KernelRecord> kernel_trace_stop() { return {}; }
StreamMarks::~StreamMarks() = default;
void StreamMarks::record() { throw Error("device stream marks: this build has no CUDA backend"); }
std::vector<double> StreamMarks::seconds_between() { return {}; }
StepGraph::StepGraph(const std::function<void()>&) { throw Error("step graph: this build has no CUDA backend"); }
StepGraph::~StepGraph() = default;
double StepGraph::replay() { return 0; }
GraphPipeline::GraphPipeline() { throw Error("graph pipeline: this build has no CUDA backend"); }
GraphPipeline::~GraphPipeline() = default;
void GraphPipeline::begin() {}
void GraphPipeline::cut() {}
void GraphPipeline::finish() {}
MemInfo mem_info() { throw Error("device memory: this build has no CUDA backend"); }
int64_t prepare_synthetic(Weight&, const synthetic::FillSpec&, const synthetic::FillSpec*) {
  throw Error("synthetic device weights: this build has no CUDA backend");
}
Ceilings measure_ceilings(int64_t, int64_t, int) { throw Error("device ceilings: this build has no CUDA backend"); }

}  // namespace di::device

#endif
