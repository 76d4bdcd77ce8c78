// device::StepGraph (device_tools.h): one decode step captured as a CUDA graph and launched again.
//
// The capture swaps the backend's main stream for a created non-blocking one (side_stream.cuh); the side
// stream joins the capture through the fork event it waits on, and rejoins it by the step's final join,
// so both branches become one graph with their events as edges. Launches keep their PDL attribute, which
// a capture records as programmatic edges. Relaxed mode: the block cache may still cudaMalloc a block it
// has not seen (the step before the capture normally warms it).
#include <cuda_runtime.h>

#include <chrono>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/device_memory.cuh"
#include "backend/cuda/side_stream.cuh"
#include "backend/cuda/step_graph.cuh"
#include "backend/device_tools.h"
#include "core/error.h"

namespace di::cuda {
namespace {
thread_local bool g_capturing = false;
}  // namespace

bool capturing_step() { return g_capturing; }

}  // namespace di::cuda

namespace di::device {

StepGraph::StepGraph(const std::function<void()>& issue) {
  DI_CUDA_CHECK(cudaDeviceSynchronize());
  cuda::rewind_upload_rings();  // the capture's uploads then fit the ring without waiting for it
  cudaStream_t stream = nullptr;
  DI_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  stream_ = stream;
  cuda::set_main_stream(stream);
  cuda::g_capturing = true;
  cudaGraph_t graph = nullptr;
  auto restore = [&] {
    cuda::g_capturing = false;
    cuda::set_main_stream(nullptr);
  };
  DI_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  try {
    issue();
  } catch (...) {
    (void)cudaStreamEndCapture(stream, &graph);  // abandons the capture
    if (graph) cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    restore();
    cudaStreamDestroy(stream);
    stream_ = nullptr;
    throw;
  }
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  restore();
  if (ended != cudaSuccess) {
    cudaStreamDestroy(stream);
    stream_ = nullptr;
    throw Error(std::string("step graph: the capture failed: ") + cudaGetErrorString(ended));
  }
  size_t n = 0;
  DI_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  nodes_ = static_cast<int64_t>(n);
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made = cudaGraphInstantiateWithFlags(&exec, graph, cudaGraphInstantiateFlagUseNodePriority);
  cudaGraphDestroy(graph);
  if (made != cudaSuccess) throw Error(std::string("step graph: instantiation failed: ") + cudaGetErrorString(made));
  exec_ = exec;
  DI_CUDA_CHECK(cudaGraphUpload(exec, stream));
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

}  // namespace di::device
