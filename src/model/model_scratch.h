// Per-forward state of the V4.1 forward: the row layout of a batch of sequences, and per sequence the
// attention state handed down the layer stack (the reference's SharedAttentionRuntime): the top-k
// list of each index source and the candidate blocks of the candidate source.
#pragma once

#include <map>
#include <utility>

#include "model/model.h"

namespace di {

// Rows [r0, r0 + n) of t (t itself when that is all of it).
inline Tensor rows_of(Backend& be, const Tensor& t, int64_t r0, int64_t n) {
  if (r0 == 0 && n == t.rows()) return t;
  Tensor out = be.alloc(t.type, {n, t.row_size()});
  if (n > 0) be.copy_rows(out, 0, t, r0, n);
  return out;
}

struct Model::ForwardScratch {
  // index source layer -> [q rows, k] I32, already offset by that layer's window key count
  std::map<int, std::pair<Tensor, int>> topk;
  Tensor candidates;           // [q rows, T] U8 from the candidate source layer
  // [q rows, list] I32 window key lists: the same for every layer with the same row layout
  Tensor window_idx;
  int64_t window_list_len = 0;
  int64_t window_key_first = -1, window_q_first = -1;  // the layout window_idx was built for
  // Unpacked compressed KV / index keys, (source layer, rows) -> [rows, dim]: the Reuse and Reindex
  // layers of one forward read the same source cache. Dropped when the source writes.
  std::map<std::pair<int, int64_t>, Tensor> comp_rows, index_keys;
  void invalidate(int layer) {
    for (auto* m : {&comp_rows, &index_keys})
      for (auto it = m->begin(); it != m->end();) it = it->first.first == layer ? m->erase(it) : std::next(it);
  }
};

// Rows of one sequence in the batch's activations. A layer's keys come from the current rows; its
// queries from the query rows, which differ only at the decoder_window_only split layer (there the
// queries are the chunk's last `window` rows, and they become the current rows after it).
struct RowSpan {
  int64_t row0 = 0;   // first row in the activations
  int64_t rows = 0;
  int64_t first = 0;  // position of the first row
};

struct BatchPart {
  SequenceState* state = nullptr;
  ForwardOptions options;
  int64_t start = 0, n = 0;  // the positions [start, start + n) this forward feeds
  RowSpan cur, q;
  bool truncates = false;    // decoder_window_only and longer than the window
};

struct Model::Batch {
  std::vector<BatchPart> parts;
  std::vector<ForwardScratch> scratch;  // per part
  std::vector<int64_t> positions;       // [current rows]
  std::vector<int64_t> q_positions;     // [query rows] of the layer in progress
  int64_t rows = 0, q_rows = 0;
  int split_layer = -1;                 // where truncating parts drop rows; -1: none does

  // Query rows = current rows, or each truncating part's last `keep` rows.
  void set_query_rows(bool split, int64_t keep) {
    q_positions.clear();
    q_rows = 0;
    for (BatchPart& p : parts) {
      int64_t drop = split && p.truncates ? p.cur.rows - keep : 0;
      p.q = {q_rows, p.cur.rows - drop, p.cur.first + drop};
      for (int64_t i = 0; i < p.q.rows; ++i) q_positions.push_back(p.q.first + i);
      q_rows += p.q.rows;
    }
  }
  void adopt_query_rows() {
    for (BatchPart& p : parts) p.cur = p.q;
    positions = q_positions;
    rows = q_rows;
  }
  bool query_rows_differ() const { return q_rows != rows; }
  // The query rows of t [current rows, ...] (t itself when they are all of them).
  Tensor query_rows(Backend& be, const Tensor& t) const {
    if (!query_rows_differ()) return t;
    Tensor out = be.alloc(t.type, {q_rows, t.row_size()});
    for (const BatchPart& p : parts) be.copy_rows(out, p.q.row0, t, p.cur.row0 + (p.q.first - p.cur.first), p.q.rows);
    return out;
  }
};

// One attention layer's batched projections (every row at once), sliced per sequence after.
struct Model::AttnRows {
  Tensor x;                    // [rows, D] normed input of the current rows (keys, compressor)
  Tensor xq, qr, q;            // [q rows, D], [q rows, q_lora], [q rows, H*Dh] roped
  Tensor kv;                   // [rows, Dh] roped, FP8 quantize-dequantized
  Tensor comp_kv, comp_score;  // Full layers, [rows, Dh]: ratio 1 the normed latents; ratio > 1 fp32 inputs
  Tensor qi, wts;              // index sources: [q rows, nIH*ihd] roped FP4 qdq, [q rows, nIH] scaled
};

}  // namespace di
