// The key rows of a sparse attention call as its kernels read them: f32 rows, then f32 or packed
// cache rows (the page pool's formats, dequantized as they are staged, exactly as unpack_rows).
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_quant.cuh"
#include "backend/tensor.h"

namespace di::cuda::attn {

// Element i of a packed cache row (unpack_rows' dequantization).
__device__ __forceinline__ float packed_at(const uint8_t* row, RowFormat f, int dh, int i) {
  switch (f) {
    case RowFormat::kFp8Ue8m0: return dq::fp8_ue8m0_dequant_at(row, row + dh, i);
    case RowFormat::kFp4E4m3: return dq::fp4_e4m3_dequant_at(row, row + dh / 2, i);
    default: return dq::fp4_ue8m0_dequant_at(row, row + dh / 2, i);
  }
}

// Keys of a sparse attention: rows [0, n_kv) of kv (f32), then n_more rows of kv_more, f32 or (packed
// != nullptr) packed cache rows of `fmt` dequantized as they are staged.
struct AttnKeys {
  const float* kv;
  int64_t n_kv;
  const float* more;
  const uint8_t* packed;
  int64_t n_more, packed_row_bytes;
  RowFormat fmt;
};

}  // namespace di::cuda::attn
