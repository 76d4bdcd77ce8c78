// Batch invariance of the CUDA ops (Backend::set_batch_invariant, EngineOptions::batch_invariant):
// the reduction-order choices that may depend on the number of rows, and the policy of each.
//
// In the default mode a kernel may pick how to split a reduction (K across CTAs, an index list
// across CTAs) from the row count M, for speed; a row's fp32 sums then differ with M. In the
// batch-invariant mode those choices come from the other dimensions only (N, K, list length, heads),
// so a row gives the same bits alone, in any batch, and at any position in it. Launch shapes (grid,
// token tile width, warps per CTA, whether K splits run on separate CTAs or inside one) may still
// follow M where they do not change any sum. Same binary and device assumed; across GPUs or builds
// nothing is claimed. tests/gpu/batch_invariance_test.cpp checks each affected op bit for bit.
//
// Audit, op by op (op: what depends on M or on other rows -> what the invariant mode does):
//  - linear kFp8Block at 1-2 rows (fp8_gemv.cu, CUDA-core sums in another order than the tensor-core tiles)
//    -> CHANGED: not taken; the tiles below with the one-row plan.
//  - linear kFp8Block / kFp4Expert (dense_linear.cu): the K split count, plan_split over
//    ceil(N/128) x ceil(M/64) tiles with nt(M) token tiles -> CHANGED: the plan of one row (one
//    64-token chunk, nt = 1: the default's plan for M <= 8) at every M. When those split CTAs would
//    not fit in one wave (or their partials exceed kMaxSplitPartialBytes), each CTA sums the same K
//    ranges itself, in split order from zero -- mma::sum_splits' additions, so the same bits.
//    Unchanged and harmless: nt(M) and the activation quantizer (in the tile for M <= 2, a prologue
//    above; both bit-exact), the fix-up CTA vs reduce_splits_kernel (both sum in split order). A
//    token's K-block partial is its own column of the MMA, accumulated in K order for every nt
//    (assumed: a tensor-core output element depends on its own row and column only; the test checks).
//  - linear kBf16 / kF32 and grouped_linear: the default mode takes the bf16 tensor-core kernel
//    (dense_bf16_mma.cu: token tile width and K split from M) -> CHANGED: the CUDA-core kernel
//    (float_linear_kernel) at every M: up to 8 rows per CTA share the weight loads, but each row has
//    its own accumulators; a lane's K order and the warp reduction are fixed by K, the vector width by
//    K and the row stride -> invariant.
//  - hc_mixes (attn_mhc.cu): K chunks per row min(264 / M, n / 256) (fp64 chunk sums, then chunk
//    order) -> CHANGED: min(264, n / 256), the one-row choice, at every M.
//  - sparse_attention, tensor-core path (attn_sparse_mma.cu; heads and dh multiples of 16, taken or
//    not whatever M): CTAs per (row, head tile, 64-index block), merged over the blocks in order; the
//    scores' head tile (64 / 32 / 16) and key parts per block (1 / 2 / 4) and the values' dim slices
//    follow the launch size, but every score and output is the same MMA chain in the same k order and
//    the running max a max of the same scores -> change no bit -> invariant; trailing -1 padding adds
//    blocks whose partials are exact zeros.
//  - sparse_attention, CUDA-core path (cuda_attention.cu): list splits from 264 / (M x head groups),
//    one pass when that gives one split -> CHANGED: every call takes the split path (block-max pass,
//    splits, merge) with one 64-index block per split. A fixed split length also makes trailing -1
//    padding harmless (a split with no index contributes exact zeros to the merge), so a row's result
//    does not depend on the list width either (a chunk's lists are as wide as its longest row needs,
//    so the width changes with chunking).
//    Rows are launched in groups whose partials fit in kMaxSplitPartialBytes. Warps per CTA
//    (nwarps, from M) only decide which heads share a CTA -> harmless.
//  - moe_experts, grouped path (moe_grouped.cu): K split from plan_split over mats x ceil(N/128) x
//    min(E, M k) expert slots with nt(M) -> CHANGED: the plan of one row (min(E, k) slots, nt = 1),
//    in-CTA splits as for linear when needed. An expert's entries run in token tiles (8 nt wide) in a
//    loop, each token summed alone (as linear); SwiGLU + quantization per entry; combine per token in
//    expert-id order from zero, then + shared expert -> invariant. Shared expert: linear().
//  - moe_experts, listed fallback (mixed expert formats): per-expert linear() (policy above), scatter-
//    add per token in expert-id order -> invariant through linear.
//  - moe_route: logits of a BF16 gate on the FP64 tensor cores (moe_route_dmma.cu, taken by D % 8 and
//    the base alignment): tile shape, split CTAs vs splits inside a CTA, and the tile's fix-up vs a
//    reduce kernel follow M, but every path sums a row's 256-K split chains in split order from zero
//    (K order from D alone); other gates one warp per (expert, row) in fp64; selection one CTA per row
//    -> already invariant.
//  - rmsnorm (one CTA per row, the CPU's order), index_scores (one thread per (row, position), the
//    tile width from heads x hd; at 1-2 rows 8 or 4 threads per position, whose first thread adds the
//    same head terms in the same order -> no bit changes), softmax_pool (serial per channel),
//    engram_inject (one 256-thread CTA per (row, stream)) -> already invariant.
//  - select_candidates, topk_indices (attn_topk.cu): exact selections (the chunk count follows the
//    widest row, but the selected index set does not depend on how it was found) -> invariant.
//  - embed, rope, round_bf16, scale_bf16, qdq, pack_rows, unpack_rows, copy_rows, concat_cols,
//    hc_pre, hc_post, stream_mean, mask_scores, engram_lookup: elementwise or per row, no cross-row
//    reduction -> invariant.
#pragma once

#include <algorithm>
#include <cstdint>

#include "backend/cuda/dense_linear.cuh"

namespace di::cuda::bi {

// Split partials (or list-split partials) above this many bytes are not materialised in the
// invariant mode: K splits then run inside the CTAs, attention rows in groups.
inline constexpr int64_t kMaxSplitPartialBytes = int64_t{256} << 20;

// ---- quantized GEMMs ----------------------------------------------------------------------------

// K split of a dense FP8 / MXFP4 linear [M, K] x [N, K]^T: row_ctas = ceil(N/128), chunks =
// ceil(M/64), nb = K/32, nt = n8 token tiles per warp; capacity = resident CTAs of the nt kernel on
// the GPU, capacity_nt1 = those of the nt = 1 kernel.
inline dense::SplitPlan linear_k_split(bool invariant, int64_t row_ctas, int64_t chunks, int64_t nb, int nt,
                                       int64_t capacity, int64_t capacity_nt1) {
  if (invariant) return dense::plan_split(row_ctas, nb, 1, capacity_nt1, 1);
  return dense::plan_split(row_ctas * chunks, nb, nt, capacity, 1);
}

// K split of a grouped expert GEMM: tiles = mats x ceil(N/128) per expert slot; slots = min(E, M k)
// (grid z), one_row_slots = min(E, k).
inline dense::SplitPlan grouped_k_split(bool invariant, int64_t tiles, int64_t slots, int64_t one_row_slots,
                                        int64_t nb, int nt, int64_t capacity, int64_t capacity_nt1) {
  if (invariant) return dense::plan_split(tiles * one_row_slots, nb, 1, capacity_nt1, 2);
  return dense::plan_split(tiles * slots, nb, nt, capacity, 2);
}

// Whether a plan's K splits run on separate CTAs (partials in the workspace, summed in split order by
// a fix-up) rather than inside each CTA (the same sums in the same order): the default mode always
// uses CTAs; the invariant mode does while the split grid fits in one wave and its partials are small.
// Either way the bits are the same, so this may follow M.
inline bool splits_on_ctas(bool invariant, int64_t tiles, int splits, int64_t capacity, int64_t partial_bytes) {
  if (!invariant || splits <= 1) return true;
  return tiles * splits <= capacity && partial_bytes <= kMaxSplitPartialBytes;
}

// ---- sparse attention ---------------------------------------------------------------------------

// How the index list (in 64-index blocks) is split over CTAs: blocks per split (0 only for an
// empty list in the default mode), and whether a single split still goes through the merge.
struct ListSplit {
  int64_t blocks_per_split = 1;
  bool always_merge = false;
};

// rows: query rows of the call; groups: CTAs per row (head groups); blocks = ceil(len / 64).
inline ListSplit sparse_attention_split(bool invariant, int64_t rows, int64_t groups, int64_t blocks) {
  if (invariant) return {1, true};
  // default: about two waves of the 132 SMs, whole 64-blocks, at most 64 splits
  const int64_t want = std::max<int64_t>(1, 264 / (rows * groups));
  const int64_t splits = std::max<int64_t>(1, std::min<int64_t>({want, blocks, 64}));
  return {(blocks + splits - 1) / splits, false};
}

// ---- hyper-connection mixes ---------------------------------------------------------------------

// K chunks per row of hc_mixes' dot products (n = hc x D): about two waves of CTAs, >= 256 elements
// each; the invariant mode takes the one-row count for every M.
inline int hc_mixes_splits(bool invariant, int64_t rows, int64_t n) {
  const int64_t want = invariant ? 264 : std::max<int64_t>(1, 264 / rows);
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(want, n / 256)));
}

}  // namespace di::cuda::bi
