// The NCCL transport of the Communicator (one process per GPU; implemented in
// src/backend/cuda/nccl_communicator.cu, linked only into the CUDA build). Declared without CUDA
// types so CPU-only code can ask for it and get a clear error.
//
// Buffers may be device memory (used in place) or host memory (staged through the device, so the
// host-memory EP layer of ep_moe.h runs unchanged over NCCL). Every call runs on the communicator's
// own stream and returns when the transfer is complete (v1: no overlap with compute yet).
#pragma once

#include <memory>
#include <vector>

#include "parallel/bootstrap.h"
#include "parallel/communicator.h"

namespace di::parallel {

// CUDA devices visible to this process; 0 in a build without CUDA.
int cuda_device_count();

// One rank of a multi-process job: picks its GPU (config.local_rank, else rank % devices), gets
// NCCL's unique id from rank 0 through bootstrap_broadcast and joins the group.
std::unique_ptr<Communicator> make_nccl_communicator(const BootstrapConfig& config);

// All ranks in this process, rank r on GPU r (ncclCommInitAll), for tests with threads as ranks
// on one multi-GPU machine. Each communicator selects its device on every call.
std::vector<std::unique_ptr<Communicator>> make_nccl_group(int world_size);

}  // namespace di::parallel
