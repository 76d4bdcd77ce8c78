// MoE expert glue on the GPU: row gather, SwiGLU with the reference's clamps and routing weight,
// scatter-add of expert outputs, and the final bf16 sum with the shared expert. The GEMMs are the
// backend's linear() (cuda_dense.cu).
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_quant.cuh"
#include "backend/cuda/moe_elem.cuh"
#include "backend/cuda/moe_kernels.cuh"
#include "backend/cuda/pdl_launch.cuh"

namespace di::cuda::moe {
namespace {

constexpr int kThreads = 256;

// One thread per float: n*d*4 bytes read and written (coalesced along the row).
__global__ void gather_rows_kernel(const float* __restrict__ src, const int32_t* __restrict__ rows, int64_t n,
                                   int64_t d, float* __restrict__ dst) {
  ::di::cuda::grid_dependency_wait();
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= n * d) return;
  const int64_t i = t / d, c = t % d;
  dst[t] = src[static_cast<int64_t>(rows[i]) * d + c];
}

// Elementwise over [n, inter]: 2 floats in, 1 out; an fp64 exp + a few FLOPs each (swiglu_value, then w * h).
__global__ void swiglu_kernel(float* __restrict__ gate, const float* __restrict__ up, int64_t n, int64_t inter,
                              const float* __restrict__ route_w, const int32_t* __restrict__ slots, float limit) {
  ::di::cuda::grid_dependency_wait();
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= n * inter) return;
  float h = swiglu_value(gate[t], up[t], limit);
  if (slots) h = __fmul_rn(route_w[slots[t / inter]], h);
  gate[t] = round_bf16(h);
}

// swiglu_kernel without routing weights, then act_quant_kernel on its bf16 output, one warp per 32-value block
// of [n, inter] (inter % 32 == 0): the same expressions, so the same codes and scales as the two launches.
// Reads 8 B and writes 1.125 B per element.
__global__ void swiglu_quant_rows_kernel(const float* __restrict__ gate, const float* __restrict__ up, int64_t nblocks,
                                         float limit, uint8_t* __restrict__ codes, float* __restrict__ scales) {
  ::di::cuda::grid_dependency_wait();
  const int64_t blk = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (blk >= nblocks) return;  // whole warps leave together
  const int64_t t = blk * 32 + (threadIdx.x & 31);
  const float h = round_bf16(swiglu_value(gate[t], up[t], limit));
  float scale;
  codes[t] = dq::act_quant_lane(h, scale);
  if ((threadIdx.x & 31) == 0) scales[blk] = scale;
}

// acc[rows[i]] += y[i]: n*d*8 bytes read, n*d*4 written. Rows are distinct within a call.
__global__ void scatter_add_kernel(float* __restrict__ acc, const float* __restrict__ y, const int32_t* __restrict__ rows,
                                   int64_t n, int64_t d) {
  ::di::cuda::grid_dependency_wait();
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= n * d) return;
  const int64_t i = t / d, c = t % d;
  float* a = acc + static_cast<int64_t>(rows[i]) * d + c;
  *a = __fadd_rn(*a, y[t]);
}

// n floats: 8 bytes in, 4 out each.
__global__ void add_round_kernel(const float* __restrict__ acc, const float* __restrict__ shared, int64_t n,
                                 float* __restrict__ out) {
  ::di::cuda::grid_dependency_wait();
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t < n) out[t] = round_bf16(__fadd_rn(acc[t], shared[t]));
}

}  // namespace

void gather_rows(const float* src, const int32_t* rows, int64_t n, int64_t d, float* dst) {
  if (n * d == 0) return;
  ::di::cuda::launch(gather_rows_kernel, blocks_for(n * d, kThreads), kThreads, 0, src, rows, n, d, dst);
}

void swiglu(float* gate, const float* up, int64_t n, int64_t inter, const float* route_w, const int32_t* slots,
            float limit) {
  if (n * inter == 0) return;
  ::di::cuda::launch(swiglu_kernel, blocks_for(n * inter, kThreads), kThreads, 0, gate, up, n, inter, route_w, slots,
                     limit);
}

void swiglu_quant_rows(const float* gate, const float* up, int64_t n, int64_t inter, float limit, uint8_t* codes,
                       float* scales) {
  DI_CHECK_MSG(inter % 32 == 0, "swiglu_quant_rows: the width must be a multiple of 32");
  const int64_t nblocks = n * inter / 32;
  if (nblocks == 0) return;
  ::di::cuda::launch(swiglu_quant_rows_kernel, blocks_for(nblocks * 32, kThreads), kThreads, 0, gate, up, nblocks,
                     limit, codes, scales);
}

void scatter_add_rows(float* acc, const float* y, const int32_t* rows, int64_t n, int64_t d) {
  if (n * d == 0) return;
  ::di::cuda::launch(scatter_add_kernel, blocks_for(n * d, kThreads), kThreads, 0, acc, y, rows, n, d);
}

void add_round_bf16(const float* acc, const float* shared, int64_t n, float* out) {
  if (n == 0) return;
  ::di::cuda::launch(add_round_kernel, blocks_for(n, kThreads), kThreads, 0, acc, shared, n, out);
}

}  // namespace di::cuda::moe
