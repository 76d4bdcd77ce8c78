// CPU backend: the GEMMs. FP8 / FP4 weights follow the reference kernels: the activation is
// FP8-quantized per 32 columns (UE8M0 scale), each 32-wide K block is accumulated in fp32, scaled
// by activation and weight scales and added to the fp32 accumulator in K order; output bf16.
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "model/quant.h"

namespace di {
namespace {

constexpr int kBlock = 32;

// Activation FP8 quantization: values (e4m3 decoded, unscaled) and per-32 scales.
struct QuantizedActivation {
  std::vector<float> values;  // [S, K]
  std::vector<float> scales;  // [S, K / 32]
};

QuantizedActivation quantize_activation(const Tensor& x) {
  int64_t s = x.rows(), k = x.row_size();
  DI_CHECK_MSG(k % kBlock == 0, "FP8 linear needs K divisible by 32");
  QuantizedActivation qa;
  qa.values.resize(s * k);
  qa.scales.resize(s * (k / kBlock));
  parallel_for(s, [&](int64_t b, int64_t e) {
    std::vector<uint8_t> codes(k), sc(k / kBlock);
    for (int64_t r = b; r < e; ++r) {
      quant::fp8_ue8m0_quant(x.f32() + r * k, static_cast<int>(k), kBlock, codes.data(), sc.data());
      for (int64_t i = 0; i < k; ++i) qa.values[r * k + i] = quant::e4m3_to_float(codes[i]);
      for (int64_t i = 0; i < k / kBlock; ++i) qa.scales[r * (k / kBlock) + i] = quant::e8m0_to_float(sc[i]);
    }
  });
  return qa;
}

// Raw (unscaled) weight values of row `r` and the per-32 K-block weight scales of that row.
void quantized_weight_row(const Weight& w, int64_t r, float* values, float* scales) {
  int64_t k = w.cols, nb = k / kBlock;
  if (w.mode == WeightMode::kFp8Block) {
    const uint8_t* p = w.data + r * k;
    for (int64_t i = 0; i < k; ++i) values[i] = quant::e4m3_to_float(p[i]);
    const uint8_t* s = w.scale + (r / kBlock) * w.scale_cols;
    for (int64_t b = 0; b < nb; ++b) scales[b] = quant::e8m0_to_float(s[b]);
  } else {
    const uint8_t* p = w.data + r * (k / 2);
    for (int64_t i = 0; i < k / 2; ++i) {
      values[2 * i] = quant::e2m1_to_float(p[i] & 15);
      values[2 * i + 1] = quant::e2m1_to_float(p[i] >> 4);
    }
    const uint8_t* s = w.scale + r * w.scale_cols;
    for (int64_t b = 0; b < nb; ++b) scales[b] = quant::e8m0_to_float(s[b]);
  }
}

Tensor quantized_linear(CpuBackend& be, const Tensor& x, const Weight& w) {
  int64_t s = x.rows(), k = w.cols, n = w.rows, nb = k / kBlock;
  DI_CHECK(x.row_size() == k);
  QuantizedActivation qa = quantize_activation(x);
  Tensor y = be.alloc(TType::kF32, {s, n});
  parallel_for(n, [&](int64_t b, int64_t e) {
    std::vector<float> wv(k), ws(nb);
    for (int64_t o = b; o < e; ++o) {
      quantized_weight_row(w, o, wv.data(), ws.data());
      for (int64_t r = 0; r < s; ++r) {
        const float* xv = qa.values.data() + r * k;
        const float* xs = qa.scales.data() + r * nb;
        float acc = 0;
        for (int64_t kb = 0; kb < nb; ++kb) {
          float partial = cpu::dot(xv + kb * kBlock, wv.data() + kb * kBlock, kBlock);
          acc += partial * xs[kb] * ws[kb];
        }
        y.f32()[r * n + o] = quant::round_bf16(acc);
      }
    }
  });
  return y;
}

Tensor float_linear(CpuBackend& be, const Tensor& x, const Weight& w, bool bf16_out) {
  int64_t s = x.rows(), k = w.cols, n = w.rows;
  DI_CHECK(x.row_size() == k);
  Tensor y = be.alloc(TType::kF32, {s, n});
  parallel_for(n, [&](int64_t b, int64_t e) {
    std::vector<float> wv(k);
    for (int64_t o = b; o < e; ++o) {
      cpu::weight_row_f32(w, o, wv.data());
      for (int64_t r = 0; r < s; ++r) {
        // bf16 GEMMs round to bf16 (fp32 order rarely matters); fp32 GEMMs are summed exactly and
        // rounded once, so the result does not depend on a summation order (see tests/golden).
        float acc = bf16_out ? cpu::dot(x.f32() + r * k, wv.data(), k)
                             : static_cast<float>(cpu::dot_f64(x.f32() + r * k, wv.data(), k));
        y.f32()[r * n + o] = bf16_out ? quant::round_bf16(acc) : acc;
      }
    }
  });
  return y;
}

}  // namespace

Tensor CpuBackend::linear(const Tensor& x, const Weight& w) {
  switch (w.mode) {
    case WeightMode::kFp8Block:
    case WeightMode::kFp4Expert: return quantized_linear(*this, x, w);
    case WeightMode::kBf16: return float_linear(*this, x, w, true);
    case WeightMode::kF32: return float_linear(*this, x, w, false);
  }
  return {};
}

Tensor CpuBackend::grouped_linear(const Tensor& x, const Weight& w, int groups) {
  DI_CHECK(w.mode == WeightMode::kFp8Block);
  int64_t s = x.rows(), kg = w.cols, rg = w.rows / groups, nb = kg / kBlock;
  DI_CHECK(x.row_size() == groups * kg);
  Tensor y = alloc(TType::kF32, {s, w.rows});
  parallel_for(w.rows, [&](int64_t b, int64_t e) {
    std::vector<float> wv(kg), ws(nb);
    for (int64_t o = b; o < e; ++o) {
      quantized_weight_row(w, o, wv.data(), ws.data());
      for (int64_t i = 0; i < kg; ++i) wv[i] *= ws[i / kBlock];  // dequantized: exact in bf16
      int64_t g = o / rg;
      for (int64_t r = 0; r < s; ++r)
        y.f32()[r * w.rows + o] = quant::round_bf16(cpu::dot(x.f32() + r * groups * kg + g * kg, wv.data(), kg));
    }
  });
  return y;
}

}  // namespace di
