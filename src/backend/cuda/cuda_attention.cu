// CUDA backend ops (placeholder definitions until the kernels land).
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.cuh"

namespace di {

Tensor CudaBackend::hc_mixes(const Tensor&, int, const Weight&, const Weight&, const Weight&, float, int, float) { throw Error("cuda op hc_mixes: not implemented yet"); }
Tensor CudaBackend::hc_pre(const Tensor&, const Tensor&, int) { throw Error("cuda op hc_pre: not implemented yet"); }
Tensor CudaBackend::hc_post(const Tensor&, const Tensor&, const Tensor&, int) { throw Error("cuda op hc_post: not implemented yet"); }
Tensor CudaBackend::stream_mean(const Tensor&, int) { throw Error("cuda op stream_mean: not implemented yet"); }
Tensor CudaBackend::sparse_attention(const Tensor&, int, const Tensor&, const Tensor&, const Weight&, float) { throw Error("cuda op sparse_attention: not implemented yet"); }
Tensor CudaBackend::softmax_pool(const Tensor&, const Tensor&, int) { throw Error("cuda op softmax_pool: not implemented yet"); }
Tensor CudaBackend::index_scores(const Tensor&, int, const Tensor&, const Tensor&, const std::vector<int64_t>&) { throw Error("cuda op index_scores: not implemented yet"); }
Tensor CudaBackend::select_candidates(const Tensor&, const std::vector<int64_t>&, int, int, TieBreak) { throw Error("cuda op select_candidates: not implemented yet"); }
void CudaBackend::mask_scores(Tensor&, const Tensor&) { throw Error("cuda op mask_scores: not implemented yet"); }
Tensor CudaBackend::topk_indices(const Tensor&, int, const std::vector<int64_t>&, int, TieBreak) { throw Error("cuda op topk_indices: not implemented yet"); }

}  // namespace di
