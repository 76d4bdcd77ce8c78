// How the ranks of a multi-process (one process per GPU, possibly several nodes) run find each
// other: every process gets its rank, the world size and the master's address; rank 0 listens on
// the master address and hands every other rank one opaque blob over TCP (NCCL's unique id, from
// which NCCL builds its own connections). Environment (docs/multi_gpu.md):
//   DEEPINFER_RANK         this process's rank, 0 .. world - 1
//   DEEPINFER_WORLD_SIZE   number of processes (GPUs) in the job
//   DEEPINFER_LOCAL_RANK   the GPU index on this node (default: rank % visible GPUs)
//   DEEPINFER_MASTER_ADDR  host name or IPv4/IPv6 address of rank 0 (default 127.0.0.1)
//   DEEPINFER_MASTER_PORT  TCP port rank 0 listens on (default 29551)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace di::parallel {

struct BootstrapConfig {
  int rank = 0;
  int world_size = 1;
  int local_rank = -1;  // -1: rank % device count
  std::string master_addr = "127.0.0.1";
  int master_port = 29551;
  double timeout_s = 300;  // how long ranks wait for rank 0 (and rank 0 for them)
};

// The configuration from the DEEPINFER_* variables above; nullopt when DEEPINFER_WORLD_SIZE is
// unset. Throws di::Error naming the variable on a malformed or inconsistent value.
std::optional<BootstrapConfig> bootstrap_from_env();

// Rank 0 sends `blob` to every other rank; every rank returns rank 0's blob (others pass {}).
// Throws di::Error on timeout or a peer that speaks another protocol.
std::vector<uint8_t> bootstrap_broadcast(const BootstrapConfig& config, const std::vector<uint8_t>& blob);

}  // namespace di::parallel
