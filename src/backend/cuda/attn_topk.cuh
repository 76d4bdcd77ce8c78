// Exact per-row top-k on the device with ties to the lowest index (TieBreak::kLowestIndex): the
// k[r] largest of values[r, 0 .. n[r]), equal values ordered by index, as ascending indices.
#pragma once

#include <cstdint>
#include <vector>

namespace di::cuda::attn {

// values: device [rows, stride] f32. For each row r: out[r * out_k + i] = (i-th smallest selected
// index) + offset for i < k[r], and -1 for k[r] <= i < out_k. Needs 0 <= k[r] <= n[r] <= stride and
// k[r] <= out_k. -0 and +0 tie. Runs on the default stream; no host round trip besides the small
// n / k uploads.
void topk_lowest_index(const float* values, int64_t rows, int64_t stride, const std::vector<int64_t>& n,
                       const std::vector<int64_t>& k, int64_t out_k, int32_t offset, int32_t* out);

}  // namespace di::cuda::attn
