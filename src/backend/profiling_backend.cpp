// ProfilingBackend: forwarding, memory accounting, per-op timing and the cost model.
//
// Cost model (per op, from its arguments): bytes = every input the op must read once + every
// output it must write once, in the formats the contract gives them (activations f32, weights as
// stored: FP8/FP4 codes + E8M0 scales, bf16, f32; packed cache rows as packed); FLOPs = the
// multiply-adds of the op's matrix products and dot products (x2), elementwise work ignored. A
// gather reads each distinct row once at least: sparse attention counts min(kv rows, S x L) rows;
// moe_experts counts the weights of the distinct experts the route picked plus the shared expert.
// This is the floor of the op as specified; a kernel that re-reads or stages data moves more.
#include "backend/profiling_backend.h"

#include <chrono>
#include <set>
#include <type_traits>
#include <unordered_set>

#include "backend/device_tools.h"

namespace di {

namespace {

double tensor_bytes(const Tensor& t) { return static_cast<double>(t.bytes()); }

std::string shape_label(const char* op, const Weight& w) {
  return std::string(op) + " " + weight_mode_name(w.mode) + " [" + std::to_string(w.rows) + " x " + std::to_string(w.cols) + "]";
}

bool is_fp8(const Weight& w) { return w.mode == WeightMode::kFp8Block || w.mode == WeightMode::kFp4Expert; }

double expert_bytes(const ExpertWeights& e) {
  return static_cast<double>(weight_storage_bytes(e.w1) + weight_storage_bytes(e.w2) + weight_storage_bytes(e.w3));
}

}  // namespace

int64_t weight_storage_bytes(const Weight& w) {
  int64_t data = 0;
  switch (w.mode) {
    case WeightMode::kFp8Block: data = w.rows * w.cols; break;
    case WeightMode::kFp4Expert: data = w.rows * w.cols / 2; break;
    default: data = w.rows * w.cols * static_cast<int64_t>(dtype_size(w.dtype)); break;
  }
  int64_t scale = 0;
  if (w.scale) {
    const int64_t rows = w.scale_rows > 0 ? w.scale_rows : (w.mode == WeightMode::kFp8Block ? (w.rows + 31) / 32 : w.rows);
    scale = rows * w.scale_cols;
  }
  return data + scale;
}

namespace {

// A GEMM's floor inputs: the weight once, x, the fp32 output; 2 FLOPs per output per input.
struct GemmCost {
  double bytes, flops;
};
GemmCost gemm_cost(const Tensor& x, const Weight& w) {
  const double s = static_cast<double>(x.rows());
  return {static_cast<double>(weight_storage_bytes(w)) + tensor_bytes(x) + 4.0 * s * w.rows, 2.0 * s * w.rows * w.cols};
}

}  // namespace

struct ProfilingBackend::Live {
  int64_t bytes = 0, peak = 0;
  std::unordered_set<const void*> owned;  // storages handed out and still alive
};

ProfilingBackend::ProfilingBackend(Backend& inner) : inner_(inner), live_(std::make_shared<Live>()) {}
ProfilingBackend::~ProfilingBackend() = default;

MemoryStats ProfilingBackend::memory() const {
  MemoryStats m;
  m.weights = weight_bytes_;
  m.n_weights = n_weights_;
  m.tensors = live_->bytes;
  m.tensors_peak = live_->peak;
  return m;
}

void ProfilingBackend::reset_peak() { live_->peak = live_->bytes; }

void ProfilingBackend::synchronize() {
  if (inner_.name() == "cuda") device::synchronize();
}

Tensor ProfilingBackend::track(Tensor t) {
  if (!t.storage || live_->owned.count(t.storage.get())) return t;  // empty, or one of ours returned again
  void* raw = t.storage.get();
  const int64_t bytes = static_cast<int64_t>(tensor_bytes(t));
  std::shared_ptr<void> inner = std::move(t.storage);
  std::shared_ptr<Live> live = live_;
  live->owned.insert(raw);
  live->bytes += bytes;
  if (live->bytes > live->peak) live->peak = live->bytes;
  t.storage = std::shared_ptr<void>(raw, [inner, live, bytes](void* p) mutable {
    live->owned.erase(p);
    live->bytes -= bytes;
    inner.reset();
  });
  return t;
}

template <typename F>
auto ProfilingBackend::timed(const std::string& label, double bytes, double flops, bool fp8, F&& fn) -> decltype(fn()) {
  if (mode_ == Mode::kOff) return fn();
  using Clock = std::chrono::steady_clock;
  const bool time = mode_ == Mode::kTime;
  if (time) synchronize();
  const auto t0 = Clock::now();
  auto record = [&] {
    const auto issued = Clock::now();
    if (time) synchronize();
    OpStats& s = ops_[{section_, label}];
    s.calls += 1;
    if (time) {
      s.seconds += std::chrono::duration<double>(Clock::now() - t0).count();
      s.host_seconds += std::chrono::duration<double>(issued - t0).count();
    }
    s.bytes += bytes;
    s.flops += flops;
    s.fp8 = fp8;
  };
  if constexpr (std::is_void_v<decltype(fn())>) {
    fn();
    record();
  } else {
    auto r = fn();
    record();
    return r;
  }
}

// --- memory ---------------------------------------------------------------------------------------

Tensor ProfilingBackend::alloc(TType type, const std::vector<int64_t>& shape) {
  return track(timed("alloc", 0, 0, false, [&] { return inner_.alloc(type, shape); }));
}

Tensor ProfilingBackend::zeros(TType type, const std::vector<int64_t>& shape) {
  Tensor probe;
  probe.type = type;
  probe.shape = shape;
  return track(timed("zeros", tensor_bytes(probe), 0, false, [&] { return inner_.zeros(type, shape); }));
}

Tensor ProfilingBackend::from_host_f32(const std::vector<float>& v, const std::vector<int64_t>& shape) {
  return track(timed("to device", 4.0 * v.size(), 0, false, [&] { return inner_.from_host_f32(v, shape); }));
}

Tensor ProfilingBackend::from_host_i32(const std::vector<int32_t>& v, const std::vector<int64_t>& shape) {
  return track(timed("to device", 4.0 * v.size(), 0, false, [&] { return inner_.from_host_i32(v, shape); }));
}

std::vector<float> ProfilingBackend::to_host_f32(const Tensor& t) {
  return timed("to host", tensor_bytes(t), 0, false, [&] { return inner_.to_host_f32(t); });
}

std::span<const float> ProfilingBackend::to_host_f32_staged(const Tensor& t) {
  return timed("to host", tensor_bytes(t), 0, false, [&] { return inner_.to_host_f32_staged(t); });
}

std::vector<int32_t> ProfilingBackend::to_host_i32(const Tensor& t) {
  return timed("to host", tensor_bytes(t), 0, false, [&] { return inner_.to_host_i32(t); });
}

void ProfilingBackend::copy_rows(Tensor& dst, int64_t d0, const Tensor& src, int64_t s0, int64_t n) {
  const double b = 2.0 * n * (src.rows() ? tensor_bytes(src) / src.rows() : 0);
  timed("copy_rows", b, 0, false, [&] { inner_.copy_rows(dst, d0, src, s0, n); });
}

void ProfilingBackend::copy_rows_batch(const std::vector<RowCopy>& copies) {
  double b = 0;
  for (const RowCopy& c : copies) b += 2.0 * c.n * (c.src.rows() ? tensor_bytes(c.src) / c.src.rows() : 0);
  timed("copy_rows_batch", b, 0, false, [&] { inner_.copy_rows_batch(copies); });
}

Tensor ProfilingBackend::concat_cols(const Tensor& a, const Tensor& b) {
  const double bytes = 2.0 * (tensor_bytes(a) + tensor_bytes(b));
  return track(timed("concat_cols", bytes, 0, false, [&] { return inner_.concat_cols(a, b); }));
}

void ProfilingBackend::prepare(Weight& w) {
  int64_t bytes = prepare_hook_ ? prepare_hook_(w) : -1;
  if (bytes < 0) {
    inner_.prepare(w);
    bytes = weight_storage_bytes(w);
  }
  weight_bytes_ += bytes;
  n_weights_ += 1;
}

// --- dense ----------------------------------------------------------------------------------------

Tensor ProfilingBackend::embed(const Tensor& ids, const Weight& table) {
  const double s = static_cast<double>(ids.numel());
  const double bytes = tensor_bytes(ids) + s * table.cols * (dtype_size(table.dtype) + 4.0);
  return track(timed("embed", bytes, 0, false, [&] { return inner_.embed(ids, table); }));
}

Tensor ProfilingBackend::linear(const Tensor& x, const Weight& w) {
  const GemmCost c = gemm_cost(x, w);
  return track(timed(shape_label("linear", w), c.bytes, c.flops, is_fp8(w), [&] { return inner_.linear(x, w); }));
}

Tensor ProfilingBackend::linear_rope(const Tensor& x, const Weight& w, int heads, int head_dim, int rope_dim,
                                     const std::vector<int64_t>& positions, const RopeTable& table,
                                     const InputNorm& norm) {
  const GemmCost c = gemm_cost(x, w);
  const double bytes = c.bytes + (norm.weight ? weight_storage_bytes(*norm.weight) : 0.0) +
                       (norm.normed ? tensor_bytes(x) : 0.0);
  Tensor y = track(timed(shape_label(norm.weight ? "rmsnorm_linear_rope" : "linear_rope", w), bytes, c.flops, is_fp8(w),
                         [&] { return inner_.linear_rope(x, w, heads, head_dim, rope_dim, positions, table, norm); }));
  if (norm.normed) *norm.normed = track(*norm.normed);
  return y;
}

Tensor ProfilingBackend::output_projection(Tensor x, const Weight& w_a, int groups, int heads, int head_dim,
                                           int rope_dim, const std::vector<int64_t>& positions, const RopeTable& table,
                                           const Weight& w_b) {
  if (mode_ != Mode::kOff)
    return Backend::output_projection(std::move(x), w_a, groups, heads, head_dim, rope_dim, positions, table, w_b);
  return track(inner_.output_projection(std::move(x), w_a, groups, heads, head_dim, rope_dim, positions, table, w_b));
}

Tensor ProfilingBackend::inverse_rope_grouped_linear(Tensor x, const Weight& w, int groups, int heads, int head_dim,
                                                     int rope_dim, const std::vector<int64_t>& positions,
                                                     const RopeTable& table) {
  const GemmCost c = gemm_cost(x, w);
  return track(timed(shape_label("rope_grouped_linear", w), c.bytes, c.flops, false, [&] {
    return inner_.inverse_rope_grouped_linear(std::move(x), w, groups, heads, head_dim, rope_dim, positions, table);
  }));
}

Tensor ProfilingBackend::grouped_linear(const Tensor& x, const Weight& w, int groups) {
  const GemmCost c = gemm_cost(x, w);  // grouped: each of the G*R outputs reads K inputs
  return track(timed(shape_label("grouped_linear", w), c.bytes, c.flops, false,
                     [&] { return inner_.grouped_linear(x, w, groups); }));
}

Tensor ProfilingBackend::rmsnorm(const Tensor& x, const Weight& weight, float eps) {
  const double bytes = 2.0 * tensor_bytes(x) + weight_storage_bytes(weight);
  return track(timed("rmsnorm", bytes, 0, false, [&] { return inner_.rmsnorm(x, weight, eps); }));
}

void ProfilingBackend::rope(Tensor& x, int heads, int head_dim, int rope_dim, const std::vector<int64_t>& positions,
                            const RopeTable& table, bool inverse) {
  // only the trailing rope_dim of each head is read and written
  const double bytes = 2.0 * 4.0 * x.rows() * heads * rope_dim;
  timed("rope", bytes, 0, false, [&] { inner_.rope(x, heads, head_dim, rope_dim, positions, table, inverse); });
}

void ProfilingBackend::round_bf16(Tensor& x) {
  timed("round_bf16", 2.0 * tensor_bytes(x), 0, false, [&] { inner_.round_bf16(x); });
}

void ProfilingBackend::scale_bf16(Tensor& x, float factor) {
  timed("scale_bf16", 2.0 * tensor_bytes(x), 0, false, [&] { inner_.scale_bf16(x, factor); });
}

// --- quantize-dequantize / cache rows -------------------------------------------------------------

void ProfilingBackend::qdq(Tensor& x, RowFormat format) {
  timed("qdq", 2.0 * tensor_bytes(x), 0, false, [&] { inner_.qdq(x, format); });
}

void ProfilingBackend::rope_qdq(Tensor& x, int heads, int head_dim, int rope_dim, const std::vector<int64_t>& positions,
                                const RopeTable& table, RowFormat format) {
  timed("rope_qdq", 2.0 * tensor_bytes(x), 0, false,
        [&] { inner_.rope_qdq(x, heads, head_dim, rope_dim, positions, table, format); });
}

Tensor ProfilingBackend::rmsnorm_rope_qdq(const Tensor& x, const Weight& norm, float eps, int heads, int head_dim,
                                          int rope_dim, const std::vector<int64_t>& positions, const RopeTable& table,
                                          RowFormat format) {
  const double bytes = 2.0 * tensor_bytes(x) + weight_storage_bytes(norm);
  return track(timed("rmsnorm_rope_qdq", bytes, 0, false, [&] {
    return inner_.rmsnorm_rope_qdq(x, norm, eps, heads, head_dim, rope_dim, positions, table, format);
  }));
}

void ProfilingBackend::pack_rows(const Tensor& x, RowFormat format, Tensor& cache, const std::vector<int64_t>& slots) {
  const double bytes = tensor_bytes(x) + static_cast<double>(slots.size()) * packed_row_bytes(format, x.row_size());
  timed("pack_rows", bytes, 0, false, [&] { inner_.pack_rows(x, format, cache, slots); });
}

Tensor ProfilingBackend::unpack_rows(const Tensor& cache, RowFormat format, int64_t dim, const std::vector<int64_t>& slots) {
  const double bytes = static_cast<double>(slots.size()) * (packed_row_bytes(format, dim) + 4.0 * dim);
  return track(timed("unpack_rows", bytes, 0, false, [&] { return inner_.unpack_rows(cache, format, dim, slots); }));
}

void ProfilingBackend::pack_rows_to(const Tensor& x, RowFormat format, const std::vector<Tensor>& caches,
                                    const std::vector<int32_t>& cache_of_row, const std::vector<int64_t>& slots) {
  int64_t written = 0;
  for (int32_t c : cache_of_row) written += c >= 0;
  const double bytes = static_cast<double>(written) * (4.0 * x.row_size() + packed_row_bytes(format, x.row_size()));
  timed("pack_rows", bytes, 0, false, [&] { inner_.pack_rows_to(x, format, caches, cache_of_row, slots); });
}

void ProfilingBackend::unpack_caches(const std::vector<Tensor>& caches, RowFormat format, Tensor& dst, int64_t d0) {
  double bytes = 0;
  for (const Tensor& c : caches) bytes += static_cast<double>(tensor_bytes(c)) + 4.0 * c.rows() * dst.row_size();
  timed("unpack_rows", bytes, 0, false, [&] { inner_.unpack_caches(caches, format, dst, d0); });
}

// --- mHC ------------------------------------------------------------------------------------------

Tensor ProfilingBackend::hc_mixes(const Tensor& x, int hc, const Weight& fn, const Weight& scale, const Weight& base,
                                  float norm_eps, int sinkhorn_iters, float hc_eps) {
  const double s = static_cast<double>(x.rows());
  const double bytes = tensor_bytes(x) + weight_storage_bytes(fn) + weight_storage_bytes(scale) +
                       weight_storage_bytes(base) + 4.0 * s * fn.rows;
  const double flops = 2.0 * s * fn.rows * fn.cols;
  return track(timed("hc_mixes", bytes, flops, false,
                     [&] { return inner_.hc_mixes(x, hc, fn, scale, base, norm_eps, sinkhorn_iters, hc_eps); }));
}

Tensor ProfilingBackend::hc_pre(const Tensor& x, const Tensor& mix, int hc) {
  const double bytes = tensor_bytes(x) + 4.0 * x.rows() * hc + tensor_bytes(x) / hc;
  return track(timed("hc_pre", bytes, static_cast<double>(x.numel()) * 2, false,
                     [&] { return inner_.hc_pre(x, mix, hc); }));
}

Tensor ProfilingBackend::hc_post(const Tensor& y, const Tensor& residual, const Tensor& mix, int hc) {
  const double bytes = tensor_bytes(y) + 2.0 * tensor_bytes(residual) + tensor_bytes(mix);
  const double flops = 2.0 * static_cast<double>(residual.numel()) * (hc + 1);
  return track(timed("hc_post", bytes, flops, false, [&] { return inner_.hc_post(y, residual, mix, hc); }));
}

std::pair<Tensor, Tensor> ProfilingBackend::hc_post_pre_norm(const Tensor& y, const Tensor& residual,
                                                             const Tensor& post_mix, const Tensor& pre_mix, int hc,
                                                             const Weight& norm, float eps) {
  if (mode_ != Mode::kOff) return Backend::hc_post_pre_norm(y, residual, post_mix, pre_mix, hc, norm, eps);
  auto [h, x] = inner_.hc_post_pre_norm(y, residual, post_mix, pre_mix, hc, norm, eps);
  return {track(std::move(h)), track(std::move(x))};
}

Tensor ProfilingBackend::stream_mean(const Tensor& x, int hc) {
  return track(timed("stream_mean", tensor_bytes(x) * (1.0 + 1.0 / hc), 0, false,
                     [&] { return inner_.stream_mean(x, hc); }));
}

// --- attention ------------------------------------------------------------------------------------

Tensor ProfilingBackend::sparse_attention(const Tensor& q, int heads, const Tensor& kv, const Tensor& idx,
                                          const Weight& sink, float softmax_scale, const Tensor& kv_more,
                                          RowFormat more_format) {
  const double s = static_cast<double>(q.rows()), l = static_cast<double>(idx.row_size());
  const double dh = static_cast<double>(kv.row_size());
  // keys read at most once each: kv rows (f32) and kv_more rows (f32 or packed), at most s * l
  const double rows_a = std::min(static_cast<double>(kv.rows()), s * l);
  const double rows_b = std::min(static_cast<double>(kv_more.rows()), s * l);
  const double more_row = kv_more.rows() ? static_cast<double>(tensor_bytes(kv_more)) / kv_more.rows() : 0.0;
  const double bytes = 2.0 * tensor_bytes(q) + tensor_bytes(idx) + 4.0 * rows_a * dh + rows_b * more_row + 4.0 * heads;
  const double flops = 4.0 * s * heads * l * dh;  // scores and the weighted sum
  return track(timed("sparse_attention", bytes, flops, false,
                     [&] { return inner_.sparse_attention(q, heads, kv, idx, sink, softmax_scale, kv_more, more_format); }));
}

void ProfilingBackend::map_paged_rows(Tensor& idx, const std::vector<int64_t>& table_start,
                                      const std::vector<int32_t>& table, int64_t rows_per_page, int64_t base) {
  timed("map_paged_rows", 2.0 * tensor_bytes(idx), 0, false,
        [&] { inner_.map_paged_rows(idx, table_start, table, rows_per_page, base); });
}

Tensor ProfilingBackend::concat_paged_rows(const Tensor& head, const Tensor& ids, const std::vector<int64_t>& table_start,
                                           const std::vector<int32_t>& table, int64_t rows_per_page, int64_t base) {
  const double bytes = 2.0 * (tensor_bytes(head) + tensor_bytes(ids)) + 8.0 * table_start.size() + 4.0 * table.size();
  return track(timed("concat_paged_rows", bytes, 0, false,
                     [&] { return inner_.concat_paged_rows(head, ids, table_start, table, rows_per_page, base); }));
}

Tensor ProfilingBackend::paged_row_list(const std::vector<int64_t>& lengths, const std::vector<int64_t>& table_start,
                                        const std::vector<int32_t>& table, int64_t rows_per_page) {
  double rows = 0;
  for (int64_t n : lengths) rows += static_cast<double>(n);
  return track(timed("paged_row_list", 4.0 * rows, 0, false,
                     [&] { return inner_.paged_row_list(lengths, table_start, table, rows_per_page); }));
}

Tensor ProfilingBackend::softmax_pool(const Tensor& kv, const Tensor& score, int ratio) {
  const double bytes = tensor_bytes(kv) + tensor_bytes(score) + tensor_bytes(kv) / ratio;
  return track(timed("softmax_pool", bytes, 0, false, [&] { return inner_.softmax_pool(kv, score, ratio); }));
}

Tensor ProfilingBackend::index_scores(const Tensor& q, int heads, const Tensor& keys, const Tensor& w,
                                      const std::vector<int64_t>& visible, const std::vector<int64_t>& key_offsets) {
  const double s = static_cast<double>(q.rows());
  const double t = key_offsets.empty() ? static_cast<double>(keys.rows()) : static_cast<double>(index_width(visible));
  const double bytes = tensor_bytes(q) + tensor_bytes(keys) + tensor_bytes(w) + 4.0 * s * t;
  const double flops = 2.0 * s * t * static_cast<double>(q.row_size());
  return track(timed("index_scores", bytes, flops, false,
                     [&] { return inner_.index_scores(q, heads, keys, w, visible, key_offsets); }));
}

Tensor ProfilingBackend::index_scores_packed(const Tensor& q, int heads, const Tensor& cache, RowFormat format,
                                             const Tensor& slots, const Tensor& w, const std::vector<int64_t>& visible,
                                             const std::vector<int64_t>& key_offsets) {
  const double s = static_cast<double>(q.rows());
  const double t = key_offsets.empty() ? static_cast<double>(slots.numel()) : static_cast<double>(index_width(visible));
  const double key_bytes = static_cast<double>(slots.numel()) * (4.0 + static_cast<double>(cache.row_size()));
  const double bytes = tensor_bytes(q) + key_bytes + tensor_bytes(w) + 4.0 * s * t;
  const double flops = 2.0 * s * t * static_cast<double>(q.row_size());
  return track(timed("index_scores", bytes, flops, false, [&] {
    return inner_.index_scores_packed(q, heads, cache, format, slots, w, visible, key_offsets);
  }));
}

Tensor ProfilingBackend::select_candidates(const Tensor& scores, const std::vector<int64_t>& visible, int topk_blocks,
                                           int block_size, TieBreak ties) {
  const double bytes = tensor_bytes(scores) * 1.25;  // read f32 scores, write a U8 mask
  return track(timed("select_candidates", bytes, 0, false,
                     [&] { return inner_.select_candidates(scores, visible, topk_blocks, block_size, ties); }));
}

void ProfilingBackend::mask_scores(Tensor& scores, const Tensor& keep_mask) {
  timed("mask_scores", 2.0 * tensor_bytes(scores) + tensor_bytes(keep_mask), 0, false,
        [&] { inner_.mask_scores(scores, keep_mask); });
}

Tensor ProfilingBackend::topk_indices(const Tensor& scores, int k, const std::vector<int64_t>& visible, int offset,
                                      TieBreak ties) {
  const double bytes = tensor_bytes(scores) + 4.0 * scores.rows() * k;
  return track(timed("topk_indices", bytes, 0, false, [&] { return inner_.topk_indices(scores, k, visible, offset, ties); }));
}

// --- MoE ------------------------------------------------------------------------------------------

MoeRoute ProfilingBackend::moe_route(const Tensor& x, const Weight& gate, const Weight& bias, int top_k,
                                     float route_scale, float gate_temp) {
  const double s = static_cast<double>(x.rows());
  const double bytes = tensor_bytes(x) + weight_storage_bytes(gate) + weight_storage_bytes(bias) + 8.0 * s * top_k;
  const double flops = 2.0 * s * gate.rows * gate.cols;
  MoeRoute r = timed("moe_route", bytes, flops, false,
                     [&] { return inner_.moe_route(x, gate, bias, top_k, route_scale, gate_temp); });
  r.weights = track(std::move(r.weights));
  r.experts = track(std::move(r.experts));
  return r;
}

Tensor ProfilingBackend::moe_experts(const Tensor& x, const MoeRoute& route, const std::vector<ExpertWeights>& experts,
                                     const ExpertWeights& shared, float swiglu_limit) {
  double bytes = 0, flops = 0;
  if (mode_ != Mode::kOff) {  // which experts the route uses (a small copy, outside the timed region)
    const std::vector<int32_t> ids = inner_.to_host_i32(route.experts);
    std::set<int32_t> distinct;
    for (int32_t e : ids)
      if (e >= 0 && e < static_cast<int32_t>(experts.size())) distinct.insert(e);
    for (int32_t e : distinct) bytes += expert_bytes(experts[static_cast<size_t>(e)]);
    const double s = static_cast<double>(x.rows()), d = static_cast<double>(x.row_size());
    const double inter = static_cast<double>(shared.w1.rows);
    bytes += expert_bytes(shared) + tensor_bytes(x) + 4.0 * s * d + tensor_bytes(route.weights);
    flops = 2.0 * 3.0 * inter * d * (static_cast<double>(ids.size()) + s);
  }
  return track(timed("moe_experts", bytes, flops, true,
                     [&] { return inner_.moe_experts(x, route, experts, shared, swiglu_limit); }));
}

Tensor ProfilingBackend::moe(const Tensor& x, const Weight& gate, const Weight& bias, int top_k, float route_scale,
                             float gate_temp, const std::vector<ExpertWeights>& experts, const ExpertWeights& shared,
                             float swiglu_limit) {
  if (mode_ != Mode::kOff)
    return Backend::moe(x, gate, bias, top_k, route_scale, gate_temp, experts, shared, swiglu_limit);
  return track(inner_.moe(x, gate, bias, top_k, route_scale, gate_temp, experts, shared, swiglu_limit));
}

// --- Engram ---------------------------------------------------------------------------------------

Tensor ProfilingBackend::engram_lookup(const Tensor& cols, const Weight& table) {
  const double n = static_cast<double>(cols.numel());
  const double bytes = tensor_bytes(cols) + n * (table.cols + table.scale_cols + 4.0 * table.cols);
  return track(timed("engram_lookup", bytes, 0, false, [&] { return inner_.engram_lookup(cols, table); }));
}

Tensor ProfilingBackend::engram_inject(const Tensor& x, const Tensor& kv, const Weight& q_weight,
                                       const Weight& k_weight, int hc, float eps) {
  const double bytes = 2.0 * tensor_bytes(x) + tensor_bytes(kv) + weight_storage_bytes(q_weight) +
                       weight_storage_bytes(k_weight);
  const double flops = 4.0 * static_cast<double>(x.numel());  // the gate's two dot products per stream
  return track(timed("engram_inject", bytes, flops, false,
                     [&] { return inner_.engram_inject(x, kv, q_weight, k_weight, hc, eps); }));
}

}  // namespace di
