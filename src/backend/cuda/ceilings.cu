// Device facts for tools (device_tools.h): name, memory, synchronisation, and the ceilings a
// benchmark compares against, measured in the same process: a large device-to-device copy and large
// bf16 and FP8 (e4m3, per-tensor scales) GEMMs through cuBLASLt.
//
// cuBLASLt is only a measuring stick here, so it is loaded at run time (dlopen) rather than linked:
// the portable binaries keep no link dependency on it, and a machine without it still runs the
// benchmark (the GEMM ceilings are then reported as missing, with the reason).
#include <cublasLt.h>
#include <cuda_profiler_api.h>

#include <algorithm>
#include <vector>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/dynamic_library.h"
#include "backend/cuda/side_stream.cuh"
#include "backend/device_tools.h"

namespace di::device {

bool available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

std::string name() {
  if (!available()) return "";
  cudaDeviceProp prop{};
  DI_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  return prop.name;
}

void synchronize() { DI_CUDA_CHECK(cudaDeviceSynchronize()); }

void profiler_range(bool start) { DI_CUDA_CHECK(start ? cudaProfilerStart() : cudaProfilerStop()); }

namespace {
__global__ void hold_kernel(uint64_t ns) {
  uint64_t t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}
}  // namespace

void hold(double ms) {
  hold_kernel<<<1, 1, 0, cuda::current_stream()>>>(static_cast<uint64_t>(ms * 1e6));
  DI_CUDA_LAUNCH_CHECK();
}

StreamMarks::~StreamMarks() {
  for (void* e : events_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
}

void StreamMarks::record() {
  cudaEvent_t e = nullptr;
  DI_CUDA_CHECK(cudaEventCreate(&e));
  events_.push_back(e);
  DI_CUDA_CHECK(cudaEventRecord(e, cuda::current_stream()));
}

std::vector<double> StreamMarks::seconds_between() {
  std::vector<double> out;
  if (events_.empty()) return out;
  DI_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(events_.back())));
  for (size_t i = 1; i < events_.size(); ++i) {
    float ms = 0;
    DI_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(events_[i - 1]), static_cast<cudaEvent_t>(events_[i])));
    out.push_back(ms * 1e-3);
  }
  for (void* e : events_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
  events_.clear();
  return out;
}

MemInfo mem_info() {
  size_t free = 0, total = 0;
  DI_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return {static_cast<int64_t>(free), static_cast<int64_t>(total)};
}

namespace {

struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(size_t bytes) {
    if (cudaMalloc(&p, bytes) != cudaSuccess)
      throw Error("GPU out of memory allocating " + std::to_string(bytes) + " bytes for a ceiling measurement");
  }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

__global__ void random_fill_kernel(uint8_t* dst, int64_t n_elems, synthetic::FillSpec spec) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n_elems; i += stride)
    synthetic::fill_element(spec, static_cast<uint64_t>(i), dst + i * spec.elem_bytes);
}

// Never time on zeros (they run faster than real data): random bf16 in [-1, 1) or random e4m3 codes.
void random_fill(void* dst, int64_t n_elems, bool fp8, uint64_t seed) {
  synthetic::FillSpec s;
  s.seed = seed;
  if (fp8) {
    s.kind = synthetic::FillKind::kFp8Code;
    s.elem_bytes = 1;
  } else {
    s.kind = synthetic::FillKind::kUniform;
    s.elem_bytes = 2;
    s.lo = -1;
    s.hi = 1;
  }
  random_fill_kernel<<<132 * 16, 256>>>(static_cast<uint8_t*>(dst), n_elems, s);
  DI_CUDA_LAUNCH_CHECK();
}

// Median milliseconds of `iters` runs of `fn` after `warmup` runs, timed with events on stream 0.
template <typename F>
double median_ms(F&& fn, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) fn();
  cudaEvent_t a, b;
  DI_CUDA_CHECK(cudaEventCreate(&a));
  DI_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int i = 0; i < iters; ++i) {
    DI_CUDA_CHECK(cudaEventRecord(a, 0));
    fn();
    DI_CUDA_CHECK(cudaEventRecord(b, 0));
    DI_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    DI_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// The few cuBLASLt entry points we use, resolved from the shared library.
struct Lt {
  void* lib = nullptr;
  decltype(&cublasLtCreate) create = nullptr;
  decltype(&cublasLtDestroy) destroy = nullptr;
  decltype(&cublasLtMatmulDescCreate) desc_create = nullptr;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) layout_create = nullptr;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) pref_create = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
  decltype(&cublasLtMatmul) matmul = nullptr;

  std::string load() {
    const std::string soname = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
    lib = cuda::open_first_library({soname, "libcublasLt.so"});
    if (!lib) return "cuBLASLt not found (" + soname + " not on the library path)";
    bool ok = true;
    auto sym = [&](auto& fp, const char* s) { ok = cuda::load_symbol(lib, fp, s) && ok; };
    sym(create, "cublasLtCreate");
    sym(destroy, "cublasLtDestroy");
    sym(desc_create, "cublasLtMatmulDescCreate");
    sym(desc_destroy, "cublasLtMatmulDescDestroy");
    sym(desc_set, "cublasLtMatmulDescSetAttribute");
    sym(layout_create, "cublasLtMatrixLayoutCreate");
    sym(layout_destroy, "cublasLtMatrixLayoutDestroy");
    sym(pref_create, "cublasLtMatmulPreferenceCreate");
    sym(pref_destroy, "cublasLtMatmulPreferenceDestroy");
    sym(pref_set, "cublasLtMatmulPreferenceSetAttribute");
    sym(heuristic, "cublasLtMatmulAlgoGetHeuristic");
    sym(matmul, "cublasLtMatmul");
    return ok ? "" : "cuBLASLt lacks an expected entry point";
  }
};

// One square GEMM D[m, n] = A^T B (column-major "TN", the layout FP8 needs on Hopper) through
// cuBLASLt, bf16 output into a separate C/D pair; returns TFLOP/s, or 0 with `why` set when cuBLASLt
// declines. FP8 is tried with per-tensor scale pointers (as torch._scaled_mm), then without them,
// then with fast accumulation; `how` names the variant that ran.
double lt_gemm_tflops(Lt& lt, int64_t dim, bool fp8, int iters, std::string& why, std::string& how) {
  const int64_t m = dim, n = dim, k = dim;
  const cudaDataType_t in_type = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
  const size_t in_size = fp8 ? 1 : 2;
  DeviceBuffer a(m * k * in_size), b(k * n * in_size), cbuf(m * n * 2), d(m * n * 2), scales(2 * sizeof(float));
  const size_t ws_bytes = 64u << 20;
  DeviceBuffer ws(ws_bytes);
  random_fill(a.p, m * k, fp8, 11);
  random_fill(b.p, k * n, fp8, 12);
  random_fill(cbuf.p, m * n, false, 13);
  const float ones[2] = {1.0f, 1.0f};
  DI_CUDA_CHECK(cudaMemcpy(scales.p, ones, sizeof ones, cudaMemcpyHostToDevice));

  cublasLtHandle_t h = nullptr;
  cublasStatus_t st = lt.create(&h);
  if (st != CUBLAS_STATUS_SUCCESS) {
    why = "cublasLtCreate returned status " + std::to_string(static_cast<int>(st));
    return 0;
  }
  double result = 0;
  struct Variant {
    const char* name;
    bool scales, fast_accum;
  };
  const std::vector<Variant> variants = fp8 ? std::vector<Variant>{{"per-tensor scales", true, false},
                                                                    {"no scales", false, false},
                                                                    {"no scales, fast accumulation", false, true}}
                                             : std::vector<Variant>{{"", false, false}};
  for (const Variant& v : variants) {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
    cublasLtMatmulPreference_t pref = nullptr;
    auto fail = [&](const char* what, cublasStatus_t s2) {
      why += std::string(why.empty() ? "" : "; ") + (fp8 ? "fp8" : "bf16") + " GEMM" + (v.name[0] ? " (" : "") + v.name +
             (v.name[0] ? ")" : "") + ": " + what + " returned status " + std::to_string(static_cast<int>(s2));
    };
    do {
      if ((st = lt.desc_create(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F)) != CUBLAS_STATUS_SUCCESS) {
        fail("MatmulDescCreate", st);
        break;
      }
      const cublasOperation_t opT = CUBLAS_OP_T, opN = CUBLAS_OP_N;
      lt.desc_set(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opT, sizeof opT);
      lt.desc_set(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opN, sizeof opN);
      if (v.scales) {
        const float* sa = static_cast<const float*>(scales.p);
        const float* sb = sa + 1;
        lt.desc_set(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa);
        lt.desc_set(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb);
      }
      if (v.fast_accum) {
        const int8_t on = 1;
        lt.desc_set(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &on, sizeof on);
      }
      lt.layout_create(&la, in_type, k, m, k);
      lt.layout_create(&lb, in_type, k, n, k);
      lt.layout_create(&lc, CUDA_R_16BF, m, n, m);
      lt.pref_create(&pref);
      lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes);
      cublasLtMatmulHeuristicResult_t heur{};
      int found = 0;
      st = lt.heuristic(h, desc, la, lb, lc, lc, pref, 1, &heur, &found);
      if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
        fail("AlgoGetHeuristic (no algorithm)", st);
        break;
      }
      const float alpha = 1.0f, beta = 0.0f;
      cublasStatus_t run_st = CUBLAS_STATUS_SUCCESS;
      auto run = [&] {
        cublasStatus_t s2 = lt.matmul(h, desc, &alpha, a.p, la, b.p, lb, &beta, cbuf.p, lc, d.p, lc, &heur.algo, ws.p,
                                      ws_bytes, 0);
        if (s2 != CUBLAS_STATUS_SUCCESS) run_st = s2;
      };
      run();
      DI_CUDA_CHECK(cudaDeviceSynchronize());
      if (run_st != CUBLAS_STATUS_SUCCESS) {
        fail("cublasLtMatmul", run_st);
        break;
      }
      const double ms = median_ms(run, 3, iters);
      if (run_st != CUBLAS_STATUS_SUCCESS) {
        fail("cublasLtMatmul", run_st);
        break;
      }
      result = 2.0 * static_cast<double>(m) * n * k / (ms * 1e-3) / 1e12;
      how = v.name;
    } while (false);
    if (pref) lt.pref_destroy(pref);
    if (la) lt.layout_destroy(la);
    if (lb) lt.layout_destroy(lb);
    if (lc) lt.layout_destroy(lc);
    if (desc) lt.desc_destroy(desc);
    cudaGetLastError();  // a declined variant leaves no sticky error behind
    if (result > 0) break;
  }
  lt.destroy(h);
  DI_CUDA_CHECK(cudaDeviceSynchronize());
  if (result > 0) why.clear();
  return result;
}

}  // namespace

Ceilings measure_ceilings(int64_t copy_bytes, int64_t gemm_dim, int iters) {
  Ceilings c;
  {  // device-to-device copy: half the bytes read, half written
    const size_t half = static_cast<size_t>(copy_bytes / 2);
    DeviceBuffer src(half), dst(half);
    random_fill(src.p, static_cast<int64_t>(half / 2), false, 7);
    const double ms = median_ms([&] { DI_CUDA_CHECK(cudaMemcpyAsync(dst.p, src.p, half, cudaMemcpyDeviceToDevice, 0)); },
                                3, iters);
    c.copy_bytes = static_cast<int64_t>(2 * half);
    c.copy_tb_s = static_cast<double>(c.copy_bytes) / (ms * 1e-3) / 1e12;
  }
  c.gemm_m = c.gemm_n = c.gemm_k = gemm_dim;
  Lt lt;
  std::string why = lt.load();
  if (why.empty()) {
    std::string w1, w2, how1, how2;
    c.bf16_tflop_s = lt_gemm_tflops(lt, gemm_dim, false, iters, w1, how1);
    c.fp8_tflop_s = lt_gemm_tflops(lt, gemm_dim, true, iters, w2, how2);
    why = w1 + (w1.empty() || w2.empty() ? "" : "; ") + w2;
    if (c.fp8_tflop_s > 0) c.fp8_variant = how2;
  }
  c.note = why;
  return c;
}

}  // namespace di::device
