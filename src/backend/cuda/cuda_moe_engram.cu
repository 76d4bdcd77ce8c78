// CUDA backend ops: MoE routing and experts, Engram lookup and injection. Same semantics and bf16
// rounding points as src/backend/cpu/cpu_moe.cpp; the kernels are in moe_*_kernels.cu.
#include <algorithm>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/dense_linear.cuh"
#include "backend/cuda/gemm_workspace.cuh"
#include "backend/cuda/mma_gemm.cuh"
#include "backend/cuda/moe_kernels.cuh"
#include "backend/cuda/side_stream.cuh"
#include "core/env_switch.h"

namespace di {
namespace {

// Whether an unrouted expert of x's rows runs as five GEMV-path launches (gemv_expert).
bool gemv_expert_fits(const CudaBackend& be, const Tensor& x, const ExpertWeights& ew) {
  static const bool on = env_switch_on("DEEPINFER_GEMV_EXPERT");  // =0: the seven launches (for measuring)
  const int64_t s = x.rows();
  return on && be.fused_chains() && !be.batch_invariant() && cuda::dense::fp8_gemv_fits(s, ew.w1) &&
         cuda::dense::fp8_gemv_fits(s, ew.w3) && cuda::dense::fp8_gemv_fits(s, ew.w2) && ew.w3.rows == ew.w1.rows &&
         ew.w2.cols == ew.w1.rows && ew.w1.rows % 32 == 0;
}

// The shared expert of one or two rows (a decode step), on the CUDA-core GEMV as be.linear would run it, with
// two launches fewer on its (side-stream) chain: x quantized once for gate and up, and h quantized by the SwiGLU
// kernel. The same quantizer on the same values, so the same bits as the seven launches. Buffers: the MoE
// workspace of the current stream (gemm_workspace.cuh), which the routed experts on that stream write only
// after this chain's kernels have finished (stream order).
Tensor gemv_expert(CudaBackend& be, const Tensor& x, const ExpertWeights& ew, float limit) {
  using namespace cuda;
  const int64_t s = x.rows(), d = x.row_size(), inter = ew.w1.rows;
  uint8_t* xc = workspace_as<uint8_t>(Ws::kMoeXCodes, static_cast<size_t>(s * d));
  float* xs = workspace_as<float>(Ws::kMoeXScales, static_cast<size_t>(s * d / 32));
  float* gate = workspace_as<float>(Ws::kMoeGate, static_cast<size_t>(s * inter));
  float* up = workspace_as<float>(Ws::kMoeUp, static_cast<size_t>(s * inter));
  uint8_t* hc = workspace_as<uint8_t>(Ws::kMoeHCodes, static_cast<size_t>(s * inter));
  float* hs = workspace_as<float>(Ws::kMoeHScales, static_cast<size_t>(s * inter / 32));
  dense::quantize_activation(x.f32(), s, d, xc, xs);
  dense::fp8_gemv(xc, xs, s, ew.w1, gate, {});
  dense::fp8_gemv(xc, xs, s, ew.w3, up, {});
  moe::swiglu_quant_rows(gate, up, s, inter, limit, hc, hs);
  Tensor y = be.alloc(TType::kF32, {s, ew.w2.rows});
  dense::fp8_gemv(hc, hs, s, ew.w2, y.f32(), {});
  return y;  // [s, D] bf16 values
}

// SwiGLU expert over the rows of x (device): gate = w1(x), up = w3(x), h = bf16(w * silu(g) * u),
// y = w2(h). `route_w` / `slots` (device, may be null) give each row's routing weight.
Tensor run_expert(CudaBackend& be, const Tensor& x, const ExpertWeights& ew, const float* route_w,
                  const int32_t* slots, float limit) {
  if (!route_w && gemv_expert_fits(be, x, ew)) return gemv_expert(be, x, ew, limit);
  Tensor gate = be.linear(x, ew.w1);  // [n, inter] bf16 values
  Tensor up = be.linear(x, ew.w3);
  DI_CHECK(gate.rows() == x.rows() && up.row_size() == gate.row_size());
  cuda::moe::swiglu(gate.f32(), up.f32(), gate.rows(), gate.row_size(), route_w, slots, limit);
  return be.linear(gate, ew.w2);  // [n, D] bf16 values
}

// The Engram table's E8M0 scales are one row per table row ([rows, hd/32]), but prepare() uploads
// ceil(rows/32) scale rows (the FP8 block-weight layout), so the device copy of the table's scales
// is incomplete. Until Weight records its scale rows, the full scales are uploaded here once per
// prepared table, keyed by its device allocation (a weak reference notices a freed / reused one).
const uint8_t* table_row_scales(const Weight& t) {
  struct Entry {
    std::weak_ptr<void> owner;
    std::shared_ptr<void> scales;
  };
  static std::mutex mu;
  static std::unordered_map<const void*, Entry> cache;
  DI_CHECK_MSG(t.device != nullptr && t.scale != nullptr, "engram table was not prepared on the CUDA backend");
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(t.device.get());
  if (it != cache.end()) {
    std::shared_ptr<void> owner = it->second.owner.lock();
    if (owner && owner.get() == t.device.get()) return static_cast<const uint8_t*>(it->second.scales.get());
  }
  for (auto i = cache.begin(); i != cache.end();) i = i->second.owner.expired() ? cache.erase(i) : std::next(i);
  const size_t bytes = static_cast<size_t>(t.rows * t.scale_cols);
  void* p = nullptr;
  if (cudaMalloc(&p, bytes) != cudaSuccess)
    throw Error("GPU out of memory allocating " + std::to_string(bytes) + " bytes of Engram table scales");
  std::shared_ptr<void> dev(p, [](void* q) { cudaFree(q); });
  DI_CUDA_CHECK(cudaMemcpy(p, t.scale, bytes, cudaMemcpyHostToDevice));
  cache[t.device.get()] = Entry{t.device, dev};
  return static_cast<const uint8_t*>(p);
}

}  // namespace

Tensor CudaBackend::router_logits(const Tensor& x, const Weight& gate) {
  const int64_t s = x.rows(), d = x.row_size(), n_exp = gate.rows;
  DI_CHECK(gate.cols == d);
  Tensor logits = alloc(TType::kF32, {s, n_exp});  // fp32, as the CPU's kF32 gate linear
  cuda::moe::router_logits(x.f32(), cuda::wdata(gate), gate.dtype, s, n_exp, d, logits.f32());
  return logits;
}

MoeRoute CudaBackend::moe_route(const Tensor& x, const Weight& gate, const Weight& bias, int top_k, float route_scale,
                                float gate_temp) {
  const int64_t s = x.rows(), n_exp = gate.rows;
  DI_CHECK(bias.rows * bias.cols == n_exp);
  MoeRoute route{alloc(TType::kF32, {s, top_k}), alloc(TType::kI32, {s, top_k})};
  const Tensor logits = router_logits(x, gate);
  cuda::moe::router_select(logits.f32(), cuda::wdata(bias), bias.dtype, s, n_exp, top_k, route_scale, gate_temp,
                           route.weights.f32(), route.experts.i32());
  return route;
}

namespace {

// True when every routed expert is an MXFP4 SwiGLU expert of one shape (w1, w3 [inter, d], w2
// [d, inter], per-row scales): the grouped path's precondition.
bool uniform_fp4_experts(const std::vector<ExpertWeights>& experts, int64_t d) {
  if (experts.empty()) return false;
  const int64_t inter = experts[0].w1.rows;
  if (inter <= 0 || inter % 32 != 0 || d % 32 != 0) return false;
  auto ok = [](const Weight& w, int64_t rows, int64_t cols) {
    return w.mode == WeightMode::kFp4Expert && w.rows == rows && w.cols == cols && w.scale_cols == cols / 32 &&
           (w.scale_rows == 0 || w.scale_rows == rows) && w.device != nullptr;
  };
  for (const ExpertWeights& e : experts)
    if (!ok(e.w1, inter, d) || !ok(e.w3, inter, d) || !ok(e.w2, d, inter)) return false;
  return true;
}

// The grouped path's per-call inputs in the persistent workspace: the routing lists of S*k entries
// over E experts, and x [S, d] quantized to FP8 (codes, scales).
struct GroupedInputs {
  cuda::moe::RouteLists lists;
  uint8_t* xc;
  float* xs;
};

GroupedInputs grouped_inputs(int64_t s, int64_t d, int64_t n_exp, int64_t k) {
  using namespace cuda;
  const int64_t n = s * k;
  int32_t* li = workspace_as<int32_t>(Ws::kMoeLists, static_cast<size_t>(2 * n_exp + 2 + 4 * n));
  const moe::RouteLists lists{li, li + n_exp + 1, li + 2 * n_exp + 1, li + 2 * n_exp + 2,
                              li + 2 * n_exp + 2 + n, li + 2 * n_exp + 2 + 2 * n, li + 2 * n_exp + 2 + 3 * n};
  return {lists, workspace_as<uint8_t>(Ws::kMoeXCodes, static_cast<size_t>(s * d)),
          workspace_as<float>(Ws::kMoeXScales, static_cast<size_t>(s * d / 32))};
}

// Device tables of the experts' weight pointers ([w1 | w3 | w2] x E), uploaded once per expert set
// (keyed by the vector's storage, re-uploaded when any pointer changed).
const uint8_t* const* expert_tables(const std::vector<ExpertWeights>& experts) {
  struct Entry {
    std::vector<const uint8_t*> ptrs;
    std::shared_ptr<void> dev;
  };
  static std::mutex mu;
  static std::unordered_map<const ExpertWeights*, Entry> cache;
  const size_t n = experts.size();
  std::vector<const uint8_t*> ptrs(3 * n);
  for (size_t e = 0; e < n; ++e) {
    ptrs[e] = cuda::wdata(experts[e].w1);
    ptrs[n + e] = cuda::wdata(experts[e].w3);
    ptrs[2 * n + e] = cuda::wdata(experts[e].w2);
  }
  std::lock_guard<std::mutex> lock(mu);
  Entry& entry = cache[experts.data()];
  if (entry.ptrs != ptrs) {
    void* p = nullptr;
    if (cudaMalloc(&p, ptrs.size() * sizeof(void*)) != cudaSuccess)
      throw Error("GPU out of memory allocating the expert weight tables");
    entry.dev = std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
    DI_CUDA_CHECK(cudaMemcpy(p, ptrs.data(), ptrs.size() * sizeof(void*), cudaMemcpyHostToDevice));
    entry.ptrs = std::move(ptrs);
  }
  return static_cast<const uint8_t* const*>(entry.dev.get());
}

}  // namespace

Tensor CudaBackend::moe_experts(const Tensor& x, const MoeRoute& route, const std::vector<ExpertWeights>& experts,
                                const ExpertWeights& shared, float swiglu_limit) {
  const int64_t s = x.rows(), d = x.row_size(), k = route.experts.row_size();
  const int64_t n_exp = static_cast<int64_t>(experts.size());
  DI_CHECK(route.experts.rows() == s && route.weights.rows() == s && route.weights.row_size() == k);
  if (s == 0) return alloc(TType::kF32, {0, d});
  if (!uniform_fp4_experts(experts, d)) return moe_experts_listed(x, route, experts, shared, swiglu_limit);
  // the shared expert needs x alone: side work beside the routed experts
  const Tensor ys = run_beside(*this, [&] { return run_expert(*this, x, shared, nullptr, nullptr, swiglu_limit); });
  return moe_experts_grouped(x, route, experts, ys, swiglu_limit);
}

Tensor CudaBackend::moe(const Tensor& x, const Weight& gate, const Weight& bias, int top_k, float route_scale,
                        float gate_temp, const std::vector<ExpertWeights>& experts, const ExpertWeights& shared,
                        float swiglu_limit) {
  if (x.rows() == 0 || !uniform_fp4_experts(experts, x.row_size()))
    return Backend::moe(x, gate, bias, top_k, route_scale, gate_temp, experts, shared, swiglu_limit);
  // the shared expert needs x alone: side work beside the router and the routed experts
  const Tensor ys = run_beside(*this, [&] { return run_expert(*this, x, shared, nullptr, nullptr, swiglu_limit); });
  const int64_t s = x.rows(), n_exp = gate.rows;
  if (!cuda::moe::route_fused_fits(s, n_exp) || static_cast<int64_t>(experts.size()) != n_exp) {
    const MoeRoute route = moe_route(x, gate, bias, top_k, route_scale, gate_temp);
    return moe_experts_grouped(x, route, experts, ys, swiglu_limit);
  }
  // small batch: selection, routing lists and the quantized input in one launch
  DI_CHECK(bias.rows * bias.cols == n_exp);
  MoeRoute route{alloc(TType::kF32, {s, top_k}), alloc(TType::kI32, {s, top_k})};
  const Tensor logits = router_logits(x, gate);
  const GroupedInputs in = grouped_inputs(s, x.row_size(), n_exp, top_k);
  cuda::moe::route_fused(logits.f32(), cuda::wdata(bias), bias.dtype, s, n_exp, top_k, route_scale, gate_temp,
                         route.weights.f32(), route.experts.i32(), in.lists, x.f32(), x.row_size(), in.xc, in.xs);
  return moe_experts_grouped(x, route, experts, ys, swiglu_limit, true);
}

Tensor CudaBackend::moe_experts_grouped(const Tensor& x, const MoeRoute& route,
                                        const std::vector<ExpertWeights>& experts, const Tensor& ys,
                                        float swiglu_limit, bool inputs_ready) {
  const int64_t s = x.rows(), d = x.row_size(), k = route.experts.row_size();
  const int64_t n_exp = static_cast<int64_t>(experts.size());
  DI_CHECK(route.experts.rows() == s && route.weights.rows() == s && route.weights.row_size() == k);

  // Grouped path: routing lists on the device, one launch per projection for all active experts.
  using namespace cuda;
  const int64_t n = s * k, inter = experts[0].w1.rows;
  DI_CHECK_MSG(n * std::max(d, inter) < (1LL << 31), "moe_experts: too many rows");
  const uint8_t* const* tables = expert_tables(experts);
  const GroupedInputs in = grouped_inputs(s, d, n_exp, k);
  const moe::RouteLists& lists = in.lists;
  uint8_t* xc = in.xc;
  float* xs = in.xs;
  if (!inputs_ready) {
    moe::route_lists(route.experts.i32(), s, static_cast<int>(k), n_exp, lists);
    dense::quantize_activation(x.f32(), s, d, xc, xs);
  }
  const int slots = static_cast<int>(std::min(n_exp, n));
  // Token tile from an expert's expected entries (uniform routing: n / E; x3 + 4 covers the usual
  // spread), not from S: a wider tile than its entries costs registers and pipeline depth on every
  // CTA, a narrower one only an extra pass (weights from L2) on the few experts past it.
  const int nt = dense::nt_for(std::min<int64_t>(s, 3 * ((n + n_exp - 1) / n_exp) + 4));
  const moe::GroupedSplitMode split_mode{batch_invariant_, std::min(n_exp, k), fast_fp4_gemm_};

  // gate and up: [n, inter] each, rows in sorted-entry order
  float* gate = workspace_as<float>(Ws::kMoeGate, static_cast<size_t>(n * inter));
  float* up = workspace_as<float>(Ws::kMoeUp, static_cast<size_t>(n * inter));
  moe::GroupedArgs a1{xc, xs, lists.tok_of, lists, static_cast<int>((inter + mma::kCtaRows - 1) / mma::kCtaRows),
                      static_cast<int>(inter), static_cast<int>(d), static_cast<int>(n)};
  moe::grouped_fp4_gemm(a1, tables, gate, tables + n_exp, up, slots, nt, split_mode);

  // h = SwiGLU x routing weight, FP8-quantized for the down projection
  uint8_t* hc = workspace_as<uint8_t>(Ws::kMoeHCodes, static_cast<size_t>(n * inter));
  float* hs = workspace_as<float>(Ws::kMoeHScales, static_cast<size_t>(n * inter / 32));
  moe::swiglu_quant(gate, up, lists, n_exp, route.weights.f32(), n, inter, swiglu_limit, hc, hs);

  float* down = workspace_as<float>(Ws::kMoeDown, static_cast<size_t>(n * d));
  moe::GroupedArgs a2{hc, hs, nullptr, lists, static_cast<int>((d + mma::kCtaRows - 1) / mma::kCtaRows),
                      static_cast<int>(d), static_cast<int>(inter), static_cast<int>(n)};
  moe::grouped_fp4_gemm(a2, tables + 2 * n_exp, down, nullptr, nullptr, slots, nt, split_mode);

  side_join();  // the shared expert's output
  DI_CHECK(ys.rows() == s && ys.row_size() == d);
  Tensor out = alloc(TType::kF32, {s, d});
  moe::combine(down, lists.order, static_cast<int>(k), ys.f32(), s, d, out.f32());
  return out;
}

// Fallback for expert sets the grouped path does not take (mixed formats or shapes): the routing
// comes to the host once and each expert runs through linear().
Tensor CudaBackend::moe_experts_listed(const Tensor& x, const MoeRoute& route, const std::vector<ExpertWeights>& experts,
                                       const ExpertWeights& shared, float swiglu_limit) {
  const int64_t s = x.rows(), d = x.row_size(), k = route.experts.row_size();
  const int64_t n_exp = static_cast<int64_t>(experts.size());
  const std::vector<int32_t> ids = to_host_i32(route.experts);  // [S, k]
  std::vector<int64_t> count(n_exp + 1, 0);
  for (int32_t e : ids)
    if (e >= 0 && e < n_exp) ++count[e + 1];
  for (int64_t e = 0; e < n_exp; ++e) count[e + 1] += count[e];  // now offsets
  const int64_t total = count[n_exp];
  // [rows | slots]: per expert in id order, its tokens in token order (as the CPU), and each
  // token's slot r*k+j in route.weights.
  std::vector<int32_t> lists(2 * total);
  std::vector<int64_t> fill(count.begin(), count.end() - 1);
  for (int64_t r = 0; r < s; ++r)
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = ids[r * k + j];
      if (e < 0 || e >= n_exp) continue;
      const int64_t at = fill[e]++;
      lists[at] = static_cast<int32_t>(r);
      lists[total + at] = static_cast<int32_t>(r * k + j);
    }

  Tensor acc = zeros(TType::kF32, {s, d});  // fp32 sum over experts, per token in expert id order
  if (total > 0) {
    Tensor dev_lists = from_host_i32(lists, {2 * total});
    const int32_t* rows = dev_lists.i32();
    const int32_t* slots = dev_lists.i32() + total;
    for (int64_t e = 0; e < n_exp; ++e) {
      const int64_t n = count[e + 1] - count[e];
      if (n == 0) continue;
      Tensor xe = alloc(TType::kF32, {n, d});
      cuda::moe::gather_rows(x.f32(), rows + count[e], n, d, xe.f32());
      Tensor ye = run_expert(*this, xe, experts[e], route.weights.f32(), slots + count[e], swiglu_limit);
      DI_CHECK(ye.rows() == n && ye.row_size() == d);
      cuda::moe::scatter_add_rows(acc.f32(), ye.f32(), rows + count[e], n, d);
    }
  }
  Tensor ys = run_expert(*this, x, shared, nullptr, nullptr, swiglu_limit);
  DI_CHECK(ys.rows() == s && ys.row_size() == d);
  Tensor out = alloc(TType::kF32, {s, d});
  cuda::moe::add_round_bf16(acc.f32(), ys.f32(), s * d, out.f32());
  return out;
}

Tensor CudaBackend::engram_lookup(const Tensor& cols, const Weight& table) {
  const int64_t s = cols.rows(), n = cols.row_size(), hd = table.cols;
  DI_CHECK(cols.type == TType::kI32 && table.dtype == DType::kF8E4M3 && table.scale_cols == hd / 32);
  Tensor out = alloc(TType::kF32, {s, n * hd});
  if (s * n == 0) return out;
  cuda::moe::engram_lookup(cols.i32(), s * n, cuda::wdata(table), table_row_scales(table), table.rows, hd, out.f32());
  return out;
}

Tensor CudaBackend::engram_inject(const Tensor& x, const Tensor& kv, const Weight& q_weight, const Weight& k_weight,
                                  int hc, float eps) {
  const int64_t s = x.rows(), d = x.row_size() / hc;
  DI_CHECK(kv.rows() == s && kv.row_size() == (hc + 1) * d);
  DI_CHECK(q_weight.rows * q_weight.cols == hc * d && k_weight.rows * k_weight.cols == hc * d);
  DI_CHECK_MSG(q_weight.dtype == k_weight.dtype, "engram_inject: q_weight and k_weight dtypes differ");
  Tensor out = alloc(TType::kF32, {s, hc * d});
  cuda::moe::engram_inject(x.f32(), kv.f32(), cuda::wdata(q_weight), cuda::wdata(k_weight), q_weight.dtype, s, hc, d,
                           eps, out.f32(), wide_inject_);
  return out;
}

}  // namespace di
