#include "runtime/cache_fill.h"

#include <algorithm>
#include <random>

#include "core/error.h"

namespace di {

namespace {

// [rows, dim] valid packed rows of `format`: random O(1) f32 values, quantize-dequantized, packed.
Tensor random_packed_rows(Backend& be, int64_t rows, int64_t dim, RowFormat format, std::mt19937_64& rng) {
  Tensor packed = be.zeros(TType::kU8, {rows, packed_row_bytes(format, dim)});
  if (rows == 0) return packed;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  // Built in blocks, so the host never holds more than one block of f32 rows.
  const int64_t block = std::max<int64_t>(1, (int64_t{16} << 20) / (4 * dim));
  for (int64_t r0 = 0; r0 < rows; r0 += block) {
    const int64_t n = std::min(block, rows - r0);
    std::vector<float> v(static_cast<size_t>(n * dim));
    for (float& x : v) x = normal(rng);
    Tensor t = be.from_host_f32(v, {n, dim});
    be.qdq(t, format);
    std::vector<int64_t> slots(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) slots[static_cast<size_t>(i)] = r0 + i;
    be.pack_rows(t, format, packed, slots);
  }
  return packed;
}

}  // namespace

CacheFiller::CacheFiller(Model& model, int64_t context, int64_t headroom, uint64_t seed)
    : model_(model), context_(context), headroom_(headroom), seed_(seed) {
  const ModelConfig& c = model.config();
  if (context < 1) throw Error("cache fill: context must be at least 1 token, got " + std::to_string(context));
  if (context + headroom > c.max_position)
    throw Error("cache fill: context " + std::to_string(context) + " + " + std::to_string(headroom) +
                " decode tokens exceeds max_position_embeddings " + std::to_string(c.max_position));
  Backend& be = model.backend();
  std::mt19937_64 rng(seed);
  window_rows_ = random_packed_rows(be, c.window, c.head_dim, RowFormat::kFp8Ue8m0, rng);
  bool any_full = false;
  for (const LayerSchedule& ls : c.layers) any_full = any_full || ls.mode == AttnMode::kFull;
  if (any_full) {
    comp_rows_ = random_packed_rows(be, context, c.head_dim, RowFormat::kFp4E4m3, rng);
    key_rows_ = random_packed_rows(be, context, c.index_head_dim, RowFormat::kFp4Ue8m0, rng);
  }
}

int64_t CacheFiller::pages_per_sequence() const {
  const int64_t t = model_.kv_pool().page_tokens();
  return (context_ + headroom_ + t - 1) / t;
}

void CacheFiller::fill(SequenceState& state) const {
  const ModelConfig& c = model_.config();
  Backend& be = model_.backend();
  DI_CHECK(state.n_tokens == 0 && state.layers.size() == c.layers.size());
  int last_full = -1;
  prepare_global_write(state, 0, context_ + headroom_);  // pages for the decode steps to come too
  GlobalKvPool& pool = *state.pool;
  for (const LayerSchedule& ls : c.layers) {
    LayerCache& cache = state.layers[static_cast<size_t>(ls.layer)];
    // window ring: slot p % W holds position p for the last W positions, i.e. every slot once the
    // context reaches W, else slots 0 .. context-1
    be.copy_rows(cache.window, 0, window_rows_, 0, std::min<int64_t>(context_, c.window));
    if (ls.mode != AttnMode::kFull) continue;
    // compressed rows of completed groups; a partial group's members would sit in the fp32 tail
    // (left zero: the benchmark's values are random anyway)
    const int64_t rows = context_ / ls.ratio;
    for_each_global_run(state, ls.layer, 0, rows, [&](int64_t pool_row, int64_t row, int64_t run) {
      be.copy_rows(pool.comp(ls.layer), pool_row, comp_rows_, row, run);
      be.copy_rows(pool.index_keys(ls.layer), pool_row, key_rows_, row, run);
    });
    cache.n_comp = rows;
    if (rows > 0) last_full = ls.layer;
  }
  state.index_keys_layer = last_full;  // the last Full layer to emit a row in a prefill's last chunk
  if (!c.engram_layer_ids.empty()) {  // compressed ids of the context's tokens
    std::mt19937_64 rng(seed_ ^ 0x5eed);
    const uint64_t classes = static_cast<uint64_t>(std::max<int64_t>(1, c.engram_compressed_vocab_size));
    state.engram_history.resize(static_cast<size_t>(context_));
    for (int32_t& h : state.engram_history) h = static_cast<int32_t>(rng() % classes);
  }
  state.n_tokens = context_;
}

}  // namespace di
