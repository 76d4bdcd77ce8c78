#include "runtime/step_runner.h"

#include "core/error.h"

namespace di {
namespace {

// Samples output token number output.size() from one logits row, applying the request's mask hook.
SampledToken sample_row(const StepTask& t, std::span<const float> row, std::span<const int32_t> output,
                        std::vector<uint32_t>& mask_buf) {
  std::span<const uint32_t> allowed;
  if (t.mask && *t.mask) {
    mask_buf.assign(static_cast<size_t>(mask_words(t.sampler->vocab_size())), ~0u);
    if ((*t.mask)(output, mask_buf)) allowed = mask_buf;
  }
  return t.sampler->sample(row, output, allowed);
}

}  // namespace

StepOutput run_step(Model& model, std::vector<StepTask>& tasks, int64_t block_tokens,
                    const std::function<void()>& started) {
  StepOutput out;
  out.begin = std::chrono::steady_clock::now();
  if (started) started();
  Backend& backend = model.backend();
  const int64_t vocab = model.config().vocab_size;
  try {
    std::vector<StateCheckpoint> checkpoints(tasks.size());  // verify steps roll back to their accepted prefix
    std::vector<BatchEntry> batch(tasks.size());
    for (size_t i = 0; i < tasks.size(); ++i) {
      StepTask& t = tasks[i];
      if (t.create) {
        SequenceState s = !t.hit                ? model.new_sequence()
                          : t.exact_hit         ? restore_exact(model, *t.hit, *t.tokens)
                                                : restore_replay(model, *t.hit, *t.tokens, t.hit_start);
        *t.caches = std::make_unique<SequenceState>(std::move(s));
        t.hit.reset();
      }
      SequenceState& state = **t.caches;
      DI_CHECK(state.n_tokens == t.begin);
      batch[i].state = &state;
      batch[i].ids.assign(t.tokens->begin() + t.begin, t.tokens->begin() + t.begin + t.n);
      batch[i].ids.insert(batch[i].ids.end(), t.drafts.begin(), t.drafts.end());
      batch[i].options = t.options;
      batch[i].options.borrow_logits = true;  // sampled below, before the next forward
      if (!t.drafts.empty()) {
        batch[i].options.all_logits = true;
        checkpoints[i] = checkpoint_state(state, static_cast<int64_t>(batch[i].ids.size()), backend);
      }
    }
    std::vector<ForwardResult> fwd = model.forward_batch(batch);
    out.forward_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - out.begin).count();

    out.results.resize(tasks.size());
    std::vector<uint32_t> mask_buf;
    for (size_t i = 0; i < tasks.size(); ++i) {
      StepTask& t = tasks[i];
      StepTaskResult& r = out.results[i];
      SequenceState& state = **t.caches;
      std::span<const float> logits = fwd[i].logits_rows();
      const int32_t* toks = t.tokens->data();
      if (t.sample && t.drafts.empty()) {
        const int64_t pos = t.begin + t.n;  // the position of the token sampled here
        std::span<const float> last(logits.data() + logits.size() - vocab, static_cast<size_t>(vocab));
        r.sampled.push_back(sample_row(t, last, std::span<const int32_t>(toks + t.n_prompt, pos - t.n_prompt), mask_buf));
        if (t.fill) (*t.tokens)[pos] = r.sampled.back().id;
      } else if (t.sample) {
        // rows 0..drafts: row k predicts the token after the k-th fed token; draft k is accepted when
        // the sampler, drawing as a plain decode would (same seed, same output index), picks it
        const int64_t n_rows = static_cast<int64_t>(batch[i].ids.size());
        DI_CHECK(t.n == 1 && static_cast<int64_t>(logits.size()) == n_rows * vocab);
        std::vector<int32_t> output(toks + t.n_prompt, toks + t.begin + 1);
        for (int64_t k = 0; k < n_rows; ++k) {
          std::span<const float> row(logits.data() + k * vocab, static_cast<size_t>(vocab));
          SampledToken s = sample_row(t, row, output, mask_buf);
          output.push_back(s.id);
          r.sampled.push_back(std::move(s));
          if (k + 1 == n_rows || r.sampled.back().id != t.drafts[k]) break;
        }
        int64_t keep = static_cast<int64_t>(r.sampled.size());  // the fed token + accepted drafts
        if (keep < n_rows) rollback_state(state, checkpoints[i], keep, backend);
      }
      r.n_tokens_after = state.n_tokens;
      if (t.capture_from >= 0) {
        const int64_t n_blocks = state.n_tokens / block_tokens;
        r.first_block = t.capture_from;
        for (int64_t b = t.capture_from; b < n_blocks; ++b) {
          auto blk = std::make_shared<CachedBlock>();
          blk->pages = share_global_pages(state, b * block_tokens, (b + 1) * block_tokens);
          blk->page_bytes = state.pool->page_bytes();
          r.captured.push_back(std::move(blk));
        }
        if (t.snapshot_tokens > 0 && !r.captured.empty() && state.n_tokens % t.snapshot_tokens == 0)
          r.captured.back()->local = capture_local(state, backend);
      }
    }
  } catch (const std::exception& e) {
    out.results.clear();
    out.error = e.what();
  }
  out.end = std::chrono::steady_clock::now();
  return out;
}

}  // namespace di
