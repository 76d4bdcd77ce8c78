// What does the host pay to issue one kernel, and the stream events around the side stream? A batch-1
// decode layer is ~50 launches (both streams), so this per-launch cost bounds how fast the host can issue a
// layer, whatever the kernels take (bench/RESULTS.md, thirty-first session: 3.0-3.2 us per cudaLaunchKernelEx
// with the PDL attribute on an H100 host, 3.8-4.3 us per <<<>>>, 0.27 us per event record, 0.4 us per record
// and stream wait).
//
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O2 -cudart static -o /tmp/probe bench/gpu/probe_launch_cost.cu && /tmp/probe
//
// Prints the host's time per call, averaged over 400 calls in a row (fewer than the launch queue holds, so
// the host never waits for the device), three times.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>

namespace {

struct Args {  // a parameter block of the size of a typical GEMV's
  const void* p[8];
  long n[4];
};

__global__ void empty_kernel(Args a) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if (a.n[0] == -12345) *static_cast<int*>(const_cast<void*>(a.p[0])) = 1;  // never: keeps the parameters live
}

template <class F>
double us_per_call(int n, F f) {
  cudaDeviceSynchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) f();
  const auto t1 = std::chrono::steady_clock::now();
  cudaDeviceSynchronize();
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / n;
}

void launch_pdl(cudaStream_t stream, unsigned grid, size_t smem, const Args& a) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = 128;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  cudaLaunchKernelEx(&cfg, empty_kernel, a);
}

}  // namespace

int main() {
  cudaStream_t side;
  cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
  cudaEvent_t e;
  cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  const Args a{};
  constexpr int kCalls = 400;
  for (int rep = 0; rep < 3; ++rep) {
    const double plain = us_per_call(kCalls, [&] { empty_kernel<<<20, 128>>>(a); });
    const double pdl = us_per_call(kCalls, [&] { launch_pdl(nullptr, 20, 0, a); });
    const double pdl_big = us_per_call(kCalls, [&] { launch_pdl(nullptr, 792, 5120, a); });
    const double on_side = us_per_call(kCalls, [&] { launch_pdl(side, 20, 0, a); });
    const double record = us_per_call(kCalls, [&] { cudaEventRecord(e, nullptr); });
    const double wait = us_per_call(kCalls, [&] {
      cudaEventRecord(e, side);
      cudaStreamWaitEvent(nullptr, e, 0);
    });
    std::printf("us per call: <<<>>> %.2f, cudaLaunchKernelEx + PDL %.2f (792 CTAs with smem %.2f, side stream %.2f), "
                "event record %.2f, record + stream wait %.2f\n",
                plain, pdl, pdl_big, on_side, record, wait);
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) std::printf("CUDA error: %s\n", cudaGetErrorString(err));
  return err == cudaSuccess ? 0 : 1;
}
