// Launchers of the MoE and Engram kernels (moe_route_kernels.cu, moe_expert_kernels.cu,
// moe_engram_kernels.cu). Pointers are device pointers; every launcher runs on the default stream
// and checks its launch. The op orchestration is in cuda_moe_engram.cu.
#pragma once

#include <cstdint>

#include "backend/tensor.h"

namespace di::cuda::moe {

inline constexpr int kMaxTopK = 32;

// ---- routing --------------------------------------------------------------------------------------

// logits[S, E] = x[S, D] . gate[E, D]^T, each dot accumulated in fp64 and rounded to fp32 once
// (the CPU's kF32 linear). gate_dtype: BF16, F16 or F32.
void router_logits(const float* x, const uint8_t* gate, DType gate_dtype, int64_t s, int64_t e, int64_t d,
                   float* logits);

// router_logits' BF16-gate path on the FP64 tensor cores (moe_route_dmma.cu). Returns false, launching
// nothing, when D % 8 != 0 or x / gate are not 16-byte aligned (the CUDA-core kernel takes those).
bool router_logits_bf16_dmma(const float* x, const uint8_t* gate, int64_t s, int64_t e, int64_t d, float* logits);

// Per row: scores sqrt(softplus(logit / temp)), top_k by score + bias (ties to the lowest expert
// id), weights = scores renormalised (+1e-20, top_k > 1) x route_scale. Output order: by biased
// score, descending. bias: E values of bias_dtype (BF16, F16 or F32).
void router_select(const float* logits, const uint8_t* bias, DType bias_dtype, int64_t s, int64_t e, int top_k,
                   float route_scale, float gate_temp, float* weights, int32_t* experts);

// ---- experts --------------------------------------------------------------------------------------

// dst[i, :] = src[rows[i], :] for i < n; rows of d floats.
void gather_rows(const float* src, const int32_t* rows, int64_t n, int64_t d, float* dst);

// In place on gate [n, inter]: h = silu(min(g, limit)) * clamp(u, +-limit) (no clamps when limit <= 0),
// times route_w[slots[i]] when slots is given, rounded to bf16.
void swiglu(float* gate, const float* up, int64_t n, int64_t inter, const float* route_w, const int32_t* slots,
            float limit);

// swiglu without routing weights, its bf16 output quantized as the FP8 linears quantize their input
// (dense::quantize_activation): codes [n, inter], scales [n, inter / 32]; one launch instead of two.
void swiglu_quant_rows(const float* gate, const float* up, int64_t n, int64_t inter, float limit, uint8_t* codes,
                       float* scales);

// acc[rows[i], :] += y[i, :] (rows distinct within one call, so no atomics and a fixed order).
void scatter_add_rows(float* acc, const float* y, const int32_t* rows, int64_t n, int64_t d);

// out = bf16(acc + shared), n values.
void add_round_bf16(const float* acc, const float* shared, int64_t n, float* out);

// ---- grouped experts (moe_grouped.cu) --------------------------------------------------------------

// Device routing lists of n = S*k entries (entry i = token i / k, route slot i), sorted by (expert,
// token). All device pointers into caller-owned buffers.
struct RouteLists {
  int32_t* offsets;   // [E + 1] first sorted position of each expert; offsets[E] = valid entries
  int32_t* active;    // [E] ids of the experts with entries, ascending (first *n_active used)
  int32_t* n_active;  // [1]
  int32_t* tok_of;    // [n] token of the sorted entry p
  int32_t* slot_of;   // [n] its route slot
  int32_t* pos_of;    // [n] sorted position of route slot i (-1: id outside [0, E))
  int32_t* order;     // [n] per token, its sorted positions in expert-id order, -1 after the last
};

// Builds the lists from route ids [S, k] (device) in one single-CTA launch.
void route_lists(const int32_t* experts, int64_t s, int k, int64_t n_exp, const RouteLists& l);

// One grouped MXFP4 GEMM (or two sharing the activation: gate and up): for each active expert e and
// its entries p, y[p, :N] = bf16(a[p] . W_e^T), a[p] = row act_row_of[p] (or p when null) of the
// quantized activation xc / xs. Weight tables: [E] device pointers to prepared [N, K] kFp4Expert
// weights (data then scales, as CudaBackend::prepare lays them out).
struct GroupedArgs {
  const uint8_t* xc;          // [*, K] E4M3 codes
  const float* xs;            // [*, K/32] scales
  const int32_t* act_row_of;  // [n] or null
  RouteLists lists;
  int row_ctas;               // ceil(N / 128)
  int N, K;
  int n_rows;                 // n = S*k (rows of y, partial sums)
};
// How the grouped GEMMs choose their K split (and their MMA): `invariant` (batch-invariant mode) takes the plan of
// one row, whose entries can use min(E, k) expert slots (`one_row_slots`); see batch_invariance.cuh.
struct GroupedSplitMode {
  bool invariant = false;
  int64_t one_row_slots = 1;
  bool fast = false;  // block sums on wgmma (EngineOptions::fast_fp4_gemm, mma_gemm.cuh)
};
// router_select, then route_lists and dense::quantize_activation of x [S, d] into xc / xs, in one
// launch for a small batch (route_fused_fits: one CTA, S x E <= 1024 scores): the same outputs bit for
// bit, two launches fewer on the decode chain. experts / weights [S, top_k] as router_select's.
// DEEPINFER_FUSED_ROUTING=0 turns the fused path off (route_fused_fits is then false).
bool route_fused_fits(int64_t s, int64_t n_exp);
void route_fused(const float* logits, const uint8_t* bias, DType bias_dtype, int64_t s, int64_t n_exp, int top_k,
                 float route_scale, float gate_temp, float* weights, int32_t* experts, const RouteLists& l,
                 const float* x, int64_t d, uint8_t* xc, float* xs);

// slots: grid z (the most experts that can be active); nt: n8 token tiles per warp. K is split across
// CTAs while they fit in one wave (partials and counters in the persistent workspace).
void grouped_fp4_gemm(const GroupedArgs& a, const uint8_t* const* w0, float* y0, const uint8_t* const* w1, float* y1,
                      int slots, int nt, const GroupedSplitMode& mode);

// h = bf16(route_w[slot] * silu(min(g, limit)) * clamp(u, +-limit)) for the valid entries, quantized
// to FP8 per 32: codes [n, inter], scales [n, inter/32].
void swiglu_quant(const float* gate, const float* up, const RouteLists& l, int64_t n_exp, const float* route_w,
                  int64_t n_rows, int64_t inter, float limit, uint8_t* codes, float* scales);

// out[t] = bf16(sum over t's entries in expert-id order of down[p] + shared[t]); rows of d floats.
void combine(const float* down, const int32_t* order, int k, const float* shared, int64_t s, int64_t d, float* out);

// ---- Engram ---------------------------------------------------------------------------------------

// out[i, :] = bf16(e4m3(table[cols[i], :]) * e8m0(scales[cols[i], c / 32])) for i < n; out-of-range
// ids give NaN rows (never read out of bounds).
void engram_lookup(const int32_t* cols, int64_t n, const uint8_t* table, const uint8_t* scales, int64_t table_rows,
                   int64_t hd, float* out);

// Per token and stream: gate from the rstd-normalised dot of h and key weighted by q*k, out = bf16(h +
// gate * value). x [S, hc*D], kv [S, (hc+1)*D]; q, k: [hc*D] of w_dtype. wide: 512 threads per (token, stream)
// with a row's loads in flight at once (moe_engram_kernels.cu).
void engram_inject(const float* x, const float* kv, const uint8_t* q, const uint8_t* k, DType w_dtype, int64_t s,
                   int hc, int64_t d, float eps, float* out, bool wide);

}  // namespace di::cuda::moe
