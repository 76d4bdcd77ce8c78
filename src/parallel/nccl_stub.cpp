// nccl_communicator.h for builds without the CUDA backend (CUDA builds: src/backend/cuda/nccl_communicator.cu).
#ifndef DEEPINFER_HAVE_CUDA

#include "core/error.h"
#include "parallel/nccl_communicator.h"

namespace di::parallel {

int cuda_device_count() { return 0; }

std::unique_ptr<Communicator> make_nccl_communicator(const BootstrapConfig&) {
  throw Error("multi-GPU (NCCL): this build has no CUDA backend (configure with -DDEEPINFER_CUDA=ON)");
}

std::vector<std::unique_ptr<Communicator>> make_nccl_group(int) {
  throw Error("multi-GPU (NCCL): this build has no CUDA backend (configure with -DDEEPINFER_CUDA=ON)");
}

}  // namespace di::parallel

#endif
