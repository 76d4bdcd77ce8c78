#include "parallel/expert_placement.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace di::parallel {

bool ExpertPlacement::holds(int rank, int expert) const {
  const std::vector<int>& r = replicas.at(static_cast<size_t>(expert));
  return std::binary_search(r.begin(), r.end(), rank);
}

int ExpertPlacement::replica_for(int expert, int origin_rank, int64_t origin_row, int slot) const {
  const std::vector<int>& r = replicas[static_cast<size_t>(expert)];
  if (r.size() == 1) return r[0];
  // A replica on the origin rank costs no transfer: take it.
  if (std::binary_search(r.begin(), r.end(), origin_rank)) return origin_rank;
  // Else spread by row: consecutive rows of one rank alternate replicas, and different origin ranks
  // start at different replicas. Depends only on (origin rank, row, slot): deterministic.
  uint64_t h = static_cast<uint64_t>(origin_row) * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(origin_rank) * 31 +
               static_cast<uint64_t>(slot);
  return r[static_cast<size_t>((h >> 17) % r.size())];
}

void ExpertPlacement::validate() const {
  auto fail = [](const std::string& m) { throw Error("expert placement: " + m); };
  if (world_size < 1 || n_experts < 1) fail("needs >= 1 rank and >= 1 expert");
  if (static_cast<int>(replicas.size()) != n_experts || static_cast<int>(slots.size()) != world_size)
    fail("table sizes do not match n_experts / world_size");
  for (int r = 0; r < world_size; ++r) {
    const std::vector<int>& s = slots[static_cast<size_t>(r)];
    if (static_cast<int>(s.size()) != slots_per_rank())
      fail("rank " + std::to_string(r) + " has " + std::to_string(s.size()) + " slots, rank 0 has " +
           std::to_string(slots_per_rank()));
    if (!std::is_sorted(s.begin(), s.end()) || std::adjacent_find(s.begin(), s.end()) != s.end())
      fail("rank " + std::to_string(r) + " slots are not ascending distinct expert ids");
    for (int e : s)
      if (e < 0 || e >= n_experts || !holds(r, e))
        fail("rank " + std::to_string(r) + " slot holds expert " + std::to_string(e) + " not in its replica list");
  }
  int64_t n_slots = 0;
  for (int e = 0; e < n_experts; ++e) {
    const std::vector<int>& r = replicas[static_cast<size_t>(e)];
    if (r.empty()) fail("expert " + std::to_string(e) + " has no replica");
    if (!std::is_sorted(r.begin(), r.end()) || std::adjacent_find(r.begin(), r.end()) != r.end())
      fail("expert " + std::to_string(e) + " replicas are not ascending distinct ranks");
    for (int rank : r) {
      const std::vector<int>& s = slots.at(static_cast<size_t>(rank));
      if (!std::binary_search(s.begin(), s.end(), e))
        fail("expert " + std::to_string(e) + " lists rank " + std::to_string(rank) + ", whose slots lack it");
    }
    n_slots += static_cast<int64_t>(r.size());
  }
  if (n_slots != static_cast<int64_t>(world_size) * slots_per_rank()) fail("replica count != slot count");
}

std::string ExpertPlacement::describe() const {
  std::string out;
  for (int r = 0; r < world_size; ++r) {
    out += "rank " + std::to_string(r) + ":";
    for (int e : slots[static_cast<size_t>(r)])
      out += " " + std::to_string(e) + (replicas[static_cast<size_t>(e)].size() > 1 ? "*" : "");
    out += "\n";
  }
  return out;
}

namespace {

// Every free slot sits on ranks that already hold `expert`: move another expert x from a rank
// lacking `expert` to a free slot (on a rank lacking x). Returns the rank freed for `expert`.
int make_room(ExpertPlacement& p, int expert, int per, std::vector<double>& rank_load,
              const std::vector<int64_t>& loads) {
  for (int free_rank = 0; free_rank < p.world_size; ++free_rank) {
    std::vector<int>& fs = p.slots[static_cast<size_t>(free_rank)];
    if (static_cast<int>(fs.size()) == per) continue;
    for (int other = 0; other < p.world_size; ++other) {
      std::vector<int>& os = p.slots[static_cast<size_t>(other)];
      if (std::find(os.begin(), os.end(), expert) != os.end()) continue;
      for (size_t i = 0; i < os.size(); ++i) {
        const int x = os[i];
        if (std::find(fs.begin(), fs.end(), x) != fs.end()) continue;
        std::vector<int>& xr = p.replicas[static_cast<size_t>(x)];
        const double share = static_cast<double>(loads[x]) / static_cast<double>(xr.size());
        *std::find(xr.begin(), xr.end(), other) = free_rank;
        fs.push_back(x);
        os.erase(os.begin() + static_cast<std::ptrdiff_t>(i));
        rank_load[other] -= share;
        rank_load[free_rank] += share;
        return other;
      }
    }
  }
  throw Error("expert placement: no rank can take a replica of expert " + std::to_string(expert));
}

}  // namespace

ExpertPlacement uniform_placement(int n_experts, int world_size) {
  if (world_size < 1 || n_experts % world_size != 0)
    throw Error("expert placement: " + std::to_string(n_experts) + " experts do not split evenly over " +
                std::to_string(world_size) + " ranks");
  ExpertPlacement p;
  p.n_experts = n_experts;
  p.world_size = world_size;
  p.replicas.resize(static_cast<size_t>(n_experts));
  p.slots.resize(static_cast<size_t>(world_size));
  const int per = n_experts / world_size;
  for (int e = 0; e < n_experts; ++e) {
    p.replicas[static_cast<size_t>(e)] = {e / per};
    p.slots[static_cast<size_t>(e / per)].push_back(e);
  }
  return p;
}

ExpertPlacement balanced_placement(const std::vector<int64_t>& loads, int world_size, int n_redundant) {
  const int n_experts = static_cast<int>(loads.size());
  if (world_size < 1 || n_redundant < 0 || (n_experts + n_redundant) % world_size != 0)
    throw Error("expert placement: " + std::to_string(n_experts) + " experts + " + std::to_string(n_redundant) +
                " redundant replicas do not split evenly over " + std::to_string(world_size) + " ranks");
  if (static_cast<int64_t>(n_redundant) > static_cast<int64_t>(n_experts) * (world_size - 1))
    throw Error("expert placement: " + std::to_string(n_redundant) + " redundant replicas need more ranks than " +
                std::to_string(world_size) + " (one replica of an expert per rank)");
  // 1. How many replicas each expert gets: largest load per replica first (ties: lowest id).
  std::vector<int> count(static_cast<size_t>(n_experts), 1);
  for (int i = 0; i < n_redundant; ++i) {
    int best = -1;
    for (int e = 0; e < n_experts; ++e) {
      if (count[e] == world_size) continue;
      if (best < 0 || loads[e] * count[best] > loads[best] * count[e]) best = e;
    }
    ++count[best];
  }
  // 2. Replicas heaviest first onto the least-loaded rank with a free slot that lacks the expert.
  struct Item {
    double load;
    int expert;
  };
  std::vector<Item> items;
  for (int e = 0; e < n_experts; ++e)
    for (int c = 0; c < count[e]; ++c) items.push_back({static_cast<double>(loads[e]) / count[e], e});
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    return a.load != b.load ? a.load > b.load : a.expert < b.expert;
  });
  const int per = (n_experts + n_redundant) / world_size;
  ExpertPlacement p;
  p.n_experts = n_experts;
  p.world_size = world_size;
  p.replicas.resize(static_cast<size_t>(n_experts));
  p.slots.resize(static_cast<size_t>(world_size));
  std::vector<double> rank_load(static_cast<size_t>(world_size), 0.0);
  for (const Item& it : items) {
    int best = -1;
    for (int r = 0; r < world_size; ++r) {
      const std::vector<int>& s = p.slots[static_cast<size_t>(r)];
      if (static_cast<int>(s.size()) == per || std::find(s.begin(), s.end(), it.expert) != s.end()) continue;
      if (best < 0 || rank_load[r] < rank_load[best]) best = r;
    }
    if (best < 0) best = make_room(p, it.expert, per, rank_load, loads);
    p.slots[static_cast<size_t>(best)].push_back(it.expert);
    p.replicas[static_cast<size_t>(it.expert)].push_back(best);
    rank_load[best] += it.load;
  }
  for (std::vector<int>& s : p.slots) std::sort(s.begin(), s.end());
  for (std::vector<int>& r : p.replicas) std::sort(r.begin(), r.end());
  p.validate();
  return p;
}

std::vector<double> rank_loads(const ExpertPlacement& placement, const std::vector<int64_t>& loads) {
  std::vector<double> out(static_cast<size_t>(placement.world_size), 0.0);
  for (int e = 0; e < placement.n_experts; ++e) {
    const std::vector<int>& r = placement.replicas[static_cast<size_t>(e)];
    for (int rank : r) out[static_cast<size_t>(rank)] += static_cast<double>(loads[e]) / static_cast<double>(r.size());
  }
  return out;
}

}  // namespace di::parallel
