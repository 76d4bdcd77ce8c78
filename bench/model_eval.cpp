// Quality of a model on held-out token ids, measured by the engine itself (CPU backend):
//  - perplexity: the ids cut into chunks of --chunk tokens, each scored once from BOS + the chunk's
//    earlier tokens (one prefill with all logits per chunk), as tools/train_small/train.py does;
//  - DSpark acceptance: speculative decoding simulated from --prompts prefixes of --prompt-len
//    tokens (BOS + ids, at evenly spaced offsets of the ids) for --gen tokens each. Each step drafts dspark_block_size tokens after the
//    target's token; the target then decodes them one by one. Greedy: a draft is accepted while it
//    equals the target's argmax. Sampled (temperature 1, greedy drafts): draft d is accepted with
//    probability p_target(d) (the lossless rule min(1, p/q) with q one-hot); on a rejection the next
//    token is drawn from p_target without d, renormalised.
//
//   model_eval --model DIR --ids FILE.i32 [--chunk 512] [--ppl-chunks N] [--prompts 16]
//              [--prompt-len 128] [--gen 64] [--seed 1]
// FILE.i32: little-endian int32 token ids (export.py writes the held-out stream).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "model/model.h"

namespace {

using di::DraftResult;
using di::ForwardResult;
using di::Model;
using di::SequenceState;

std::vector<int32_t> read_ids(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) throw di::Error(path + ": cannot open");
  std::vector<int32_t> v(static_cast<size_t>(f.tellg()) / 4);
  f.seekg(0);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
  return v;
}

double log_softmax_at(const float* row, int64_t n, int32_t id) {
  double mx = *std::max_element(row, row + n), s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(double(row[i]) - mx);
  return double(row[id]) - mx - std::log(s);
}

std::vector<double> softmax(const float* row, int64_t n) {
  double mx = *std::max_element(row, row + n), s = 0;
  std::vector<double> p(n);
  for (int64_t i = 0; i < n; ++i) s += (p[i] = std::exp(double(row[i]) - mx));
  for (double& v : p) v /= s;
  return p;
}

int32_t draw(const std::vector<double>& p, std::mt19937_64& rng) {
  double total = 0;
  for (double v : p) total += v;
  double u = std::uniform_real_distribution<double>(0.0, total)(rng), acc = 0;
  for (size_t i = 0; i < p.size(); ++i)
    if ((acc += p[i]) > u) return static_cast<int32_t>(i);
  return static_cast<int32_t>(p.size() - 1);
}

int32_t argmax(const std::vector<float>& v) { return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin()); }

struct Acceptance {
  long long steps = 0, accepted = 0, tokens = 0;
  std::vector<long long> histogram;  // steps by number of accepted drafts
};

// One prompt: prefill, then draft / verify steps until `gen` tokens were produced.
void speculate(Model& m, const std::vector<int32_t>& prompt, int gen, bool greedy, std::mt19937_64& rng, Acceptance& acc) {
  const int64_t vocab = m.config().vocab_size;
  const int block = m.config().dspark_block_size;
  SequenceState st = m.new_sequence();
  ForwardResult f = m.forward(st, prompt);
  m.dspark_seed(st, f.features);
  auto next_of = [&](const std::vector<float>& logits) {
    return greedy ? argmax(logits) : draw(softmax(logits.data(), vocab), rng);
  };
  int32_t anchor = next_of(f.logits);
  int produced = 1;
  while (produced < gen && st.n_tokens + block + 2 < m.config().max_position) {
    DraftResult d = m.dspark_draft(st, anchor);
    int32_t feed = anchor, next = -1;
    int k = 0;
    for (; k < block; ++k) {
      f = m.forward(st, {feed});
      m.dspark_seed(st, f.features);
      const int32_t draft = d.ids[k + 1];
      if (greedy) {
        const int32_t t = argmax(f.logits);
        if (t != draft) {
          next = t;
          break;
        }
      } else {
        std::vector<double> p = softmax(f.logits.data(), vocab);
        if (std::uniform_real_distribution<double>(0.0, 1.0)(rng) >= p[draft]) {
          p[draft] = 0;  // residual of the lossless rule with a one-hot draft
          next = draw(p, rng);
          break;
        }
      }
      feed = draft;
    }
    if (k == block) {  // every draft accepted: the target's token after the last one
      f = m.forward(st, {feed});
      m.dspark_seed(st, f.features);
      next = next_of(f.logits);
    }
    acc.steps += 1;
    acc.accepted += k;
    acc.tokens += k + 1;
    acc.histogram[k] += 1;
    produced += k + 1;
    anchor = next;
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_dir, ids_path;
  int chunk = 512, ppl_chunks = -1, prompts = 16, prompt_len = 128, gen = 64;
  uint64_t seed = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--model") model_dir = v;
    else if (k == "--ids") ids_path = v;
    else if (k == "--chunk") chunk = std::stoi(v);
    else if (k == "--ppl-chunks") ppl_chunks = std::stoi(v);
    else if (k == "--prompts") prompts = std::stoi(v);
    else if (k == "--prompt-len") prompt_len = std::stoi(v);
    else if (k == "--gen") gen = std::stoi(v);
    else if (k == "--seed") seed = std::stoull(v);
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (model_dir.empty() || ids_path.empty()) {
    std::fprintf(stderr, "usage: model_eval --model DIR --ids FILE.i32 [--chunk N] [--ppl-chunks N] [--prompts N] "
                         "[--prompt-len N] [--gen N] [--seed S]\n");
    return 2;
  }
  try {
    auto t0 = std::chrono::steady_clock::now();
    std::unique_ptr<di::Backend> backend = di::make_cpu_backend();
    std::unique_ptr<Model> m = Model::load(model_dir, *backend);
    const int64_t vocab = m->config().vocab_size;
    const int32_t bos = m->config().bos_token_id;
    std::vector<int32_t> ids = read_ids(ids_path);

    if (ppl_chunks != 0) {
      double nll = 0;
      long long n = 0, done = 0;
      for (size_t c = 0; c < ids.size() && (ppl_chunks < 0 || done < ppl_chunks); c += chunk, ++done) {
        std::vector<int32_t> y(ids.begin() + c, ids.begin() + std::min(ids.size(), c + chunk));
        std::vector<int32_t> x = {bos};
        x.insert(x.end(), y.begin(), y.end() - 1);
        SequenceState st = m->new_sequence();
        ForwardResult f = m->forward(st, x, /*all_logits=*/true);
        for (size_t i = 0; i < y.size(); ++i) nll -= log_softmax_at(f.logits.data() + i * vocab, vocab, y[i]);
        n += static_cast<long long>(y.size());
      }
      std::printf("perplexity: %lld tokens in %lld chunks of %d: nll %.4f ppl %.3f\n", n, done, chunk, nll / n,
                  std::exp(nll / n));
      std::fflush(stdout);
    }
    if (prompts > 0 && m->has_dspark()) {
      for (bool greedy : {true, false}) {
        Acceptance acc;
        acc.histogram.assign(m->config().dspark_block_size + 1, 0);
        std::mt19937_64 rng(seed);
        for (int p = 0; p < prompts; ++p) {
          size_t c = static_cast<size_t>(p) * (ids.size() / prompts);  // spread over the held-out stream
          if (c + prompt_len > ids.size()) break;
          std::vector<int32_t> prompt = {bos};
          prompt.insert(prompt.end(), ids.begin() + c, ids.begin() + c + prompt_len - 1);
          speculate(*m, prompt, gen, greedy, rng, acc);
        }
        std::printf("DSpark %s: %lld steps, accepted drafts per step %.3f, mean acceptance length %.3f tokens "
                    "per target step; steps by accepted drafts:",
                    greedy ? "greedy" : "sampled (T=1)", acc.steps, double(acc.accepted) / acc.steps,
                    double(acc.tokens) / acc.steps);
        for (long long h : acc.histogram) std::printf(" %lld", h);
        std::printf("\n");
        std::fflush(stdout);
      }
    }
    std::printf("time %.1f s\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
