// The V4.1 forward (spec §2.1-2.2, §2.6-2.7, §4.3): embedding, four residual streams with
// single-pass mHC, 40 blocks (Engram before blocks 1 and 14), the final collapse and fp32 head; and
// the DSpark draft (feature taps -> main_proj -> 3 stages -> Markov correction + confidence).
#include "model/model.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "core/error.h"
#include "model/model_scratch.h"
#include "model/rope_table.h"
#include "tokenizer/engram_token_map.h"
#include "tokenizer/tokenizer.h"

#if __has_include("model/checkpoint_validate.h")
#include "model/checkpoint_validate.h"
#define DI_HAVE_VALIDATE 1
#endif

namespace di {

Model::Model(ModelConfig cfg, std::unique_ptr<Checkpoint> ckpt, Backend& backend)
    : cfg_(std::move(cfg)), ckpt_(std::move(ckpt)), backend_(backend) {}

std::unique_ptr<Model> Model::load(const std::filesystem::path& dir, Backend& backend, const ModelOptions& options) {
  ModelConfig cfg = load_model_config(dir);
  std::unique_ptr<Checkpoint> ckpt = Checkpoint::open(dir);
  std::optional<EngramTokenMap> map;
  if (!cfg.engram_layer_ids.empty()) {
    // Engram hashes a tokenizer-normalised id space: the token map comes from tokenizer.json.
    if (!std::filesystem::exists(dir / "tokenizer.json"))
      throw Error((dir / "tokenizer.json").string() + ": missing; Engram layers need the tokenizer to build the token map");
    map = build_engram_token_map(*Tokenizer::load(dir));
  }
  return load(std::move(cfg), std::move(ckpt), backend, options, map ? &*map : nullptr);
}

std::unique_ptr<Model> Model::load(ModelConfig cfg, std::unique_ptr<Checkpoint> ckpt, Backend& backend,
                                   const ModelOptions& options, const EngramTokenMap* engram_map) {
#ifdef DI_HAVE_VALIDATE
  validate_checkpoint(cfg, *ckpt, options.allow_unexpected_tensors);
#endif
  std::unique_ptr<Model> m(new Model(std::move(cfg), std::move(ckpt), backend));
  m->options_ = options;
  m->w_ = bind_model_weights(m->cfg_, *m->ckpt_, backend);
  m->kv_pool_ = GlobalKvPool::create(m->cfg_, options.kv_page_tokens, backend);
  for (const LayerSchedule& ls : m->cfg_.layers) m->rope_.push_back(rope_table_for(ls, m->cfg_));
  m->engram_ = make_engram_layout(m->cfg_);
  if (m->engram_.n_slots() > 0) {
    if (!engram_map) throw Error("the config has Engram layers but no Engram token map was given");
    m->engram_pad_ = engram_pad_compressed(m->cfg_, engram_map->token_map, engram_map->compressed_vocab_size);
    m->engram_token_map_ = engram_map->token_map;
  }
  return m;
}

Tensor Model::one_hot_pre(int64_t n) {
  // The first sublayer collapses stream 0 only.
  std::vector<float> v(n * cfg_.hc_mix_dim(), 0.0f);
  for (int64_t i = 0; i < n; ++i) v[i * cfg_.hc_mix_dim()] = 1.0f;
  return backend_.from_host_f32(v, {n, cfg_.hc_mix_dim()});
}

Tensor Model::repeat_streams(const Tensor& x) {
  // [n, D] -> [n, hc * D]: every stream starts as the embedding.
  const int64_t n = x.rows(), hc = cfg_.hc_mult;
  // Decode sizes: one batched copy (one launch on CUDA), not hc - 1 concatenations of two copies each, a few
  // us of host time apiece at the start of a step, where the device waits for the host.
  constexpr int64_t kBatchedRows = 512;
  if (hc == 1 || n * hc > kBatchedRows) {
    Tensor h = x;
    for (int k = 1; k < hc; ++k) h = backend_.concat_cols(h, x);
    return h;
  }
  Tensor h = backend_.alloc(x.type, {n, hc * x.row_size()});
  Tensor streams = h;  // the same storage as [n * hc, D]: row i * hc + k is stream k of row i
  streams.shape = {n * hc, x.row_size()};
  std::vector<Backend::RowCopy> copies;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < hc; ++k) copies.push_back({streams, i * hc + k, x, i, 1});
  backend_.copy_rows_batch(copies);
  return h;
}

Tensor Model::moe(int layer, const Tensor& x) {
  const LayerSchedule& ls = cfg_.layers[layer];
  const LayerWeights& lw = w_.layers[layer];
  int top_k = ls.is_dspark ? cfg_.dspark_n_activated_experts : cfg_.n_activated_experts;
  return backend_.moe(x, lw.gate, lw.gate_bias, top_k, static_cast<float>(cfg_.route_scale),
                      static_cast<float>(cfg_.gate_temp), lw.experts, lw.shared, static_cast<float>(cfg_.swiglu_limit));
}

Tensor Model::engram(int layer, const Tensor& h, const Tensor& cols) {
  const LayerWeights& lw = w_.layers[layer];
  Tensor rows = backend_.engram_lookup(cols, lw.engram_table);  // [n, n_cols * head_dim]
  Tensor kv = backend_.linear(rows, lw.engram_wkv);              // [n, (hc + 1) * D]
  return backend_.engram_inject(h, kv, lw.engram_q, lw.engram_k, cfg_.hc_mult, static_cast<float>(cfg_.norm_eps));
}

Tensor Model::block(int layer, const Tensor& h_in, Tensor& pre_mix, Batch& batch, const ForwardHooks* hooks,
                    const Tensor* x_in, const Weight* next_norm, Tensor* next_x) {
  const LayerWeights& lw = w_.layers[layer];
  const int hc = cfg_.hc_mult;
  const float eps = static_cast<float>(cfg_.norm_eps), hc_eps = static_cast<float>(cfg_.hc_eps);
  // attention site: collapses with the previous site's pre; its input feeds the keys of every
  // current row, its queries (and everything after) only the query rows
  Tensor x = x_in ? *x_in : backend_.rmsnorm(backend_.hc_pre(h_in, pre_mix, hc), lw.attn_norm, eps);
  batch.set_query_rows(layer == batch.split_layer, cfg_.window);
  Tensor h = batch.query_rows(backend_, h_in);
  // the mixes the FFN site uses: nothing reads them before hc_post, so they are side work beside the
  // attention (a backend may run it concurrently; Backend::side_begin)
  Tensor a_mix;
  auto ffn_site_mixes = [&] {
    a_mix = backend_.hc_mixes(h, hc, lw.hc_attn_fn, lw.hc_attn_scale, lw.hc_attn_base, eps, cfg_.hc_sinkhorn_iters,
                              hc_eps);
  };
  Tensor y;
  if (cfg_.layers[layer].is_dspark) {
    run_beside(backend_, ffn_site_mixes);
    y = dspark_attention(layer, x, batch.positions, *batch.parts[0].state);
  } else {
    y = attention(layer, x, batch, ffn_site_mixes);
  }
  if (batch.query_rows_differ()) batch.adopt_query_rows();
  if (hooks && hooks->after_attention) hooks->after_attention(layer, y);
  backend_.side_join();
  // FFN site: the new streams and the MoE input (hc_post, hc_pre, rmsnorm); the site's mixes (the
  // next site's pre) beside the MoE
  auto [h1, x_ffn] = backend_.hc_post_pre_norm(y, h, a_mix, a_mix, hc, lw.ffn_norm, eps);
  Tensor f_mix = run_beside(backend_, [&] {
    return backend_.hc_mixes(h1, hc, lw.hc_ffn_fn, lw.hc_ffn_scale, lw.hc_ffn_base, eps, cfg_.hc_sinkhorn_iters,
                             hc_eps);
  });
  y = moe(layer, x_ffn);
  if (hooks && hooks->after_ffn) hooks->after_ffn(layer, y);
  backend_.side_join();
  pre_mix = f_mix;
  if (!next_norm) return backend_.hc_post(y, h1, f_mix, hc);
  auto [h_out, x_next] = backend_.hc_post_pre_norm(y, h1, f_mix, f_mix, hc, *next_norm, eps);
  *next_x = x_next;
  return h_out;
}

void Model::dspark_seed(SequenceState& state, const Tensor& features, int64_t first_position) {
  DI_CHECK(has_dspark());
  if (first_position >= 0) {
    if (first_position < state.dspark_seeded)
      throw Error("dspark_seed: features from position " + std::to_string(first_position) + ", but positions up to " +
                  std::to_string(state.dspark_seeded) + " are seeded");
    state.dspark_seeded = first_position;  // the positions skipped fall out of the ring (features of >= window rows)
  }
  int64_t n = features.rows(), start = state.dspark_seeded, win = cfg_.window;
  const float eps = static_cast<float>(cfg_.norm_eps);
  const LayerWeights& first = w_.layers[cfg_.n_layers];
  Tensor main_x = backend_.rmsnorm(backend_.linear(features, first.main_proj), first.main_norm, eps);  // [n, D]
  std::vector<int64_t> positions(n);
  for (int64_t i = 0; i < n; ++i) positions[i] = start + i;
  for (int s = 0; s < cfg_.n_mtp_layers; ++s) {
    int layer = cfg_.n_layers + s;
    const AttentionWeights& a = w_.layers[layer].attn;
    Tensor kv = backend_.rmsnorm_rope_qdq(backend_.linear(main_x, a.wkv), a.kv_norm, eps, 1, cfg_.head_dim,
                                          cfg_.rope_dim, positions, rope_[layer], RowFormat::kFp8Ue8m0);
    int64_t first_row = std::max<int64_t>(0, n - win);
    Tensor tail = backend_.alloc(TType::kF32, {n - first_row, kv.row_size()});
    backend_.copy_rows(tail, 0, kv, first_row, n - first_row);
    std::vector<int64_t> slots;
    for (int64_t i = first_row; i < n; ++i) slots.push_back((start + i) % win);
    backend_.pack_rows(tail, RowFormat::kFp8Ue8m0, state.layers[layer].window, slots);
  }
  state.dspark_seeded += n;
}

DraftResult Model::dspark_draft(SequenceState& state, int32_t anchor) {
  DI_CHECK(has_dspark() && state.dspark_seeded > 0);
  const int block_size = cfg_.dspark_block_size, hc = cfg_.hc_mult;
  const float eps = static_cast<float>(cfg_.norm_eps);
  const int64_t vocab = cfg_.vocab_size;
  if (anchor < 0 || anchor >= vocab) throw Error("DSpark anchor token id " + std::to_string(anchor) + " out of range");
  std::vector<int32_t> ids(block_size, cfg_.dspark_noise_token_id);
  ids[0] = anchor;
  std::vector<int64_t> positions(block_size);
  for (int i = 0; i < block_size; ++i) positions[i] = state.dspark_seeded + i;  // p+1 .. p+block
  Tensor h = repeat_streams(backend_.embed(backend_.from_host_i32(ids, {block_size}), w_.embed));
  Tensor pre = one_hot_pre(block_size);
  Batch batch;  // one sequence, the draft block's rows
  BatchPart part;
  part.state = &state;
  part.start = state.dspark_seeded;
  part.n = block_size;
  part.cur = {0, block_size, part.start};
  batch.parts.push_back(part);
  batch.scratch.resize(1);
  batch.positions = positions;
  batch.rows = block_size;
  for (int s = 0; s < cfg_.n_mtp_layers; ++s) h = block(cfg_.n_layers + s, h, pre, batch, nullptr);
  const LayerWeights& last = w_.layers[cfg_.n_layers + cfg_.n_mtp_layers - 1];
  Tensor x = backend_.hc_pre(h, pre, hc);  // [block, D]
  std::vector<float> logits = backend_.to_host_f32(backend_.linear(backend_.rmsnorm(x, last.final_norm, eps), w_.head));

  DraftResult r;
  r.ids.push_back(anchor);
  std::vector<Tensor> markov_rows;
  for (int i = 0; i < block_size; ++i) {
    // sequential Markov correction: the previous token's low-rank embedding biases this row
    Tensor e = backend_.embed(backend_.from_host_i32({r.ids.back()}, {1}), last.markov_embed);  // [1, rank]
    std::vector<float> bias = backend_.to_host_f32(backend_.linear(e, last.markov_head));      // [1, vocab]
    float* row = logits.data() + i * vocab;
    for (int64_t v = 0; v < vocab; ++v) row[v] += bias[v];
    r.ids.push_back(static_cast<int32_t>(std::max_element(row, row + vocab) - row));  // greedy, first max
    markov_rows.push_back(e);
  }
  Tensor emb = backend_.alloc(TType::kF32, {block_size, cfg_.dspark_markov_rank});
  for (int i = 0; i < block_size; ++i) backend_.copy_rows(emb, i, markov_rows[i], 0, 1);
  r.confidence = backend_.to_host_f32(backend_.linear(backend_.concat_cols(x, emb), last.confidence));
  r.logits = std::move(logits);
  return r;
}

}  // namespace di
