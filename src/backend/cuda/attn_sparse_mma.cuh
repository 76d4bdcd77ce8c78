// Sparse attention on the bf16 tensor cores (attn_sparse_mma.cu), and the merge of per-split partial
// results that both sparse attention paths use.
#pragma once

#include <cstdint>

#include "backend/cuda/attn_common.cuh"
#include "backend/cuda/attn_keys.cuh"

namespace di {
class CudaBackend;
}

namespace di::cuda::attn {

// Whether the tensor-core path takes a call: heads and head dim multiples of 16, dh <= 512, f32 key
// and query rows 16-byte aligned, a non-empty list (packed rows of any width: the choice must not
// depend on where the keys live, so packed and unpacked keys give the same bits).
bool sparse_attention_mma_fits(const float* q, int heads, int dh, const AttnKeys& keys, int64_t len);

// out [s, heads * dh] = sparse_attention(q [s, heads * dh], keys, idx [s, len]) as the CPU computes it
// (cpu_attention.cpp), with q and the key rows holding bf16 values (the model's queries leave RoPE
// and its keys leave qdq / unpacking as bf16).
void sparse_attention_mma(int64_t s, int heads, int dh, const float* q, const AttnKeys& keys, const int32_t* idx,
                          int64_t len, const uint8_t* sink, WType sink_t, float scale, float* out, CudaBackend& be);

// out[r, h, :] = bf16(sum_z acc_z e^(m_z - M) / (sum_z l_z e^(m_z - M) + e^(sink_h - M))) over the
// `splits` partials part [rows, heads, splits, dh + 2] = (acc [dh], m, l), M the largest m (from -1e30).
void combine_splits(const float* part, int splits, int64_t rows, int heads, int dh, const uint8_t* sink, WType sink_t,
                    float* out);

}  // namespace di::cuda::attn
