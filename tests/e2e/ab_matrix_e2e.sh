#!/usr/bin/env bash
# bench/gpu/ab_matrix.sh off the GPU (the v41-tiny model on the CPU): the combinations each mode runs, in
# order (all: every one, all on first; each: all on, each off alone, all off; alone: all off, each on alone,
# all on), each with its decode-steps table; DI_AB_FILE writes another file; a missing switch list is an error.
# Usage: bash ab_matrix_e2e.sh <deepinfer-binary> <repo>/tests
set -uo pipefail

DEEPINFER=$(realpath "$1")
TESTS=$(realpath "$2")
AB="$TESTS/../bench/gpu/ab_matrix.sh"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

failed=0
bad() { failed=$((failed + 1)); echo "FAIL: $1"; }

run_mode() {  # run_mode MODE EXPECTED-ROUND-LINES...
  local mode=$1
  shift
  OUT="$WORK/$mode" DI_AB_BIN="$DEEPINFER" DI_AB_MODE=$mode DI_DEVICE=cpu DI_BENCH_MODEL=v41-tiny DI_BENCH_LAYERS=1 \
    DI_BENCH_BATCH=1 DI_BENCH_ITERS=1 DI_AB_ROUNDS=1 bash "$AB" "DEEPINFER_X DEEPINFER_Y" >/dev/null 2>&1 ||
    bad "$mode: ab_matrix.sh failed"
  local got want tables
  got=$(grep '^round' "$WORK/$mode/ab_matrix.txt")
  want=$(printf 'round 1: %s\n' "$@")
  [[ $got == "$want" ]] || bad "$mode: combinations
got:
$got
want:
$want"
  tables=$(grep -cE '^ +4096 +1 +[0-9.]+' "$WORK/$mode/ab_matrix.txt")
  [[ $tables == "$#" ]] || bad "$mode: $tables decode-step rows for $# combinations"
}

run_mode all "DEEPINFER_X=1 DEEPINFER_Y=1" "DEEPINFER_X=0 DEEPINFER_Y=1" "DEEPINFER_X=1 DEEPINFER_Y=0" \
  "DEEPINFER_X=0 DEEPINFER_Y=0"
run_mode each "DEEPINFER_X=1 DEEPINFER_Y=1" "DEEPINFER_X=0 DEEPINFER_Y=1" "DEEPINFER_X=1 DEEPINFER_Y=0" \
  "DEEPINFER_X=0 DEEPINFER_Y=0"
run_mode alone "DEEPINFER_X=0 DEEPINFER_Y=0" "DEEPINFER_X=1 DEEPINFER_Y=0" "DEEPINFER_X=0 DEEPINFER_Y=1" \
  "DEEPINFER_X=1 DEEPINFER_Y=1"
# DI_AB_FILE: another file, the earlier one kept
OUT="$WORK/all" DI_AB_FILE=second.txt DI_AB_BIN="$DEEPINFER" DI_DEVICE=cpu DI_BENCH_MODEL=v41-tiny DI_BENCH_LAYERS=1 \
  DI_BENCH_BATCH=1 DI_BENCH_ITERS=1 DI_AB_ROUNDS=1 bash "$AB" "DEEPINFER_X" >/dev/null 2>&1 || bad "DI_AB_FILE: failed"
[[ $(grep -c '^round' "$WORK/all/second.txt") == 2 && $(grep -c '^round' "$WORK/all/ab_matrix.txt") == 4 ]] ||
  bad "DI_AB_FILE: second.txt or the first run's ab_matrix.txt is not as written"
out=$(OUT="$WORK/none" DI_AB_BIN="$DEEPINFER" bash "$AB" 2>&1)
rc=$?
[[ $rc -ne 0 && $out == *usage* ]] || bad "no switches: rc $rc, output: $out"

((failed == 0)) && echo "ab_matrix_e2e: PASS" || echo "ab_matrix_e2e: $failed failure(s)"
exit $((failed > 0))
