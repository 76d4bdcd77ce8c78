// A Backend decorator for one rank of the CPU simulation of attention DP + MoE EP: every op runs on
// the inner backend over this rank's own rows, except moe_experts, which goes through EpMoe (routed
// pairs to the ranks holding their experts, combined back). A Model over it is one DP rank; the
// ranks' Models must run the same sequence of forwards (a rank without work calls idle_forward).
#pragma once

#include <map>
#include <memory>

#include "backend/backend.h"
#include "model/model_weights.h"
#include "parallel/ep_moe.h"

namespace di::parallel {

class EpBackend final : public Backend {
 public:
  // placements: one per routed-expert count (384 backbone / 128 DSpark at the real dims).
  EpBackend(Backend& inner, Communicator& comm, const std::vector<ExpertPlacement>& placements);

  // A forward with no rows: the MoE collectives of backbone layers 0 .. n_layers - 1, in order (a
  // "dummy step").
  void idle_forward(const ModelWeights& weights, int n_layers, float swiglu_limit);
  int64_t moe_calls() const { return moe_calls_; }

  std::string name() const override { return inner_.name() + "+ep"; }
  void set_batch_invariant(bool on) override { inner_.set_batch_invariant(on); }
  void set_fast_fp4_gemm(bool on) override { inner_.set_fast_fp4_gemm(on); }
  void side_begin() override { inner_.side_begin(); }
  void side_end() override { inner_.side_end(); }
  void side_join() override { inner_.side_join(); }
  int side_mark() override { return inner_.side_mark(); }
  void side_wait(int mark) override { inner_.side_wait(mark); }
  Tensor alloc(TType t, const std::vector<int64_t>& s) override { return inner_.alloc(t, s); }
  Tensor zeros(TType t, const std::vector<int64_t>& s) override { return inner_.zeros(t, s); }
  Tensor from_host_f32(const std::vector<float>& v, const std::vector<int64_t>& s) override {
    return inner_.from_host_f32(v, s);
  }
  Tensor from_host_i32(const std::vector<int32_t>& v, const std::vector<int64_t>& s) override {
    return inner_.from_host_i32(v, s);
  }
  std::vector<float> to_host_f32(const Tensor& t) override { return inner_.to_host_f32(t); }
  std::vector<int32_t> to_host_i32(const Tensor& t) override { return inner_.to_host_i32(t); }
  std::span<const float> to_host_f32_staged(const Tensor& t) override { return inner_.to_host_f32_staged(t); }
  void copy_rows_batch(const std::vector<RowCopy>& copies) override { inner_.copy_rows_batch(copies); }
  void copy_rows(Tensor& d, int64_t d0, const Tensor& s, int64_t s0, int64_t n) override {
    inner_.copy_rows(d, d0, s, s0, n);
  }
  Tensor concat_cols(const Tensor& a, const Tensor& b) override { return inner_.concat_cols(a, b); }
  void prepare(Weight& w) override { inner_.prepare(w); }
  Tensor embed(const Tensor& ids, const Weight& table) override { return inner_.embed(ids, table); }
  Tensor linear(const Tensor& x, const Weight& w) override { return inner_.linear(x, w); }
  Tensor grouped_linear(const Tensor& x, const Weight& w, int groups) override {
    return inner_.grouped_linear(x, w, groups);
  }
  Tensor rmsnorm(const Tensor& x, const Weight& w, float eps) override { return inner_.rmsnorm(x, w, eps); }
  Tensor linear_rope(const Tensor& x, const Weight& w, int heads, int head_dim, int rope_dim,
                     const std::vector<int64_t>& positions, const RopeTable& table, const InputNorm& norm) override {
    return inner_.linear_rope(x, w, heads, head_dim, rope_dim, positions, table, norm);
  }
  Tensor inverse_rope_grouped_linear(Tensor x, const Weight& w, int groups, int heads, int head_dim, int rope_dim,
                                     const std::vector<int64_t>& positions, const RopeTable& table) override {
    return inner_.inverse_rope_grouped_linear(std::move(x), w, groups, heads, head_dim, rope_dim, positions, table);
  }
  Tensor output_projection(Tensor x, const Weight& w_a, int groups, int heads, int head_dim, int rope_dim,
                           const std::vector<int64_t>& positions, const RopeTable& table, const Weight& w_b) override {
    return inner_.output_projection(std::move(x), w_a, groups, heads, head_dim, rope_dim, positions, table, w_b);
  }
  void rope(Tensor& x, int heads, int head_dim, int rope_dim, const std::vector<int64_t>& positions,
            const RopeTable& table, bool inverse) override {
    inner_.rope(x, heads, head_dim, rope_dim, positions, table, inverse);
  }
  void round_bf16(Tensor& x) override { inner_.round_bf16(x); }
  void scale_bf16(Tensor& x, float f) override { inner_.scale_bf16(x, f); }
  void qdq(Tensor& x, RowFormat f) override { inner_.qdq(x, f); }
  void rope_qdq(Tensor& x, int heads, int head_dim, int rope_dim, const std::vector<int64_t>& positions,
                const RopeTable& table, RowFormat f) override {
    inner_.rope_qdq(x, heads, head_dim, rope_dim, positions, table, f);
  }
  Tensor rmsnorm_rope_qdq(const Tensor& x, const Weight& norm, float eps, int heads, int head_dim, int rope_dim,
                          const std::vector<int64_t>& positions, const RopeTable& table, RowFormat f) override {
    return inner_.rmsnorm_rope_qdq(x, norm, eps, heads, head_dim, rope_dim, positions, table, f);
  }
  void pack_rows(const Tensor& x, RowFormat f, Tensor& cache, const std::vector<int64_t>& slots) override {
    inner_.pack_rows(x, f, cache, slots);
  }
  Tensor unpack_rows(const Tensor& cache, RowFormat f, int64_t dim, const std::vector<int64_t>& slots) override {
    return inner_.unpack_rows(cache, f, dim, slots);
  }
  void pack_rows_to(const Tensor& x, RowFormat f, const std::vector<Tensor>& caches, const std::vector<int32_t>& cache_of_row,
                    const std::vector<int64_t>& slots) override {
    inner_.pack_rows_to(x, f, caches, cache_of_row, slots);
  }
  void unpack_caches(const std::vector<Tensor>& caches, RowFormat f, Tensor& dst, int64_t d0) override {
    inner_.unpack_caches(caches, f, dst, d0);
  }
  Tensor hc_mixes(const Tensor& x, int hc, const Weight& fn, const Weight& scale, const Weight& base, float norm_eps,
                  int iters, float hc_eps) override {
    return inner_.hc_mixes(x, hc, fn, scale, base, norm_eps, iters, hc_eps);
  }
  Tensor hc_pre(const Tensor& x, const Tensor& mix, int hc) override { return inner_.hc_pre(x, mix, hc); }
  Tensor hc_post(const Tensor& y, const Tensor& r, const Tensor& mix, int hc) override {
    return inner_.hc_post(y, r, mix, hc);
  }
  Tensor stream_mean(const Tensor& x, int hc) override { return inner_.stream_mean(x, hc); }
  std::pair<Tensor, Tensor> hc_post_pre_norm(const Tensor& y, const Tensor& residual, const Tensor& post_mix,
                                             const Tensor& pre_mix, int hc, const Weight& norm, float eps) override {
    return inner_.hc_post_pre_norm(y, residual, post_mix, pre_mix, hc, norm, eps);
  }
  Tensor sparse_attention(const Tensor& q, int heads, const Tensor& kv, const Tensor& idx, const Weight& sink,
                          float scale, const Tensor& kv_more, RowFormat more_format) override {
    return inner_.sparse_attention(q, heads, kv, idx, sink, scale, kv_more, more_format);
  }
  void map_paged_rows(Tensor& idx, const std::vector<int64_t>& table_start, const std::vector<int32_t>& table,
                      int64_t rows_per_page, int64_t base) override {
    inner_.map_paged_rows(idx, table_start, table, rows_per_page, base);
  }
  Tensor concat_paged_rows(const Tensor& head, const Tensor& ids, const std::vector<int64_t>& table_start,
                           const std::vector<int32_t>& table, int64_t rows_per_page, int64_t base) override {
    return inner_.concat_paged_rows(head, ids, table_start, table, rows_per_page, base);
  }
  Tensor paged_row_list(const std::vector<int64_t>& lengths, const std::vector<int64_t>& table_start,
                        const std::vector<int32_t>& table, int64_t rows_per_page) override {
    return inner_.paged_row_list(lengths, table_start, table, rows_per_page);
  }
  Tensor softmax_pool(const Tensor& kv, const Tensor& score, int ratio) override {
    return inner_.softmax_pool(kv, score, ratio);
  }
  Tensor index_scores(const Tensor& q, int heads, const Tensor& keys, const Tensor& w,
                      const std::vector<int64_t>& visible, const std::vector<int64_t>& key_offsets) override {
    return inner_.index_scores(q, heads, keys, w, visible, key_offsets);
  }
  Tensor index_scores_packed(const Tensor& q, int heads, const Tensor& cache, RowFormat format, const Tensor& slots,
                             const Tensor& w, const std::vector<int64_t>& visible,
                             const std::vector<int64_t>& key_offsets) override {
    return inner_.index_scores_packed(q, heads, cache, format, slots, w, visible, key_offsets);
  }
  Tensor select_candidates(const Tensor& scores, const std::vector<int64_t>& visible, int topk_blocks, int block_size,
                           TieBreak ties) override {
    return inner_.select_candidates(scores, visible, topk_blocks, block_size, ties);
  }
  void mask_scores(Tensor& scores, const Tensor& keep) override { inner_.mask_scores(scores, keep); }
  Tensor topk_indices(const Tensor& scores, int k, const std::vector<int64_t>& visible, int offset,
                      TieBreak ties) override {
    return inner_.topk_indices(scores, k, visible, offset, ties);
  }
  MoeRoute moe_route(const Tensor& x, const Weight& gate, const Weight& bias, int top_k, float route_scale,
                     float gate_temp) override {
    return inner_.moe_route(x, gate, bias, top_k, route_scale, gate_temp);
  }
  Tensor moe_experts(const Tensor& x, const MoeRoute& route, const std::vector<ExpertWeights>& experts,
                     const ExpertWeights& shared, float swiglu_limit) override;
  Tensor engram_lookup(const Tensor& cols, const Weight& table) override { return inner_.engram_lookup(cols, table); }
  Tensor engram_inject(const Tensor& x, const Tensor& kv, const Weight& q, const Weight& k, int hc,
                       float eps) override {
    return inner_.engram_inject(x, kv, q, k, hc, eps);
  }

 private:
  EpMoe& ep_for(int n_experts);

  Backend& inner_;
  std::map<int, std::unique_ptr<EpMoe>> ep_;  // by routed-expert count
  int64_t moe_calls_ = 0;
};

}  // namespace di::parallel
