// Exact per-row top-k on the device with ties to the lowest index (TieBreak::kLowestIndex): the
// k[r] largest of values[r, 0 .. n[r]), equal values ordered by index, as ascending indices.
#pragma once

#include <cstdint>
#include <vector>

namespace di::cuda {
class UploadCache;
}

namespace di::cuda::attn {

// values: device [rows, stride] f32. For each row r: out[r * out_k + i] = (i-th smallest selected
// index) + offset for i < k[r], and -1 for k[r] <= i < out_k. Needs 0 <= k[r] <= n[r] <= stride and
// k[r] <= out_k. -0 and +0 tie. Runs on the current stream; no host round trip besides the small
// n / k upload (taken from `lists` when given and it holds them).
void topk_lowest_index(const float* values, int64_t rows, int64_t stride, const std::vector<int64_t>& n,
                       const std::vector<int64_t>& k, int64_t out_k, int32_t offset, int32_t* out,
                       UploadCache* lists = nullptr);

// torch.topk's CPU selection (TieBreak::kTorch; cpu::torch_topk_indices, emulated step by step by
// torch_select.h): for each row r, the k indices it selects among values[r, 0 .. n), unordered, in
// sel[r * k ...]. One warp per row: the heap branch (k * 64 <= n) scans the row 32 values at a time
// and lets one lane apply the heap updates in index order; the nth_element branch runs on one lane
// over a pair copy of the row (n < 64 k, so rows are short). No host round trip.
void topk_torch(const float* values, int64_t rows, int64_t stride, int64_t n, int64_t k, int32_t* sel);

// out[r, :] = the selected indices of row r in ascending order, + offset, entries >= visible[r]
// (device [rows] int64) -> -1 (they sort last): the CPU's kTorch topk_indices output.
void sorted_selection(const int32_t* sel, int64_t rows, int64_t k, const int64_t* visible, int32_t offset,
                      int32_t* out);

}  // namespace di::cuda::attn
