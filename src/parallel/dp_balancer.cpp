#include "parallel/dp_balancer.h"

#include <algorithm>

#include "core/error.h"

namespace di::parallel {

DpBalancer::DpBalancer(int n_ranks, int64_t decode_weight)
    : decode_weight_(decode_weight), load_(static_cast<size_t>(n_ranks), 0), requests_(static_cast<size_t>(n_ranks), 0) {
  if (n_ranks < 1) throw Error("--dp: expected >= 1 rank, got " + std::to_string(n_ranks));
  if (decode_weight < 0) throw Error("DP balancer: negative decode weight");
}

DpTicket DpBalancer::assign(const DpRequest& req) {
  if (req.prompt_tokens < 0 || req.max_new_tokens < 0) throw Error("DP balancer: negative token count");
  if (!req.prefix_hit_tokens.empty() && static_cast<int>(req.prefix_hit_tokens.size()) != n_ranks())
    throw Error("DP balancer: prefix hits for " + std::to_string(req.prefix_hit_tokens.size()) + " ranks, there are " +
                std::to_string(n_ranks()));
  DpTicket best;
  int64_t best_total = 0;
  for (int r = 0; r < n_ranks(); ++r) {
    const int64_t hit = req.prefix_hit_tokens.empty() ? 0 : std::clamp<int64_t>(req.prefix_hit_tokens[r], 0, req.prompt_tokens);
    const int64_t cost = (req.prompt_tokens - hit) + req.max_new_tokens * decode_weight_;
    const int64_t total = load_[r] + cost;
    if (best.rank < 0 || total < best_total || (total == best_total && requests_[r] < requests_[best.rank])) {
      best = {r, cost};
      best_total = total;
    }
  }
  load_[best.rank] += best.cost;
  ++requests_[best.rank];
  return best;
}

void DpBalancer::progress(DpTicket& ticket, int64_t done) {
  DI_CHECK(ticket.rank >= 0 && ticket.rank < n_ranks());
  done = std::clamp<int64_t>(done, 0, ticket.cost);
  ticket.cost -= done;
  load_[ticket.rank] -= done;
}

void DpBalancer::release(const DpTicket& ticket) {
  DI_CHECK(ticket.rank >= 0 && ticket.rank < n_ranks() && requests_[ticket.rank] > 0);
  load_[ticket.rank] -= ticket.cost;
  --requests_[ticket.rank];
}

}  // namespace di::parallel
