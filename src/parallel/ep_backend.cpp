#include "parallel/ep_backend.h"

#include "core/error.h"

namespace di::parallel {

EpBackend::EpBackend(Backend& inner, Communicator& comm, const std::vector<ExpertPlacement>& placements)
    : inner_(inner) {
  for (const ExpertPlacement& p : placements) ep_[p.n_experts] = std::make_unique<EpMoe>(inner, comm, p);
}

EpMoe& EpBackend::ep_for(int n_experts) {
  auto it = ep_.find(n_experts);
  if (it == ep_.end())
    throw Error("EpBackend: no expert placement for a layer of " + std::to_string(n_experts) + " routed experts");
  return *it->second;
}

Tensor EpBackend::moe_experts(const Tensor& x, const MoeRoute& route, const std::vector<ExpertWeights>& experts,
                              const ExpertWeights& shared, float swiglu_limit) {
  ++moe_calls_;
  MoeLayerRef layer;
  layer.experts = &experts;
  layer.shared = &shared;
  layer.top_k = x.rows() > 0 ? static_cast<int>(route.experts.row_size()) : 0;
  layer.swiglu_limit = swiglu_limit;
  return ep_for(static_cast<int>(experts.size())).forward_routed(layer, x, route);
}

void EpBackend::idle_forward(const ModelWeights& weights, int n_layers, float swiglu_limit) {
  DI_CHECK(n_layers >= 0 && static_cast<size_t>(n_layers) <= weights.layers.size());
  for (int l = 0; l < n_layers; ++l) {
    const LayerWeights& lw = weights.layers[static_cast<size_t>(l)];
    moe_experts(Tensor{TType::kF32, {0, lw.shared.w2.rows}, nullptr, nullptr}, MoeRoute{}, lw.experts, lw.shared,
                swiglu_limit);
  }
}

}  // namespace di::parallel
