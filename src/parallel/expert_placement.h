// Which rank holds which routed experts (expert parallelism). Each rank has the same number of
// expert slots; an expert fills one slot on each rank that holds a replica of it. Without redundancy
// every expert has one replica (contiguous blocks of ids per rank); with redundancy (EPLB-style) the
// hottest experts by measured load get extra replicas on other ranks and replicas are packed so the
// ranks' expected loads even out. A routed token-expert pair picks its replica from its own origin
// rank and row only, so the choice is deterministic and never depends on the other requests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace di::parallel {

struct ExpertPlacement {
  int n_experts = 0;
  int world_size = 0;
  std::vector<std::vector<int>> replicas;  // [n_experts] ranks holding the expert, ascending
  std::vector<std::vector<int>> slots;     // [world_size] expert ids in a rank's slots, ascending

  int slots_per_rank() const { return slots.empty() ? 0 : static_cast<int>(slots[0].size()); }
  int n_redundant() const { return world_size * slots_per_rank() - n_experts; }
  bool holds(int rank, int expert) const;
  // The rank that runs routed pair (origin rank, origin row, top-k slot) of `expert`.
  int replica_for(int expert, int origin_rank, int64_t origin_row, int slot) const;
  // Throws di::Error naming the first inconsistency (every expert held, equal slots, no duplicates).
  void validate() const;
  std::string describe() const;  // one line per rank
};

// Expert e on rank e / (n_experts / world_size). n_experts must be a multiple of world_size.
ExpertPlacement uniform_placement(int n_experts, int world_size);

// EPLB-style: `loads` [n_experts] (e.g. routed tokens per expert over a window of steps).
// n_redundant extra replicas go one at a time to the expert with the largest load per replica;
// replicas are then placed heaviest first on the least-loaded rank with a free slot that does not
// already hold that expert (ties: lowest rank). (n_experts + n_redundant) must be a multiple of
// world_size and n_redundant <= n_experts * (world_size - 1).
ExpertPlacement balanced_placement(const std::vector<int64_t>& loads, int world_size, int n_redundant);

// Expected load per rank when each expert's load splits evenly over its replicas.
std::vector<double> rank_loads(const ExpertPlacement& placement, const std::vector<int64_t>& loads);

}  // namespace di::parallel
