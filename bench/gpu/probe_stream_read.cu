// How long does one kernel take to read a decode GEMV's weights, at best? A pure streaming read (16-byte loads,
// each CTA a contiguous slice, an XOR kept live) of 6.6 / 33.5 / 42 MB -- the sizes of wq_a, wo_a, wq_b -- in a CUDA
// graph of 20 launches with programmatic dependent launch, as the decode step replays them; copies rotate past
// the L2. Against it, fp8_gemv's and fp8_gemv_mma's times (op_bench) say how much of a GEMV's time is the read
// itself and how much its own structure. Variants: CTAs per SM, loads in flight per thread, the first loads
// issued before the PDL wait, and the read alone after a one-CTA kernel (the chain's "time after input").
//
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -cudart static -o /tmp/probe_stream bench/gpu/probe_stream_read.cu
//   /tmp/probe_stream
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdint>
#include <vector>

namespace {

#define CHECK(expr)                                                                  \
  do {                                                                               \
    cudaError_t e_ = (expr);                                                         \
    if (e_ != cudaSuccess) {                                                         \
      std::printf("%s: %s\n", #expr, cudaGetErrorString(e_));                        \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

constexpr int kThreads = 256;

// Each CTA XORs its contiguous slice of n16 16-byte words, kLoads loads in flight per thread.
template <int kLoads, bool kEarly>
__global__ void __launch_bounds__(kThreads) stream_read(const uint4* __restrict__ w, int64_t n16, unsigned* out) {
  const int64_t per = (n16 + gridDim.x - 1) / gridDim.x, b = blockIdx.x * per, e = min(n16, b + per);
  uint4 v[kLoads];
  int64_t i0 = b + threadIdx.x;
  if (kEarly) {
#pragma unroll
    for (int j = 0; j < kLoads; ++j) v[j] = i0 + j * kThreads < e ? __ldg(w + i0 + j * kThreads) : make_uint4(0, 0, 0, 0);
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  unsigned x = 0;
  if (!kEarly) {
#pragma unroll
    for (int j = 0; j < kLoads; ++j) v[j] = i0 + j * kThreads < e ? __ldg(w + i0 + j * kThreads) : make_uint4(0, 0, 0, 0);
  }
  for (; i0 < e; i0 += kLoads * kThreads) {
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      x ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
      const int64_t k = i0 + (j + kLoads) * kThreads;
      v[j] = k < e ? __ldg(w + k) : make_uint4(0, 0, 0, 0);
    }
  }
  if (x == 0x9e3779b9u) out[blockIdx.x] = x;  // never in practice: keeps the loads live
}

// One CTA of one warp: the chain's previous kernel (a norm of one row).
__global__ void tiny(unsigned* out) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if (threadIdx.x == 0) out[0] += 1;
}

template <typename... Args>
void launch_pdl(cudaStream_t s, void (*k)(Args...), unsigned grid, unsigned block, Args... args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.stream = s;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  CHECK(cudaLaunchKernelEx(&cfg, k, args...));
}

// us per launch of `body(i)` (i = 0 .. calls - 1) captured as one graph, replayed 5 times, best replay.
template <class F>
double graph_us(cudaStream_t s, int calls, F body) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < calls; ++i) body(i);
  CHECK(cudaStreamEndCapture(s, &g));
  CHECK(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  double best = 1e30;
  for (int r = 0; r < 6; ++r) {
    CHECK(cudaEventRecord(a, s));
    CHECK(cudaGraphLaunch(ge, s));
    CHECK(cudaEventRecord(b, s));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    if (r > 0 && ms * 1e3 / calls < best) best = ms * 1e3 / calls;
  }
  CHECK(cudaGraphExecDestroy(ge));
  CHECK(cudaGraphDestroy(g));
  return best;
}

}  // namespace

int main() {
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  std::printf("device: %s, %d SMs\n", prop.name, sms);
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const int64_t bytes_max = 42 << 20, copies = 6;  // 6 x 42 MB > 4 x the L2
  uint8_t* buf;
  CHECK(cudaMalloc(&buf, bytes_max * copies));
  CHECK(cudaMemset(buf, 0x5a, bytes_max * copies));
  unsigned* out;
  CHECK(cudaMalloc(&out, 1 << 20));
  constexpr int kCalls = 20;
  for (int64_t mb10 : {66, 335, 420}) {  // MB x 10
    const int64_t bytes = mb10 * (1 << 20) / 10 / 16 * 16, n16 = bytes / 16;
    const auto w = [&](int i) { return reinterpret_cast<const uint4*>(buf + (i % copies) * bytes_max); };
    std::printf("\n%.1f MB: us per launch (TB/s)\n", mb10 / 10.0);
    for (int per_sm : {2, 4, 8}) {
      const unsigned grid = per_sm * sms;
      const double l4 = graph_us(s, kCalls, [&](int i) { launch_pdl(s, stream_read<4, false>, grid, kThreads, w(i), n16, out); });
      const double l8 = graph_us(s, kCalls, [&](int i) { launch_pdl(s, stream_read<8, false>, grid, kThreads, w(i), n16, out); });
      const double e8 = graph_us(s, kCalls, [&](int i) { launch_pdl(s, stream_read<8, true>, grid, kThreads, w(i), n16, out); });
      const double warm = graph_us(s, kCalls, [&](int) { launch_pdl(s, stream_read<8, false>, grid, kThreads, w(0), n16, out); });
      // after a one-CTA kernel: (tiny + read) - tiny alone
      const double t_alone = graph_us(s, kCalls, [&](int) { launch_pdl(s, tiny, 1u, 32u, out); });
      const double chain = graph_us(s, kCalls, [&](int i) {
        launch_pdl(s, tiny, 1u, 32u, out);
        launch_pdl(s, stream_read<8, true>, grid, kThreads, w(i), n16, out);
      });
      std::printf("  %d CTAs/SM: 4 loads %.2f (%.2f), 8 loads %.2f (%.2f), 8 early %.2f (%.2f), L2-warm %.2f (%.2f); "
                  "after a 1-CTA kernel: %.2f (tiny alone %.2f)\n",
                  per_sm, l4, bytes / l4 / 1e6, l8, bytes / l8 / 1e6, e8, bytes / e8 / 1e6, warm, bytes / warm / 1e6,
                  chain - t_alone, t_alone);
    }
  }
  CHECK(cudaGetLastError());
  return 0;
}
