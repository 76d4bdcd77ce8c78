#include "parallel/ep_plan.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "model/quant.h"

namespace di::parallel {

DispatchPlan plan_dispatch(const ExpertPlacement& placement, int rank, const int32_t* experts, const float* weights,
                           int64_t rows, int top_k) {
  const int world = placement.world_size;
  DispatchPlan plan;
  plan.world_size = world;
  plan.send_counts.assign(static_cast<size_t>(world), 0);
  // Destination of every pair, counted per rank; then a stable counting sort by destination.
  std::vector<int32_t> dest(static_cast<size_t>(rows * top_k), -1);
  for (int64_t r = 0; r < rows; ++r)
    for (int j = 0; j < top_k; ++j) {
      const int32_t e = experts[r * top_k + j];
      if (e < 0) continue;
      if (e >= placement.n_experts)
        throw Error("plan_dispatch: row " + std::to_string(r) + " routes to expert " + std::to_string(e) +
                    ", the placement has " + std::to_string(placement.n_experts));
      const int d = placement.replica_for(e, rank, r, j);
      dest[static_cast<size_t>(r * top_k + j)] = d;
      ++plan.send_counts[static_cast<size_t>(d)];
    }
  std::vector<int64_t> next(static_cast<size_t>(world), 0);
  for (int d = 1; d < world; ++d) next[d] = next[d - 1] + plan.send_counts[d - 1];
  const int64_t n_pairs = std::accumulate(plan.send_counts.begin(), plan.send_counts.end(), int64_t{0});
  plan.send_row.resize(static_cast<size_t>(n_pairs));
  plan.send_expert.resize(static_cast<size_t>(n_pairs));
  plan.send_weight.resize(static_cast<size_t>(n_pairs));
  std::vector<int64_t> pos(static_cast<size_t>(rows * top_k), -1);  // pair -> index in the send buffer
  for (int64_t r = 0; r < rows; ++r)
    for (int j = 0; j < top_k; ++j) {
      const int32_t d = dest[static_cast<size_t>(r * top_k + j)];
      if (d < 0) continue;
      const int64_t i = next[d]++;
      plan.send_row[i] = static_cast<int32_t>(r);
      plan.send_expert[i] = experts[r * top_k + j];
      plan.send_weight[i] = weights[r * top_k + j];
      pos[static_cast<size_t>(r * top_k + j)] = i;
    }
  // Combine order: per row, its pairs by ascending expert id (ties: slot order).
  plan.combine_offsets.assign(static_cast<size_t>(rows + 1), 0);
  plan.combine_index.reserve(static_cast<size_t>(n_pairs));
  std::vector<int> slots(static_cast<size_t>(top_k));
  for (int64_t r = 0; r < rows; ++r) {
    std::iota(slots.begin(), slots.end(), 0);
    const int32_t* er = experts + r * top_k;
    std::stable_sort(slots.begin(), slots.end(), [&](int a, int b) { return er[a] < er[b]; });
    for (int j : slots)
      if (pos[static_cast<size_t>(r * top_k + j)] >= 0)
        plan.combine_index.push_back(static_cast<int32_t>(pos[static_cast<size_t>(r * top_k + j)]));
    plan.combine_offsets[static_cast<size_t>(r + 1)] = static_cast<int64_t>(plan.combine_index.size());
  }
  return plan;
}

std::vector<int64_t> recv_counts_of(const std::vector<int64_t>& count_matrix, int world_size, int rank) {
  DI_CHECK(static_cast<int64_t>(count_matrix.size()) == static_cast<int64_t>(world_size) * world_size);
  std::vector<int64_t> out(static_cast<size_t>(world_size));
  for (int src = 0; src < world_size; ++src) out[src] = count_matrix[static_cast<size_t>(src * world_size + rank)];
  return out;
}

ExpertGroups group_by_expert(const std::vector<int32_t>& recv_expert) {
  ExpertGroups g;
  g.order.resize(recv_expert.size());
  std::iota(g.order.begin(), g.order.end(), 0);
  std::stable_sort(g.order.begin(), g.order.end(), [&](int32_t a, int32_t b) { return recv_expert[a] < recv_expert[b]; });
  g.offsets.push_back(0);
  for (size_t i = 0; i < g.order.size(); ++i) {
    const int32_t e = recv_expert[g.order[i]];
    if (g.experts.empty() || g.experts.back() != e) {
      if (!g.experts.empty()) g.offsets.push_back(static_cast<int64_t>(i));
      g.experts.push_back(e);
    }
  }
  if (!g.experts.empty()) g.offsets.push_back(static_cast<int64_t>(g.order.size()));
  return g;
}

void combine_rows(const DispatchPlan& plan, const float* returned, const float* shared, int64_t rows, int64_t dim,
                  float* out) {
  DI_CHECK(static_cast<int64_t>(plan.combine_offsets.size()) == rows + 1);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < dim; ++c) {
      float acc = 0.0f;  // as the single-rank op: routed outputs in expert order, then the shared expert
      for (int64_t i = plan.combine_offsets[r]; i < plan.combine_offsets[r + 1]; ++i)
        acc += returned[static_cast<int64_t>(plan.combine_index[i]) * dim + c];
      out[r * dim + c] = quant::round_bf16(acc + shared[r * dim + c]);
    }
}

}  // namespace di::parallel
