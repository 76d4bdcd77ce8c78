// The op contract between the V4.1 forward (src/model) and a backend. The forward's control flow is
// written once against these ops; the CPU backend is the reference implementation, the CUDA backend
// implements the same ops and is tested against it op by op.
//
// Conventions: activations are [rows, cols] F32 tensors; "bf16 out" means every output value is
// rounded to the nearest bf16 (the reference keeps bf16 there). Index tensors are I32, -1 = none.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backend/tensor.h"

namespace di {

// How top-k selections break exact ties (index scores are bf16, so ties are common).
enum class TieBreak : uint8_t {
  kTorch,        // the elements torch.topk picks on the CPU (depends on the row's width)
  kLowestIndex,  // the lowest index first: independent of width, so of chunking
};

struct RopeTable {
  std::vector<float> freqs;  // [rope_dim / 2] fp32 angular frequencies (YaRN already blended)
};

struct ExpertWeights {
  Weight w1, w2, w3;  // gate [inter, D], down [D, inter], up [inter, D]
};

struct MoeRoute {
  Tensor weights;  // [S, k] f32 routing weights (renormalised x route scale)
  Tensor experts;  // [S, k] i32 expert ids
};

class Backend;
// A copy of `t` in new storage of the same backend (t itself when it holds nothing).
Tensor copy_tensor(Backend& b, const Tensor& t);

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // Batch-invariant mode (EngineOptions::batch_invariant): when on, every op's result for a row is
  // independent of the other rows of the call and of their number -- launch shapes may still follow
  // the row count, but reduction orders (K splits, list splits) are chosen from the other dimensions
  // only. Off (the default): a backend may pick reduction orders for speed at each row count. The
  // CPU backend ignores it: its ops already reduce every row in an order fixed by the row alone.
  // The CUDA backend's policy and audit: src/backend/cuda/batch_invariance.cuh.
  virtual void set_batch_invariant(bool on) { (void)on; }
  // Fast MXFP4 GEMMs (EngineOptions::fast_fp4_gemm): the CUDA backend sums the expert GEMMs' K blocks
  // on the wgmma FP8 tensor cores (~14-bit block sums, as DeepGEMM) instead of exactly. The CPU
  // backend ignores it.
  virtual void set_fast_fp4_gemm(bool on) { (void)on; }

  // --- concurrency --------------------------------------------------------------------------------
  // Ops issued between side_begin() and side_end() see every op issued before side_begin(), and may
  // run beside the ops issued after side_end(); side_join() orders every later op after them. Until
  // the join the caller must not read their outputs, nor change their inputs in place (copies to
  // the host join first). A backend may run everything in order: the CPU backend ignores these.
  virtual void side_begin() {}
  virtual void side_end() {}
  virtual void side_join() {}
  // A mark of the side work issued so far (inside a side region too); side_wait(mark) orders every
  // later op after that work alone (the side work issued after the mark stays beside them).
  virtual int side_mark() { return -1; }
  virtual void side_wait(int mark) { (void)mark; }

  // --- memory -----------------------------------------------------------------------------------
  virtual Tensor alloc(TType type, const std::vector<int64_t>& shape) = 0;  // contents undefined
  virtual Tensor zeros(TType type, const std::vector<int64_t>& shape) = 0;
  virtual Tensor from_host_f32(const std::vector<float>& v, const std::vector<int64_t>& shape) = 0;
  virtual Tensor from_host_i32(const std::vector<int32_t>& v, const std::vector<int64_t>& shape) = 0;
  virtual std::vector<float> to_host_f32(const Tensor& t) = 0;
  virtual std::vector<int32_t> to_host_i32(const Tensor& t) = 0;
  // t copied into a host buffer that this backend owns and reuses, valid until the next call. Kept
  // across steps it costs no page faults (a fresh 33 MB vector of batch-64 logits took ~8,000 every
  // step); the CUDA backend's is pinned (a pageable copy ran at ~5 GB/s: 6.3 ms for those logits).
  virtual std::span<const float> to_host_f32_staged(const Tensor& t) = 0;
  // dst[d0 + i] = src[s0 + i] for i < n (whole rows; row sizes must match)
  virtual void copy_rows(Tensor& dst, int64_t d0, const Tensor& src, int64_t s0, int64_t n) = 0;
  // copy_rows for every entry as one operation (one launch on CUDA, where a copy each cost ~2 us of
  // device time: the compressor's per-sequence copies at batch 64). The copies may run in any order:
  // no destination may overlap another entry's destination or source.
  struct RowCopy {
    Tensor dst;  // a handle to the destination rows (shares their storage)
    int64_t d0 = 0;
    Tensor src;
    int64_t s0 = 0, n = 0;
  };
  virtual void copy_rows_batch(const std::vector<RowCopy>& copies) {
    for (const RowCopy& c : copies) {
      Tensor dst = c.dst;
      copy_rows(dst, c.d0, c.src, c.s0, c.n);
    }
  }
  // [S, a] ++ [S, b] -> [S, a + b] (F32 or I32)
  virtual Tensor concat_cols(const Tensor& a, const Tensor& b) = 0;
  // Prepares a checkpoint weight for this backend (uploads it, for a device backend).
  virtual void prepare(Weight& w) = 0;

  // --- dense math -------------------------------------------------------------------------------
  // Rows of a BF16 table: [S] ids -> [S, D] (exact).
  virtual Tensor embed(const Tensor& ids, const Weight& table) = 0;
  // y = x W^T. kFp8Block / kFp4Expert: x quantized to FP8 per 32 (UE8M0) first, block-scaled fp32
  // accumulation, bf16 out. kBf16: bf16 out. kF32: fp32 out.
  virtual Tensor linear(const Tensor& x, const Weight& w) = 0;
  // Block-diagonal projection: x [S, G*K] with W [G*R, K] -> [S, G*R]; W dequantized (exact in bf16),
  // bf16 GEMM, bf16 out (the reference's wo_a einsum).
  virtual Tensor grouped_linear(const Tensor& x, const Weight& w, int groups) = 0;
  // RMSNorm over each row, bf16 out. weight: BF16 [cols].
  virtual Tensor rmsnorm(const Tensor& x, const Weight& weight, float eps) = 0;
  // Interleaved-pair RoPE on the trailing rope_dim of every head of x [S, heads*head_dim], in place,
  // bf16 out. positions: [S]. inverse: conjugate rotation.
  virtual void rope(Tensor& x, int heads, int head_dim, int rope_dim, const std::vector<int64_t>& positions,
                    const RopeTable& table, bool inverse) = 0;
  // The queries' projection: y = linear(x', w), then rope(y, ..., inverse = false), where x' = x or,
  // with norm.weight, rmsnorm(x, *norm.weight, norm.eps) (stored into *norm.normed when that is set).
  // The CUDA backend normalizes while the GEMM stages x and rotates in its epilogue (same bits).
  struct InputNorm {
    const Weight* weight = nullptr;
    float eps = 0.0f;
    Tensor* normed = nullptr;
  };
  virtual Tensor linear_rope(const Tensor& x, const Weight& w, int heads, int head_dim, int rope_dim,
                             const std::vector<int64_t>& positions, const RopeTable& table, const InputNorm& norm) {
    Tensor in = x;
    if (norm.weight) {
      in = rmsnorm(x, *norm.weight, norm.eps);
      if (norm.normed) *norm.normed = in;
    }
    Tensor y = linear(in, w);
    rope(y, heads, head_dim, rope_dim, positions, table, false);
    return y;
  }
  // rope(x, ..., inverse = true) then grouped_linear(x, w, groups): the attention output into wo_a.
  // x is consumed (the default rotates it in place; the CUDA backend rotates while staging it).
  virtual Tensor inverse_rope_grouped_linear(Tensor x, const Weight& w, int groups, int heads, int head_dim,
                                             int rope_dim, const std::vector<int64_t>& positions,
                                             const RopeTable& table) {
    rope(x, heads, head_dim, rope_dim, positions, table, true);
    return grouped_linear(x, w, groups);
  }
  // linear(inverse_rope_grouped_linear(x, w_a, ...), w_b): the attention output's two projections (wo_a, wo_b). A
  // backend may hand the first's output to the second already quantized.
  virtual Tensor output_projection(Tensor x, const Weight& w_a, int groups, int heads, int head_dim, int rope_dim,
                                   const std::vector<int64_t>& positions, const RopeTable& table, const Weight& w_b) {
    return linear(inverse_rope_grouped_linear(std::move(x), w_a, groups, heads, head_dim, rope_dim, positions, table),
                  w_b);
  }
  // Rounds every value to bf16 in place.
  virtual void round_bf16(Tensor& x) = 0;
  // x = bf16(x * factor), in place.
  virtual void scale_bf16(Tensor& x, float factor) = 0;

  // --- quantize-dequantize (spec §2.8), in place, per row ------------------------------------------
  virtual void qdq(Tensor& x, RowFormat format) = 0;
  // rope(x, ...) then qdq(x, format), in place; rmsnorm_rope_qdq: x = rmsnorm(x, norm, eps) first, in
  // a new tensor (the keys' and index keys' chains). The CUDA backend fuses each chain into one launch.
  virtual void rope_qdq(Tensor& x, int heads, int head_dim, int rope_dim, const std::vector<int64_t>& positions,
                        const RopeTable& table, RowFormat format) {
    rope(x, heads, head_dim, rope_dim, positions, table, false);
    qdq(x, format);
  }
  virtual Tensor rmsnorm_rope_qdq(const Tensor& x, const Weight& norm, float eps, int heads, int head_dim, int rope_dim,
                                  const std::vector<int64_t>& positions, const RopeTable& table, RowFormat format) {
    Tensor y = rmsnorm(x, norm, eps);
    rope_qdq(y, heads, head_dim, rope_dim, positions, table, format);
    return y;
  }
  // Packs rows of x (already quantize-dequantized) into cache rows at `slots`; reads them back.
  virtual void pack_rows(const Tensor& x, RowFormat format, Tensor& cache, const std::vector<int64_t>& slots) = 0;
  virtual Tensor unpack_rows(const Tensor& cache, RowFormat format, int64_t dim, const std::vector<int64_t>& slots) = 0;
  // The same over many caches in one call (a batch's window rings): row i of x is packed into
  // caches[cache_of_row[i]] at slots[i] (cache_of_row[i] = -1: not written); every row of every
  // cache (equal shapes) unpacked into dst rows d0.., caches in order.
  virtual void pack_rows_to(const Tensor& x, RowFormat format, const std::vector<Tensor>& caches,
                            const std::vector<int32_t>& cache_of_row, const std::vector<int64_t>& slots) = 0;
  virtual void unpack_caches(const std::vector<Tensor>& caches, RowFormat format, Tensor& dst, int64_t d0) = 0;

  // --- hyper-connections (mHC) ------------------------------------------------------------------
  // X [S, hc, D] -> mixes [S, (2+hc)*hc] f32: pre (hc), post (hc), Sinkhorn comb (hc x hc, row = input).
  virtual Tensor hc_mixes(const Tensor& x, int hc, const Weight& fn, const Weight& scale, const Weight& base,
                          float norm_eps, int sinkhorn_iters, float hc_eps) = 0;
  // sum_k pre[k] X[:, k] -> [S, D] bf16. `pre` holds hc values per row at column offset 0 of `mix`.
  virtual Tensor hc_pre(const Tensor& x, const Tensor& mix, int hc) = 0;
  // out[:, k] = post[k] y + sum_j comb[j, k] R[:, j] -> [S, hc, D] bf16.
  virtual Tensor hc_post(const Tensor& y, const Tensor& residual, const Tensor& mix, int hc) = 0;
  // mean over the hc streams -> [S, D] bf16 (DSpark feature tap).
  virtual Tensor stream_mean(const Tensor& x, int hc) = 0;
  // hc_post(y, residual, post_mix, hc), then the next site's input rmsnorm(hc_pre(that, pre_mix, hc),
  // norm, eps): {the streams [S, hc*D], the normed input [S, D]}. The CUDA backend fuses the three.
  virtual std::pair<Tensor, Tensor> hc_post_pre_norm(const Tensor& y, const Tensor& residual, const Tensor& post_mix,
                                                     const Tensor& pre_mix, int hc, const Weight& norm, float eps) {
    Tensor h = hc_post(y, residual, post_mix, hc);
    Tensor x = rmsnorm(hc_pre(h, pre_mix, hc), norm, eps);
    return {h, x};
  }

  // --- attention --------------------------------------------------------------------------------
  // Single latent head (K = V). q [S, H*Dh], kv [N, Dh], idx [S, L] (-1 = skip), sink [H] f32.
  // Online softmax over blocks of 64 indices with bf16 probabilities (as the reference kernel).
  // q and the keys hold bf16 values (the model's queries leave RoPE, its keys qdq, as bf16): the CUDA
  // backend multiplies them on the bf16 tensor cores.
  // kv_more (optional) continues kv: index N + i reads kv_more row i -- keys that live in another
  // tensor without a copy. F32 [M, Dh], or U8 packed cache rows [M, packed_row_bytes(more_format, Dh)]
  // dequantized as unpack_rows does (the compressed KV read straight from the page pool).
  virtual Tensor sparse_attention(const Tensor& q, int heads, const Tensor& kv, const Tensor& idx,
                                  const Weight& sink, float softmax_scale, const Tensor& kv_more = Tensor{},
                                  RowFormat more_format = RowFormat::kFp4E4m3) = 0;
  // Row ids of paged caches -> pool rows, in place: row i of a list of row r (entries >= 0) becomes
  // base + table[table_start[r] + i / rows_per_page] * rows_per_page + i % rows_per_page; -1 stays.
  // idx [S, L] I32, table_start [S], table: the page ids of every row's sequence, concatenated.
  virtual void map_paged_rows(Tensor& idx, const std::vector<int64_t>& table_start, const std::vector<int32_t>& table,
                              int64_t rows_per_page, int64_t base) = 0;
  // head [S, a] ++ ids [S, b] mapped as map_paged_rows maps them -> [S, a + b] I32; ids is not changed.
  // The attention's index lists (window ++ top-k); one launch on CUDA instead of a copy, the map and
  // the concatenation.
  virtual Tensor concat_paged_rows(const Tensor& head, const Tensor& ids, const std::vector<int64_t>& table_start,
                                   const std::vector<int32_t>& table, int64_t rows_per_page, int64_t base) {
    Tensor mapped = copy_tensor(*this, ids);
    map_paged_rows(mapped, table_start, table, rows_per_page, base);
    return concat_cols(head, mapped);
  }
  // Pool rows of paged sequences: the first lengths[p] rows of part p, parts concatenated, row i of
  // part p -> table[table_start[p] + i / rows_per_page] * rows_per_page + i % rows_per_page. I32
  // [sum of lengths]. The host sends the page tables only (the batched indexer's row list is 8 MB at
  // batch 64 and 32K context).
  virtual Tensor paged_row_list(const std::vector<int64_t>& lengths, const std::vector<int64_t>& table_start,
                                const std::vector<int32_t>& table, int64_t rows_per_page) = 0;
  // Per-channel softmax pooling: kv, score [G*ratio, Dh] f32 -> [G, Dh] f32.
  virtual Tensor softmax_pool(const Tensor& kv, const Tensor& score, int ratio) = 0;
  // Lightning-indexer scores: q [S, nh*hd], keys [*, hd], w [S, nh] -> [S, T] (bf16 values, the
  // reference's bf16 einsum / relu / weighting / head sum); -inf where t >= visible[s]. Without
  // key_offsets every row scores keys 0 .. T-1, T = keys.rows(); with them (one per row: several
  // sequences' keys in one tensor) row s scores keys key_offsets[s] + t, T = max(visible).
  virtual Tensor index_scores(const Tensor& q, int heads, const Tensor& keys, const Tensor& w,
                              const std::vector<int64_t>& visible, const std::vector<int64_t>& key_offsets) = 0;
  // The same over keys packed in a cache (the page pool's index keys): key j is cache row slots[j]
  // (slots: I32 [n] on this backend), dequantized as unpack_rows does -- the same scores as
  // index_scores(q, heads, unpack_rows(cache, format, q.row_size() / heads, slots), ...) without the
  // unpacked copy (fp32 keys are 7.5x the packed FP4 rows).
  virtual Tensor index_scores_packed(const Tensor& q, int heads, const Tensor& cache, RowFormat format,
                                     const Tensor& slots, const Tensor& w, const std::vector<int64_t>& visible,
                                     const std::vector<int64_t>& key_offsets) = 0;
  // Two-level selection, level one: block score = max of block_size positions, the query's newest
  // block pinned, keep the top `topk_blocks` finite blocks; scores outside them -> -inf in
  // `restrict_scores` (when given). Returns the mask [S, T] U8.
  virtual Tensor select_candidates(const Tensor& scores, const std::vector<int64_t>& visible, int topk_blocks,
                                   int block_size, TieBreak ties) = 0;
  virtual void mask_scores(Tensor& scores, const Tensor& keep_mask) = 0;
  // Top-k per row, indices ascending; entries >= visible[s] -> -1; kept entries + offset. [S, k] I32.
  virtual Tensor topk_indices(const Tensor& scores, int k, const std::vector<int64_t>& visible, int offset,
                              TieBreak ties) = 0;

  // --- MoE --------------------------------------------------------------------------------------
  virtual MoeRoute moe_route(const Tensor& x, const Weight& gate, const Weight& bias, int top_k, float route_scale,
                             float gate_temp) = 0;
  // Routed experts (weights applied before w2) + the shared expert -> [S, D] bf16.
  virtual Tensor moe_experts(const Tensor& x, const MoeRoute& route, const std::vector<ExpertWeights>& experts,
                             const ExpertWeights& shared, float swiglu_limit) = 0;
  // The MoE layer: moe_route, then moe_experts. A backend may start the shared expert before the
  // routing (the CUDA backend runs it beside the router and the routed experts).
  virtual Tensor moe(const Tensor& x, const Weight& gate, const Weight& bias, int top_k, float route_scale,
                     float gate_temp, const std::vector<ExpertWeights>& experts, const ExpertWeights& shared,
                     float swiglu_limit) {
    const MoeRoute route = moe_route(x, gate, bias, top_k, route_scale, gate_temp);
    return moe_experts(x, route, experts, shared, swiglu_limit);
  }

  // --- Engram -----------------------------------------------------------------------------------
  // Gathers and dequantizes table rows: cols [S, n] (global row ids) -> [S, n*row_dim] bf16.
  virtual Tensor engram_lookup(const Tensor& cols, const Weight& table) = 0;
  // h += gate * value per stream, gate from the normalised stream/key dot product. X [S, hc, D],
  // kv [S, (hc+1)*D]. Returns the new X (bf16).
  virtual Tensor engram_inject(const Tensor& x, const Tensor& kv, const Weight& q_weight, const Weight& k_weight,
                               int hc, float eps) = 0;
};

// f() issued as side work (Backend::side_begin / side_end, the end also when f throws); its result.
template <class F>
auto run_beside(Backend& b, F&& f) {
  struct Scope {
    Backend& b;
    ~Scope() { b.side_end(); }
  };
  b.side_begin();
  Scope scope{b};
  return f();
}

// index_scores with key offsets: the output width, max(visible) (0 for no rows); and the check that
// every row's keys [offset, offset + visible) lie in the `key_rows` keys (throws di::Error).
int64_t index_width(const std::vector<int64_t>& visible);
void check_key_offsets(const std::vector<int64_t>& key_offsets, const std::vector<int64_t>& visible, int64_t key_rows);

std::unique_ptr<Backend> make_cpu_backend();
// "cpu" or "cuda"; throws di::Error for an unknown or unavailable device.
std::unique_ptr<Backend> make_backend(const std::string& device);

}  // namespace di
