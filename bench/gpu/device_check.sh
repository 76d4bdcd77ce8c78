#!/usr/bin/env bash
# One device call that checks and measures the current build (the device machines give a session a
# few minutes of GPU time: one call should bring back everything a commit needs), from the repo root:
#   bash bench/gpu/device_check.sh [STEPS]      STEPS: any of tests engine bench ab (default: all;
#                                               ab only with DI_AB set)
# Binaries: build-gpu/bin.tar.xz from tests/gpu/build_portable.sh (carry it). Results go to $OUT (the
# device's result folder; ./build-gpu-run/out otherwise), at most seven files:
#   tests   run.log, gpu_tests.xml, score_cuda_vs_cpu.txt (tests/gpu/run.sh: every CUDA op against the
#           CPU, the forward against the golden cases, score --device cuda vs cpu)
#   engine  engine.txt (tests/gpu/engine_cuda.sh: async == sync, batch-invariant, chunking, side stream)
#   bench   bench.txt (the tables) and bench.jsonl (one JSON object per measurement): decode at 4K,
#           batches DI_BENCH_BATCH (default 1,8,64), per layer and per op at DI_PROFILE_BATCH (default
#           1,8,64), 17 layers on a GPU of more than 100 GB (H200), else 8 (H100); DI_BENCH_LAYERS overrides.
#   ab      bench_ab.txt: with DI_AB=NAME (a DEEPINFER_* switch), plain decode steps at the same batches
#           with NAME=1, 0, 1, 0 in turn (an A/B on one machine: starts differ by a few %); DI_AB_VALUES
#           sets the values (e.g. "8 0 8 0" for DEEPINFER_FIXUP_ROUNDS)
# Env: DI_GPU_TESTS_TIMEOUT (seconds, default 240), DI_BENCH_ITERS (default 7); DI_DEVICE=cpu and
# DI_BENCH_MODEL=v41-tiny run the bench step on a machine without a GPU (a check of this script).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
DEST=${OUT:-$PWD/build-gpu-run/out}
STEPS=${1:-tests engine bench${DI_AB:+ ab}}
BIN_DIR=build-gpu-run/check
mkdir -p "$DEST" && rm -rf "$BIN_DIR" && mkdir -p "$BIN_DIR" && tar -xJf build-gpu/bin.tar.xz -C "$BIN_DIR" || exit 2
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader 2>/dev/null
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u +%FT%TZ)"
status=0
if [[ $STEPS == *tests* ]]; then
  DI_GPU_PREBUILT=1 DI_GPU_TESTS_TIMEOUT=${DI_GPU_TESTS_TIMEOUT:-240} bash tests/gpu/run.sh >/dev/null 2>&1 || status=1
  grep -E "PASSED|FAILED|tests ran|score_cuda_vs_cpu" "$DEST/run.log" | tail -8
fi
if [[ $STEPS == *engine* ]]; then
  bash tests/gpu/engine_cuda.sh "$BIN_DIR/deepinfer" "$(mktemp -d)" >"$DEST/engine.txt" 2>&1 || status=1
  grep -E "PASS|FAIL" "$DEST/engine.txt"
fi
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
layers=${DI_BENCH_LAYERS:-$([[ ${mem:-0} -gt 100000 ]] && echo 17 || echo 8)}
if [[ $STEPS == *bench* ]]; then
  "$BIN_DIR/deepinfer" bench --synthetic "${DI_BENCH_MODEL:-v41-flash}" --layers "$layers" --device "${DI_DEVICE:-cuda}" \
    --batch "${DI_BENCH_BATCH:-1,8,64}" \
    --context 4096 --iters "${DI_BENCH_ITERS:-7}" --profile-batch "${DI_PROFILE_BATCH:-1,8,64}" --json \
    >"$DEST/bench.all" 2>"$DEST/bench.txt" || status=1
  grep '^{' "$DEST/bench.all" >"$DEST/bench.jsonl"
  grep -v '^{' "$DEST/bench.all" >>"$DEST/bench.txt"
  rm -f "$DEST/bench.all"
  sed -n '/^decode steps/,/^$/p' "$DEST/bench.txt"
fi
if [[ $STEPS == *ab* && -n ${DI_AB:-} ]]; then
  : >"$DEST/bench_ab.txt"
  for on in ${DI_AB_VALUES:-1 0 1 0}; do
    echo "$DI_AB=$on" >>"$DEST/bench_ab.txt"
    env "$DI_AB=$on" "$BIN_DIR/deepinfer" bench --synthetic "${DI_BENCH_MODEL:-v41-flash}" --layers "$layers" \
      --device "${DI_DEVICE:-cuda}" --batch "${DI_BENCH_BATCH:-1,8,64}" --context 4096 --iters "${DI_BENCH_ITERS:-7}" \
      --prefill 0 --no-profile --no-ceilings 2>/dev/null | sed -n '/^decode steps/,/^$/p' >>"$DEST/bench_ab.txt" || status=1
  done
  cat "$DEST/bench_ab.txt"
fi
exit $status
