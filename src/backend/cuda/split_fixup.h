// How many fix-up rounds a GEMM's last CTA may take to sum its tile's K-split partials before a
// reduce_splits launch does it instead (mma_gemm.cuh, fixup_in_kernel). Host-only, so tests can
// set it: both ways give the same bits. DEEPINFER_FIXUP_ROUNDS sets the start value (default 8).
#pragma once

#include <cstdint>

namespace di::cuda::mma {

int64_t fixup_max_rounds();
void set_fixup_max_rounds(int64_t n);  // n >= 0; 0: every split launch sums in reduce_splits

}  // namespace di::cuda::mma
