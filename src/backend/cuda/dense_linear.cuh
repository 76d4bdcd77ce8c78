// The dense GEMMs of the CUDA backend at the pointer level (callable from other CUDA op files, e.g.
// for expert or shared-expert projections). All on the default stream; x, y are device pointers;
// w must have been prepared (uploaded) by CudaBackend::prepare.
#pragma once

#include <cstdint>

#include "backend/cuda/attn_common.cuh"
#include "backend/cuda/gemv_mma_switch.h"
#include "backend/cuda/rope_math.cuh"
#include "backend/tensor.h"

namespace di::cuda::dense {

// y[S, N] = bf16(x[S, K] W^T) for kFp8Block / kFp4Expert weights, as CpuBackend::linear: x
// FP8-quantized per 32 (bit-exact with quant::fp8_ue8m0_quant), per-K-block partial x act scale x
// weight scale added in fp32, bf16 out. Block partials come from the FP8 tensor cores, so the result
// equals the CPU's to fp32 rounding (not bit for bit). No allocation per call (persistent workspace).
// invariant: K split chosen without the row count (batch_invariance.cuh). fast_fp4: MXFP4 block sums on
// the wgmma tensor cores (~14-bit sums, mma_gemm.cuh; EngineOptions::fast_fp4_gemm).
// RoPE applied inside a GEMM (linear_rope: the output, forward; grouped_mma_linear: the input,
// inverse), with rope_kernel's arithmetic: rows of heads whose trailing rope_dim rotate in
// interleaved pairs, row r at position pos[r]. rope.freqs == nullptr: no rotation.
struct RopeArgs {
  const int64_t* pos = nullptr;  // [rows]
  RowRope rope{};
};
// Where a GEMM's output goes quantized for the next FP8 linear: codes [rows, N] E4M3, scales [rows, N / 32] (the
// layout quantize_activation writes). codes == nullptr: none.
struct ActCodesOut {
  uint8_t* codes = nullptr;
  float* scales = nullptr;
};
// RMSNorm of the GEMM's input (linear_rope with a norm: q_norm before wq_b), with rmsnorm_kernel's
// arithmetic: up to 2 rows each CTA normalizes x while staging it; past that (or when the normalized
// rows are wanted: `normed`) one launch normalizes and quantizes them for the GEMM. w == nullptr: none.
struct NormArgs {
  const uint8_t* w = nullptr;  // [K]
  attn::WType type = attn::WType::kBf16;
  float eps = 0.0f;
  float* normed = nullptr;  // [rows, K] or nullptr
};
// rope: rotates the output in the epilogue; returns false when it did not (K split across CTAs: the
// caller rotates the output itself). Always true without rope.
bool quantized_linear(const float* x, int64_t rows, const Weight& w, float* y, bool invariant = false,
                      bool fast_fp4 = false, const RopeArgs& rope = {}, const NormArgs& norm = {});

// One or two rows on the CUDA cores (fp8_gemv.cu; quantized_linear takes it at those batches outside the
// batch-invariant mode): kFp8Block weights with K % 256 == 0, the activation quantized (codes [rows, K],
// scales [rows, K / 32], as quantize_activation writes them) and staged whole (rows x K x 4 bytes <= 64 KiB).
// Applies `rope` to the output. fp8_gemv_fits is false with DEEPINFER_FP8_GEMV=0 (A/B measurements).
// With the tensor-core GEMV on (gemv_mma_max_rows() > 0), up to that many rows with K % 64 == 0 go to it instead.
bool fp8_gemv_fits(int64_t rows, const Weight& w);
void fp8_gemv(const uint8_t* codes, const float* scales, int64_t rows, const Weight& w, float* y, const RopeArgs& rope);
// The tensor-core GEMV (fp8_gemv_mma.cu), when on for the row count (gemv_mma_switch.h).
bool fp8_gemv_mma_fits(int64_t rows, const Weight& w);
void fp8_gemv_mma(const uint8_t* codes, const float* scales, int64_t rows, const Weight& w, float* y,
                  const RopeArgs& rope);
// The same kernel for a block-diagonal grouped linear of float activations (x [rows, G K] staged as f16 hi + lo of
// x over a power of two per 32-block: 22 bits, bf16 values exactly), optionally x's inverse RoPE while staged and
// y quantized for the next FP8 linear: wo_a at up to 8 rows (grouped_mma_linear and its inverse-RoPE form take it).
bool grouped_gemv_mma_fits(const float* x, int64_t rows, const Weight& w, int groups);
void grouped_gemv_mma(const float* x, int64_t rows, const Weight& w, int groups, const RopeArgs& x_rope, float* y,
                      const ActCodesOut& codes_out = {});

// The activation quantizer of quantized_linear: codes [rows, K] E4M3, scales [rows, K/32] as floats.
void quantize_activation(const float* x, int64_t rows, int64_t K, uint8_t* codes, float* scales);

// How a quantized GEMM splits K across CTAs: `tiles` independent CTA tiles (row blocks x token
// tiles), nb K blocks, nt n8 token tiles per warp, `capacity` CTAs resident on the whole GPU.
struct SplitPlan {
  int splits = 1;
  int kb_per_split = 0;
};
// waves: resident waves of CTAs the splits may fill (1 for dense linears, 2 for grouped experts).
SplitPlan plan_split(int64_t tiles, int64_t nb, int nt, int64_t capacity, int waves);

// y[i] = the K splits' partials [splits, n] summed in split order from zero (bf16-rounded when
// bf16_out): the split-K fix-up of the GEMM kernels.
void reduce_splits(const float* partial, int splits, int64_t n, bool bf16_out, float* y);

// n8 token tiles per warp for up to `tokens` tokens per tile (1, 2, 4 or 8).
int nt_for(int64_t tokens);

// y = x W^T for kBf16 (fp32 accumulation, bf16 out) / kF32 (fp64 accumulation, fp32 out) weights
// stored as BF16, F16 or F32.
void float_linear(const float* x, int64_t rows, const Weight& w, bool bf16_out, float* y);

// y = x W^T for BF16-stored weights on the bf16 tensor cores (dense_bf16_mma.cu): fp32 sums, x split
// into bf16 hi + lo. Takes K % 64 == 0, 16-byte aligned x and W; not batch-invariant across row counts
// (the float kernel is used in that mode).
bool bf16_mma_fits(const float* x, int64_t rows, const Weight& w);
void bf16_mma_linear(const float* x, int64_t rows, const Weight& w, bool bf16_out, float* y);

// grouped_linear on the same tensor-core kernel (FP8 block weights dequantized to bf16, exact):
// R % 256 == 0, K % 64 == 0.
bool grouped_mma_fits(const float* x, int64_t rows, const Weight& w, int groups);
void grouped_mma_linear(const float* x, int64_t rows, const Weight& w, int groups, float* y);
// The same with x's inverse RoPE applied while staging it (x itself is not written): wo_a after the
// attention. Up to 8 rows (each CTA recomputes the rotations of its K range; past one token tile
// that costs more than the rope launch it saves).
// With codes_out.codes set, y is also quantized for the next FP8 linear (quantize_activation's codes and scales,
// the same bits) by the CTA that finalizes each tile; false when it was not (a separate split sum): the caller then
// quantizes y itself.
bool grouped_mma_rope_fits(const float* x, int64_t rows, const Weight& w, int groups);
bool grouped_mma_linear_inverse_rope(const float* x, int64_t rows, const Weight& w, int groups, const RopeArgs& rope,
                                     float* y, const ActCodesOut& codes_out = {});

// Block-diagonal: x [S, G*K], W [G*R, K] kFp8Block, y [S, G*R] = bf16(x_g . dequant(W_o)).
void grouped_linear(const float* x, int64_t rows, const Weight& w, int groups, float* y);

}  // namespace di::cuda::dense
