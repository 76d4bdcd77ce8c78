// Device-side helpers for tools (bench, inspect) that sit beside the Backend op contract: device
// queries, synchronisation, synthetic weight materialisation and the hardware ceilings measured with
// vendor libraries. Plain functions with no CUDA types, so CPU-only code can call them; without a
// CUDA build available() is false and the others throw (synchronize() is a no-op).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend/tensor.h"
#include "model/synthetic_fill.h"

namespace di::device {

bool available();  // this build has the CUDA backend and a device is present
std::string name();  // "NVIDIA H200" (empty without a device)
void synchronize();  // waits for all device work
// Starts / stops the device profiler's capture range (cudaProfilerStart / Stop), for profiling one
// region with `ncu --profile-from-start off`; a no-op without a device.
void profiler_range(bool start);
// The CUDA backend's current stream waits `ms` on the device (one spinning thread), so that the host issues
// what follows before the device starts it: a region timed or traced after it shows the device alone,
// never waiting for the host. Throws without the CUDA backend.
void hold(double ms);

// The device's kernel timeline over a region (CUPTI activity records; libcupti is loaded at run time,
// so nothing links against it): kernel_trace_start() begins recording every kernel's start and end on
// the GPU clock, kernel_trace_stop() waits for the device and returns the kernels in start order. With
// PDL a kernel starts before the one it waits for has ended: the time a kernel adds to its stream is
// its end minus the previous kernel's end. Throws where CUPTI cannot be loaded (the error says why).
struct KernelRecord {
  std::string name;  // demangled
  int64_t start_ns = 0, end_ns = 0;
  uint32_t stream = 0;
  int64_t ctas = 0;
};
void kernel_trace_start();
std::vector<KernelRecord> kernel_trace_stop();

// Timed events on the CUDA backend's current stream, for times inside a pass that must not be
// synchronised (the bench's per-layer share of a plain decode step): record() marks the stream where
// the host is; seconds_between() waits for the last mark, gives the device time between each pair
// of consecutive marks and forgets the marks. An event boundary orders the next kernel as a plain launch (no PDL overlap),
// about a microsecond. Without the CUDA backend record() throws.
class StreamMarks {
 public:
  StreamMarks() = default;
  ~StreamMarks();
  StreamMarks(const StreamMarks&) = delete;
  StreamMarks& operator=(const StreamMarks&) = delete;
  void record();
  std::vector<double> seconds_between();  // marks - 1 values (none for fewer than 2 marks)

 private:
  std::vector<void*> events_;  // cudaEvent_t
};

// A CUDA graph of the device work that `issue` makes (one decode step), captured once and launched again
// with the same inputs: what a step costs when the host issues it as one graph instead of kernel by kernel.
// The capture runs `issue` on a created stream as the backend's main stream (the legacy default stream
// cannot be captured); inside it nothing may wait for the device: a read-back other than
// to_host_f32_staged, or an upload too large for the staging ring, throws. Measuring only: every replay
// recomputes the captured step into the same buffers, which the backend has since handed back to its
// block cache, so nothing else may run on the device between replays.
class StepGraph {
 public:
  explicit StepGraph(const std::function<void()>& issue);
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;
  double replay();  // seconds from the launch until the device has finished the step
  int64_t nodes() const { return nodes_; }
  double capture_seconds() const { return capture_s_; }  // the host's time to run `issue` under capture

 private:
  void* stream_ = nullptr;  // cudaStream_t
  void* exec_ = nullptr;    // cudaGraphExec_t
  int64_t nodes_ = 0;
  double capture_s_ = 0;
};

// A decode step issued as a chain of CUDA graphs, each captured from a group of the forward's layers and
// launched as soon as it is captured, so that the device runs a group while the host captures the next: the
// forward's host work stays, the per-kernel launches become captured nodes. Each group's executable graph is
// kept and updated in place from the next step's capture (cudaGraphExecUpdate) when the topology matches, and
// instantiated anew when it does not. begin() starts a step; cut() ends a group (joining the side stream
// first), launches it and starts the next; finish() launches the last group and waits for the device. The
// same limits as StepGraph apply inside the step; measuring only, for `deepinfer bench --graph-layers`.
class GraphPipeline {
 public:
  GraphPipeline();
  ~GraphPipeline();
  GraphPipeline(const GraphPipeline&) = delete;
  GraphPipeline& operator=(const GraphPipeline&) = delete;
  void begin();
  void cut();
  void finish();
  int64_t instantiations() const { return instantiations_; }  // groups whose graph could not be updated
  int64_t updates() const { return updates_; }

 private:
  void end_group();
  void* stream_ = nullptr;     // cudaStream_t
  std::vector<void*> execs_;   // cudaGraphExec_t per group of the step
  size_t group_ = 0;
  int64_t instantiations_ = 0, updates_ = 0;
};

struct MemInfo {
  int64_t free = 0, total = 0;  // bytes, cudaMemGetInfo
};
MemInfo mem_info();

// Prepares `w` on the CUDA backend from a synthetic fill instead of host bytes: allocates the same
// device layout as CudaBackend::prepare (data bytes, then scale bytes) and generates the values in
// device memory. `scale` is null for weights without scales. Returns the bytes allocated.
int64_t prepare_synthetic(Weight& w, const synthetic::FillSpec& data, const synthetic::FillSpec* scale);

// Hardware ceilings, measured now (median of `iters` after warm-up).
struct Ceilings {
  double copy_tb_s = 0;      // device-to-device copy, bytes read + written
  int64_t copy_bytes = 0;    // per copy (read + written)
  double bf16_tflop_s = 0;   // cuBLASLt bf16 GEMM, fp32 accumulate
  double fp8_tflop_s = 0;    // cuBLASLt e4m3 GEMM, per-tensor scales, fp32 accumulate, bf16 out
  int64_t gemm_m = 0, gemm_n = 0, gemm_k = 0;
  std::string fp8_variant;   // how the FP8 GEMM ran ("per-tensor scales", ...)
  std::string note;          // e.g. why a GEMM ceiling is missing (cuBLASLt not found)
};
Ceilings measure_ceilings(int64_t copy_bytes, int64_t gemm_dim, int iters);

}  // namespace di::device
