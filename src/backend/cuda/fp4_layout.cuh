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
// Scales: for each tile T and group of 4 K blocks kb4, 128 bytes at ((T * nb4 + kb4) * 8 + g) * 16,
// nb4 = ceil(nb / 4): word j = the E8M0 scales of blocks 4 kb4 .. 4 kb4 + 3 (low byte first) of
// row 32 T + 16 mt + 8 h + g; bytes past the matrix are 0.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace di::cuda::fp4 {

__host__ __device__ inline int64_t padded_rows(int64_t rows) { return (rows + 31) / 32 * 32; }
__host__ __device__ inline int64_t data_bytes(int64_t rows, int64_t cols) { return padded_rows(rows) * cols / 2; }
__host__ __device__ inline int64_t scale_bytes(int64_t rows, int64_t cols) { return padded_rows(rows) / 32 * ((cols / 32 + 3) / 4) * 128; }

// dst [data_bytes | scale_bytes] (device) <- row-major device data [rows, cols / 2] and scales
// [rows, scale_cols] (scale_cols >= cols / 32), on the default stream.
void tile(const uint8_t* data, const uint8_t* scales, int64_t scale_cols, int64_t rows, int64_t cols, uint8_t* dst);

}  // namespace di::cuda::fp4
