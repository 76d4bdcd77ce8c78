// A Backend decorator for measurement: forwards every op to an inner backend and
//  - accounts memory: bytes of prepared weights and of live tensors (current and peak), by wrapping
//    the storage of every tensor it hands out, so it needs nothing from the inner backend;
//  - optionally counts (and times) every op (synchronising the device before and after, so each op's time is its
//    own, launch and host work included) and attributes it to the current section (a layer index,
//    set from ForwardHooks), with the bytes the op must move and the FLOPs it must do, computed from
//    its arguments (see op_cost in the .cpp: the floor of the op as specified, not of a kernel);
//  - optionally prepares weights itself (a hook), e.g. synthetic weights generated on the device.
// Per-op synchronisation adds overhead: compare against an un-timed step.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "backend/backend.h"

namespace di {

struct OpStats {
  int64_t calls = 0;
  double seconds = 0;  // summed wall time of the calls
  double host_seconds = 0;  // summed time the host spent issuing them (timed calls: the op returned, before the sync)
  double bytes = 0;    // summed bytes the calls must move (reads + writes)
  double flops = 0;    // summed floating-point operations
  bool fp8 = false;    // FP8/FP4 tensor math (compare with the FP8 ceiling, else the bf16 one)
};

struct MemoryStats {
  int64_t weights = 0;       // bytes of prepared weights (device copies; the mapped bytes on the CPU)
  int64_t n_weights = 0;
  int64_t tensors = 0;       // bytes of live tensors handed out by this backend
  int64_t tensors_peak = 0;  // high-water mark of `tensors` since the last reset_peak()
};

class ProfilingBackend final : public Backend {
 public:
  // Prepares `w` and returns its bytes, or returns -1 to let the inner backend prepare it.
  using PrepareHook = std::function<int64_t(Weight& w)>;
  static constexpr int kNoSection = -1000000;

  enum class Mode {
    kOff,    // forward only (memory is still accounted)
    kCount,  // also count calls, bytes and FLOPs per op (no synchronisation)
    kTime,   // also time each op, synchronising before and after it
  };

  explicit ProfilingBackend(Backend& inner);
  ~ProfilingBackend() override;

  void set_mode(Mode m) { mode_ = m; }
  Mode mode() const { return mode_; }
  void set_section(int section) { section_ = section; }
  int section() const { return section_; }
  void set_prepare_hook(PrepareHook hook) { prepare_hook_ = std::move(hook); }
  // Op statistics keyed by (section, op label), e.g. (3, "linear fp8 [32768 x 1280]").
  const std::map<std::pair<int, std::string>, OpStats>& ops() const { return ops_; }
  void clear_ops() { ops_.clear(); }
  MemoryStats memory() const;
  void reset_peak();
  void synchronize();  // waits for the inner backend's device (no-op on the CPU)
  Backend& inner() { return inner_; }

  std::string name() const override { return inner_.name(); }
  void set_batch_invariant(bool on) override { inner_.set_batch_invariant(on); }
  void set_fast_fp4_gemm(bool on) override { inner_.set_fast_fp4_gemm(on); }
  void side_begin() override { inner_.side_begin(); }
  void side_end() override { inner_.side_end(); }
  void side_join() override { inner_.side_join(); }
  int side_mark() override { return inner_.side_mark(); }
  void side_wait(int mark) override { inner_.side_wait(mark); }
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
  // Plain steps (kOff) take the inner backend's fused op; counted or timed ones its two ops.
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
  // Plain steps (kOff) take the inner backend's fused op; counted or timed ones its three ops.
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
  // Plain steps (kOff) take the inner backend's MoE as it runs; counted or timed ones its two ops.
  Tensor moe(const Tensor& x, const Weight& gate, const Weight& bias, int top_k, float route_scale, float gate_temp,
             const std::vector<ExpertWeights>& experts, const ExpertWeights& shared, float swiglu_limit) override;

  Tensor engram_lookup(const Tensor& cols, const Weight& table) override;
  Tensor engram_inject(const Tensor& x, const Tensor& kv, const Weight& q_weight, const Weight& k_weight, int hc,
                       float eps) override;

 private:
  struct Live;  // shared with tensor deleters, so it outlives this backend if tensors do
  template <typename F>
  auto timed(const std::string& label, double bytes, double flops, bool fp8, F&& fn) -> decltype(fn());
  Tensor track(Tensor t);

  Backend& inner_;
  Mode mode_ = Mode::kOff;
  int section_ = kNoSection;
  PrepareHook prepare_hook_;
  std::map<std::pair<int, std::string>, OpStats> ops_;
  int64_t weight_bytes_ = 0, n_weights_ = 0;
  std::shared_ptr<Live> live_;
};

// Bytes a prepared weight occupies (data + E8M0 scales), as CudaBackend::prepare lays it out.
int64_t weight_storage_bytes(const Weight& w);

}  // namespace di
