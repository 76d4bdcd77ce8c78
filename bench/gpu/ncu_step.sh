#!/usr/bin/env bash
# Per-kernel device time of one decode step, for finding what a step spends its time on:
#   bash bench/gpu/ncu_step.sh DEEPINFER BATCH CONTEXT OUT.csv [LAYERS]
# Runs `deepinfer bench --profiler-range` on the synthetic V4.1-Flash checkpoint under ncu, which times
# only the last timed decode step (cudaProfilerStart / Stop) kernel by kernel, in launch order. ncu
# keeps L2 between kernels (--cache-control none, as in a real step: its default flush about doubles
# the small kernels) and leaves the clocks alone. Summarise with bench/gpu/ncu_summary.py.
set -euo pipefail
BIN=$1 BATCH=$2 CTX=$3 CSV=$4 LAYERS=${5:-17}
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
"$NCU" --clock-control none --cache-control none --profile-from-start off \
  --metrics gpu__time_duration.sum,launch__grid_size --csv --page raw --print-units base \
  "$BIN" bench --synthetic v41-flash --layers "$LAYERS" --device cuda --batch "$BATCH" --context "$CTX" \
  --iters 2 --no-profile --no-ceilings --profiler-range >"$CSV.raw"
# keep the CSV rows only (ncu prints the program's own output first)
grep '^"' "$CSV.raw" >"$CSV"
rm -f "$CSV.raw"
