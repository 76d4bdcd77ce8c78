#!/usr/bin/env bash
# The in-stream timeline of one decode step (kernel starts and ends as they ran, PDL and side stream
# included), for finding the time a step spends between kernels -- ncu_step.sh times each kernel alone:
#   bash bench/gpu/nsys_step.sh DEEPINFER BATCH CONTEXT OUT.csv [LAYERS]
# Runs `deepinfer bench --profiler-range` on the synthetic V4.1-Flash checkpoint under nsys, capturing
# the last timed decode step (cudaProfilerStart / Stop); writes the CUDA GPU trace as CSV. Summarise
# with bench/gpu/nsys_summary.py.
set -euo pipefail
BIN=$1 BATCH=$2 CTX=$3 CSV=$4 LAYERS=${5:-17}
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
REP=$(mktemp -d)/step
"$NSYS" profile --trace cuda --capture-range cudaProfilerApi --capture-range-end stop --sample none \
  --cpuctxsw none -o "$REP" "$BIN" bench --synthetic v41-flash --layers "$LAYERS" --device cuda --batch "$BATCH" \
  --context "$CTX" --iters 3 --no-profile --no-ceilings --profiler-range >/dev/null
"$NSYS" stats --report cuda_gpu_trace --format csv --output "$REP" "$REP.nsys-rep" >/dev/null
mv "$REP"_cuda_gpu_trace.csv "$CSV"
