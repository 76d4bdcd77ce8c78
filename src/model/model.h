// DeepSeek-V4.1-Flash, written once over the Backend op contract: the 40-block forward with
// single-pass mHC, CSA2 attention (Full / Reindex / Reuse), MoE, Engram, and the DSpark draft.
// One Model serves many sequences; each sequence's caches live in its SequenceState.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "model/engram_hash.h"
#include "model/model_weights.h"
#include "model/safetensors.h"
#include "model/sequence_state.h"
#include "model/state_io.h"

namespace di {

struct EngramTokenMap;  // tokenizer/engram_token_map.h
struct WindowLists;     // model/model_scratch.h

struct ForwardResult {
  std::vector<float> logits;  // [n_rows, vocab] fp32: the last position, or every computed position
  // With ForwardOptions::borrow_logits, `logits` stays empty and these rows are read in place from
  // the backend's host buffer: valid until the model's next forward (the engine samples them at once).
  std::span<const float> borrowed_logits;
  std::span<const float> logits_rows() const { return logits.empty() ? borrowed_logits : logits; }
  Tensor features;            // [n_rows, n_taps * D] DSpark feature taps (empty without DSpark)
  // Position of logits row 0 (all_logits) and of features row 0: the state's n_tokens before the
  // forward, or later when decoder_window_only computed only the chunk's last rows.
  int64_t rows_position = 0;
};

struct ForwardOptions {
  bool all_logits = false;  // one logits row per computed token, else the last token's row only
  // Logits in ForwardResult::borrowed_logits instead of a copy per entry (batch 64's 33 MB of
  // logits took ~8 ms a step to copy into fresh vectors).
  bool borrow_logits = false;
  // Encoder side of SWA bounded replay: the compressed-KV / index-key rows of positions
  // < keep_global_before came from the prefix cache; this forward rebuilds the window rings,
  // compressor tails and DSpark features of its tokens but does not rewrite those rows.
  int64_t keep_global_before = 0;
  // Decoder side of SWA bounded replay: in a chunk longer than the window, the last KV-source layer
  // (the last Full layer) writes its global rows and window ring from every row, then it and the
  // layers after it run only on the chunk's last `window` rows. Their window attention then lacks
  // the dropped rows: an approximation (off = exact). Logits and features cover the kept rows.
  bool decoder_window_only = false;
};

struct BatchEntry {
  SequenceState* state = nullptr;
  std::vector<int32_t> ids;  // tokens at positions state->n_tokens..
  ForwardOptions options;
};

struct DraftResult {
  std::vector<int32_t> ids;         // [block + 1]: the anchor token, then the greedy drafts
  std::vector<float> logits;        // [block, vocab] Markov-corrected draft logits
  std::vector<float> confidence;    // [block] confidence logits (before the sigmoid)
};

// Observation / injection points of one forward, for layer-by-layer tests against the reference.
struct ForwardHooks {
  // Before layer `layer` (before its Engram): may replace the residual streams and the pre mix. Set, it
  // turns off the fusion that computes a block's input inside the block before it.
  std::function<void(int layer, Tensor& h, Tensor& pre_mix)> before_layer;
  // Before layer `layer`, only to observe where the forward is (a bench's section marks): changes
  // nothing, so the forward keeps its cross-layer fusions.
  std::function<void(int layer)> at_layer;
  // After an Engram injection: the block's input (may be replaced).
  std::function<void(int layer, Tensor& h)> after_engram;
  // The attention and MoE sublayer outputs of a block ([n, D]).
  std::function<void(int layer, const Tensor& y)> after_attention;
  std::function<void(int layer, const Tensor& y)> after_ffn;
  // After the block: its output streams and the FFN-site mixes it hands on.
  std::function<void(int layer, const Tensor& h, const Tensor& mix)> after_block;
};

struct ModelOptions {
  bool allow_unexpected_tensors = false;
  // The official reference's indexers read the index keys last published by any Full layer; in
  // decode a ratio-2 layer whose group is still open publishes none and so scores against the
  // ratio-1 source's keys of the previous step. On (default): reproduce the official decode exactly.
  // Off: every layer scores against its own KV source's keys, window lists are always `window`
  // long, and any chunking of a prompt -- one-token decode included -- gives the same logits as
  // one prefill.
  bool reference_decode_quirks = true;
  // With the quirks off: the indexer of a layer runs once over every sequence of a batch (their
  // keys in one tensor) instead of once per sequence -- the same lists. Off only to test that.
  bool batched_indexer = true;
  // Positions per page of the global-KV page pool (a multiple of every compress ratio).
  int64_t kv_page_tokens = 64;
};

class Model {
 public:
  // Loads config, checkpoint and (for Engram) tokenizer from `dir`; validates; binds weights.
  static std::unique_ptr<Model> load(const std::filesystem::path& dir, Backend& backend,
                                     const ModelOptions& options = {});
  // Same from a parsed config and an open checkpoint (e.g. the synthetic one of `deepinfer bench`).
  // engram_map: the Engram token map (load(dir) builds it from DIR/tokenizer.json); required when
  // the config has Engram layers.
  static std::unique_ptr<Model> load(ModelConfig cfg, std::unique_ptr<Checkpoint> ckpt, Backend& backend,
                                     const ModelOptions& options, const EngramTokenMap* engram_map);

  const ModelConfig& config() const { return cfg_; }
  Backend& backend() { return backend_; }
  bool has_dspark() const { return cfg_.n_mtp_layers > 0 && cfg_.dspark_block_size > 0; }

  SequenceState new_sequence() { return make_sequence_state(cfg_, backend_, kv_pool_); }
  // The page pool every sequence of this model keeps its global rows in.
  GlobalKvPool& kv_pool() { return *kv_pool_; }

  // Runs `ids` at positions state.n_tokens.. (a prefill chunk or one decode token) and appends them
  // to the caches. all_logits: one row per token, else the last token's row only. A batch of one.
  ForwardResult forward(SequenceState& state, const std::vector<int32_t>& ids, bool all_logits = false,
                        const ForwardHooks* hooks = nullptr);

  // Continuous batching: prefill chunks and decode tokens of different sequences in one pass. Dense
  // work (embedding, mHC, norms, projections, MoE, head) runs once over the concatenated rows of all
  // entries; attention, compressors, indexer and Engram history per entry. One result per entry, in
  // order. On the CPU backend each entry's results are bit-identical to running it alone. Each
  // state may appear once. Hooks see the concatenated rows.
  std::vector<ForwardResult> forward_batch(std::vector<BatchEntry>& entries, const ForwardHooks* hooks = nullptr);

  // Engram token history of a prefix restored from the prefix cache without running it.
  void restore_history(SequenceState& state, const std::vector<int32_t>& prefix_ids);

  // The last layer that writes global rows a later layer reads (the last Full layer), -1 if none.
  int last_kv_source_layer() const;

  // DSpark: writes the draft stages' window rows for the positions whose target features are given
  // (rows for positions state.dspark_seeded..), as the reference's prefill / per-step seeding.
  // first_position >= 0: the features start there instead (ForwardResult::rows_position after a
  // decoder_window_only chunk; the positions skipped must not be needed: >= window rows given).
  void dspark_seed(SequenceState& state, const Tensor& features, int64_t first_position = -1);
  // DSpark: drafts block_size tokens after `anchor`, the token sampled at position `pos` + 1 (pos =
  // the last seeded position). Greedy drafts.
  DraftResult dspark_draft(SequenceState& state, int32_t anchor);

 private:
  Model(ModelConfig cfg, std::unique_ptr<Checkpoint> ckpt, Backend& backend);

  struct ForwardScratch;  // per-forward, per-sequence shared attention state (top-k lists, candidates)
  struct Batch;           // the row layout of one forward: which rows belong to which sequence
  struct AttnRows;        // one layer's batched projections, sliced per sequence
  // x_in: the block's attention input when the block before computed it (else it is computed here);
  // next_norm: the next block's attention norm, whose input this block then writes to *next_x (the
  // fused Backend::hc_post_pre_norm, valid when nothing changes the streams in between).
  Tensor block(int layer, const Tensor& h, Tensor& pre_mix, Batch& batch, const ForwardHooks* hooks,
               const Tensor* x_in = nullptr, const Weight* next_norm = nullptr, Tensor* next_x = nullptr);
  // `beside`: side work to issue once the keys are (the caller's work that may run beside the rest).
  Tensor attention(int layer, const Tensor& x, Batch& batch, const std::function<void()>& beside = {});
  Tensor dspark_attention(int layer, const Tensor& x, const std::vector<int64_t>& positions, SequenceState& state);
  // Every part's last min(rows, window) current rows of kv into its window ring, one launch.
  static void write_windows(Backend& be, const Tensor& kv, const Batch& batch, const std::vector<Tensor>& rings,
                            int64_t window);
  // Full layers: the compressor over every sequence's rows (pending tails, completed groups ->
  // packed compressed KV and index keys; the latents of all sequences projected and packed at once).
  void compress(int layer, const AttnRows& a, Batch& batch);
  // Compressed branch of a ratio > 0 layer for one sequence's query rows: their top-k lists of its
  // compressed row ids ([q rows, k] I32, -1 = none).
  Tensor compressed_branch(int layer, const AttnRows& a, int part, Batch& batch);
  // The same for every query row of the batch at once ([q rows, k], rows of a part past its own
  // list width -1); the batched indexer (quirks off: every layer reads its own KV source's keys).
  Tensor compressed_branch_batch(int layer, const AttnRows& a, Batch& batch);
  bool batched_indexer() const { return options_.batched_indexer && !options_.reference_decode_quirks; }
  // The batch's window lists for its current row layout (built on the host once per layout).
  const WindowLists& window_lists_of(Batch& batch);
  // [q rows, window ++ top-k] lists of the whole batch; `lists` per part, `width` the widest;
  // with_pool_rows(head, ids, first part, parts) = head ++ the parts' row ids mapped to key ids of the
  // page pool (ids unchanged: it may be a Reuse layer's source list).
  using WithPoolRows = std::function<Tensor(const Tensor&, const Tensor&, size_t, size_t)>;
  Tensor attention_lists(const WindowLists& wl, const std::vector<Tensor>& lists, int64_t width, Batch& batch,
                         const WithPoolRows& with_pool_rows);
  Tensor attention_output(int layer, Tensor o, const std::vector<int64_t>& positions);
  // Engram: appends ids to the history (cut to `start` first) and hashes them: [n][slot][col] rows.
  std::vector<int32_t> engram_hashes(SequenceState& state, int64_t start, const std::vector<int32_t>& ids);
  Tensor moe(int layer, const Tensor& x);
  Tensor engram(int layer, const Tensor& h, const Tensor& cols);
  Tensor one_hot_pre(int64_t n);
  Tensor repeat_streams(const Tensor& x);

  ModelConfig cfg_;
  ModelOptions options_;
  std::unique_ptr<Checkpoint> ckpt_;
  Backend& backend_;
  ModelWeights w_;
  std::shared_ptr<GlobalKvPool> kv_pool_;
  std::vector<RopeTable> rope_;        // per layer
  EngramLayout engram_;
  std::vector<int32_t> engram_token_map_;
  int32_t engram_pad_ = 0;
};

}  // namespace di
