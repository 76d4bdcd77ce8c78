// GPU op benchmark: the decode-shaped GEMMs of V4.1-Flash on the CUDA backend (FP8 32x32-block
// dense, MXFP4 experts) at batch 1 / 8 / 64, against the device-to-device copy ceiling measured in
// the same run. Prints a table and one JSON object per measurement.
// usage: op_bench [--iters N]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct OwnedWeight {
  std::vector<uint8_t> data, scale;
  di::Weight w;
};

// Random FP8 (e4m3 codes without NaN, scales 2^-6..2^-3) or FP4 (random nibbles) weight.
OwnedWeight make_weight(di::WeightMode mode, int64_t rows, int64_t cols, std::mt19937& rng) {
  OwnedWeight o;
  bool fp4 = mode == di::WeightMode::kFp4Expert;
  o.data.resize(fp4 ? rows * cols / 2 : rows * cols);
  for (auto& b : o.data) {
    b = static_cast<uint8_t>(rng());
    if (!fp4 && (b & 0x7f) == 0x7f) b ^= 1;
  }
  int64_t srows = fp4 ? rows : (rows + 31) / 32, scols = (cols + 31) / 32;
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

}  // namespace

int main(int argc, char** argv) {
  int iters = 20;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--iters") iters = std::atoi(argv[i + 1]);
  std::unique_ptr<di::Backend> be = di::make_backend("cuda");
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);

  // ceiling: device-to-device copy of 2 GiB (bytes read + written)
  const int64_t copy_rows = 2048, row = 1 << 20;
  di::Tensor a = be->zeros(di::TType::kU8, {copy_rows, row}), b = be->zeros(di::TType::kU8, {copy_rows, row});
  std::vector<double> ts;
  for (int i = 0; i < 3 + iters / 2; ++i) {
    cudaDeviceSynchronize();
    auto t0 = Clock::now();
    be->copy_rows(b, 0, a, 0, copy_rows);
    cudaDeviceSynchronize();
    if (i >= 3) ts.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  double copy_tbs = 2.0 * copy_rows * row / median(ts) / 1e12;
  std::printf("ceiling: device copy %.2f TB/s (read + write)\n", copy_tbs);
  std::printf("{\"op\": \"device_copy\", \"bytes\": %lld, \"tb_s\": %.3f}\n", 2LL * copy_rows * row, copy_tbs);

  struct Shape {
    const char* name;
    di::WeightMode mode;
    int64_t out, in;
  };
  const Shape shapes[] = {
      {"attn.wq_a", di::WeightMode::kFp8Block, 1280, 5120},   {"attn.wq_b", di::WeightMode::kFp8Block, 32768, 1280},
      {"attn.wo_b", di::WeightMode::kFp8Block, 5120, 8192},   {"shared.w1", di::WeightMode::kFp8Block, 2304, 5120},
      {"expert.w1", di::WeightMode::kFp4Expert, 2304, 5120},  {"expert.w2", di::WeightMode::kFp4Expert, 5120, 2304},
  };
  std::mt19937 rng(12345);
  std::printf("\n%-10s %6s %10s %12s %10s %8s\n", "weight", "batch", "time_us", "bytes", "TB/s", "of_copy");
  for (const Shape& s : shapes) {
    OwnedWeight ow = make_weight(s.mode, s.out, s.in, rng);
    be->prepare(ow.w);
    for (int64_t batch : {1, 8, 64}) {
      std::vector<float> x(batch * s.in);
      for (auto& v : x) v = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 512.0f;
      di::Tensor xt = be->from_host_f32(x, {batch, s.in});
      std::vector<double> t;
      for (int i = 0; i < 3 + iters; ++i) {
        cudaDeviceSynchronize();
        auto t0 = Clock::now();
        di::Tensor y = be->linear(xt, ow.w);
        cudaDeviceSynchronize();
        if (i >= 3) t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      }
      double sec = median(t);
      double bytes = static_cast<double>(ow.data.size() + ow.scale.size()) + batch * (s.in + s.out) * 4.0;
      double tbs = bytes / sec / 1e12;
      std::printf("%-10s %6lld %10.1f %12.0f %10.3f %7.0f%%\n", s.name, static_cast<long long>(batch), sec * 1e6, bytes,
                  tbs, 100 * tbs / copy_tbs);
      std::printf("{\"op\": \"linear\", \"weight\": \"%s\", \"batch\": %lld, \"us\": %.2f, \"bytes\": %.0f, \"tb_s\": %.3f}\n",
                  s.name, static_cast<long long>(batch), sec * 1e6, bytes, tbs);
    }
  }
  return 0;
}
