// Expert parallelism over NCCL (needs >= 2 GPUs; skipped otherwise): the transport itself, then the
// EP MoE layer of src/parallel with ranks as threads, one GPU and one NCCL communicator each, on the
// tiny model's MoE weights, against the single-rank CPU op. The layer exchanges host buffers (staged
// through each rank's GPU), so the numbers are the CPU backend's: bit-identical is expected.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>

#include "gpu_test_util.h"
#include "model/config.h"
#include "model/model.h"
#include "model/model_weights.h"
#include "model/safetensors.h"
#include "parallel/ep_backend.h"
#include "parallel/ep_moe.h"
#include "parallel/nccl_communicator.h"

namespace di {
namespace {

using parallel::Communicator;
using parallel::CommType;

// Runs fn on one thread per communicator; rethrows the first failure.
void run_on(std::vector<std::unique_ptr<Communicator>>& comms, const std::function<void(Communicator&)>& fn) {
  std::vector<std::exception_ptr> errors(comms.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < comms.size(); ++r)
    threads.emplace_back([&, r] {
      try {
        fn(*comms[r]);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (std::thread& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

std::vector<int> worlds() {
  std::vector<int> out;
  for (int w : {2, 4, 8})
    if (w <= parallel::cuda_device_count()) out.push_back(w);
  return out;
}

TEST(NcclEp, AllToAllV) {
  if (worlds().empty()) GTEST_SKIP() << "needs >= 2 CUDA devices";
  const uint64_t seed = gputest::fresh_seed();
  for (int world : worlds()) {
    std::mt19937_64 rng(seed + world);
    std::vector<int64_t> counts(static_cast<size_t>(world * world));
    for (int64_t& c : counts) c = static_cast<int64_t>(rng() % 5);
    auto comms = parallel::make_nccl_group(world);
    run_on(comms, [&](Communicator& comm) {
      const int me = comm.rank();
      std::vector<int64_t> sc(world), rc(world);
      std::vector<int32_t> send;
      for (int d = 0; d < world; ++d) {
        sc[d] = counts[me * world + d];
        rc[d] = counts[d * world + me];
        for (int64_t i = 0; i < sc[d]; ++i) send.push_back(me * 10000 + d * 100 + static_cast<int32_t>(i));
      }
      std::vector<int32_t> recv(static_cast<size_t>(std::accumulate(rc.begin(), rc.end(), int64_t{0})));
      comm.all_to_all_v(send.data(), sc, recv.data(), rc, CommType::kI32);
      size_t k = 0;
      for (int s = 0; s < world; ++s)
        for (int64_t i = 0; i < rc[s]; ++i) ASSERT_EQ(recv[k++], s * 10000 + me * 100 + i);
      std::vector<int64_t> all = comm.all_gather_host({me});
      for (int p = 0; p < world; ++p) ASSERT_EQ(all[p], p);
      comm.barrier();
    });
  }
}

TEST(NcclEp, MoeEqualsSingleRank) {
  if (worlds().empty()) GTEST_SKIP() << "needs >= 2 CUDA devices";
  std::mt19937_64 rng(gputest::fresh_seed());
  const std::string dir = std::string(DI_TEST_DATA) + "/golden_dev/model";
  ModelConfig cfg = load_model_config(dir);
  std::unique_ptr<Checkpoint> ckpt = Checkpoint::open(dir);
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  ModelWeights w = bind_model_weights(cfg, *ckpt, *cpu);
  const LayerWeights& lw = w.layers[2];
  parallel::MoeLayerRef ref{&lw.gate, &lw.gate_bias, &lw.experts, &lw.shared, cfg.n_activated_experts,
                            static_cast<float>(cfg.route_scale), static_cast<float>(cfg.gate_temp),
                            static_cast<float>(cfg.swiglu_limit)};
  const int64_t dim = cfg.hidden_size, n = 41;
  std::vector<float> xv(static_cast<size_t>(n * dim));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (float& v : xv) v = nd(rng);
  Tensor x = cpu->from_host_f32(xv, {n, dim});
  MoeRoute route = cpu->moe_route(x, lw.gate, lw.gate_bias, ref.top_k, ref.route_scale, ref.gate_temp);
  std::vector<float> want = cpu->to_host_f32(cpu->moe_experts(x, route, lw.experts, lw.shared, ref.swiglu_limit));
  const int n_experts = static_cast<int>(lw.experts.size());
  for (int world : worlds()) {
    if (n_experts % world != 0) continue;
    auto comms = parallel::make_nccl_group(world);
    std::vector<int64_t> first(world + 1, 0);
    for (int r = 0; r < world; ++r) first[r + 1] = r == 0 ? 0 : std::min<int64_t>(n, first[r] + 1 + static_cast<int64_t>(rng() % 20));
    first[world] = n;  // rank 0 has no rows, the last rank the rest
    std::vector<std::vector<float>> got(world);
    parallel::ExpertPlacement placement = parallel::uniform_placement(n_experts, world);
    run_on(comms, [&](Communicator& comm) {
      const int me = comm.rank();
      std::unique_ptr<Backend> be = make_cpu_backend();
      parallel::EpMoe ep(*be, comm, placement);
      const int64_t rows = first[me + 1] - first[me];
      Tensor xr = rows > 0 ? be->from_host_f32(std::vector<float>(xv.begin() + first[me] * dim,
                                                                  xv.begin() + first[me + 1] * dim), {rows, dim})
                           : Tensor{TType::kF32, {0, dim}};
      Tensor y = ep.forward(ref, xr);
      got[me] = rows > 0 ? be->to_host_f32(y) : std::vector<float>{};
    });
    std::vector<float> joined;
    for (auto& g : got) joined.insert(joined.end(), g.begin(), g.end());
    ASSERT_EQ(joined.size(), want.size());
    EXPECT_EQ(0, std::memcmp(joined.data(), want.data(), want.size() * sizeof(float))) << "EP " << world;
  }
}

// DP ranks with EP MoE over NCCL on the tiny model: one sequence per rank (rank 0 idle), prefill
// logits equal the single-rank CPU model's.
TEST(NcclEp, ModelLogitsEqualOneRank) {
  if (worlds().empty()) GTEST_SKIP() << "needs >= 2 CUDA devices";
  std::mt19937_64 rng(gputest::fresh_seed());
  const std::string dir = std::string(DI_TEST_DATA) + "/golden_dev/model";
  std::unique_ptr<Backend> ref_be = make_cpu_backend();
  std::unique_ptr<Model> ref = Model::load(dir, *ref_be);
  const ModelConfig& cfg = ref->config();
  for (int world : worlds()) {
    if (cfg.n_routed_experts % world != 0) continue;
    std::vector<std::vector<int32_t>> prompts(world);
    for (int r = 1; r < world; ++r)
      for (int i = 0, n = 1 + static_cast<int>(rng() % 20); i < n; ++i)
        prompts[r].push_back(static_cast<int32_t>(rng() % static_cast<uint64_t>(cfg.vocab_size)));
    std::vector<std::vector<float>> got(world);
    parallel::ExpertPlacement placement = parallel::uniform_placement(cfg.n_routed_experts, world);
    auto comms = parallel::make_nccl_group(world);
    run_on(comms, [&](Communicator& comm) {
      const int me = comm.rank();
      std::unique_ptr<Backend> cpu = make_cpu_backend();
      parallel::EpBackend be(*cpu, comm, {placement});
      std::unique_ptr<Model> model = Model::load(dir, be);
      if (prompts[me].empty()) {
        ModelConfig c = load_model_config(dir);
        std::unique_ptr<Checkpoint> ckpt = Checkpoint::open(dir);
        ModelWeights w = bind_model_weights(c, *ckpt, *cpu);
        be.idle_forward(w, c.n_layers, static_cast<float>(c.swiglu_limit));
        return;
      }
      SequenceState st = model->new_sequence();
      got[me] = model->forward(st, prompts[me], true).logits;
    });
    for (int r = 1; r < world; ++r) {
      SequenceState st = ref->new_sequence();
      std::vector<float> want = ref->forward(st, prompts[r], true).logits;
      ASSERT_EQ(got[r].size(), want.size());
      EXPECT_EQ(0, std::memcmp(got[r].data(), want.data(), want.size() * sizeof(float))) << "EP " << world << " rank " << r;
    }
  }
}

}  // namespace
}  // namespace di
