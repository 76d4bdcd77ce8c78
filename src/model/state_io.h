// Copies of a sequence's caches: a clone (exact snapshots), the global rows of a block of positions
// -- the compressed KV and index keys of the Full layers in their packed formats, all that SWA
// bounded replay keeps of a prefix (spec §3.4) -- as copies (GlobalRows) or as shared pages.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "model/sequence_state.h"

namespace di {

// A copy that evolves independently: every ring and tail copied, counts and history; the global-row
// pages shared until either writes one (copy on write).
SequenceState clone_state(const SequenceState& s, Backend& b);

// Global rows covering positions [begin, end) (multiples of every compress ratio), per Full layer.
struct GlobalRows {
  std::vector<int> layers;          // the Full layers, in layer order
  std::vector<int> ratios;          // their compress ratios
  std::vector<Tensor> comp;         // per layer: [(end - begin) / ratio, packed_row(Dh)] U8 FP4 + E4M3 scales
  std::vector<Tensor> index_keys;   // per layer: [(end - begin) / ratio, packed_row(index dim)] U8 FP4 + UE8M0
  int64_t begin = 0, end = 0;
};

// Throws di::Error when [begin, end) is not ratio-aligned or not yet written.
GlobalRows read_global_rows(const SequenceState& s, int64_t begin, int64_t end, Backend& b);

// Writes the rows into the state's compressed caches (growing them); n_comp then covers `end`.
// Throws di::Error when the rows would leave a gap below `begin` or do not match the state's layers.
void write_global_rows(SequenceState& s, const GlobalRows& rows, Backend& b);

// Zero-copy: the pages holding positions [begin, end) (page-aligned, written), for the prefix cache.
std::vector<PageRef> share_global_pages(const SequenceState& s, int64_t begin, int64_t end);
// Appends pages holding positions [begin, begin + pages * page_tokens) to a state whose global rows
// end at `begin` (= its pages' end); its rows then cover them. Throws di::Error otherwise.
void adopt_global_pages(SequenceState& s, const std::vector<PageRef>& pages, int64_t begin);

// Bytes of global rows per token (890 B on V4.1-Flash), rounded up when a ratio does not divide.
int64_t global_bytes_per_token(const ModelConfig& cfg);

// A state whose global rows (and Engram history: Model::restore_history) cover a prefix hit, before
// the encoder-side replay: the next forward feeds positions from `position` (hit - window, or 0),
// and the window rings hold nothing below it. Feed [position, hit) with keep_global_before = hit.
void set_replay_start(SequenceState& s, int64_t position);

}  // namespace di
