// The dense GEMMs of the CUDA backend at the pointer level (callable from other CUDA op files, e.g.
// for expert or shared-expert projections). All on the default stream; x, y are device pointers;
// w must have been prepared (uploaded) by CudaBackend::prepare.
#pragma once

#include <cstdint>

#include "backend/tensor.h"

namespace di::cuda::dense {

// y[S, N] = bf16(x[S, K] W^T) for kFp8Block / kFp4Expert weights, exactly as CpuBackend::linear:
// x FP8-quantized per 32 (quant::fp8_ue8m0_quant), per-K-block fp32 partial (same 8-way order as
// the CPU dot) x act scale x weight scale, added in K-block order, bf16 out.
void quantized_linear(const float* x, int64_t rows, const Weight& w, float* y);

// y = x W^T for kBf16 (fp32 accumulation, bf16 out) / kF32 (fp64 accumulation, fp32 out) weights
// stored as BF16, F16 or F32.
void float_linear(const float* x, int64_t rows, const Weight& w, bool bf16_out, float* y);

// Block-diagonal: x [S, G*K], W [G*R, K] kFp8Block, y [S, G*R] = bf16(x_g . dequant(W_o)).
void grouped_linear(const float* x, int64_t rows, const Weight& w, int groups, float* y);

}  // namespace di::cuda::dense
