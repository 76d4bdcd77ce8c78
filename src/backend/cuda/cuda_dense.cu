// CUDA backend ops (placeholder definitions until the kernels land).
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.cuh"

namespace di {

Tensor CudaBackend::embed(const Tensor&, const Weight&) { throw Error("cuda op embed: not implemented yet"); }
Tensor CudaBackend::linear(const Tensor&, const Weight&) { throw Error("cuda op linear: not implemented yet"); }
Tensor CudaBackend::grouped_linear(const Tensor&, const Weight&, int) { throw Error("cuda op grouped_linear: not implemented yet"); }
Tensor CudaBackend::rmsnorm(const Tensor&, const Weight&, float) { throw Error("cuda op rmsnorm: not implemented yet"); }
void CudaBackend::rope(Tensor&, int, int, int, const std::vector<int64_t>&, const RopeTable&, bool) { throw Error("cuda op rope: not implemented yet"); }
void CudaBackend::round_bf16(Tensor&) { throw Error("cuda op round_bf16: not implemented yet"); }
void CudaBackend::scale_bf16(Tensor&, float) { throw Error("cuda op scale_bf16: not implemented yet"); }
void CudaBackend::qdq(Tensor&, RowFormat) { throw Error("cuda op qdq: not implemented yet"); }
void CudaBackend::pack_rows(const Tensor&, RowFormat, Tensor&, const std::vector<int64_t>&) { throw Error("cuda op pack_rows: not implemented yet"); }
Tensor CudaBackend::unpack_rows(const Tensor&, RowFormat, int64_t, const std::vector<int64_t>&) { throw Error("cuda op unpack_rows: not implemented yet"); }

}  // namespace di
