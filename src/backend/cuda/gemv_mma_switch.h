// Whether FP8 linears and wo_a of few rows take the tensor-core GEMV (fp8_gemv_mma.cu): up to
// gemv_mma_max_rows() rows do. Opt in with DEEPINFER_GEMV_MMA_ROWS=N (1-8; default 0, off): in the
// forty-second session's decode steps it won at batch 2 but lost at batches 1 and 8 (bench/RESULTS.md).
// Host-only, so tests can set it.
#pragma once

namespace di::cuda::dense {

int gemv_mma_max_rows();
void set_gemv_mma_max_rows(int n);  // 0: off; clamped to 8

}  // namespace di::cuda::dense
