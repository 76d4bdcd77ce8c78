// CPU backend: allocation, host transfers, row copies, weight element access, embedding.
#include <cstdlib>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "model/quant.h"

namespace di {
namespace {

size_t elem_size(TType t) { return t == TType::kU8 ? 1 : 4; }

}  // namespace

Tensor CpuBackend::alloc(TType type, const std::vector<int64_t>& shape) {
  Tensor t;
  t.type = type;
  t.shape = shape;
  size_t bytes = static_cast<size_t>(t.numel()) * elem_size(type);
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
  if (!p) throw Error("out of host memory allocating " + std::to_string(bytes) + " bytes");
  t.storage = std::shared_ptr<void>(p, std::free);
  t.data = p;
  return t;
}

Tensor CpuBackend::zeros(TType type, const std::vector<int64_t>& shape) {
  Tensor t = alloc(type, shape);
  std::memset(t.data, 0, static_cast<size_t>(t.numel()) * elem_size(type));
  return t;
}

Tensor CpuBackend::from_host_f32(const std::vector<float>& v, const std::vector<int64_t>& shape) {
  Tensor t = alloc(TType::kF32, shape);
  DI_CHECK(static_cast<int64_t>(v.size()) == t.numel());
  std::memcpy(t.data, v.data(), v.size() * 4);
  return t;
}

Tensor CpuBackend::from_host_i32(const std::vector<int32_t>& v, const std::vector<int64_t>& shape) {
  Tensor t = alloc(TType::kI32, shape);
  DI_CHECK(static_cast<int64_t>(v.size()) == t.numel());
  std::memcpy(t.data, v.data(), v.size() * 4);
  return t;
}

std::vector<float> CpuBackend::to_host_f32(const Tensor& t) {
  DI_CHECK(t.type == TType::kF32);
  return std::vector<float>(t.f32(), t.f32() + t.numel());
}

std::span<const float> CpuBackend::to_host_f32_staged(const Tensor& t) {
  DI_CHECK(t.type == TType::kF32);
  staged_.assign(t.f32(), t.f32() + t.numel());
  return staged_;
}

std::vector<int32_t> CpuBackend::to_host_i32(const Tensor& t) {
  DI_CHECK(t.type == TType::kI32);
  return std::vector<int32_t>(t.i32(), t.i32() + t.numel());
}

void CpuBackend::copy_rows(Tensor& dst, int64_t d0, const Tensor& src, int64_t s0, int64_t n) {
  DI_CHECK(dst.type == src.type && dst.row_size() == src.row_size());
  DI_CHECK(d0 >= 0 && s0 >= 0 && d0 + n <= dst.rows() && s0 + n <= src.rows());
  size_t row_bytes = static_cast<size_t>(src.row_size()) * elem_size(src.type);
  std::memmove(static_cast<uint8_t*>(dst.data) + d0 * row_bytes, static_cast<uint8_t*>(src.data) + s0 * row_bytes,
               n * row_bytes);
}

Tensor CpuBackend::concat_cols(const Tensor& a, const Tensor& b) {
  DI_CHECK(a.type == b.type && a.type != TType::kU8 && a.rows() == b.rows());  // 4-byte elements
  int64_t ca = a.row_size(), cb = b.row_size();
  Tensor out = alloc(a.type, {a.rows(), ca + cb});
  for (int64_t r = 0; r < a.rows(); ++r) {
    std::memcpy(out.i32() + r * (ca + cb), a.i32() + r * ca, ca * 4);
    std::memcpy(out.i32() + r * (ca + cb) + ca, b.i32() + r * cb, cb * 4);
  }
  return out;
}

Tensor CpuBackend::embed(const Tensor& ids, const Weight& table) {
  int64_t n = ids.numel(), d = table.cols;
  Tensor out = alloc(TType::kF32, {n, d});
  for (int64_t i = 0; i < n; ++i) {
    int32_t id = ids.i32()[i];
    DI_CHECK(id >= 0 && id < table.rows);
    cpu::weight_row_f32(table, id, out.f32() + i * d);
  }
  return out;
}

namespace cpu {

void weight_row_f32(const Weight& w, int64_t r, float* out) {
  switch (w.dtype) {
    case DType::kBF16: {
      const uint16_t* p = reinterpret_cast<const uint16_t*>(w.data) + r * w.cols;
      for (int64_t i = 0; i < w.cols; ++i) out[i] = quant::bf16_to_float(p[i]);
      return;
    }
    case DType::kF16: {
      const uint16_t* p = reinterpret_cast<const uint16_t*>(w.data) + r * w.cols;
      for (int64_t i = 0; i < w.cols; ++i) out[i] = quant::f16_to_float(p[i]);
      return;
    }
    case DType::kF32: {
      std::memcpy(out, reinterpret_cast<const float*>(w.data) + r * w.cols, w.cols * 4);
      return;
    }
    default:
      DI_CHECK_MSG(false, "weight_row_f32: unsupported dtype");
  }
}

float weight_at(const Weight& w, int64_t i) {
  switch (w.dtype) {
    case DType::kBF16: return quant::bf16_to_float(reinterpret_cast<const uint16_t*>(w.data)[i]);
    case DType::kF16: return quant::f16_to_float(reinterpret_cast<const uint16_t*>(w.data)[i]);
    case DType::kF32: return reinterpret_cast<const float*>(w.data)[i];
    default: DI_CHECK_MSG(false, "weight_at: unsupported dtype");
  }
  return 0;
}

float dot(const float* a, const float* b, int64_t n) {
  // Eight independent partial sums: vectorizes without -ffast-math.
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) s[j] += a[i + j] * b[i + j];
  float tail = 0;
  for (; i < n; ++i) tail += a[i] * b[i];
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7])) + tail;
}

float sum_squares(const float* x, int64_t n) {
  float c[kSumSquaresChains] = {};
  int64_t i = 0;
  for (; i + kSumSquaresChains <= n; i += kSumSquaresChains)
    for (int j = 0; j < kSumSquaresChains; ++j) c[j] += x[i + j] * x[i + j];
  for (int j = 0; i + j < n; ++j) c[j] += x[i + j] * x[i + j];
  for (int h = kSumSquaresChains / 2; h > 0; h /= 2)
    for (int j = 0; j < h; ++j) c[j] += c[j + h];
  return c[0];
}

double dot_f64(const float* a, const float* b, int64_t n) {
  // fp32 products are exact in double; 4 partial sums keep the loop vectorizable. The result is
  // within an ulp of the exact sum for any order, so rounding it to fp32 once is order-independent.
  double s[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int j = 0; j < 4; ++j) s[j] += static_cast<double>(a[i + j]) * b[i + j];
  for (; i < n; ++i) s[0] += static_cast<double>(a[i]) * b[i];
  return (s[0] + s[1]) + (s[2] + s[3]);
}

}  // namespace cpu
}  // namespace di
