// Tensors and weights as the backends see them. A Tensor is a dense row-major array owned by the
// backend that allocated it (host memory for the CPU backend, device memory for CUDA). Activations
// are F32 arrays; where the reference keeps bf16, ops round their outputs to bf16 values, so the CPU
// backend reproduces the reference's rounding points while computing in fp32.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model/safetensors.h"

namespace di {

enum class TType : uint8_t { kF32, kI32, kU8 };

struct Tensor {
  TType type = TType::kF32;
  std::vector<int64_t> shape;
  std::shared_ptr<void> storage;  // keeps the allocation alive
  void* data = nullptr;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  int64_t dim(int i) const { return shape.at(static_cast<size_t>(i < 0 ? i + static_cast<int>(shape.size()) : i)); }
  int64_t rows() const { return shape.empty() ? 0 : shape[0]; }
  int64_t row_size() const {  // product of the trailing dims
    int64_t n = 1;
    for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
    return shape.empty() ? 0 : n;
  }
  bool empty() const { return data == nullptr; }
  // Bytes of the elements its shape holds (0 for a default-constructed tensor).
  int64_t bytes() const { return shape.empty() ? 0 : numel() * (type == TType::kU8 ? 1 : 4); }
  float* f32() const { return static_cast<float*>(data); }
  int32_t* i32() const { return static_cast<int32_t*>(data); }
  uint8_t* u8() const { return static_cast<uint8_t*>(data); }
};

// Rows [r0, r0 + n) of t without a copy: the view shares t's storage (keeps it alive), so writing
// through either changes both. For read-only operands; copy first what an op will modify in place.
inline Tensor row_view(const Tensor& t, int64_t r0, int64_t n) {
  if (r0 == 0 && n == t.rows()) return t;
  Tensor v = t;
  v.shape[0] = n;
  v.data = static_cast<uint8_t*>(t.data) + r0 * (t.bytes() / (t.rows() ? t.rows() : 1));
  return v;
}

// How a weight is multiplied. Fixed per tensor by the reference's module definitions.
enum class WeightMode : uint8_t {
  kFp8Block,   // F8_E4M3 [out, in] + E8M0 [ceil(out/32), ceil(in/32)]; activation FP8-quantized per 32
  kFp4Expert,  // I8 [out, in/2] (E2M1 pairs, even column low nibble) + E8M0 [out, in/32]; activation FP8
  kBf16,       // BF16 [out, in], bf16 GEMM (fp32 accumulate, bf16 output)
  kF32,        // BF16 or F32 on disk, promoted: fp32 GEMM on the input as given, fp32 output
};

// "fp8" | "fp4" | "bf16" | "f32": for reports and test messages.
inline const char* weight_mode_name(WeightMode m) {
  switch (m) {
    case WeightMode::kFp8Block: return "fp8";
    case WeightMode::kFp4Expert: return "fp4";
    case WeightMode::kBf16: return "bf16";
    case WeightMode::kF32: return "f32";
  }
  return "?";
}

struct Weight {
  WeightMode mode = WeightMode::kBf16;
  DType dtype = DType::kBF16;      // on-disk dtype of `data`
  int64_t rows = 0;                // out features
  int64_t cols = 0;                // in features (logical, unpacked)
  const uint8_t* data = nullptr;   // host view (mmap) of the checkpoint bytes
  const uint8_t* scale = nullptr;  // E8M0 scales or nullptr
  int64_t scale_rows = 0;          // [scale_rows, scale_cols]: ceil(rows/32) for 32x32 blocks,
  int64_t scale_cols = 0;          // rows for FP4 experts and Engram tables (one per row per 32)
  std::shared_ptr<void> device;    // backend-private copy (e.g. on the GPU), may be empty
  bool present() const { return data != nullptr; }
};

// Packed cache row formats of spec §3.1.
enum class RowFormat : uint8_t {
  kFp8Ue8m0,  // window KV: dim e4m3 + dim/32 UE8M0 scales (528 B for 512)
  kFp4E4m3,   // compressed KV: dim/2 packed E2M1 + dim/16 E4M3 scales (288 B for 512)
  kFp4Ue8m0,  // index keys: dim/2 packed E2M1 + dim/32 UE8M0 scales (68 B for 128)
};

inline int64_t packed_row_bytes(RowFormat f, int64_t dim) {
  switch (f) {
    case RowFormat::kFp8Ue8m0: return dim + dim / 32;
    case RowFormat::kFp4E4m3: return dim / 2 + dim / 16;
    case RowFormat::kFp4Ue8m0: return dim / 2 + dim / 32;
  }
  return 0;
}

}  // namespace di
