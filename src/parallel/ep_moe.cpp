#include "parallel/ep_moe.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/error.h"

namespace di::parallel {

EpMoe::EpMoe(Backend& backend, Communicator& comm, ExpertPlacement placement)
    : be_(backend), comm_(comm), placement_(std::move(placement)) {
  placement_.validate();
  if (placement_.world_size != comm_.world_size())
    throw Error("EpMoe: the placement is for " + std::to_string(placement_.world_size) + " ranks, the group has " +
                std::to_string(comm_.world_size()));
}

const ExpertWeights& EpMoe::zero_shared(const ExpertWeights& like) {
  if (zero_shared_.w1.present() && zero_shared_.w1.rows == like.w1.rows && zero_shared_.w1.cols == like.w1.cols)
    return zero_shared_;
  zero_bytes_.clear();
  auto zero = [&](const Weight& w) {
    Weight z = w;
    z.device.reset();
    // Zero bytes are zero in every weight dtype (bf16, e4m3, e2m1 pairs) whatever the scale; 4 bytes
    // per element bounds every dtype's size.
    zero_bytes_.emplace_back(static_cast<size_t>(w.rows * w.cols * 4), 0);
    z.data = zero_bytes_.back().data();
    if (w.scale) {
      zero_bytes_.emplace_back(static_cast<size_t>(std::max<int64_t>(1, w.scale_rows * w.scale_cols)), 127);
      z.scale = zero_bytes_.back().data();
    }
    be_.prepare(z);
    return z;
  };
  zero_bytes_.reserve(6);  // the Weights point into these buffers: no reallocation
  zero_shared_ = {zero(like.w1), zero(like.w2), zero(like.w3)};
  return zero_shared_;
}

Tensor EpMoe::forward(const MoeLayerRef& layer, const Tensor& x) {
  MoeRoute route;
  if (x.rows() > 0)
    route = be_.moe_route(x, *layer.gate, *layer.gate_bias, layer.top_k, layer.route_scale, layer.gate_temp);
  return forward_routed(layer, x, route);
}

std::vector<float> EpMoe::run_pairs(const MoeLayerRef& layer, const std::vector<float>& rows,
                                    const std::vector<int32_t>& experts, const std::vector<float>& weights,
                                    int64_t dim) {
  const int64_t n = static_cast<int64_t>(experts.size());
  std::vector<float> out(static_cast<size_t>(n * dim));
  if (n == 0) return out;
  for (int32_t e : experts)
    if (!placement_.holds(comm_.rank(), e))
      throw Error("EpMoe: rank " + std::to_string(comm_.rank()) + " received a pair for expert " + std::to_string(e) +
                  ", which it does not hold");
  // Grouped by expert, as a grouped GEMM takes them; the outputs go back to the received order.
  ExpertGroups groups = group_by_expert(experts);
  std::vector<float> grouped_rows(static_cast<size_t>(n * dim)), grouped_w(static_cast<size_t>(n));
  std::vector<int32_t> grouped_e(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int32_t src = groups.order[i];
    std::memcpy(&grouped_rows[i * dim], &rows[static_cast<int64_t>(src) * dim], dim * sizeof(float));
    grouped_e[i] = experts[src];
    grouped_w[i] = weights[src];
  }
  const Weight& w2 = (*layer.experts)[static_cast<size_t>(grouped_e[0])].w2;
  DI_CHECK_MSG(w2.mode != WeightMode::kF32, "pair outputs are exact only for bf16-rounded expert outputs");
  MoeRoute route{be_.from_host_f32(grouped_w, {n, 1}), be_.from_host_i32(grouped_e, {n, 1})};
  Tensor y = be_.moe_experts(be_.from_host_f32(grouped_rows, {n, dim}), route, *layer.experts,
                             zero_shared(*layer.shared), layer.swiglu_limit);
  std::vector<float> grouped_out = be_.to_host_f32(y);
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(&out[static_cast<int64_t>(groups.order[i]) * dim], &grouped_out[i * dim], dim * sizeof(float));
  return out;
}

Tensor EpMoe::forward_routed(const MoeLayerRef& layer, const Tensor& x, const MoeRoute& route) {
  const int world = comm_.world_size(), rank = comm_.rank();
  const int64_t rows = x.rows();
  const int64_t dim = layer.shared->w2.rows;
  if (rows > 0 && x.row_size() != dim)
    throw Error("EpMoe: rows of width " + std::to_string(x.row_size()) + ", the layer has D = " + std::to_string(dim));
  // 1. Plan the dispatch of this rank's pairs.
  std::vector<int32_t> experts;
  std::vector<float> weights;
  int top_k = layer.top_k;
  if (rows > 0) {
    experts = be_.to_host_i32(route.experts);
    weights = be_.to_host_f32(route.weights);
    top_k = static_cast<int>(route.experts.row_size());
  }
  DispatchPlan plan = plan_dispatch(placement_, rank, experts.data(), weights.data(), rows, top_k);
  std::vector<int64_t> recv_counts = recv_counts_of(comm_.all_gather_host(plan.send_counts), world, rank);
  const int64_t n_send = static_cast<int64_t>(plan.send_row.size());
  const int64_t n_recv = std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0});
  stats_ = {rows, n_send - plan.send_counts[rank], plan.send_counts[rank], n_recv};

  // 2. Dispatch: the pairs' rows, expert ids and weights.
  std::vector<float> xh = rows > 0 ? be_.to_host_f32(x) : std::vector<float>{};
  std::vector<float> send_rows(static_cast<size_t>(n_send * dim));
  for (int64_t i = 0; i < n_send; ++i)
    std::memcpy(&send_rows[i * dim], &xh[static_cast<int64_t>(plan.send_row[i]) * dim], dim * sizeof(float));
  auto scaled = [dim](std::vector<int64_t> c) {
    for (int64_t& v : c) v *= dim;
    return c;
  };
  std::vector<float> recv_rows(static_cast<size_t>(n_recv * dim)), recv_w(static_cast<size_t>(n_recv));
  std::vector<int32_t> recv_e(static_cast<size_t>(n_recv));
  comm_.all_to_all_v(send_rows.data(), scaled(plan.send_counts), recv_rows.data(), scaled(recv_counts), CommType::kF32);
  comm_.all_to_all_v(plan.send_expert.data(), plan.send_counts, recv_e.data(), recv_counts, CommType::kI32);
  comm_.all_to_all_v(plan.send_weight.data(), plan.send_counts, recv_w.data(), recv_counts, CommType::kF32);

  // 3. This rank's experts over every pair it received.
  std::vector<float> recv_out = run_pairs(layer, recv_rows, recv_e, recv_w, dim);

  // 4. Combine: outputs return along the reverse route, arriving in send order.
  std::vector<float> returned(static_cast<size_t>(n_send * dim));
  comm_.all_to_all_v(recv_out.data(), scaled(recv_counts), returned.data(), scaled(plan.send_counts), CommType::kF32);
  if (rows == 0) return Tensor{TType::kF32, {0, dim}, nullptr, nullptr};
  // The shared expert alone: moe_experts with no routed pair (expert id -1 matches none).
  MoeRoute none{be_.from_host_f32(std::vector<float>(static_cast<size_t>(rows), 0.0f), {rows, 1}),
                be_.from_host_i32(std::vector<int32_t>(static_cast<size_t>(rows), -1), {rows, 1})};
  std::vector<float> shared = be_.to_host_f32(be_.moe_experts(x, none, *layer.experts, *layer.shared, layer.swiglu_limit));
  std::vector<float> out(static_cast<size_t>(rows * dim));
  combine_rows(plan, returned.data(), shared.data(), rows, dim, out.data());
  return be_.from_host_f32(out, {rows, dim});
}

}  // namespace di::parallel
