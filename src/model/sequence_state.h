// Everything one request carries between forwards (spec §2.9, §3.1), in the packed deployment
// formats: window rings (FP8 rows + UE8M0 scales), ratio-2 compressor tails (fp32), the page table of
// its compressed KV (FP4 + E4M3 scales) and index keys (FP4 + UE8M0 scales) of the Full layers -- the
// rows themselves live in the model's shared page pool (global_kv_pool.h) --, the Engram history, and
// the DSpark stages' own window rings. Also the checkpoint / rollback of a speculative step.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "model/global_kv_pool.h"

namespace di {

struct LayerCache {
  int ratio = 0;                // compress ratio of a Full layer (owns tail / global rows), else 0
  bool dspark = false;          // a DSpark stage's ring (written by dspark_seed, not by forward)
  Tensor window;                // [window, packed_row(Dh)] U8 ring, slot = position % window
  Tensor tail_kv, tail_score;   // [ratio, Dh] F32 pending compressor group (ratio > 1 Full layers)
  int64_t n_comp = 0;           // compressed rows (and index keys) written, in the pages
  // Ratio > 1 Full layers: the compressor inputs of the last forward's tokens when it fed at most
  // `window` of them ([n, Dh] F32 each; empty otherwise), so that rollback_state can rebuild the
  // pending tail of any accepted prefix of a speculative step.
  Tensor step_kv, step_score;
};

struct SequenceState {
  int64_t n_tokens = 0;                 // positions already in the caches
  std::vector<int32_t> engram_history;  // compressed ids of every position (Engram)
  std::vector<LayerCache> layers;       // backbone layers then DSpark stages
  // Global rows: page i holds positions [i * page_tokens, (i + 1) * page_tokens) of every Full layer.
  // Pages may be shared (prefix cache, clones); a write goes to a page only this state holds.
  std::shared_ptr<GlobalKvPool> pool;
  std::vector<PageRef> pages;
  int64_t dspark_seeded = 0;            // positions written into the DSpark rings
  // The Full layer whose index keys the reference's indexers read next: the last one that emitted
  // a compressed row, possibly in an earlier forward (see compressed_branch). -1: none yet.
  int index_keys_layer = -1;
  // The window rings hold nothing below this position (a state rebuilt from the prefix cache's
  // global rows: its replay starts here). Window lists skip those positions.
  int64_t window_floor = 0;
};

SequenceState make_sequence_state(const ModelConfig& cfg, Backend& backend, std::shared_ptr<GlobalKvPool> pool);

// Before writing the global rows of positions [begin, end): pages cover [0, end), and those holding
// [begin, end) are this state's alone (a shared one is copied to a fresh page first).
void prepare_global_write(SequenceState& s, int64_t begin, int64_t end);
// Pool rows of a Full layer's rows [row0, row0 + n) (for pack_rows / unpack_rows on the pool).
std::vector<int64_t> global_slots(const SequenceState& s, int layer, int64_t row0, int64_t n);
// Calls fn(pool_row, row, run) for runs of rows [row0, row0 + n) of a Full layer that are contiguous
// in the pool (consecutive pages merge): for whole-row copies.
void for_each_global_run(const SequenceState& s, int layer, int64_t row0, int64_t n,
                         const std::function<void(int64_t pool_row, int64_t row, int64_t run)>& fn);
// Bytes of the state's own tensors (window rings, compressor tails); its global rows are in the pool.
int64_t local_state_bytes(const SequenceState& s);
// Pages the state's counters need: those covering its positions and its global rows.
int64_t pages_needed(const SequenceState& s);

// What a forward of n new tokens may overwrite: the ring slots of those positions (backbone and
// DSpark stages), the compressor tails, the counts. Taken just before that forward.
struct StateCheckpoint {
  int64_t n_tokens = 0, n_new = 0, dspark_seeded = 0;
  int index_keys_layer = -1;
  std::vector<Tensor> ring_rows;             // per layer: [min(n_new, window), row] U8, positions n_tokens..
  std::vector<Tensor> dspark_rows;           // per DSpark layer: [dspark_saved, row] U8, the ring rows
  int64_t dspark_saved = 0;                  //   of positions dspark_seeded.. that seeding may overwrite
  std::vector<Tensor> tail_kv, tail_score;   // per layer (ratio > 1 Full layers; else empty)
  std::vector<int64_t> n_comp;               // per layer
};

// n_new_tokens <= window (a speculative verify step). Throws di::Error otherwise.
StateCheckpoint checkpoint_state(const SequenceState& s, int64_t n_new_tokens, Backend& b);

// After the forward of the n_new_tokens the checkpoint was taken for (and any dspark_seed of their
// features), keep only the first n_keep of them: the state then equals, for every later forward,
// the state after feeding just those n_keep tokens (bit for bit with reference_decode_quirks off,
// where chunking does not change any row). The DSpark seeding is cut back to n_tokens as well.
// The forward must not have used keep_global_before or decoder_window_only.
void rollback_state(SequenceState& s, const StateCheckpoint& cp, int64_t n_keep, Backend& b);

}  // namespace di
