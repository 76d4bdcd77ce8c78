// The arithmetic of one expert-parallel MoE step, apart from any transport or backend:
//  - dispatch: which of a rank's routed (row, expert) pairs go to which rank (the expert placement
//    picks the replica), in what order, and the send counts;
//  - receive: the received pairs grouped by expert (the order a grouped expert GEMM wants) and the
//    permutation back;
//  - combine: each row's returned expert outputs summed in ascending expert id -- the order of the
//    single-rank op -- plus the shared expert, rounded to bf16 once, so the result is bit-identical
//    to the single-rank MoE whatever the rank count, placement or replica choice.
#pragma once

#include <cstdint>
#include <vector>

#include "parallel/expert_placement.h"

namespace di::parallel {

struct DispatchPlan {
  int world_size = 0;
  // The pairs to send, ordered by destination rank, then by (row, top-k slot).
  std::vector<int32_t> send_row;     // [P] origin row
  std::vector<int32_t> send_expert;  // [P] global expert id
  std::vector<float> send_weight;    // [P] routing weight (applied by the expert, before w2)
  std::vector<int64_t> send_counts;  // [world] pairs per destination rank
  // Row r's returned outputs are at combine_index[combine_offsets[r] .. combine_offsets[r + 1]) of
  // the returned buffer (which comes back in send order), in ascending expert id.
  std::vector<int64_t> combine_offsets;  // [rows + 1]
  std::vector<int32_t> combine_index;    // [P]
};

// experts, weights: [rows, top_k] from the router (expert id < 0: no expert, skipped).
DispatchPlan plan_dispatch(const ExpertPlacement& placement, int rank, const int32_t* experts, const float* weights,
                           int64_t rows, int top_k);

// Receive counts of `rank` from the all-gathered send counts ([world][world], row = sender).
std::vector<int64_t> recv_counts_of(const std::vector<int64_t>& count_matrix, int world_size, int rank);

struct ExpertGroups {
  std::vector<int32_t> order;    // [R] received pair indices grouped by ascending expert id (stable)
  std::vector<int32_t> experts;  // [G] the distinct expert ids, ascending
  std::vector<int64_t> offsets;  // [G + 1] group g = order[offsets[g] .. offsets[g + 1])
};
ExpertGroups group_by_expert(const std::vector<int32_t>& recv_expert);

// out[r] = bf16(sum over row r's returned outputs in combine order + shared[r]) for r < rows.
// returned [P, dim] in send order, shared [rows, dim]; out [rows, dim]. All f32.
void combine_rows(const DispatchPlan& plan, const float* returned, const float* shared, int64_t rows, int64_t dim,
                  float* out);

}  // namespace di::parallel
