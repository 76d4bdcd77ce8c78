// CUDA backend ops (placeholder definitions until the kernels land).
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.cuh"

namespace di {

MoeRoute CudaBackend::moe_route(const Tensor&, const Weight&, const Weight&, int, float, float) { throw Error("cuda op moe_route: not implemented yet"); }
Tensor CudaBackend::moe_experts(const Tensor&, const MoeRoute&, const std::vector<ExpertWeights>&, const ExpertWeights&, float) { throw Error("cuda op moe_experts: not implemented yet"); }
Tensor CudaBackend::engram_lookup(const Tensor&, const Weight&) { throw Error("cuda op engram_lookup: not implemented yet"); }
Tensor CudaBackend::engram_inject(const Tensor&, const Tensor&, const Weight&, const Weight&, int, float) { throw Error("cuda op engram_inject: not implemented yet"); }

}  // namespace di
