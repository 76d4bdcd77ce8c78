// The V4.1 engine's prefix-cache payload (one block of global rows -- the pool pages the request that
// wrote them held, shared, not copied --, plus the local state at the block's end in exact mode) and
// how a hit becomes a request's caches (its page table starts with the hit's pages):
//  - exact: the local state of the hit's last block, the global rows of every block and the Engram
//    history; the request continues at the hit's end H bit-identically to a cold run;
//  - replay (SWA bounded replay, encoder side, spec §3.4): the global rows of every block and the
//    history below the replay start S = H - window; the request re-runs [S, H) with
//    keep_global_before = H, which rebuilds its window rings and compressor tails.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model/model.h"
#include "runtime/prefix_cache.h"

namespace di {

struct CachedBlock final : PrefixCache::Payload {
  std::vector<PageRef> pages;                  // the block's positions (block_tokens / page_tokens pages)
  int64_t page_bytes = 0;                      // bytes of one of them
  std::shared_ptr<const SequenceState> local;  // exact mode: local state at the block's end, else null
};

// The local state of `s` at its current end: window rings, compressor tails and counters. Its
// page table is left empty (the blocks hold those pages) and so is the Engram history.
std::shared_ptr<const SequenceState> capture_local(const SequenceState& s, Backend& b);

// Bytes a cached block holds (its rows and its local state).
int64_t cached_block_bytes(const CachedBlock& block);

// Exact hit: the state after the hit's n_tokens tokens (the last block must carry a local state).
SequenceState restore_exact(Model& model, const PrefixCache::Hit& hit, const std::vector<int32_t>& tokens);
// Replay hit: global rows of the hit, history below `start`; the next forward feeds [start, hit end)
// with keep_global_before = hit.n_tokens.
SequenceState restore_replay(Model& model, const PrefixCache::Hit& hit, const std::vector<int32_t>& tokens,
                             int64_t start);

}  // namespace di
