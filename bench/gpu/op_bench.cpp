// GPU op benchmark: the decode-shaped GEMMs of V4.1-Flash on the CUDA backend (FP8 32x32-block
// dense, MXFP4 experts) and the grouped MoE experts, at batch 1..64, against the device-to-device
// copy ceiling measured in the same run. Prints a table (time, bytes, memory floor, TB/s, time over
// the floor) and one JSON object per measurement.
//
// Method: each measurement enqueues `iters` calls behind a host-side stall of the stream (so the
// host's launch cost is hidden, as in a CUDA-graph replay) and times them with events; inputs rotate
// over enough weight copies that the bytes of one pass exceed 4x the L2 (no cache replays). With
// --l2-warm the linears read one copy every call instead: what they take when their weights sit in L2
// (as a prefetch ahead of them would leave them), reported as op `linear_l2`.
// usage: op_bench [--iters N] [--moe-experts E] [--fast-fp4-gemm] [--l2-warm]
//        (--fast-fp4-gemm: Backend::set_fast_fp4_gemm)
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"

namespace {

#define BENCH_CUDA(expr)                                                                  \
  do {                                                                                    \
    cudaError_t e_ = (expr);                                                              \
    if (e_ != cudaSuccess) {                                                              \
      std::fprintf(stderr, "%s failed: %s\n", #expr, cudaGetErrorString(e_));            \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

struct OwnedWeight {
  std::vector<uint8_t> data, scale;
  di::Weight w;
};

// Random FP8 (E4M3 codes without NaN, scales 2^-6..2^-3) or FP4 (random nibbles) weight.
OwnedWeight make_weight(di::WeightMode mode, int64_t rows, int64_t cols, std::mt19937_64& rng) {
  OwnedWeight o;
  const bool fp4 = mode == di::WeightMode::kFp4Expert;
  o.data.resize(fp4 ? rows * cols / 2 : rows * cols);
  for (size_t i = 0; i < o.data.size(); i += 8) {
    uint64_t r = rng();
    for (size_t j = 0; j < 8 && i + j < o.data.size(); ++j, r >>= 8) {
      uint8_t b = static_cast<uint8_t>(r);
      if (!fp4 && (b & 0x7f) == 0x7f) b ^= 1;
      o.data[i + j] = b;
    }
  }
  const int64_t srows = fp4 ? rows : (rows + 31) / 32, scols = (cols + 31) / 32;
  o.scale.resize(srows * scols);
  for (auto& s : o.scale) s = static_cast<uint8_t>(121 + rng() % 4);
  o.w.mode = mode;
  o.w.dtype = fp4 ? di::DType::kI8 : di::DType::kF8E4M3;
  o.w.rows = rows;
  o.w.cols = cols;
  o.w.data = o.data.data();
  o.w.scale = o.scale.data();
  o.w.scale_rows = srows;
  o.w.scale_cols = scols;
  return o;
}

int64_t weight_bytes(const OwnedWeight& o) { return static_cast<int64_t>(o.data.size() + o.scale.size()); }

// Stalls the default stream for `ms` on a host thread, so that work enqueued meanwhile runs back to back.
void stall_stream(int ms) {
  static int stall_ms;
  stall_ms = ms;
  BENCH_CUDA(cudaLaunchHostFunc(
      0, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(stall_ms)); }, nullptr));
}

// Seconds per call of fn(i), i = 0 .. iters-1, enqueued behind a stall; the median of `reps` runs.
template <class Fn>
double time_calls(int iters, int reps, const Fn& fn) {
  cudaEvent_t a, b;
  BENCH_CUDA(cudaEventCreate(&a));
  BENCH_CUDA(cudaEventCreate(&b));
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    BENCH_CUDA(cudaDeviceSynchronize());
    stall_stream(30);
    BENCH_CUDA(cudaEventRecord(a, 0));
    for (int i = 0; i < iters; ++i) fn(i);
    BENCH_CUDA(cudaEventRecord(b, 0));
    BENCH_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    BENCH_CUDA(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1e-3 / iters);
  }
  BENCH_CUDA(cudaEventDestroy(a));
  BENCH_CUDA(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void report(const char* op, const std::string& name, int64_t batch, double sec, double bytes, double copy_tbs) {
  const double tbs = bytes / sec / 1e12, floor_us = bytes / (copy_tbs * 1e12) * 1e6;
  std::printf("%-12s %-12s %6lld %9.2f %9.2f %13.0f %7.3f %6.0f%% %6.2fx\n", op, name.c_str(),
              static_cast<long long>(batch), sec * 1e6, floor_us, bytes, tbs, 100 * tbs / copy_tbs,
              sec * 1e6 / floor_us);
  std::printf("{\"op\": \"%s\", \"weight\": \"%s\", \"batch\": %lld, \"us\": %.2f, \"floor_us\": %.2f, \"bytes\": %.0f, "
              "\"tb_s\": %.3f}\n",
              op, name.c_str(), static_cast<long long>(batch), sec * 1e6, floor_us, bytes, tbs);
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 20, moe_experts = 128;
  bool fast_fp4 = false, l2_warm = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--fast-fp4-gemm") fast_fp4 = true;
    if (a == "--l2-warm") l2_warm = true;
    if (i + 1 < argc && a == "--iters") iters = std::atoi(argv[i + 1]);
    if (i + 1 < argc && a == "--moe-experts") moe_experts = std::atoi(argv[i + 1]);
  }
  std::unique_ptr<di::Backend> be = di::make_backend("cuda");
  be->set_fast_fp4_gemm(fast_fp4);
  cudaDeviceProp prop{};
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
  const int64_t rotate_bytes = 4LL * prop.l2CacheSize;

  // ceiling: device-to-device copy of 2 GiB (bytes read + written)
  const int64_t copy_rows = 2048, row = 1 << 20;
  di::Tensor a = be->zeros(di::TType::kU8, {copy_rows, row}), b = be->zeros(di::TType::kU8, {copy_rows, row});
  const double copy_sec = time_calls(1, 5, [&](int) { be->copy_rows(b, 0, a, 0, copy_rows); });
  const double copy_tbs = 2.0 * copy_rows * row / copy_sec / 1e12;
  std::printf("ceiling: device copy %.2f TB/s (read + write)\n", copy_tbs);
  std::printf("{\"op\": \"device_copy\", \"bytes\": %lld, \"tb_s\": %.3f}\n", 2LL * copy_rows * row, copy_tbs);
  a = di::Tensor();
  b = di::Tensor();

  struct Shape {
    const char* name;
    di::WeightMode mode;
    int64_t out, in;
    int groups = 1;  // > 1: Backend::grouped_linear (wo_a: 8 groups of [1024, 4096] over x [S, 8 x 4096])
  };
  const Shape shapes[] = {
      {"attn.wq_a", di::WeightMode::kFp8Block, 1280, 5120},   {"attn.wq_b", di::WeightMode::kFp8Block, 32768, 1280},
      {"attn.wo_b", di::WeightMode::kFp8Block, 5120, 8192},   {"shared.w1", di::WeightMode::kFp8Block, 2304, 5120},
      {"expert.w1", di::WeightMode::kFp4Expert, 2304, 5120},  {"expert.w2", di::WeightMode::kFp4Expert, 5120, 2304},
      {"attn.wo_a", di::WeightMode::kFp8Block, 8192, 4096, 8},
  };
  const int64_t batches[] = {1, 2, 4, 8, 16, 32, 64};
  std::mt19937_64 rng(12345);
  std::printf("\nbytes = weights + scales + fp32 activations in and out; floor = bytes / copy ceiling\n");
  std::printf("%-12s %-12s %6s %9s %9s %13s %7s %7s %7s\n", "op", "weight", "batch", "time_us", "floor_us", "bytes",
              "TB/s", "of_copy", "x_floor");
  for (const Shape& s : shapes) {
    OwnedWeight ow = make_weight(s.mode, s.out, s.in, rng);
    const int copies =
        l2_warm ? 1 : static_cast<int>(std::max<int64_t>(1, (rotate_bytes + weight_bytes(ow) - 1) / weight_bytes(ow)));
    std::vector<di::Weight> ws(copies, ow.w);
    for (di::Weight& w : ws) be->prepare(w);
    for (int64_t batch : batches) {
      const int64_t in = s.in * s.groups;
      std::vector<float> x(batch * in);
      // bf16-valued for the grouped projection, as the attention's output is (its kernel skips the lo MMAs then)
      for (auto& v : x)
        v = s.groups > 1 ? static_cast<float>(static_cast<int>(rng() % 255) - 127) / 64.0f
                         : static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 512.0f;
      di::Tensor xt = be->from_host_f32(x, {batch, in});
      const auto call = [&](int i) {
        if (s.groups > 1) be->grouped_linear(xt, ws[i % copies], s.groups);
        else be->linear(xt, ws[i % copies]);
      };
      for (int i = 0; i < 3; ++i) call(i);  // warm-up: workspace sizes, module load
      const double sec = time_calls(iters, 3, call);
      const double bytes = static_cast<double>(weight_bytes(ow)) + batch * (in + s.out) * 4.0;
      report(l2_warm ? "linear_l2" : "linear", s.name, batch, sec, bytes, copy_tbs);
    }
  }

  // Grouped MoE experts (V4.1-Flash shapes: D 5120, inter 2304, top-6; `moe_experts` random MXFP4
  // experts, one copy each; routing uniform at random) + the FP8 shared expert, through moe_experts.
  // bytes = the weights of the distinct experts routed to + the shared expert + activations.
  {
    const int64_t d = 5120, inter = 2304, E = moe_experts;
    const int k = 6;
    OwnedWeight e1 = make_weight(di::WeightMode::kFp4Expert, inter, d, rng);
    OwnedWeight e2 = make_weight(di::WeightMode::kFp4Expert, d, inter, rng);
    std::vector<di::ExpertWeights> experts(E);
    for (auto& ex : experts) {
      ex.w1 = e1.w;
      ex.w3 = e1.w;
      ex.w2 = e2.w;
      be->prepare(ex.w1);
      be->prepare(ex.w3);
      be->prepare(ex.w2);
    }
    OwnedWeight s1 = make_weight(di::WeightMode::kFp8Block, inter, d, rng);
    OwnedWeight s2 = make_weight(di::WeightMode::kFp8Block, d, inter, rng);
    di::ExpertWeights shared{s1.w, s2.w, s1.w};
    be->prepare(shared.w1);
    be->prepare(shared.w2);
    be->prepare(shared.w3);
    const double expert_bytes = 2.0 * weight_bytes(e1) + weight_bytes(e2);
    const double shared_bytes = 2.0 * weight_bytes(s1) + weight_bytes(s2);
    std::printf("\nmoe_experts: %lld MXFP4 experts of %.1f MB + FP8 shared expert %.1f MB, top-%d uniform routing\n",
                static_cast<long long>(E), expert_bytes / 1e6, shared_bytes / 1e6, k);
    for (int64_t batch : batches) {
      const int routes = 8;  // different routings, cycled
      std::vector<di::MoeRoute> rs;
      double distinct = 0;
      for (int r = 0; r < routes; ++r) {
        std::vector<int32_t> ids(batch * k);
        std::vector<float> w(batch * k, 0.3f);
        std::set<int32_t> used;
        for (int64_t t = 0; t < batch; ++t) {
          std::vector<int32_t> perm(E);
          for (int64_t e = 0; e < E; ++e) perm[e] = static_cast<int32_t>(e);
          for (int j = 0; j < k; ++j) {
            std::swap(perm[j], perm[j + rng() % (E - j)]);
            ids[t * k + j] = perm[j];
            used.insert(perm[j]);
          }
        }
        distinct += static_cast<double>(used.size()) / routes;
        rs.push_back({be->from_host_f32(w, {batch, k}), be->from_host_i32(ids, {batch, k})});
      }
      std::vector<float> x(batch * d);
      for (auto& v : x) v = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 2048.0f;
      di::Tensor xt = be->from_host_f32(x, {batch, d});
      for (int i = 0; i < 3; ++i) be->moe_experts(xt, rs[i % routes], experts, shared, 7.0f);
      const double sec = time_calls(iters, 3, [&](int i) { be->moe_experts(xt, rs[i % routes], experts, shared, 7.0f); });
      const double bytes = distinct * expert_bytes + shared_bytes + batch * d * 8.0;
      report("moe_experts", std::to_string(static_cast<int>(distinct + 0.5)) + "_active", batch, sec, bytes, copy_tbs);
    }
  }
  return 0;
}
