// Expert parallelism simulated with threads as ranks (src/parallel): placement tables, the dispatch /
// combine arithmetic, and the MoE layer at EP 2, 4 and 8 on the tiny model's MoE weights against the
// single-rank op -- bit-identical, since the combine adds in the single-rank order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "core/error.h"
#include "model/config.h"
#include "model/model_weights.h"
#include "model/safetensors.h"
#include "parallel/ep_moe.h"
#include "parallel/expert_placement.h"
#include "parallel/thread_communicator.h"
#include "test_util.h"

namespace di {
namespace {

using parallel::Communicator;
using parallel::CommType;
using parallel::ExpertPlacement;
using testing_util::fresh_seed;

// --- communicator -----------------------------------------------------------------------------

TEST(ThreadCommunicator, AllToAllVMovesEverySegment) {
  std::mt19937_64 rng(fresh_seed("AllToAllVMovesEverySegment"));
  for (int world : {1, 2, 3, 5, 8}) {
    // counts[src][dst], some zero; element value encodes (src, dst, index)
    std::vector<int64_t> counts(static_cast<size_t>(world * world));
    for (int64_t& c : counts) c = (rng() % 3 == 0) ? 0 : static_cast<int64_t>(rng() % 7);
    parallel::run_ranks(world, [&](Communicator& comm) {
      const int me = comm.rank();
      std::vector<int64_t> send_counts(world), recv_counts(world);
      std::vector<int32_t> send;
      for (int d = 0; d < world; ++d) {
        send_counts[d] = counts[me * world + d];
        recv_counts[d] = counts[d * world + me];
        for (int64_t i = 0; i < send_counts[d]; ++i) send.push_back(me * 10000 + d * 100 + static_cast<int32_t>(i));
      }
      std::vector<int32_t> recv(static_cast<size_t>(std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0})));
      comm.all_to_all_v(send.data(), send_counts, recv.data(), recv_counts, CommType::kI32);
      size_t k = 0;
      for (int s = 0; s < world; ++s)
        for (int64_t i = 0; i < recv_counts[s]; ++i) ASSERT_EQ(recv[k++], s * 10000 + me * 100 + i);
      // all_gather_host and all_reduce_sum (rank order)
      std::vector<int64_t> all = comm.all_gather_host({me, me * 2});
      for (int p = 0; p < world; ++p) ASSERT_EQ(all[p * 2 + 1], p * 2);
      std::vector<float> v = {static_cast<float>(me) + 0.5f, 1.0f};
      comm.all_reduce_sum(v.data(), 2, CommType::kF32);
      EXPECT_EQ(v[1], static_cast<float>(world));
      EXPECT_EQ(v[0], world * (world - 1) / 2.0f + 0.5f * world);
      comm.barrier();
    });
  }
}

TEST(ThreadCommunicator, AFailingRankAbortsTheOthers) {
  // Rank 1 expects more than rank 0 sends: the error surfaces instead of a hang.
  EXPECT_THROW(parallel::run_ranks(3,
                                   [](Communicator& comm) {
                                     std::vector<int64_t> sc(3, 1), rc(3, 1);
                                     if (comm.rank() == 1) rc[0] = 2;
                                     std::vector<float> s(3, 1.0f), r(4);
                                     comm.all_to_all_v(s.data(), sc, r.data(), rc, CommType::kF32);
                                     comm.barrier();
                                   }),
               Error);
}

// --- placement --------------------------------------------------------------------------------

TEST(ExpertPlacement, UniformBlocks) {
  ExpertPlacement p = parallel::uniform_placement(384, 8);
  p.validate();
  EXPECT_EQ(p.slots_per_rank(), 48);
  EXPECT_EQ(p.n_redundant(), 0);
  EXPECT_EQ(p.replicas[47], std::vector<int>{0});
  EXPECT_EQ(p.replicas[48], std::vector<int>{1});
  EXPECT_EQ(p.replica_for(200, 3, 17, 0), 4);
  EXPECT_THROW(parallel::uniform_placement(384, 5), Error);
}

TEST(ExpertPlacement, RedundantReplicasGoToHotExpertsAndEvenTheLoad) {
  std::mt19937_64 rng(fresh_seed("RedundantReplicasGoToHotExperts"));
  for (int trial = 0; trial < 50; ++trial) {
    const int world = 1 << (1 + rng() % 3);  // 2, 4, 8
    const int n_experts = world * static_cast<int>(1 + rng() % 12);
    const int n_redundant = world * static_cast<int>(rng() % 3);
    // Zipf-like loads: a few hot experts
    std::vector<int64_t> loads(n_experts);
    for (int e = 0; e < n_experts; ++e) loads[e] = static_cast<int64_t>(1 + rng() % 50 + (rng() % 5 == 0 ? 2000 : 0));
    if (n_redundant > n_experts * (world - 1)) continue;
    ExpertPlacement p = parallel::balanced_placement(loads, world, n_redundant);
    p.validate();
    ASSERT_EQ(p.n_redundant(), n_redundant);
    // The hottest expert has the most replicas.
    const int hottest = static_cast<int>(std::max_element(loads.begin(), loads.end()) - loads.begin());
    for (int e = 0; e < n_experts; ++e) ASSERT_LE(p.replicas[e].size(), p.replicas[hottest].size());
    // Greedy packing bound: no rank exceeds the mean by more than the heaviest replica's load.
    std::vector<double> bal = parallel::rank_loads(p, loads);
    double mean = 0, heaviest = 0;
    for (double l : bal) mean += l / world;
    for (int e = 0; e < n_experts; ++e)
      heaviest = std::max(heaviest, static_cast<double>(loads[e]) / static_cast<double>(p.replicas[e].size()));
    EXPECT_LE(*std::max_element(bal.begin(), bal.end()), mean + heaviest + 1e-6) << p.describe();
    // Replica choice: deterministic, a held replica, the origin rank's own copy when it has one.
    for (int i = 0; i < 20; ++i) {
      const int e = static_cast<int>(rng() % n_experts), origin = static_cast<int>(rng() % world);
      const int64_t row = static_cast<int64_t>(rng() % 1000);
      const int r = p.replica_for(e, origin, row, 1);
      ASSERT_TRUE(p.holds(r, e));
      ASSERT_EQ(r, p.replica_for(e, origin, row, 1));
      if (p.holds(origin, e)) {
        ASSERT_EQ(r, origin);
      }
    }
  }
}

TEST(ExpertPlacement, ReplicasOfAHotExpertShareItsPairs) {
  std::vector<int64_t> loads(8, 1);
  loads[3] = 1000;
  loads[5] = 900;  // the 4 extra replicas split: 3 copies of each, so some rank lacks expert 3
  ExpertPlacement p = parallel::balanced_placement(loads, 4, 4);
  ASSERT_EQ(p.replicas[3].size(), 3u) << p.describe();
  ASSERT_EQ(p.replicas[5].size(), 3u) << p.describe();
  std::vector<int> hits(4, 0);
  const int origin = [&] {  // a rank without a copy spreads over the replicas
    for (int r = 0; r < 4; ++r)
      if (!p.holds(r, 3)) return r;
    return -1;
  }();
  ASSERT_GE(origin, 0);
  std::vector<double> bal = parallel::rank_loads(p, loads), uni = parallel::rank_loads(parallel::uniform_placement(8, 4), loads);
  EXPECT_LT(*std::max_element(bal.begin(), bal.end()), 0.7 * *std::max_element(uni.begin(), uni.end()));  // 634 vs 1001
  for (int64_t row = 0; row < 400; ++row) ++hits[p.replica_for(3, origin, row, 0)];
  for (int r : p.replicas[3]) EXPECT_GT(hits[r], 400 / static_cast<int>(p.replicas[3].size()) / 2) << p.describe();
}

TEST(ExpertPlacement, RejectsImpossibleTables) {
  std::vector<int64_t> loads(8, 1);
  EXPECT_THROW(parallel::balanced_placement(loads, 3, 0), Error);
  EXPECT_THROW(parallel::balanced_placement(loads, 2, 10), Error);  // 9 copies of an expert on 2 ranks
  ExpertPlacement p = parallel::uniform_placement(8, 2);
  p.slots[1].pop_back();
  EXPECT_THROW(p.validate(), Error);
}

// --- dispatch / combine plan ------------------------------------------------------------------

TEST(EpPlan, EveryPairSentOnceToAHolderAndCombinedInExpertOrder) {
  std::mt19937_64 rng(fresh_seed("EveryPairSentOnce"));
  std::vector<int64_t> loads(16);
  for (int64_t& l : loads) l = static_cast<int64_t>(rng() % 100);
  ExpertPlacement p = parallel::balanced_placement(loads, 4, 4);
  const int64_t rows = 23;
  const int k = 3;
  std::vector<int32_t> experts(rows * k);
  std::vector<float> weights(rows * k);
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int32_t> perm(16);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int j = 0; j < k; ++j) {
      experts[r * k + j] = (r == 5 && j == 1) ? -1 : perm[j];  // one empty slot
      weights[r * k + j] = static_cast<float>(rng() % 1000) / 100.0f;
    }
  }
  parallel::DispatchPlan plan = parallel::plan_dispatch(p, 2, experts.data(), weights.data(), rows, k);
  ASSERT_EQ(plan.send_row.size(), static_cast<size_t>(rows * k - 1));
  int64_t i = 0;
  for (int d = 0; d < 4; ++d)
    for (int64_t n = 0; n < plan.send_counts[d]; ++n, ++i) ASSERT_TRUE(p.holds(d, plan.send_expert[i]));
  for (int64_t r = 0; r < rows; ++r) {
    int32_t prev = -1;
    ASSERT_EQ(plan.combine_offsets[r + 1] - plan.combine_offsets[r], r == 5 ? k - 1 : k);
    for (int64_t c = plan.combine_offsets[r]; c < plan.combine_offsets[r + 1]; ++c) {
      const int32_t at = plan.combine_index[c];
      ASSERT_EQ(plan.send_row[at], r);
      ASSERT_GT(plan.send_expert[at], prev);
      prev = plan.send_expert[at];
    }
  }
  parallel::ExpertGroups g = parallel::group_by_expert(plan.send_expert);
  ASSERT_EQ(g.offsets.size(), g.experts.size() + 1);
  for (size_t gi = 0; gi < g.experts.size(); ++gi)
    for (int64_t j = g.offsets[gi]; j < g.offsets[gi + 1]; ++j) ASSERT_EQ(plan.send_expert[g.order[j]], g.experts[gi]);
}

// --- the MoE layer over EP --------------------------------------------------------------------

class ExpertParallelMoe : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = std::string(DI_TEST_DATA) + "/golden_dev/model";
    cfg_ = load_model_config(dir);
    ckpt_ = Checkpoint::open(dir);
    be_ = make_cpu_backend();
    w_ = bind_model_weights(cfg_, *ckpt_, *be_);
  }

  parallel::MoeLayerRef layer_ref(int layer) const {
    const LayerWeights& lw = w_.layers[static_cast<size_t>(layer)];
    const bool dspark = cfg_.layers[static_cast<size_t>(layer)].is_dspark;
    return {&lw.gate, &lw.gate_bias, &lw.experts, &lw.shared,
            dspark ? cfg_.dspark_n_activated_experts : cfg_.n_activated_experts,
            static_cast<float>(cfg_.route_scale), static_cast<float>(cfg_.gate_temp),
            static_cast<float>(cfg_.swiglu_limit)};
  }

  // Uneven row counts per rank summing to n; rank `empty` gets none.
  static std::vector<int64_t> split_rows(std::mt19937_64& rng, int64_t n, int world, int empty) {
    std::vector<int64_t> cuts = {0, n};
    for (int i = 0; i + 2 < world; ++i) cuts.push_back(static_cast<int64_t>(rng() % (n + 1)));
    std::sort(cuts.begin(), cuts.end());
    std::vector<int64_t> counts;
    for (size_t i = 0; i + 1 < cuts.size(); ++i) counts.push_back(cuts[i + 1] - cuts[i]);
    counts.insert(counts.begin() + empty, 0);
    return counts;
  }

  // Random routing, skewed: about half the pairs pick expert `hot`.
  static MoeRoute random_route(Backend& be, std::mt19937_64& rng, int64_t rows, int k, int n_experts, int hot) {
    std::vector<int32_t> ex(static_cast<size_t>(rows * k));
    std::vector<float> wt(static_cast<size_t>(rows * k));
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<int32_t> perm(n_experts);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      if (rng() % 2) std::swap(perm[0], *std::find(perm.begin(), perm.end(), hot));
      for (int j = 0; j < k; ++j) {
        ex[r * k + j] = perm[j];
        // Log-uniform over 7 decades: bf16 outputs of similar size add exactly in fp32 in any
        // order; outputs far apart in size make the order of addition visible.
        wt[r * k + j] = std::pow(10.0f, std::uniform_real_distribution<float>(-7.0f, 0.3f)(rng));
      }
    }
    return {be.from_host_f32(wt, {rows, k}), be.from_host_i32(ex, {rows, k})};
  }

  ModelConfig cfg_;
  std::unique_ptr<Checkpoint> ckpt_;
  std::unique_ptr<Backend> be_;
  ModelWeights w_;
};

TEST_F(ExpertParallelMoe, EqualsTheSingleRankOpBitForBit) {
  std::mt19937_64 rng(fresh_seed("EqualsTheSingleRankOpBitForBit"));
  const int64_t dim = cfg_.hidden_size;
  // A backbone MoE layer and a DSpark stage (its own expert count and top-k).
  std::vector<int> layers = {2, static_cast<int>(cfg_.layers.size()) - 1};
  for (int layer : layers) {
    const parallel::MoeLayerRef ref = layer_ref(layer);
    const int n_experts = static_cast<int>(ref.experts->size());
    for (int world : {2, 4, 8}) {
      for (bool redundant : {false, true}) {
        for (bool random_routing : {false, true}) {
          if (n_experts % world != 0 && !redundant) continue;
          const int64_t n = 5 + static_cast<int64_t>(rng() % 40);
          std::vector<float> xv(static_cast<size_t>(n * dim));
          std::normal_distribution<float> nd(0.0f, 1.0f);
          for (float& v : xv) v = nd(rng);
          Tensor x = be_->from_host_f32(xv, {n, dim});
          const int hot = static_cast<int>(rng() % n_experts);
          // Random routing uses more experts per row than the router (top-2): with 3 or more terms
          // the order of addition shows in the bits.
          const int k = random_routing ? std::min(4, n_experts - 1) : ref.top_k;
          MoeRoute route = random_routing ? random_route(*be_, rng, n, k, n_experts, hot)
                                          : be_->moe_route(x, *ref.gate, *ref.gate_bias, ref.top_k, ref.route_scale,
                                                           ref.gate_temp);
          std::vector<float> want =
              be_->to_host_f32(be_->moe_experts(x, route, *ref.experts, *ref.shared, ref.swiglu_limit));
          // Placement: uniform, or EPLB-style with `world` redundant replicas from the observed loads.
          std::vector<int32_t> all_e = be_->to_host_i32(route.experts);
          std::vector<float> all_w = be_->to_host_f32(route.weights);
          std::vector<int64_t> loads(static_cast<size_t>(n_experts), 0);
          for (int32_t e : all_e) ++loads[e];
          int n_red = 0;
          if (redundant) {
            n_red = world;
            while ((n_experts + n_red) % world != 0) ++n_red;
            if (n_red > n_experts * (world - 1)) continue;
          }
          ExpertPlacement placement = redundant ? parallel::balanced_placement(loads, world, n_red)
                                                : parallel::uniform_placement(n_experts, world);
          std::vector<int64_t> counts = split_rows(rng, n, world, static_cast<int>(rng() % world));
          std::vector<int64_t> first(world + 1, 0);
          for (int r = 0; r < world; ++r) first[r + 1] = first[r] + counts[r];
          std::vector<std::vector<float>> got(world);
          std::vector<parallel::EpStepStats> stats(world);
          parallel::run_ranks(world, [&](Communicator& comm) {
            const int me = comm.rank();
            std::unique_ptr<Backend> be = make_cpu_backend();  // one backend per rank, like one per GPU
            parallel::EpMoe ep(*be, comm, placement);
            const int64_t rows = counts[me];
            std::vector<float> xs(xv.begin() + first[me] * dim, xv.begin() + (first[me] + rows) * dim);
            Tensor xr = rows > 0 ? be->from_host_f32(xs, {rows, dim}) : Tensor{TType::kF32, {0, dim}};
            Tensor y;
            if (random_routing) {
              MoeRoute rr;
              if (rows > 0) {
                rr.weights = be->from_host_f32(std::vector<float>(all_w.begin() + first[me] * k,
                                                                  all_w.begin() + (first[me] + rows) * k), {rows, k});
                rr.experts = be->from_host_i32(std::vector<int32_t>(all_e.begin() + first[me] * k,
                                                                    all_e.begin() + (first[me] + rows) * k), {rows, k});
              }
              y = ep.forward_routed(ref, xr, rr);
            } else {
              y = ep.forward(ref, xr);
            }
            got[me] = rows > 0 ? be->to_host_f32(y) : std::vector<float>{};
            stats[me] = ep.last_stats();
          });
          std::vector<float> joined;
          int64_t received = 0;
          for (int r = 0; r < world; ++r) {
            joined.insert(joined.end(), got[r].begin(), got[r].end());
            received += stats[r].pairs_received;
          }
          SCOPED_TRACE("layer " + std::to_string(layer) + " EP " + std::to_string(world) +
                       (redundant ? " redundant" : "") + (random_routing ? " random routing" : " router"));
          ASSERT_EQ(received, n * k);  // every pair ran exactly once
          ASSERT_EQ(joined.size(), want.size());
          ASSERT_EQ(0, std::memcmp(joined.data(), want.data(), want.size() * sizeof(float)))
              << "first difference at " << (std::mismatch(joined.begin(), joined.end(), want.begin()).first - joined.begin());
        }
      }
    }
  }
}

}  // namespace
}  // namespace di
