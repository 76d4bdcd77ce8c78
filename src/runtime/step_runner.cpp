#include "runtime/step_runner.h"

#include <chrono>

#include "core/error.h"

namespace di {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

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

StepOutput run_step(Model& model, std::vector<StepTask>& tasks, int64_t block_tokens) {
  StepOutput out;
  auto t0 = std::chrono::steady_clock::now();
  out.begin = t0;
  Backend& backend = model.backend();
  const int64_t vocab = model.config().vocab_size;
  try {
    // checkpoints of verify steps, so they can be rolled back to their accepted prefix
    std::vector<StateCheckpoint> checkpoints(tasks.size());
    std::vector<BatchEntry> batch(tasks.size());
    for (size_t i = 0; i < tasks.size(); ++i) {
      StepTask& t = tasks[i];
      if (t.n_draft > 0) {
        t.options.all_logits = true;
        checkpoints[i] = checkpoint_state(*t.state, static_cast<int64_t>(t.ids.size()), backend);
      }
      batch[i].state = t.state;
      batch[i].ids = t.ids;
      batch[i].options = t.options;
    }
    std::vector<ForwardResult> fwd = model.forward_batch(batch);
    out.forward_seconds = seconds_since(t0);

    out.results.resize(tasks.size());
    std::vector<uint32_t> mask_buf;
    for (size_t i = 0; i < tasks.size(); ++i) {
      StepTask& t = tasks[i];
      StepTaskResult& r = out.results[i];
      const std::vector<float>& logits = fwd[i].logits;
      if (t.sample && t.n_draft == 0) {
        std::span<const float> last(logits.data() + logits.size() - vocab, static_cast<size_t>(vocab));
        std::span<const int32_t> output(t.tokens->data() + t.n_prompt, t.tokens->size() - t.n_prompt);
        r.sampled.push_back(sample_row(t, last, output, mask_buf));
      } else if (t.n_draft > 0) {
        // rows 0..n_draft: row k predicts the token after ids[k]; draft ids[k + 1] is accepted when the
        // sampled token equals it (the draw is the one a plain decode would make: same seed, same index)
        const int64_t n_rows = static_cast<int64_t>(t.ids.size());
        DI_CHECK(static_cast<int64_t>(logits.size()) == n_rows * vocab);
        std::vector<int32_t> output(t.tokens->begin() + t.n_prompt, t.tokens->end());
        for (int64_t k = 0; k < n_rows; ++k) {
          std::span<const float> row(logits.data() + k * vocab, static_cast<size_t>(vocab));
          SampledToken s = sample_row(t, row, output, mask_buf);
          output.push_back(s.id);
          r.sampled.push_back(std::move(s));
          if (k + 1 == n_rows || r.sampled.back().id != t.ids[k + 1]) break;
        }
        int64_t keep = static_cast<int64_t>(r.sampled.size());  // the pending token + accepted drafts
        if (keep < n_rows) rollback_state(*t.state, checkpoints[i], keep, backend);
      }
      r.n_tokens_after = t.state->n_tokens;
      if (t.capture_from >= 0) {
        const int64_t n_blocks = t.state->n_tokens / block_tokens;
        r.first_block = t.capture_from;
        for (int64_t b = t.capture_from; b < n_blocks; ++b) {
          auto blk = std::make_shared<CachedBlock>();
          blk->rows = read_global_rows(*t.state, b * block_tokens, (b + 1) * block_tokens, backend);
          r.captured.push_back(std::move(blk));
        }
        if (t.capture_local && !r.captured.empty() && t.state->n_tokens % block_tokens == 0)
          r.captured.back()->local = capture_local(*t.state, backend);
      }
    }
  } catch (const std::exception& e) {
    out.results.clear();
    out.error = e.what();
  }
  out.end = std::chrono::steady_clock::now();
  out.seconds = std::chrono::duration<double>(out.end - t0).count();
  return out;
}

}  // namespace di
