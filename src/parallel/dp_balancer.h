// Attention data parallelism: each DP rank runs its own scheduler, KV pool and prefix cache over its
// own requests (the MoE layers are shared through expert parallelism). New requests go to the rank
// with the least outstanding work; a prompt prefix already cached on a rank makes that rank cheaper by
// the tokens it need not prefill. Deterministic: equal costs go to the rank with fewer requests, then
// the lowest rank.
#pragma once

#include <cstdint>
#include <vector>

namespace di::parallel {

struct DpRequest {
  int64_t prompt_tokens = 0;
  int64_t max_new_tokens = 0;
  std::vector<int64_t> prefix_hit_tokens;  // [n_ranks] cached prompt tokens per rank, or empty
};

struct DpTicket {
  int rank = -1;
  int64_t cost = 0;  // the work charged to the rank until release()
};

class DpBalancer {
 public:
  // decode_weight: the cost of one generated token relative to one prefill token.
  explicit DpBalancer(int n_ranks, int64_t decode_weight = 1);

  DpTicket assign(const DpRequest& request);
  // The request finished (or was cancelled): its remaining cost leaves the rank.
  void release(const DpTicket& ticket);
  // Progress: `done` of the ticket's cost is no longer outstanding (e.g. prefill finished).
  void progress(DpTicket& ticket, int64_t done);

  int n_ranks() const { return static_cast<int>(load_.size()); }
  const std::vector<int64_t>& load() const { return load_; }          // [n_ranks] outstanding work
  const std::vector<int64_t>& requests() const { return requests_; }  // [n_ranks] open requests

 private:
  int64_t decode_weight_;
  std::vector<int64_t> load_, requests_;
};

}  // namespace di::parallel
