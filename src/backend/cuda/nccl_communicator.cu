// NCCL transport of parallel::Communicator (src/parallel/nccl_communicator.h): all-to-all-v as
// grouped point-to-point sends/receives, all-gather, all-reduce; host buffers staged through
// device memory. Written against NCCL 2.x; compiled in the CUDA build, not yet run on >1 GPU.
//
// libnccl is loaded at run time (dlopen), not linked: single-GPU runs and the portable binaries
// (built for GPU machines without our dependencies) must not need it; asking for multi-GPU
// without it is a clear error.
#include "parallel/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <numeric>
#include <string>

#include "backend/cuda/dynamic_library.h"
#include "core/error.h"

namespace di::parallel {

namespace {

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("NCCL communicator: ") + what + ": " + cudaGetErrorString(e));
}

// The NCCL entry points we use, resolved from libnccl.so.2 on first use.
struct NcclApi {
  decltype(&ncclGetErrorString) get_error_string = nullptr;
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRank) comm_init_rank = nullptr;
  decltype(&ncclCommInitAll) comm_init_all = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
  decltype(&ncclSend) send = nullptr;
  decltype(&ncclRecv) recv = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
};

const NcclApi& nccl() {
  static const NcclApi api = [] {
    void* lib = cuda::open_first_library({"libnccl.so.2", "libnccl.so"});
    if (!lib)
      throw Error("multi-GPU needs NCCL: libnccl.so.2 was not found (install NCCL 2.x or add its directory to "
                  "LD_LIBRARY_PATH)");
    NcclApi a;
    auto sym = [&](auto& fn, const char* name) {
      if (!cuda::load_symbol(lib, fn, name))
        throw Error(std::string("NCCL: libnccl lacks ") + name + " (NCCL >= 2.7 needed)");
    };
    sym(a.get_error_string, "ncclGetErrorString");
    sym(a.get_unique_id, "ncclGetUniqueId");
    sym(a.comm_init_rank, "ncclCommInitRank");
    sym(a.comm_init_all, "ncclCommInitAll");
    sym(a.comm_destroy, "ncclCommDestroy");
    sym(a.group_start, "ncclGroupStart");
    sym(a.group_end, "ncclGroupEnd");
    sym(a.send, "ncclSend");
    sym(a.recv, "ncclRecv");
    sym(a.all_gather, "ncclAllGather");
    sym(a.all_reduce, "ncclAllReduce");
    return a;
  }();
  return api;
}

void nccl_ok(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw Error(std::string("NCCL: ") + what + ": " + nccl().get_error_string(r));
}

ncclDataType_t nccl_type(CommType t) {
  switch (t) {
    case CommType::kF32: return ncclFloat32;
    case CommType::kI32: return ncclInt32;
    case CommType::kI64: return ncclInt64;
    case CommType::kU8: return ncclUint8;
  }
  return ncclUint8;
}

bool is_device_pointer(const void* p) {
  if (!p) return true;  // nothing to stage
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    (void)cudaGetLastError();  // plain host memory on older runtimes
    return false;
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

// A device copy of a host range (or the device pointer itself), copied back on request.
class Staged {
 public:
  Staged(void* p, int64_t bytes, bool upload, cudaStream_t stream) : host_(p), bytes_(bytes), stream_(stream) {
    if (is_device_pointer(p) || bytes == 0) {
      dev_ = p;
      return;
    }
    cuda_ok(cudaMallocAsync(&owned_, static_cast<size_t>(bytes), stream), "staging alloc");
    dev_ = owned_;
    if (upload) cuda_ok(cudaMemcpyAsync(dev_, p, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, stream), "upload");
  }
  ~Staged() {
    if (owned_) (void)cudaFreeAsync(owned_, stream_);
  }
  Staged(const Staged&) = delete;
  Staged& operator=(const Staged&) = delete;
  void* dev() const { return dev_; }
  void download() {
    if (owned_)
      cuda_ok(cudaMemcpyAsync(host_, owned_, static_cast<size_t>(bytes_), cudaMemcpyDeviceToHost, stream_), "download");
  }

 private:
  void* host_;
  int64_t bytes_;
  cudaStream_t stream_;
  void* dev_ = nullptr;
  void* owned_ = nullptr;
};

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int world, int device) : comm_(comm), rank_(rank), world_(world), device_(device) {
    cuda_ok(cudaSetDevice(device_), "cudaSetDevice");
    cuda_ok(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "stream");
  }
  ~NcclCommunicator() override {
    (void)cudaSetDevice(device_);
    (void)nccl().comm_destroy(comm_);
    (void)cudaStreamDestroy(stream_);
  }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }

  void all_to_all_v(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                    const std::vector<int64_t>& recv_counts, CommType type) override {
    DI_CHECK(static_cast<int>(send_counts.size()) == world_ && static_cast<int>(recv_counts.size()) == world_);
    cuda_ok(cudaSetDevice(device_), "cudaSetDevice");
    const int64_t eb = comm_type_bytes(type);
    const int64_t n_send = std::accumulate(send_counts.begin(), send_counts.end(), int64_t{0});
    const int64_t n_recv = std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0});
    Staged s(const_cast<void*>(send), n_send * eb, true, stream_);
    Staged r(recv, n_recv * eb, false, stream_);
    int64_t so = 0, ro = 0;
    nccl_ok(nccl().group_start(), "group start");
    for (int p = 0; p < world_; ++p) {
      if (send_counts[p] > 0)
        nccl_ok(nccl().send(static_cast<const uint8_t*>(s.dev()) + so * eb, static_cast<size_t>(send_counts[p]),
                         nccl_type(type), p, comm_, stream_), "send");
      if (recv_counts[p] > 0)
        nccl_ok(nccl().recv(static_cast<uint8_t*>(r.dev()) + ro * eb, static_cast<size_t>(recv_counts[p]), nccl_type(type),
                         p, comm_, stream_), "recv");
      so += send_counts[p];
      ro += recv_counts[p];
    }
    nccl_ok(nccl().group_end(), "group end");
    r.download();
    cuda_ok(cudaStreamSynchronize(stream_), "all_to_all_v");
  }

  void all_gather(const void* send, int64_t count, void* recv, CommType type) override {
    cuda_ok(cudaSetDevice(device_), "cudaSetDevice");
    const int64_t eb = comm_type_bytes(type);
    Staged s(const_cast<void*>(send), count * eb, true, stream_);
    Staged r(recv, count * eb * world_, false, stream_);
    nccl_ok(nccl().all_gather(s.dev(), r.dev(), static_cast<size_t>(count), nccl_type(type), comm_, stream_), "all_gather");
    r.download();
    cuda_ok(cudaStreamSynchronize(stream_), "all_gather");
  }

  void all_reduce_sum(void* data, int64_t count, CommType type) override {
    cuda_ok(cudaSetDevice(device_), "cudaSetDevice");
    Staged d(data, count * comm_type_bytes(type), true, stream_);
    nccl_ok(nccl().all_reduce(d.dev(), d.dev(), static_cast<size_t>(count), nccl_type(type), ncclSum, comm_, stream_),
            "all_reduce");
    d.download();
    cuda_ok(cudaStreamSynchronize(stream_), "all_reduce_sum");
  }

  void barrier() override {
    int32_t one = 1;
    all_reduce_sum(&one, 1, CommType::kI32);
  }

  std::vector<int64_t> all_gather_host(const std::vector<int64_t>& mine) override {
    int64_t n = static_cast<int64_t>(mine.size());
    std::vector<int64_t> sizes(static_cast<size_t>(world_));
    all_gather(&n, 1, sizes.data(), CommType::kI64);
    for (int p = 0; p < world_; ++p)
      if (sizes[p] != n)
        throw Error("all_gather_host: rank " + std::to_string(p) + " offers " + std::to_string(sizes[p]) +
                    " values, rank " + std::to_string(rank_) + " " + std::to_string(n));
    std::vector<int64_t> all(static_cast<size_t>(n * world_));
    all_gather(mine.data(), n, all.data(), CommType::kI64);
    return all;
  }

 private:
  ncclComm_t comm_;
  int rank_, world_, device_;
  cudaStream_t stream_ = nullptr;
};

}  // namespace

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

std::unique_ptr<Communicator> make_nccl_communicator(const BootstrapConfig& config) {
  const int devices = cuda_device_count();
  if (devices == 0) throw Error("multi-GPU (NCCL): rank " + std::to_string(config.rank) + " sees no CUDA device");
  const int device = config.local_rank >= 0 ? config.local_rank : config.rank % devices;
  if (device >= devices)
    throw Error("DEEPINFER_LOCAL_RANK: " + std::to_string(device) + ", but this node has " + std::to_string(devices) +
                " CUDA devices");
  cuda_ok(cudaSetDevice(device), "cudaSetDevice");
  ncclUniqueId id{};
  std::vector<uint8_t> blob;
  if (config.rank == 0) {
    nccl_ok(nccl().get_unique_id(&id), "ncclGetUniqueId");
    blob.assign(reinterpret_cast<const uint8_t*>(&id), reinterpret_cast<const uint8_t*>(&id) + sizeof id);
  }
  blob = bootstrap_broadcast(config, blob);
  if (blob.size() != sizeof id)
    throw Error("bootstrap: rank 0 sent " + std::to_string(blob.size()) + " bytes, an NCCL unique id has " +
                std::to_string(sizeof id));
  std::memcpy(&id, blob.data(), sizeof id);
  ncclComm_t comm = nullptr;
  nccl_ok(nccl().comm_init_rank(&comm, config.world_size, id, config.rank), "ncclCommInitRank");
  return std::make_unique<NcclCommunicator>(comm, config.rank, config.world_size, device);
}

std::vector<std::unique_ptr<Communicator>> make_nccl_group(int world_size) {
  const int devices = cuda_device_count();
  if (world_size < 1 || world_size > devices)
    throw Error("multi-GPU (NCCL): " + std::to_string(world_size) + " ranks need " + std::to_string(world_size) +
                " CUDA devices; this machine has " + std::to_string(devices));
  std::vector<ncclComm_t> comms(static_cast<size_t>(world_size));
  std::vector<int> devs(static_cast<size_t>(world_size));
  std::iota(devs.begin(), devs.end(), 0);
  nccl_ok(nccl().comm_init_all(comms.data(), world_size, devs.data()), "ncclCommInitAll");
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < world_size; ++r) out.push_back(std::make_unique<NcclCommunicator>(comms[r], r, world_size, r));
  return out;
}

}  // namespace di::parallel
