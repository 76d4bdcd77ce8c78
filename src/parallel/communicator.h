// The collectives expert parallelism needs, independent of the transport: ranks as threads of one
// process (thread_communicator.h, the CPU simulation and its tests) or one process per GPU over
// NCCL (src/backend/cuda/nccl_communicator.cu). Every call is collective: all ranks of the group
// make the same calls in the same order. Buffers are contiguous; counts are in elements.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace di::parallel {

enum class CommType : uint8_t { kF32, kI32, kI64, kU8 };

inline int64_t comm_type_bytes(CommType t) {
  switch (t) {
    case CommType::kF32: return 4;
    case CommType::kI32: return 4;
    case CommType::kI64: return 8;
    case CommType::kU8: return 1;
  }
  return 0;
}

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // Each rank sends send_counts[p] elements to rank p, taken in rank order from `send` (segment p
  // starts at the sum of the counts before it), and receives recv_counts[p] elements from rank p into
  // `recv` the same way. recv_counts[p] must equal rank p's send_counts[rank()].
  virtual void all_to_all_v(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                            const std::vector<int64_t>& recv_counts, CommType type) = 0;
  // recv [world * count] = every rank's `send` [count], in rank order.
  virtual void all_gather(const void* send, int64_t count, void* recv, CommType type) = 0;
  // data [count] = the element-wise sum over ranks, in place. The thread implementation adds in rank
  // order (deterministic); NCCL's order is its own, so the forward never all-reduces floats.
  virtual void all_reduce_sum(void* data, int64_t count, CommType type) = 0;
  virtual void barrier() = 0;

  // Control data on the host (send counts, loads): every rank's `mine` concatenated in rank order.
  // Transports over device memory stage through it.
  virtual std::vector<int64_t> all_gather_host(const std::vector<int64_t>& mine) = 0;
};

}  // namespace di::parallel
