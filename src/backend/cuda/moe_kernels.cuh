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

// acc[rows[i], :] += y[i, :] (rows distinct within one call, so no atomics and a fixed order).
void scatter_add_rows(float* acc, const float* y, const int32_t* rows, int64_t n, int64_t d);

// out = bf16(acc + shared), n values.
void add_round_bf16(const float* acc, const float* shared, int64_t n, float* out);

// ---- Engram ---------------------------------------------------------------------------------------

// out[i, :] = bf16(e4m3(table[cols[i], :]) * e8m0(scales[cols[i], c / 32])) for i < n; out-of-range
// ids give NaN rows (never read out of bounds).
void engram_lookup(const int32_t* cols, int64_t n, const uint8_t* table, const uint8_t* scales, int64_t table_rows,
                   int64_t hd, float* out);

// Per token and stream: gate from the rstd-normalised dot of h and key weighted by q*k, out = bf16(h +
// gate * value). x [S, hc*D], kv [S, (hc+1)*D]; q, k: [hc*D] of w_dtype.
void engram_inject(const float* x, const float* kv, const uint8_t* q, const uint8_t* k, DType w_dtype, int64_t s,
                   int hc, int64_t d, float eps, float* out);

}  // namespace di::cuda::moe
