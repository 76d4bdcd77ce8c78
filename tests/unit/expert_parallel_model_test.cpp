// Attention DP + MoE EP simulated end to end on the tiny model (tests/data/golden_dev): each rank
// (a thread) runs its own Model over an EpBackend with its own sequences -- uneven counts, one rank
// idle -- and the logits of a prefill and a decode step equal the single-rank Model's, bit for bit.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "model/config.h"
#include "model/model_weights.h"
#include "model/safetensors.h"
#include "parallel/ep_backend.h"
#include "parallel/thread_communicator.h"
#include "test_util.h"
#include "tiny_model.h"

namespace di {
namespace {

struct Seq {
  std::vector<int32_t> prompt;
  int32_t next = 0;                     // the decode step's token
  std::vector<float> prefill, decode;   // logits (all prompt rows; the one decode row)
};

TEST(ExpertParallelModel, DpRanksWithEpMoeMatchOneRank) {
  std::mt19937_64 rng(testing_util::fresh_seed("DpRanksWithEpMoeMatchOneRank"));
  const std::string dir = std::string(DI_TEST_DATA) + "/golden_dev/model";
  std::unique_ptr<Backend> ref_be = make_cpu_backend();
  std::unique_ptr<Model> ref = testing_util::load_tiny_model(*ref_be, /*reference_decode_quirks=*/false);
  const ModelConfig& cfg = ref->config();
  const int vocab = static_cast<int>(cfg.vocab_size);
  for (int world : {2, 4, 8}) {
    // 0-2 sequences per rank, one rank idle, prompts of 1-20 tokens.
    const int idle = static_cast<int>(rng() % world);
    std::vector<std::vector<Seq>> seqs(world);
    for (int r = 0; r < world; ++r) {
      const int n = r == idle ? 0 : 1 + static_cast<int>(rng() % 2);
      for (int i = 0; i < n; ++i) {
        Seq s;
        s.prompt = testing_util::random_ids(rng, 1 + static_cast<int64_t>(rng() % 20), vocab);
        s.next = static_cast<int32_t>(rng() % vocab);
        seqs[r].push_back(s);
      }
    }
    // Placement: uniform, or with `world` redundant replicas for odd loads.
    const int n_experts = cfg.n_routed_experts;
    std::vector<int64_t> loads(n_experts);
    for (int64_t& l : loads) l = static_cast<int64_t>(1 + rng() % 100);
    const bool redundant = rng() % 2;
    parallel::ExpertPlacement placement = redundant ? parallel::balanced_placement(loads, world, world)
                                                    : parallel::uniform_placement(n_experts, world);
    std::vector<std::vector<Seq>> got = seqs;
    parallel::run_ranks(world, [&](parallel::Communicator& comm) {
      const int me = comm.rank();
      std::unique_ptr<Backend> cpu = make_cpu_backend();
      parallel::EpBackend be(*cpu, comm, {placement});
      std::unique_ptr<Model> model = testing_util::load_tiny_model(be, false);
      // An idle rank still joins every MoE layer's collectives.
      ModelConfig c = load_model_config(dir);
      std::unique_ptr<Checkpoint> ckpt = Checkpoint::open(dir);
      ModelWeights w = bind_model_weights(c, *ckpt, *cpu);
      std::vector<Seq>& mine = got[me];
      std::vector<SequenceState> states;
      for (size_t i = 0; i < mine.size(); ++i) states.push_back(model->new_sequence());
      for (int step = 0; step < 2; ++step) {
        if (mine.empty()) {
          be.idle_forward(w, c.n_layers, static_cast<float>(c.swiglu_limit));
          continue;
        }
        std::vector<BatchEntry> entries;
        for (size_t i = 0; i < mine.size(); ++i) {
          BatchEntry e;
          e.state = &states[i];
          e.ids = step == 0 ? mine[i].prompt : std::vector<int32_t>{mine[i].next};
          e.options.all_logits = true;
          entries.push_back(std::move(e));
        }
        std::vector<ForwardResult> out = model->forward_batch(entries);
        for (size_t i = 0; i < mine.size(); ++i) (step == 0 ? mine[i].prefill : mine[i].decode) = out[i].logits;
      }
      EXPECT_EQ(be.moe_calls(), 2 * c.n_layers);
    });
    for (int r = 0; r < world; ++r)
      for (size_t i = 0; i < seqs[r].size(); ++i) {
        SequenceState st = ref->new_sequence();
        std::vector<float> prefill = ref->forward(st, seqs[r][i].prompt, true).logits;
        std::vector<float> decode = ref->forward(st, {seqs[r][i].next}, true).logits;
        SCOPED_TRACE("EP " + std::to_string(world) + (redundant ? " redundant" : "") + ", rank " + std::to_string(r) +
                     " sequence " + std::to_string(i));
        ASSERT_EQ(got[r][i].prefill.size(), prefill.size());
        ASSERT_EQ(got[r][i].decode.size(), decode.size());
        EXPECT_EQ(0, std::memcmp(got[r][i].prefill.data(), prefill.data(), prefill.size() * sizeof(float)))
            << "max rel error " << testing_util::max_rel_error(got[r][i].prefill, prefill);
        EXPECT_EQ(0, std::memcmp(got[r][i].decode.data(), decode.data(), decode.size() * sizeof(float)))
            << "max rel error " << testing_util::max_rel_error(got[r][i].decode, decode);
      }
  }
}

}  // namespace
}  // namespace di
