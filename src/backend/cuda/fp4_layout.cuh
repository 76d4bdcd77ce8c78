// MXFP4 weights on the GPU are stored in the order the MMA warp tiles read them (mma_gemm.cuh), not
// row-major: one 16-byte load per lane per K block, 512 contiguous bytes per warp. Row-major, a lane
// read 4 bytes of each of its 4 rows per K block (four loads, half of each 32-byte sector).
//
// Data: rows padded to a multiple of 32 (zeros); for each 32-row tile T and K block kb, 512 bytes at
// ((T * nb + kb) * 32 + lane) * 16, nb = cols / 32: lane l = 4g + q holds in word j = 2 mt + h the 8
// E2M1 codes c0 .. c7 of columns [8q, 8q + 8) of block kb of row 32 T + 16 mt + 8 h + g, re-encoded
// for the GEMM path the weight was prepared for (Encoding; Weight::device_layout):
//  - kF16 (the exact default): bits placed so that 1, 2, 3 and 3 integer ops give the four f16x2
//    wgmma A registers (c0 c1), (c4 c5), (c2 c3), (c6 c7), each code as 2^-14 times its value (an f16
//    subnormal or normal: E2M1 magnitude bits at f16 bits 9-11, sign at 15): mma::fp4_f16.
//  - kE4m3 (EngineOptions::fast_fp4_gemm): two logic ops give E4M3 bytes of 2^-6 times c0 .. c3 and
//    four give c4 .. c7 (mma::fp4_lo / fp4_hi).
// The GEMM multiplies its activation scales by the inverse power of two. Row-major, the widening
// took ~13 integer ops per 4 codes.
// Scales: for each tile T and group of 4 K blocks kb4, 128 bytes at ((T * nb4 + kb4) * 8 + g) * 16,
// nb4 = ceil(nb / 4): word j = the E8M0 scales of blocks 4 kb4 .. 4 kb4 + 3 (low byte first) of
// row 32 T + 16 mt + 8 h + g; bytes past the matrix are 0.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace di::cuda::fp4 {

enum class Encoding : int { kF16 = 0, kE4m3 = 1 };

__host__ __device__ inline int64_t padded_rows(int64_t rows) { return (rows + 31) / 32 * 32; }
__host__ __device__ inline int64_t data_bytes(int64_t rows, int64_t cols) { return padded_rows(rows) * cols / 2; }
__host__ __device__ inline int64_t scale_bytes(int64_t rows, int64_t cols) { return padded_rows(rows) / 32 * ((cols / 32 + 3) / 4) * 128; }

// dst [data_bytes | scale_bytes] (device) <- row-major device data [rows, cols / 2] and scales
// [rows, scale_cols] (scale_cols >= cols / 32), on the default stream.
void tile(const uint8_t* data, const uint8_t* scales, int64_t scale_cols, int64_t rows, int64_t cols, Encoding enc,
          uint8_t* dst);

}  // namespace di::cuda::fp4
