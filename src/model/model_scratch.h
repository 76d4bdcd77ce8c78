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
  // index source layer -> [q rows, k] I32 compressed row ids of the sequence (Reuse layers share them)
  std::map<int, Tensor> topk;
  Tensor candidates;           // [q rows, T] U8 from the candidate source layer
  // Unpacked index keys, (source layer, rows) -> [rows, ihd]: the Reindex layers of one forward read
  // the same source cache. Dropped when the source writes.
  std::map<std::pair<int, int64_t>, Tensor> index_keys;
  void invalidate(int layer) {
    for (auto it = index_keys.begin(); it != index_keys.end();)
      it = it->first.first == layer ? index_keys.erase(it) : std::next(it);
  }
};

// The window key lists of every query row of a batch, for one row layout.
struct WindowLists {
  int64_t rows = -1, q_rows = -1;  // the layout they were built for
  std::vector<std::vector<int32_t>> parts;  // per part: [q rows, len] over [rings ; current rows]
  std::vector<int64_t> len;        // per part
  Tensor all;                      // [q rows, len] of every part when every len is equal, else empty
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
  // Keys of a layer's attention: [the window rings of the parts past their first chunk ; every
  // current row]. ring_base[i]: part i's ring rows (-1: none, a first chunk reads no ring).
  std::vector<int64_t> ring_base;
  int64_t ring_rows = 0;
  WindowLists window;
  // The batched indexer's state (Model::compressed_branch_batch), as ForwardScratch per part: the
  // top-k lists of every query row per index source, the candidate mask, and per KV source the page
  // pool rows of every part's index keys with each query row's first key.
  std::map<int, Tensor> topk;
  Tensor candidates;
  struct IndexKeys {
    Tensor slots;                  // [sum of the parts' compressed rows] I32: pool rows of the packed keys
    std::vector<int64_t> offsets;  // [q rows]
  };
  std::map<int, IndexKeys> index_keys;
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

// One attention layer's batched projections (every row at once), sliced per sequence where needed.
struct Model::AttnRows {
  Tensor x;                    // [rows, D] normed input of the current rows (keys, compressor)
  Tensor xq, qr, q;            // [q rows, D], [q rows, q_lora], [q rows, H*Dh] roped
  Tensor kv;                   // [rows, Dh] roped, FP8 quantize-dequantized
  Tensor comp_kv, comp_score;  // Full layers, [rows, Dh]: ratio 1 the normed latents; ratio > 1 fp32 inputs
  Tensor qi, wts;              // index sources: [q rows, nIH*ihd] roped FP4 qdq, [q rows, nIH] scaled
};

}  // namespace di
