// MXFP4 weights on the GPU are stored in the order the MMA warp tiles read them (mma_gemm.cuh), not
// row-major: one 16-byte load per lane per K block, 512 contiguous bytes per warp. Row-major, a lane
// read 4 bytes of each of its 4 rows per K block (four loads, half of each 32-byte sector).
//
// Data: rows padded to a multiple of 32 (zeros); for each 32-row tile T and K block kb, 512 bytes at
// ((T * nb + kb) * 32 + lane) * 16, nb = cols / 32: lane l = 4g + q holds in word j = 2 mt + h the 8
// E2M1 codes of columns [8q, 8q + 8) of block kb of row 32 T + 16 mt + 8 h + g, re-encoded so that
// two logic ops give E4M3 bytes of 2^-6 times the first four values and four give the last four
// (mma::fp4_lo / fp4_hi; the GEMM multiplies its activation scales by 2^6). Row-major, the widening
// took ~13 integer ops per 4 codes.
// Scales, widened to bf16 (2^(e-127) exactly for every E8M0 byte e: 2^-127 is a bf16 subnormal, 0xFF
// a NaN): for each tile T and group of 4 K blocks kb4, 256 bytes at ((T * nb4 + kb4) * 8 + g) * 32,
// nb4 = ceil(nb / 4): word 2 j + i = the scales of blocks 4 kb4 + 2 i and + 1 (low half first) of
// row 32 T + 16 mt + 8 h + g (j = 2 mt + h); zeros past the matrix. A scale is then one mask or
// shift from its float; the E8M0 byte took a shift, a mask and a compare-select, four per K block
// per lane, and ncu found the grouped MoE kernel bound by its integer pipe. Cost: 2 scale bytes per
// 32 weights instead of 1 (+6% bytes).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace di::cuda::fp4 {

__host__ __device__ inline int64_t padded_rows(int64_t rows) { return (rows + 31) / 32 * 32; }
__host__ __device__ inline int64_t data_bytes(int64_t rows, int64_t cols) { return padded_rows(rows) * cols / 2; }
__host__ __device__ inline int64_t scale_bytes(int64_t rows, int64_t cols) { return padded_rows(rows) / 32 * ((cols / 32 + 3) / 4) * 256; }

// dst [data_bytes | scale_bytes] (device) <- row-major device data [rows, cols / 2] and scales
// [rows, scale_cols] (scale_cols >= cols / 32), on the default stream.
void tile(const uint8_t* data, const uint8_t* scales, int64_t scale_cols, int64_t rows, int64_t cols, uint8_t* dst);

}  // namespace di::cuda::fp4
