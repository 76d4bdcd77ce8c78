// Ranks as threads of one process sharing memory: the Communicator of the CPU simulation of expert
// parallelism. Collectives copy straight from the peers' buffers between two barriers, so results
// equal what a transport would deliver, in a fixed order. When one rank fails, run_ranks aborts the
// group: the others' pending collectives throw instead of waiting forever.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>

#include "parallel/communicator.h"

namespace di::parallel {

class ThreadGroup {
 public:
  explicit ThreadGroup(int world_size);
  int world_size() const { return world_; }
  // Blocks until all ranks arrive; throws di::Error once the group is aborted (after every rank that
  // is still reading peers' buffers is done, so no buffer is freed under a reader).
  // starts_read: the ranks leave this barrier to read each other's buffers, then call end_read().
  void arrive_and_wait(bool starts_read = false);
  void end_read();
  void abort(const std::string& why);

  // What each rank offers to the collective in progress (written before, read after a barrier).
  struct Post {
    const void* send = nullptr;
    const std::vector<int64_t>* counts = nullptr;
    void* data = nullptr;
  };
  std::vector<Post> posts;  // [world]

 private:
  int world_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  int reading_ = 0;  // ranks between a read-opening barrier and their end_read()
  int64_t generation_ = 0;
  bool aborted_ = false;
  std::string why_;
};

class ThreadCommunicator : public Communicator {
 public:
  ThreadCommunicator(ThreadGroup& group, int rank) : group_(group), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return group_.world_size(); }
  void all_to_all_v(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                    const std::vector<int64_t>& recv_counts, CommType type) override;
  void all_gather(const void* send, int64_t count, void* recv, CommType type) override;
  void all_reduce_sum(void* data, int64_t count, CommType type) override;
  void barrier() override { group_.arrive_and_wait(); }
  std::vector<int64_t> all_gather_host(const std::vector<int64_t>& mine) override;

 private:
  ThreadGroup& group_;
  int rank_;
};

// Runs fn on `world_size` threads, one ThreadCommunicator each; rethrows the first rank's failure.
void run_ranks(int world_size, const std::function<void(Communicator&)>& fn);

}  // namespace di::parallel
