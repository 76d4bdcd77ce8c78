// The CPU reference backend: every op of backend.h in plain fp32 loops over host memory, threaded
// with parallel_for. It reproduces the reference's rounding points (bf16 outputs, FP8/FP4
// quantize-dequantize, block-scaled GEMM accumulation), so it is the oracle for the CUDA backend.
#pragma once

#include "backend/backend.h"

namespace di {

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }

  Tensor alloc(TType type, const std::vector<int64_t>& shape) override;
  Tensor zeros(TType type, const std::vector<int64_t>& shape) override;
  Tensor from_host_f32(const std::vector<float>& v, const std::vector<int64_t>& shape) override;
  Tensor from_host_i32(const std::vector<int32_t>& v, const std::vector<int64_t>& shape) override;
  std::vector<float> to_host_f32(const Tensor& t) override;
  std::vector<int32_t> to_host_i32(const Tensor& t) override;
  std::span<const float> to_host_f32_staged(const Tensor& t) override;
  void copy_rows(Tensor& dst, int64_t d0, const Tensor& src, int64_t s0, int64_t n) override;
  Tensor concat_cols(const Tensor& a, const Tensor& b) override;
  void prepare(Weight&) override {}

  Tensor embed(const Tensor& ids, const Weight& table) override;
  Tensor linear(const Tensor& x, const Weight& w) override;
  Tensor grouped_linear(const Tensor& x, const Weight& w, int groups) override;
  Tensor rmsnorm(const Tensor& x, const Weight& weight, float eps) override;
  void rope(Tensor& x, int heads, int head_dim, int rope_dim, const std::vector<int64_t>& positions,
            const RopeTable& table, bool inverse) override;
  void round_bf16(Tensor& x) override;
  void scale_bf16(Tensor& x, float factor) override;

  void qdq(Tensor& x, RowFormat format) override;
  void pack_rows(const Tensor& x, RowFormat format, Tensor& cache, const std::vector<int64_t>& slots) override;
  Tensor unpack_rows(const Tensor& cache, RowFormat format, int64_t dim, const std::vector<int64_t>& slots) override;
  void pack_rows_to(const Tensor& x, RowFormat format, const std::vector<Tensor>& caches,
                    const std::vector<int32_t>& cache_of_row, const std::vector<int64_t>& slots) override;
  void unpack_caches(const std::vector<Tensor>& caches, RowFormat format, Tensor& dst, int64_t d0) override;

  Tensor hc_mixes(const Tensor& x, int hc, const Weight& fn, const Weight& scale, const Weight& base, float norm_eps,
                  int sinkhorn_iters, float hc_eps) override;
  Tensor hc_pre(const Tensor& x, const Tensor& mix, int hc) override;
  Tensor hc_post(const Tensor& y, const Tensor& residual, const Tensor& mix, int hc) override;
  Tensor stream_mean(const Tensor& x, int hc) override;

  Tensor sparse_attention(const Tensor& q, int heads, const Tensor& kv, const Tensor& idx, const Weight& sink,
                          float softmax_scale, const Tensor& kv_more, RowFormat more_format) override;
  void map_paged_rows(Tensor& idx, const std::vector<int64_t>& table_start, const std::vector<int32_t>& table,
                      int64_t rows_per_page, int64_t base) override;
  Tensor paged_row_list(const std::vector<int64_t>& lengths, const std::vector<int64_t>& table_start,
                        const std::vector<int32_t>& table, int64_t rows_per_page) override;
  Tensor softmax_pool(const Tensor& kv, const Tensor& score, int ratio) override;
  Tensor index_scores(const Tensor& q, int heads, const Tensor& keys, const Tensor& w,
                      const std::vector<int64_t>& visible, const std::vector<int64_t>& key_offsets) override;
  Tensor index_scores_packed(const Tensor& q, int heads, const Tensor& cache, RowFormat format, const Tensor& slots,
                             const Tensor& w, const std::vector<int64_t>& visible,
                             const std::vector<int64_t>& key_offsets) override;
  Tensor select_candidates(const Tensor& scores, const std::vector<int64_t>& visible, int topk_blocks,
                           int block_size, TieBreak ties) override;
  void mask_scores(Tensor& scores, const Tensor& keep_mask) override;
  Tensor topk_indices(const Tensor& scores, int k, const std::vector<int64_t>& visible, int offset,
                      TieBreak ties) override;

  MoeRoute moe_route(const Tensor& x, const Weight& gate, const Weight& bias, int top_k, float route_scale,
                     float gate_temp) override;
  Tensor moe_experts(const Tensor& x, const MoeRoute& route, const std::vector<ExpertWeights>& experts,
                     const ExpertWeights& shared, float swiglu_limit) override;

  Tensor engram_lookup(const Tensor& cols, const Weight& table) override;
  Tensor engram_inject(const Tensor& x, const Tensor& kv, const Weight& q_weight, const Weight& k_weight, int hc,
                       float eps) override;

 private:
  std::vector<float> staged_;  // to_host_f32_staged's buffer, reused across calls
};

// Helpers shared by the CPU op files.
namespace cpu {
// Values of a 1-D or 2-D weight of any stored float dtype (BF16/F16/F32), row `r`, into out[cols].
void weight_row_f32(const Weight& w, int64_t r, float* out);
// Element i of a small F32/BF16 vector weight (norm weights, biases, sinks, hc scales).
float weight_at(const Weight& w, int64_t i);
float dot(const float* a, const float* b, int64_t n);
// sum_i x[i]^2 in fp32 for the RMS of rmsnorm and hc_mixes: kSumSquaresChains interleaved chains
// (chain j: x[j], x[j + 256], ... in order), then the pairwise tree c[j] += c[j + h], h = 128 .. 1 --
// the order one CUDA block of 256 threads runs in parallel (cuda::block_sum_squares_exact). With
// dot's 8 chains the GPU's mean square of mHC's 20480-wide rows was a 2560-add dependent chain.
inline constexpr int kSumSquaresChains = 256;
float sum_squares(const float* x, int64_t n);
// Dot product accumulated in double (fp32 GEMMs of the reference: mHC mixes, router, head).
double dot_f64(const float* a, const float* b, int64_t n);
// One packed cache row -> dim floats (the dequantization of unpack_rows).
void unpack_row(const uint8_t* row, RowFormat format, int64_t dim, float* y);
}  // namespace cpu

}  // namespace di
