// One rank's MoE sublayer under expert parallelism (attention data parallel: each rank brings its
// own rows). Route locally -> all-to-all the routed pairs to the ranks holding their experts ->
// grouped experts there -> all-to-all the outputs back -> combine in the single-rank op's order
// (ep_plan.h). The router and the shared expert run on every rank over its own rows.
//
// Built on the Backend op contract: the experts run through moe_experts with one routed pair per
// row and a zero shared expert, which yields each pair's weighted expert output exactly (those are
// bf16 values: `linear` rounds its output, and adding the zero shared expert's exact 0 changes
// nothing). Exchanges copy host vectors, so this runs with the CPU backend over any Communicator that
// takes host memory (the thread one; NCCL stages host buffers). A device-resident GPU path (gather /
// scatter kernels, device-side counts) is described in docs/multi_gpu.md and not written yet.
#pragma once

#include <vector>

#include "backend/backend.h"
#include "parallel/communicator.h"
#include "parallel/ep_plan.h"
#include "parallel/expert_placement.h"

namespace di::parallel {

struct MoeLayerRef {
  const Weight* gate = nullptr;                    // [n_experts, D]
  const Weight* gate_bias = nullptr;               // [n_experts]
  const std::vector<ExpertWeights>* experts = nullptr;  // [n_experts] by global id; a rank uses its slots only
  const ExpertWeights* shared = nullptr;
  int top_k = 0;
  float route_scale = 1, gate_temp = 1, swiglu_limit = 0;
};

struct EpStepStats {
  int64_t rows = 0;            // this rank's rows
  int64_t pairs_sent = 0;      // routed pairs leaving for other ranks
  int64_t pairs_local = 0;     // routed pairs run on this rank for its own rows
  int64_t pairs_received = 0;  // routed pairs run here for any rank (local included)
};

class EpMoe {
 public:
  EpMoe(Backend& backend, Communicator& comm, ExpertPlacement placement);

  // x [S, D] f32 (S may be 0) -> [S, D] bf16, equal to Model::moe on the same rows.
  Tensor forward(const MoeLayerRef& layer, const Tensor& x);
  // Same with a given route (weights / experts [S, k]), e.g. random routing in tests.
  Tensor forward_routed(const MoeLayerRef& layer, const Tensor& x, const MoeRoute& route);

  const ExpertPlacement& placement() const { return placement_; }
  const EpStepStats& last_stats() const { return stats_; }

 private:
  // Weighted output of each received pair: rows [R, D], experts / weights [R] -> [R, D].
  std::vector<float> run_pairs(const MoeLayerRef& layer, const std::vector<float>& rows,
                               const std::vector<int32_t>& experts, const std::vector<float>& weights, int64_t dim);
  const ExpertWeights& zero_shared(const ExpertWeights& like);

  Backend& be_;
  Communicator& comm_;
  ExpertPlacement placement_;
  EpStepStats stats_;
  // A shared expert of zeros with the real one's shapes and modes (its output is exactly 0).
  ExpertWeights zero_shared_;
  std::vector<std::vector<uint8_t>> zero_bytes_;
};

}  // namespace di::parallel
