// device::StepGraph and device::GraphPipeline (device_tools.h): a decode step captured as CUDA graphs.
//
// A capture swaps the backend's main stream for a created non-blocking one (side_stream.cuh); the side
// stream joins the capture through the fork event it waits on and rejoins it by a join, so both branches
// become one graph with their events as edges. Launches keep their PDL attribute, which a capture records as
// programmatic edges. Relaxed mode: the block cache may still cudaMalloc a block it has not seen.
#include <cuda_runtime.h>

#include <chrono>
#include <string>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/device_memory.cuh"
#include "backend/cuda/side_stream.cuh"
#include "backend/cuda/step_graph.cuh"
#include "backend/device_tools.h"
#include "core/error.h"

namespace di::cuda {
namespace {

thread_local bool g_capturing = false;

// Captures the backend's work from now on, on `stream` as its main stream.
void begin_capture(cudaStream_t stream) {
  set_main_stream(stream);
  g_capturing = true;
  DI_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
}

// Ends the capture on `stream` (the main stream stays `stream`): the graph, or an Error with the reason.
cudaGraph_t end_capture(cudaStream_t stream) {
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  g_capturing = false;
  if (ended == cudaSuccess) return graph;
  if (graph) cudaGraphDestroy(graph);
  (void)cudaGetLastError();
  throw Error(std::string("step graph: the capture failed: ") + cudaGetErrorString(ended));
}

// Ends a capture that a throw interrupted, dropping what it recorded (its error, if the capture was invalidated
// too, is not the one to report).
void abandon_capture(cudaStream_t stream) {
  cudaGraph_t graph = nullptr;
  (void)cudaStreamEndCapture(stream, &graph);
  if (graph) cudaGraphDestroy(graph);
  (void)cudaGetLastError();
  g_capturing = false;
}

cudaGraphExec_t instantiate(cudaGraph_t graph) {
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made = cudaGraphInstantiateWithFlags(&exec, graph, 0);
  if (made != cudaSuccess) throw Error(std::string("step graph: instantiation failed: ") + cudaGetErrorString(made));
  return exec;
}

cudaStream_t new_stream() {
  cudaStream_t s = nullptr;
  DI_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

}  // namespace

bool capturing_step() { return g_capturing; }

}  // namespace di::cuda

namespace di::device {

StepGraph::StepGraph(const std::function<void()>& issue) {
  DI_CUDA_CHECK(cudaDeviceSynchronize());
  cuda::rewind_upload_rings();  // the capture's uploads then fit the ring without waiting for it
  const cudaStream_t stream = cuda::new_stream();
  stream_ = stream;  // destroyed here if the constructor throws (the destructor does not run then)
  cudaGraph_t graph = nullptr;
  try {
    const auto t0 = std::chrono::steady_clock::now();
    cuda::begin_capture(stream);
    try {
      issue();
    } catch (...) {
      cuda::abandon_capture(stream);
      throw;
    }
    graph = cuda::end_capture(stream);
    capture_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    cuda::set_main_stream(nullptr);
    size_t n = 0;
    DI_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
    nodes_ = static_cast<int64_t>(n);
    exec_ = cuda::instantiate(graph);
    cudaGraphDestroy(graph);
    graph = nullptr;
    DI_CUDA_CHECK(cudaGraphUpload(static_cast<cudaGraphExec_t>(exec_), stream));
  } catch (...) {
    cuda::set_main_stream(nullptr);
    if (graph) cudaGraphDestroy(graph);
    if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
    cudaStreamDestroy(stream);
    throw;
  }
}

StepGraph::~StepGraph() {
  if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  if (stream_) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

double StepGraph::replay() {
  DI_CUDA_CHECK(cudaDeviceSynchronize());
  const auto t0 = std::chrono::steady_clock::now();
  DI_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), static_cast<cudaStream_t>(stream_)));
  DI_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)));
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

GraphPipeline::GraphPipeline() : stream_(cuda::new_stream()) {}

GraphPipeline::~GraphPipeline() {
  if (cuda::capturing_step()) cuda::abandon_capture(static_cast<cudaStream_t>(stream_));  // a step that threw
  cuda::set_main_stream(nullptr);
  for (void* e : execs_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(e));
  cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

void GraphPipeline::begin() {
  cuda::rewind_upload_rings();  // the previous step has finished (finish() waited for it)
  group_ = 0;
  cuda::begin_capture(static_cast<cudaStream_t>(stream_));
}

void GraphPipeline::cut() {
  end_group();
  cuda::begin_capture(static_cast<cudaStream_t>(stream_));
}

void GraphPipeline::finish() {
  end_group();
  cuda::set_main_stream(nullptr);
  DI_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)));
}

void GraphPipeline::end_group() {
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_);
  cuda::side_join();  // a capture ends with every forked stream joined
  cudaGraph_t graph = cuda::end_capture(stream);
  if (group_ < execs_.size()) {
    cudaGraphExecUpdateResultInfo info{};
    if (cudaGraphExecUpdate(static_cast<cudaGraphExec_t>(execs_[group_]), graph, &info) == cudaSuccess) {
      ++updates_;
    } else {
      (void)cudaGetLastError();
      cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(execs_[group_]));
      execs_[group_] = cuda::instantiate(graph);
      ++instantiations_;
    }
  } else {
    execs_.push_back(cuda::instantiate(graph));
    ++instantiations_;
  }
  cudaGraphDestroy(graph);
  DI_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(execs_[group_]), stream));
  ++group_;
}

}  // namespace di::device
