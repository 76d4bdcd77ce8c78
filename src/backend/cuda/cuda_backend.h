// The CUDA backend for Hopper (sm_90a): the ops of backend.h on the GPU. Tensors hold device
// memory; weights are uploaded once by prepare() (Weight::device), straight from the mmapped
// checkpoint. Every op is tested against the CPU backend (tests/gpu).
#pragma once

#include <memory>
#include <mutex>

#include "backend/backend.h"

namespace di {
namespace cuda {
class UploadCache;
namespace dense {
struct RopeArgs;  // dense_linear.cuh
}
}

class CudaBackend final : public Backend {
 public:
  CudaBackend();
  ~CudaBackend() override;
  std::string name() const override { return "cuda"; }
  // Reduction orders chosen without the row count (batch_invariance.cuh); off by default.
  void set_batch_invariant(bool on) override { batch_invariant_ = on; }
  bool batch_invariant() const { return batch_invariant_; }
  bool fused_chains() const { return fused_chains_; }
  void set_fast_fp4_gemm(bool on) override { fast_fp4_gemm_ = on; }
  void side_begin() override;
  void side_end() override;
  void side_join() override;
  int side_mark() override;
  void side_wait(int mark) override;

  Tensor alloc(TType type, const std::vector<int64_t>& shape) override;
  Tensor zeros(TType type, const std::vector<int64_t>& shape) override;
  Tensor from_host_f32(const std::vector<float>& v, const std::vector<int64_t>& shape) override;
  Tensor from_host_i32(const std::vector<int32_t>& v, const std::vector<int64_t>& shape) override;
  std::vector<float> to_host_f32(const Tensor& t) override;
  std::vector<int32_t> to_host_i32(const Tensor& t) override;
  std::span<const float> to_host_f32_staged(const Tensor& t) override;
  void copy_rows(Tensor& dst, int64_t d0, const Tensor& src, int64_t s0, int64_t n) override;
  void copy_rows_batch(const std::vector<RowCopy>& copies) override;
  Tensor concat_cols(const Tensor& a, const Tensor& b) override;
  void prepare(Weight& w) override;

  Tensor embed(const Tensor& ids, const Weight& table) override;
  Tensor linear(const Tensor& x, const Weight& w) override;
  Tensor grouped_linear(const Tensor& x, const Weight& w, int groups) override;
  Tensor linear_rope(const Tensor& x, const Weight& w, int heads, int head_dim, int rope_dim,
                     const std::vector<int64_t>& positions, const RopeTable& table, const InputNorm& norm) override;
  Tensor inverse_rope_grouped_linear(Tensor x, const Weight& w, int groups, int heads, int head_dim, int rope_dim,
                                     const std::vector<int64_t>& positions, const RopeTable& table) override;
  // At one or two rows, with output_codes_: wo_a's CTAs quantize the tiles they finish for wo_b's GEMV (one launch
  // fewer on the chain; the same bits).
  Tensor output_projection(Tensor x, const Weight& w_a, int groups, int heads, int head_dim, int rope_dim,
                           const std::vector<int64_t>& positions, const RopeTable& table, const Weight& w_b) override;
  Tensor rmsnorm(const Tensor& x, const Weight& weight, float eps) override;
  void rope(Tensor& x, int heads, int head_dim, int rope_dim, const std::vector<int64_t>& positions,
            const RopeTable& table, bool inverse) override;
  void round_bf16(Tensor& x) override;
  void scale_bf16(Tensor& x, float factor) override;

  void qdq(Tensor& x, RowFormat format) override;
  void rope_qdq(Tensor& x, int heads, int head_dim, int rope_dim, const std::vector<int64_t>& positions,
                const RopeTable& table, RowFormat format) override;
  Tensor rmsnorm_rope_qdq(const Tensor& x, const Weight& norm, float eps, int heads, int head_dim, int rope_dim,
                          const std::vector<int64_t>& positions, const RopeTable& table, RowFormat format) override;
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
  std::pair<Tensor, Tensor> hc_post_pre_norm(const Tensor& y, const Tensor& residual, const Tensor& post_mix,
                                             const Tensor& pre_mix, int hc, const Weight& norm, float eps) override;

  Tensor sparse_attention(const Tensor& q, int heads, const Tensor& kv, const Tensor& idx, const Weight& sink,
                          float softmax_scale, const Tensor& kv_more, RowFormat more_format) override;
  void map_paged_rows(Tensor& idx, const std::vector<int64_t>& table_start, const std::vector<int32_t>& table,
                      int64_t rows_per_page, int64_t base) override;
  Tensor concat_paged_rows(const Tensor& head, const Tensor& ids, const std::vector<int64_t>& table_start,
                           const std::vector<int32_t>& table, int64_t rows_per_page, int64_t base) override;
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
  Tensor moe(const Tensor& x, const Weight& gate, const Weight& bias, int top_k, float route_scale, float gate_temp,
             const std::vector<ExpertWeights>& experts, const ExpertWeights& shared, float swiglu_limit) override;

  Tensor engram_lookup(const Tensor& cols, const Weight& table) override;
  Tensor engram_inject(const Tensor& x, const Tensor& kv, const Weight& q_weight, const Weight& k_weight, int hc,
                       float eps) override;

  // Bytes held by uploaded weights and by live tensors (for logs and `inspect`).
  int64_t weight_bytes() const { return weight_bytes_; }

 private:
  // The grouped routed experts plus `shared_y`, the shared expert's output (side work until joined).
  // inputs_ready: the routing lists and quantized x are already in the workspace (moe::route_fused).
  Tensor moe_experts_grouped(const Tensor& x, const MoeRoute& route, const std::vector<ExpertWeights>& experts,
                             const Tensor& shared_y, float swiglu_limit, bool inputs_ready = false);
  // A GEMM epilogue's / staging's RoPE: the positions and the table's frequencies uploaded (cached by content).
  cuda::dense::RopeArgs rope_args(const std::vector<int64_t>& positions, const RopeTable& table, int head_dim,
                                  int rope_dim);
  // Whether inverse_rope_grouped_linear's fused kernel takes these shapes (else the Backend composition).
  bool inverse_rope_fused_fits(const Tensor& x, const Weight& w, int groups, int heads, int head_dim,
                               int rope_dim) const;
  // logits [S, E] of the router's gate (fp32, fp64 sums).
  Tensor router_logits(const Tensor& x, const Weight& gate);
  Tensor moe_experts_listed(const Tensor& x, const MoeRoute& route, const std::vector<ExpertWeights>& experts,
                            const ExpertWeights& shared, float swiglu_limit);
  // Pinned host memory, grown on demand (the DMA engine writes pinned memory directly; a pageable
  // destination is staged by the driver in pieces).
  struct PinnedBuffer {
    void* data = nullptr;
    size_t bytes = 0;
    void* reserve(size_t n);
    ~PinnedBuffer();
  };
  PinnedBuffer staging_;  // what large copies into caller vectors go through; one copy at a time
  std::mutex staging_mutex_;
  PinnedBuffer staged_view_;  // to_host_f32_staged's buffer, handed to the caller
  void copy_to_host(void* dst, const void* src, size_t bytes);
  // embed's out-of-range flag: the CPU backend checks every id as it embeds; here the kernel sets this
  // pinned host word and every copy to the host (which waits for the stream) checks and clears it. A
  // read-back in embed itself held the host ~60 us at the start of every decode step, the GPU idle.
  PinnedBuffer embed_bad_;
  int* embed_bad_flag();
  void check_embed_ids();
  int64_t weight_bytes_ = 0;
  std::unique_ptr<cuda::UploadCache> rope_uploads_;  // RoPE's positions and frequency tables
  std::unique_ptr<cuda::UploadCache> page_uploads_;  // the batch's page tables (the same for every layer of a step)
  // the indexer's per-row lengths and offsets (visible, key offsets, top-k n / k, candidate blocks), the same for every
  // indexed layer of a ratio in a step: at batch 1 each upload is a launch on the main chain (DEEPINFER_LIST_CACHE=0:
  // one upload per call, for measuring)
  std::unique_ptr<cuda::UploadCache> list_uploads_;
  bool batch_invariant_ = false;
  bool fast_fp4_gemm_ = false;  // MXFP4 block sums on wgmma (mma_gemm.cuh)
  // rope_qdq, rmsnorm_rope_qdq, concat_paged_rows, linear_rope and inverse_rope_grouped_linear as one launch
  // each, the shared expert of one or two rows in five; DEEPINFER_FUSED_CHAINS=0 runs the Backend compositions
  // instead (the same bits: for measuring the fusion).
  bool fused_chains_ = true;
  // output_projection's quantized hand-off (DEEPINFER_OUTPUT_CODES=0: the two ops, for measuring it).
  bool output_codes_ = true;
  // engram_inject with a row's loads in flight at once (DEEPINFER_WIDE_INJECT=0: the 256-thread kernel, one L2 round
  // trip per 256 elements; its sums in another order, both within the CPU bound).
  bool wide_inject_ = true;
};

}  // namespace di
