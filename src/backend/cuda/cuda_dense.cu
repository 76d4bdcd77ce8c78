// CUDA backend: the dense ops (embed, linear, grouped_linear, rmsnorm, rope, bf16 rounding, qdq and
// packed cache rows) with the semantics of the CPU backend (cpu_memory.cpp, cpu_linear.cpp,
// cpu_elementwise.cpp). The GEMMs live in dense_linear.cu; the quantizers in cuda_quant.cuh.
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include "backend/cuda/attn_common.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_quant.cuh"
#include "backend/cuda/dense_linear.cuh"
#include "backend/cuda/dense_scratch.cuh"
#include "backend/cuda/gemm_workspace.cuh"
#include "backend/cuda/pdl_launch.cuh"
#include "backend/cuda/rope_math.cuh"

namespace di {
namespace {

using cuda::blocks_for;
using cuda::dense::Scratch;
using cuda::dense::upload;
using cuda::dq::kFullMask;
using cuda::RowRope;

constexpr int kThreads = 256;

// Element i of a float weight stored as BF16 / F16 / F32 (cpu::weight_at, exact).
template <DType kD>
__device__ __forceinline__ float weight_value(const uint8_t* w, int64_t i) {
  if constexpr (kD == DType::kBF16) {
    return cuda::bf16_bits_to_float(reinterpret_cast<const uint16_t*>(w)[i]);
  } else if constexpr (kD == DType::kF16) {
    __half_raw r;
    r.x = reinterpret_cast<const unsigned short*>(w)[i];
    return __half2float(__half(r));
  } else {
    return reinterpret_cast<const float*>(w)[i];
  }
}

void check_float_dtype(DType d, const char* op) {
  if (d != DType::kBF16 && d != DType::kF16 && d != DType::kF32)
    throw Error(std::string("cuda ") + op + ": unsupported weight dtype " + dtype_name(d) + " (expected BF16, F16 or F32)");
}

// A row norm's weight for rows of n values: n float values (1-D, or [1, n] / [n, 1]) stored as BF16 /
// F16 / F32.
void check_norm_weight(const Weight& norm, int64_t n, const char* op) {
  DI_CHECK(norm.cols == n || norm.rows * norm.cols == n);
  check_float_dtype(norm.dtype, op);
}

// The arguments of the one-CTA-per-row norm kernels: x [S, n] f32 (S < 2^31 CTAs), its norm weight.
void check_norm_rows(const Tensor& x, const Weight& norm, const char* op) {
  DI_CHECK(x.type == TType::kF32);
  check_norm_weight(norm, x.row_size(), op);
  DI_CHECK_MSG(x.rows() < (1LL << 31), std::string(op) + ": too many rows");
}

// f(std::integral_constant<DType, D>{}) for a checked float weight dtype: the kernel instantiation that
// reads that storage.
template <class F>
void with_float_dtype(DType d, F&& f) {
  switch (d) {
    case DType::kBF16: f(std::integral_constant<DType, DType::kBF16>{}); break;
    case DType::kF16: f(std::integral_constant<DType, DType::kF16>{}); break;
    default: f(std::integral_constant<DType, DType::kF32>{}); break;
  }
}

// The arguments of rope / rope_qdq: x [S, heads * head_dim] f32, a position per row, rope_dim / 2
// frequencies.
void check_rope_args(const Tensor& x, int heads, int head_dim, int rope_dim, const std::vector<int64_t>& positions,
                     const RopeTable& table) {
  DI_CHECK(x.type == TType::kF32 && x.row_size() == static_cast<int64_t>(heads) * head_dim);
  DI_CHECK(static_cast<int64_t>(positions.size()) == x.rows() && static_cast<int>(table.freqs.size()) * 2 == rope_dim);
  DI_CHECK(rope_dim >= 0 && rope_dim <= head_dim);
}

// ---- embed ------------------------------------------------------------------------------------------

// [n, d] one thread per output value: reads 2 B (BF16 table) and writes 4 B. An id outside the table
// gives a NaN row and sets *bad (pinned host memory: CudaBackend::check_embed_ids reads it after a copy to
// the host, so the launch needs no read-back of its own).
template <DType kD>
__global__ void embed_kernel(const int32_t* __restrict__ ids, int64_t n, int64_t d, int64_t vocab,
                             const uint8_t* __restrict__ table, float* __restrict__ out, int* __restrict__ bad) {
  ::di::cuda::grid_dependency_wait();
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n * d;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = e / d, c = e % d;
    const int32_t id = ids[i];
    if (id < 0 || id >= vocab) {
      out[e] = __int_as_float(0x7fc00000);
      *bad = 1;
    } else {
      out[e] = weight_value<kD>(table, static_cast<int64_t>(id) * d + c);
    }
  }
}

int grid_for(int64_t n) { return static_cast<int>(std::min<int64_t>(blocks_for(n, kThreads), 65536)); }

// ---- rmsnorm ----------------------------------------------------------------------------------------

// [S, n] one CTA per row. The sum of squares reproduces cpu::sum_squares(x, n) bit for bit
// (cuda::block_sum_squares_exact: 256 chains, one per thread, and a tree); then every thread scales
// its share of the row. Reads 8 B and writes 4 B per element (the second read of x hits L2). One
// warp per row was latency-bound: 14.4 us at n = 5120 in ncu.
constexpr int kNormThreads = 256;

// This thread's first kHeld elements of a row and their norm weights (elements t, t + kNormThreads, ...), loaded
// before the row's sum of squares so that they are in flight beside it (clamped loads: cuda_common.cuh).
template <DType kD, int kHeld>
__device__ __forceinline__ void load_held(const float* xr, const uint8_t* w, int64_t n, float (&xv)[kHeld],
                                          float (&wv)[kHeld]) {
#pragma unroll
  for (int k = 0; k < kHeld; ++k) {
    const int64_t i = min(static_cast<int64_t>(threadIdx.x + k * kNormThreads), n - 1);
    xv[k] = xr[i];
    wv[k] = weight_value<kD>(w, i);
  }
}

template <DType kD>
__global__ void __launch_bounds__(kNormThreads)
    rmsnorm_kernel(const float* __restrict__ x, int64_t n, const uint8_t* __restrict__ w, float eps,
                   float* __restrict__ y) {
  ::di::cuda::grid_dependency_wait();
  const int64_t row = blockIdx.x;
  const float* xr = x + row * n;
  float* yr = y + row * n;
  constexpr int kHeld = 24;  // rows up to 6144 wide need no second pass
  float xv[kHeld], wv[kHeld];
  load_held<kD>(xr, w, n, xv, wv);
  const float inv = cuda::rms_scale(cuda::block_sum_squares_exact<kNormThreads>(xr, n), n, eps);
#pragma unroll
  for (int k = 0; k < kHeld; ++k) {
    const int64_t i = threadIdx.x + k * kNormThreads;
    if (i < n) yr[i] = cuda::dq::rms_normed(xv[k], wv[k], inv);
  }
#pragma unroll 4
  for (int64_t i = threadIdx.x + kHeld * kNormThreads; i < n; i += kNormThreads)
    yr[i] = cuda::dq::rms_normed(xr[i], weight_value<kD>(w, i), inv);
}

// ---- rope -------------------------------------------------------------------------------------------

// [S, heads, rope_dim/2] one thread per rotated pair, in place: 8 B read and written per pair.
__global__ void rope_kernel(float* __restrict__ x, int64_t S, int heads, int head_dim, int rope_dim,
                            const int64_t* __restrict__ pos, const float* __restrict__ freqs, bool inverse) {
  ::di::cuda::grid_dependency_wait();
  const int half = rope_dim / 2;
  const int64_t total = S * heads * half;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(e % half);
    const int64_t rh = e / half;  // row * heads + head
    float* p = x + rh * head_dim + (head_dim - rope_dim) + 2 * i;
    cuda::rope_pair(p[0], p[1], head_dim - rope_dim + 2 * i, pos[rh / heads], RowRope{freqs, head_dim, rope_dim},
                    inverse);
  }
}

// One row's RoPE as the fused kernels apply it: a warp holds 32 consecutive values of the row, value
// `col` in this lane (pairs (2i, 2i + 1) never straddle a warp's 32). Returns the lane's value after
// the forward rotation (unchanged outside every head's trailing rope_dim). All 32 lanes call it.
__device__ __forceinline__ float rope_lane(float v, int64_t col, int64_t pos, const RowRope& rope) {
  return cuda::rope_value(v, __shfl_xor_sync(kFullMask, v, 1), col, pos, rope);
}

// ---- elementwise ------------------------------------------------------------------------------------

// [n] in place: 4 B read and written per value.
__global__ void scale_bf16_kernel(float* __restrict__ x, int64_t n, float factor, bool scale) {
  ::di::cuda::grid_dependency_wait();
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[e] = cuda::dq::round_bf16(scale ? __fmul_rn(x[e], factor) : x[e]);
}

// ---- qdq / packed rows ------------------------------------------------------------------------------

// This lane's value v of a warp's 32 values of a row, quantize-dequantized (every format's blocks divide 32,
// so a segment is quantized alone exactly as inside its row), from registers. All 32 lanes call it.
__device__ __forceinline__ float qdq_lane(float v, RowFormat f) {
  switch (f) {
    case RowFormat::kFp8Ue8m0: return cuda::dq::lane_fp8_ue8m0_qdq(v);
    case RowFormat::kFp4E4m3: return cuda::dq::lane_fp4_e4m3_qdq(v);
    case RowFormat::kFp4Ue8m0: return cuda::dq::lane_fp4_ue8m0_qdq(v);
  }
  return v;
}

// [S rows] one warp per 32 values (n % 32 == 0), in place: 8 B per value.
__global__ void qdq_warp_kernel(float* __restrict__ x, int64_t segments, RowFormat f) {
  ::di::cuda::grid_dependency_wait();
  const int64_t seg = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (seg >= segments) return;
  float* p = x + seg * 32 + (threadIdx.x & 31);
  *p = qdq_lane(*p, f);
}

// rope_kernel then qdq_warp_kernel in one launch: one warp per 32 values (n % 32 == 0), in place.
__global__ void rope_qdq_kernel(float* __restrict__ x, int64_t segments, int64_t n, const int64_t* __restrict__ pos,
                                RowRope rope, RowFormat f) {
  ::di::cuda::grid_dependency_wait();
  const int64_t seg = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (seg >= segments) return;
  const int lane = threadIdx.x & 31;
  float* p = x + seg * 32 + lane;
  const int64_t col = (seg * 32) % n + lane;
  *p = qdq_lane(rope_lane(*p, col, pos[seg * 32 / n], rope), f);
}

// rmsnorm_kernel, rope_kernel and qdq_warp_kernel in one launch, one CTA per row (n % 32 == 0): each
// warp normalizes, rotates and quantizes 32 values at a time with the three kernels' arithmetic.
template <DType kD>
__global__ void __launch_bounds__(kNormThreads)
    rmsnorm_rope_qdq_kernel(const float* __restrict__ x, int64_t n, const uint8_t* __restrict__ w, float eps,
                            const int64_t* __restrict__ pos, RowRope rope, RowFormat f, float* __restrict__ y) {
  ::di::cuda::grid_dependency_wait();
  const int64_t row = blockIdx.x;
  const float* xr = x + row * n;
  float* yr = y + row * n;
  constexpr int kHeld = 2;  // rows up to 512 wide (the KV latent) load once
  float xv[kHeld], wv[kHeld];
  load_held<kD>(xr, w, n, xv, wv);
  const int64_t p = pos[row];
  const float inv = cuda::rms_scale(cuda::block_sum_squares_exact<kNormThreads>(xr, n), n, eps);
  // A warp's 32 lanes share i & ~31, so they finish together (n % 32 == 0), as the warp-wide quantizer needs.
  const auto finish = [&](int64_t i, float xi, float wi) {
    yr[i] = qdq_lane(rope_lane(cuda::dq::rms_normed(xi, wi, inv), i, p, rope), f);
  };
#pragma unroll
  for (int k = 0; k < kHeld; ++k) {
    const int64_t i = threadIdx.x + k * kNormThreads;
    if ((i & ~31) < n) finish(i, xv[k], wv[k]);
  }
  for (int64_t i = threadIdx.x + kHeld * kNormThreads; (i & ~31) < n; i += kNormThreads)
    finish(i, xr[i], weight_value<kD>(w, i));
}

// kFp4E4m3 rows with n % 32 == 16: one thread per 16-value block, in place.
__global__ void qdq_fp4_e4m3_block_kernel(float* __restrict__ x, int64_t nblocks) {
  ::di::cuda::grid_dependency_wait();
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= nblocks) return;
  float* p = x + b * 16;
  const float s = cuda::e4m3_to_float(
      cuda::dq::fp4_e4m3_scale_code(cuda::dq::serial_amax(p, 16, cuda::dq::kFp4E4M3AmaxFloor)));
  for (int i = 0; i < 16; ++i) p[i] = cuda::dq::fp4_qdq_value(p[i], s);
}

// Row addresses for the pack and unpack kernels, as kernel parameters where a call touches few rows
// (a decode step's ring writes and reads): an uploaded list is a launch of its own ahead of the kernel,
// ~7 us on a batch-1 chain. Threads that index them share a row per warp, so the parameter loads broadcast.
template <typename P>
struct ParamRows {  // up to kMax row pointers
  static constexpr int kMax = 64;
  P p[kMax];
  __device__ P operator[](int64_t r) const { return p[r]; }
};
struct ParamCaches {  // every row of up to kMax caches of rows_per rows each, in cache order
  static constexpr int kMax = 64;
  const uint8_t* base[kMax];
  int64_t rows_per, row_bytes;
  __device__ const uint8_t* operator[](int64_t r) const { return base[r / rows_per] + (r % rows_per) * row_bytes; }
};

// [S rows] one warp per 32 values of a row (n % 32 == 0): 4 B read per value, its codes and scales
// written into rows[r] (the cache row of any cache; nullptr: row r is not written), as the row
// quantizer writes them. Rows: uint8_t* const* (an uploaded list) or ParamRows<uint8_t*>.
template <typename Rows>
__global__ void pack_warp_kernel(const float* __restrict__ x, int64_t S, int n, RowFormat f, Rows rows) {
  ::di::cuda::grid_dependency_wait();
  const int64_t seg = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int per_row = n / 32;
  const int64_t r = seg / per_row;
  if (r >= S) return;
  uint8_t* row = rows[r];
  if (row == nullptr) return;
  const int j = static_cast<int>(seg % per_row);
  const float* p = x + r * n + 32 * j;
  switch (f) {
    case RowFormat::kFp8Ue8m0: cuda::dq::warp_fp8_ue8m0_quant_row(p, 32, row + 32 * j, row + n + j); break;
    case RowFormat::kFp4E4m3: cuda::dq::warp_fp4_e4m3_quant_row(p, 32, row + 16 * j, row + n / 2 + 2 * j); break;
    case RowFormat::kFp4Ue8m0: cuda::dq::warp_fp4_ue8m0_quant_row(p, 32, row + 16 * j, row + n / 2 + j); break;
  }
}

// kFp4E4m3 rows with n % 32 == 16: one thread per row.
__global__ void pack_fp4_e4m3_serial_kernel(const float* __restrict__ x, int64_t S, int n, uint8_t* const* __restrict__ rows) {
  ::di::cuda::grid_dependency_wait();
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= S || rows[r] == nullptr) return;
  uint8_t* row = rows[r];
  cuda::dq::serial_fp4_e4m3_quant(x + r * n, n, row, row + n / 2);
}

// [S, dim] one thread per value: reads ~1 B (FP8) or ~0.6 B (FP4) and writes 4 B. Rows: const uint8_t*
// const* (an uploaded list) or ParamCaches.
template <typename Rows>
__global__ void unpack_kernel(Rows rows, RowFormat f, int64_t S, int n, float* __restrict__ y) {
  ::di::cuda::grid_dependency_wait();
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < S * n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / n;
    const int i = static_cast<int>(e % n);
    const uint8_t* row = rows[r];
    switch (f) {
      case RowFormat::kFp8Ue8m0: y[e] = cuda::dq::fp8_ue8m0_dequant_at(row, row + n, i); break;
      case RowFormat::kFp4E4m3: y[e] = cuda::dq::fp4_e4m3_dequant_at(row, row + n / 2, i); break;
      case RowFormat::kFp4Ue8m0: y[e] = cuda::dq::fp4_ue8m0_dequant_at(row, row + n / 2, i); break;
    }
  }
}

// kFp8Ue8m0 rows, 4 values per thread (one 4-byte code load, one 16-byte store), as unpack_kernel computes
// them: a quarter of its CTAs. On the side stream a kernel's CTAs wait for SMs that the main stream's GEMVs
// hold, so a decode step's ring unpack should ask for few. Needs n % 4 == 0 and 4-byte aligned rows.
__global__ void unpack_fp8_x4_kernel(ParamCaches rows, int64_t S, int n, float* __restrict__ y) {
  ::di::cuda::grid_dependency_wait();
  const int quads = n / 4;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < S * quads;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / quads;
    const int i = static_cast<int>(e % quads) * 4;
    const uint8_t* row = rows[r];
    const uint32_t codes = *reinterpret_cast<const uint32_t*>(row + i);
    const float s = cuda::e8m0_to_float(row[n + i / 32]);
    using cuda::dq::fp8_ue8m0_dequant;
    reinterpret_cast<float4*>(y)[e] =
        make_float4(fp8_ue8m0_dequant(static_cast<uint8_t>(codes), s),
                    fp8_ue8m0_dequant(static_cast<uint8_t>(codes >> 8), s),
                    fp8_ue8m0_dequant(static_cast<uint8_t>(codes >> 16), s),
                    fp8_ue8m0_dequant(static_cast<uint8_t>(codes >> 24), s));
  }
}

int row_block(RowFormat f) { return f == RowFormat::kFp4E4m3 ? 16 : 32; }

}  // namespace

Tensor CudaBackend::embed(const Tensor& ids, const Weight& table) {
  DI_CHECK(ids.type == TType::kI32);
  check_float_dtype(table.dtype, "embed");
  const int64_t n = ids.numel(), d = table.cols;
  Tensor out = alloc(TType::kF32, {n, d});
  if (n * d == 0) return out;
  const int grid = grid_for(n * d);
  with_float_dtype(table.dtype, [&](auto kd) {
    ::di::cuda::launch(embed_kernel<decltype(kd)::value>, grid, kThreads, 0, ids.i32(), n, d, table.rows,
                       cuda::wdata(table), out.f32(), embed_bad_flag());
  });
  return out;
}

Tensor CudaBackend::linear(const Tensor& x, const Weight& w) {
  DI_CHECK(x.type == TType::kF32 && x.row_size() == w.cols);
  const int64_t s = x.rows();
  Tensor y = alloc(TType::kF32, {s, w.rows});
  switch (w.mode) {
    case WeightMode::kFp8Block:
    case WeightMode::kFp4Expert:
      cuda::dense::quantized_linear(x.f32(), s, w, y.f32(), batch_invariant_, fast_fp4_gemm_);
      break;
    case WeightMode::kBf16:
    case WeightMode::kF32: {
      const bool bf16_out = w.mode == WeightMode::kBf16;
      // on the tensor cores; in the batch-invariant mode on the CUDA-core kernel (invariant by
      // construction)
      if (!batch_invariant_ && cuda::dense::bf16_mma_fits(x.f32(), s, w))
        cuda::dense::bf16_mma_linear(x.f32(), s, w, bf16_out, y.f32());
      else
        cuda::dense::float_linear(x.f32(), s, w, bf16_out, y.f32());
      break;
    }
  }
  return y;
}

Tensor CudaBackend::linear_rope(const Tensor& x, const Weight& w, int heads, int head_dim, int rope_dim,
                                const std::vector<int64_t>& positions, const RopeTable& table, const InputNorm& norm) {
  const bool quantized = w.mode == WeightMode::kFp8Block || w.mode == WeightMode::kFp4Expert;
  if (!fused_chains_ || !quantized || heads <= 0 || head_dim % 2 != 0 || rope_dim % 2 != 0 ||
      static_cast<int64_t>(heads) * head_dim != w.rows)
    return Backend::linear_rope(x, w, heads, head_dim, rope_dim, positions, table, norm);
  DI_CHECK(x.type == TType::kF32 && x.row_size() == w.cols);
  const int64_t s = x.rows();
  Tensor y = alloc(TType::kF32, {s, w.rows});
  check_rope_args(y, heads, head_dim, rope_dim, positions, table);
  cuda::dense::NormArgs na;
  if (norm.weight) {
    check_norm_weight(*norm.weight, w.cols, "linear_rope");
    na = {cuda::wdata(*norm.weight), cuda::attn::weight_type(*norm.weight, "linear_rope", "norm"), norm.eps, nullptr};
    if (norm.normed) {
      *norm.normed = alloc(TType::kF32, {s, w.cols});
      na.normed = norm.normed->f32();
    }
  }
  if (y.numel() == 0) return y;
  const cuda::dense::RopeArgs rope = rope_args(positions, table, head_dim, rope_dim);
  // the epilogue rotates unless K was split across CTAs
  if (!cuda::dense::quantized_linear(x.f32(), s, w, y.f32(), batch_invariant_, fast_fp4_gemm_, rope, na))
    CudaBackend::rope(y, heads, head_dim, rope_dim, positions, table, false);
  return y;
}

cuda::dense::RopeArgs CudaBackend::rope_args(const std::vector<int64_t>& positions, const RopeTable& table,
                                             int head_dim, int rope_dim) {
  return {rope_uploads_->get(positions), RowRope{rope_uploads_->get(table.freqs), head_dim, rope_dim}};
}

bool CudaBackend::inverse_rope_fused_fits(const Tensor& x, const Weight& w, int groups, int heads, int head_dim,
                                          int rope_dim) const {
  // (4 | head_dim, rope_dim: the staging rotates 4 values, two pairs of one head, at a time)
  return fused_chains_ && !batch_invariant_ && heads > 0 && head_dim % 4 == 0 && rope_dim % 4 == 0 &&
         x.row_size() == static_cast<int64_t>(heads) * head_dim && groups > 0 && x.row_size() == groups * w.cols &&
         cuda::dense::grouped_mma_rope_fits(x.f32(), x.rows(), w, groups);
}

Tensor CudaBackend::inverse_rope_grouped_linear(Tensor x, const Weight& w, int groups, int heads, int head_dim,
                                                int rope_dim, const std::vector<int64_t>& positions,
                                                const RopeTable& table) {
  if (!inverse_rope_fused_fits(x, w, groups, heads, head_dim, rope_dim))
    return Backend::inverse_rope_grouped_linear(std::move(x), w, groups, heads, head_dim, rope_dim, positions, table);
  check_rope_args(x, heads, head_dim, rope_dim, positions, table);
  Tensor y = alloc(TType::kF32, {x.rows(), w.rows});
  const cuda::dense::RopeArgs rope = rope_args(positions, table, head_dim, rope_dim);
  cuda::dense::grouped_mma_linear_inverse_rope(x.f32(), x.rows(), w, groups, rope, y.f32());
  return y;
}

Tensor CudaBackend::output_projection(Tensor x, const Weight& w_a, int groups, int heads, int head_dim, int rope_dim,
                                     const std::vector<int64_t>& positions, const RopeTable& table, const Weight& w_b) {
  const int64_t s = x.rows();
  if (!output_codes_ || !inverse_rope_fused_fits(x, w_a, groups, heads, head_dim, rope_dim) || w_b.cols != w_a.rows ||
      !cuda::dense::fp8_gemv_fits(s, w_b))
    return Backend::output_projection(std::move(x), w_a, groups, heads, head_dim, rope_dim, positions, table, w_b);
  // wo_a's tiles quantized by the CTAs that finish them, straight into wo_b's GEMV: the ops of
  // inverse_rope_grouped_linear + linear on their paths, less act_quant's launch (the same bits)
  check_rope_args(x, heads, head_dim, rope_dim, positions, table);
  const int64_t k = w_a.rows;
  Tensor z = alloc(TType::kF32, {s, k});  // wo_a's output [s, G*o_lora]
  Tensor y = alloc(TType::kF32, {s, w_b.rows});
  using cuda::Ws;
  const cuda::dense::ActCodesOut codes{cuda::workspace_as<uint8_t>(Ws::kHandoffCodes, static_cast<size_t>(s * k)),
                                       cuda::workspace_as<float>(Ws::kHandoffScales, static_cast<size_t>(s * k / 32))};
  const cuda::dense::RopeArgs rope = rope_args(positions, table, head_dim, rope_dim);
  if (!cuda::dense::grouped_mma_linear_inverse_rope(x.f32(), s, w_a, groups, rope, z.f32(), codes))
    cuda::dense::quantize_activation(z.f32(), s, k, codes.codes, codes.scales);
  cuda::dense::fp8_gemv(codes.codes, codes.scales, s, w_b, y.f32(), {});
  return y;
}

Tensor CudaBackend::grouped_linear(const Tensor& x, const Weight& w, int groups) {
  DI_CHECK(x.type == TType::kF32 && groups > 0 && x.row_size() == groups * w.cols);
  Tensor y = alloc(TType::kF32, {x.rows(), w.rows});
  if (!batch_invariant_ && cuda::dense::grouped_mma_fits(x.f32(), x.rows(), w, groups))  // as linear()
    cuda::dense::grouped_mma_linear(x.f32(), x.rows(), w, groups, y.f32());
  else
    cuda::dense::grouped_linear(x.f32(), x.rows(), w, groups, y.f32());
  return y;
}

Tensor CudaBackend::rmsnorm(const Tensor& x, const Weight& weight, float eps) {
  const int64_t s = x.rows(), n = x.row_size();
  check_norm_rows(x, weight, "rmsnorm");
  Tensor y = alloc(TType::kF32, {s, n});
  if (s * n == 0) return y;
  const unsigned grid = static_cast<unsigned>(s);  // one CTA per row
  const uint8_t* w = cuda::wdata(weight);
  with_float_dtype(weight.dtype, [&](auto kd) {
    ::di::cuda::launch(rmsnorm_kernel<decltype(kd)::value>, grid, kNormThreads, 0, x.f32(), n, w, eps, y.f32());
  });
  return y;
}

void CudaBackend::rope(Tensor& x, int heads, int head_dim, int rope_dim, const std::vector<int64_t>& positions,
                       const RopeTable& table, bool inverse) {
  check_rope_args(x, heads, head_dim, rope_dim, positions, table);
  const int64_t s = x.rows();
  const int64_t total = s * heads * (rope_dim / 2);
  if (total == 0) return;
  ::di::cuda::launch(rope_kernel, grid_for(total), kThreads, 0, x.f32(), s, heads, head_dim, rope_dim,
                     rope_uploads_->get(positions), rope_uploads_->get(table.freqs), inverse);
}

void CudaBackend::round_bf16(Tensor& x) {
  DI_CHECK(x.type == TType::kF32);
  if (x.numel() == 0) return;
  ::di::cuda::launch(scale_bf16_kernel, grid_for(x.numel()), kThreads, 0, x.f32(), x.numel(), 1.0f, false);
}

void CudaBackend::scale_bf16(Tensor& x, float factor) {
  DI_CHECK(x.type == TType::kF32);
  if (x.numel() == 0) return;
  ::di::cuda::launch(scale_bf16_kernel, grid_for(x.numel()), kThreads, 0, x.f32(), x.numel(), factor, true);
}

void CudaBackend::qdq(Tensor& x, RowFormat format) {
  const int64_t s = x.rows(), n = x.row_size();
  DI_CHECK(x.type == TType::kF32 && n % row_block(format) == 0 && n < (1LL << 31));
  if (s * n == 0) return;
  if (n % 32 == 0) {
    ::di::cuda::launch(qdq_warp_kernel, static_cast<int>(blocks_for(s * n, kThreads)), kThreads, 0, x.f32(), s * n / 32,
                       format);
  } else {  // kFp4E4m3, n % 32 == 16
    ::di::cuda::launch(qdq_fp4_e4m3_block_kernel, static_cast<int>(blocks_for(s * n / 16, kThreads)), kThreads, 0,
                       x.f32(), s * n / 16);
  }
}

namespace {

// Whether the fused RoPE + qdq kernels take x [S, heads * head_dim]: warps of 32 values, pairs that
// start at even columns of the row.
bool fused_rope_fits(const Tensor& x, int heads, int head_dim, int rope_dim) {
  const int64_t n = x.row_size();
  return n % 32 == 0 && n < (1LL << 31) && head_dim % 2 == 0 && rope_dim % 2 == 0 && heads > 0 &&
         static_cast<int64_t>(heads) * head_dim == n;
}

}  // namespace

void CudaBackend::rope_qdq(Tensor& x, int heads, int head_dim, int rope_dim, const std::vector<int64_t>& positions,
                           const RopeTable& table, RowFormat format) {
  if (!fused_chains_ || !fused_rope_fits(x, heads, head_dim, rope_dim))
    return Backend::rope_qdq(x, heads, head_dim, rope_dim, positions, table, format);
  check_rope_args(x, heads, head_dim, rope_dim, positions, table);
  const int64_t s = x.rows(), n = x.row_size();
  if (s * n == 0) return;
  const RowRope rope{rope_uploads_->get(table.freqs), head_dim, rope_dim};
  ::di::cuda::launch(rope_qdq_kernel, static_cast<int>(blocks_for(s * n, kThreads)), kThreads, 0, x.f32(), s * n / 32,
                     n, rope_uploads_->get(positions), rope, format);
}

Tensor CudaBackend::rmsnorm_rope_qdq(const Tensor& x, const Weight& norm, float eps, int heads, int head_dim,
                                     int rope_dim, const std::vector<int64_t>& positions, const RopeTable& table,
                                     RowFormat format) {
  if (!fused_chains_ || !fused_rope_fits(x, heads, head_dim, rope_dim))
    return Backend::rmsnorm_rope_qdq(x, norm, eps, heads, head_dim, rope_dim, positions, table, format);
  check_rope_args(x, heads, head_dim, rope_dim, positions, table);
  const int64_t s = x.rows(), n = x.row_size();
  check_norm_rows(x, norm, "rmsnorm_rope_qdq");
  Tensor y = alloc(TType::kF32, {s, n});
  if (s * n == 0) return y;
  const unsigned grid = static_cast<unsigned>(s);  // one CTA per row
  const uint8_t* w = cuda::wdata(norm);
  const int64_t* pos = rope_uploads_->get(positions);
  const RowRope rope{rope_uploads_->get(table.freqs), head_dim, rope_dim};
  with_float_dtype(norm.dtype, [&](auto kd) {
    ::di::cuda::launch(rmsnorm_rope_qdq_kernel<decltype(kd)::value>, grid, kNormThreads, 0, x.f32(), n, w, eps, pos,
                       rope, format, y.f32());
  });
  return y;
}

namespace {

// Packs x's rows to per-row cache rows (nullptr: skipped): one launch.
void pack_to_rows(const Tensor& x, RowFormat format, const std::vector<uint8_t*>& rows) {
  const int64_t n = x.row_size(), s = x.rows();
  DI_CHECK(x.type == TType::kF32 && static_cast<int64_t>(rows.size()) == s);
  DI_CHECK(n % row_block(format) == 0 && n < (1LL << 31));
  if (s == 0 || n == 0) return;
  const int blocks = static_cast<int>(blocks_for(s * n, kThreads));
  if (n % 32 == 0 && s <= ParamRows<uint8_t*>::kMax) {
    ParamRows<uint8_t*> params{};
    std::copy(rows.begin(), rows.end(), params.p);
    ::di::cuda::launch(pack_warp_kernel<ParamRows<uint8_t*>>, blocks, kThreads, 0, x.f32(), s, static_cast<int>(n),
                       format, params);
    return;
  }
  Scratch drows = upload(rows);
  if (n % 32 == 0)
    ::di::cuda::launch(pack_warp_kernel<uint8_t* const*>, blocks, kThreads, 0, x.f32(), s, static_cast<int>(n), format,
                       static_cast<uint8_t* const*>(drows.as<uint8_t*>()));
  else  // kFp4E4m3, n % 32 == 16
    ::di::cuda::launch(pack_fp4_e4m3_serial_kernel, static_cast<int>(blocks_for(s, kThreads)), kThreads, 0, x.f32(), s,
                       static_cast<int>(n), drows.as<uint8_t*>());
}

// Unpacks the cache rows at `rows` into y [rows, dim]: one launch.
void unpack_from_rows(const std::vector<const uint8_t*>& rows, RowFormat format, int64_t dim, float* y) {
  const int64_t s = static_cast<int64_t>(rows.size());
  DI_CHECK(dim % row_block(format) == 0 && dim < (1LL << 31));
  if (s * dim == 0) return;
  Scratch drows = upload(rows);
  const uint8_t* const* list = drows.as<const uint8_t*>();
  ::di::cuda::launch(unpack_kernel<const uint8_t* const*>, grid_for(s * dim), kThreads, 0, list, format, s,
                     static_cast<int>(dim), y);
}

}  // namespace

void CudaBackend::pack_rows(const Tensor& x, RowFormat format, Tensor& cache, const std::vector<int64_t>& slots) {
  const int64_t rb = packed_row_bytes(format, x.row_size());
  DI_CHECK(cache.type == TType::kU8 && cache.row_size() == rb && static_cast<int64_t>(slots.size()) == x.rows());
  std::vector<uint8_t*> rows;
  rows.reserve(slots.size());
  for (int64_t slot : slots) {
    DI_CHECK(slot >= 0 && slot < cache.rows());
    rows.push_back(cache.u8() + slot * rb);
  }
  pack_to_rows(x, format, rows);
}

void CudaBackend::pack_rows_to(const Tensor& x, RowFormat format, const std::vector<Tensor>& caches,
                               const std::vector<int32_t>& cache_of_row, const std::vector<int64_t>& slots) {
  const int64_t rb = packed_row_bytes(format, x.row_size());
  DI_CHECK(static_cast<int64_t>(cache_of_row.size()) == x.rows() && slots.size() == cache_of_row.size());
  std::vector<uint8_t*> rows(slots.size(), nullptr);
  for (size_t r = 0; r < slots.size(); ++r) {
    if (cache_of_row[r] < 0) continue;
    const Tensor& cache = caches.at(static_cast<size_t>(cache_of_row[r]));
    DI_CHECK(cache.type == TType::kU8 && cache.row_size() == rb && slots[r] >= 0 && slots[r] < cache.rows());
    rows[r] = cache.u8() + slots[r] * rb;
  }
  pack_to_rows(x, format, rows);
}

Tensor CudaBackend::unpack_rows(const Tensor& cache, RowFormat format, int64_t dim, const std::vector<int64_t>& slots) {
  const int64_t rb = packed_row_bytes(format, dim);
  DI_CHECK(cache.type == TType::kU8 && cache.row_size() == rb);
  std::vector<const uint8_t*> rows;
  rows.reserve(slots.size());
  for (int64_t slot : slots) {
    DI_CHECK(slot >= 0 && slot < cache.rows());
    rows.push_back(cache.u8() + slot * rb);
  }
  Tensor out = alloc(TType::kF32, {static_cast<int64_t>(slots.size()), dim});
  unpack_from_rows(rows, format, dim, out.f32());
  return out;
}

void CudaBackend::unpack_caches(const std::vector<Tensor>& caches, RowFormat format, Tensor& dst, int64_t d0) {
  const int64_t dim = dst.row_size(), rb = packed_row_bytes(format, dim);
  DI_CHECK(dst.type == TType::kF32 && dim % row_block(format) == 0 && dim < (1LL << 31));
  int64_t total = 0;
  bool same_rows = caches.size() <= ParamCaches::kMax;
  for (const Tensor& c : caches) {
    DI_CHECK(c.type == TType::kU8 && c.row_size() == rb);
    total += c.rows();
    same_rows = same_rows && c.rows() == caches[0].rows();
  }
  DI_CHECK(d0 >= 0 && d0 + total <= dst.rows());
  if (total == 0) return;
  float* y = dst.f32() + d0 * dim;
  if (same_rows) {  // every cache of the same size (a layer's rings): their bases as parameters
    ParamCaches params{};
    for (size_t i = 0; i < caches.size(); ++i) params.base[i] = caches[i].u8();
    params.rows_per = caches[0].rows();
    params.row_bytes = rb;
    bool aligned = rb % 4 == 0 && dim % 4 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0;
    for (const Tensor& c : caches) aligned = aligned && reinterpret_cast<uintptr_t>(c.data) % 4 == 0;
    if (format == RowFormat::kFp8Ue8m0 && aligned)
      ::di::cuda::launch(unpack_fp8_x4_kernel, grid_for(total * dim / 4), kThreads, 0, params, total,
                         static_cast<int>(dim), y);
    else
      ::di::cuda::launch(unpack_kernel<ParamCaches>, grid_for(total * dim), kThreads, 0, params, format, total,
                         static_cast<int>(dim), y);
    return;
  }
  std::vector<const uint8_t*> rows;
  for (const Tensor& c : caches)
    for (int64_t i = 0; i < c.rows(); ++i) rows.push_back(c.u8() + i * rb);
  unpack_from_rows(rows, format, dim, y);
}

}  // namespace di
