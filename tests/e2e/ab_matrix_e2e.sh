#!/usr/bin/env bash
# bench/gpu/ab_matrix.sh off the GPU (the v41-tiny model on the CPU): the combinations each mode runs, in
# order (all: every one, all on first; each: all on, each off alone, all off; alone: all off, each on alone,
# all on), each with its decode-steps table; DI_AB_FILE writes another file; DI_AB_BINS runs each combination on
# each binary (and needs no switch); tests/gpu/pack_builds.sh packs builds that DI_AB_BUILDS runs; a missing
# switch list is an error.
# Usage: bash ab_matrix_e2e.sh <deepinfer-binary> <repo>/tests
set -uo pipefail

DEEPINFER=$(realpath "$1")
TESTS=$(realpath "$2")
AB="$TESTS/../bench/gpu/ab_matrix.sh"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

failed=0
bad() { failed=$((failed + 1)); echo "FAIL: $1"; }

ab() {  # ab SWITCHES [VAR=VALUE...]: ab_matrix.sh on the tiny model on the CPU, one round, the variables added
  local switches=$1
  shift
  env DI_DEVICE=cpu DI_BENCH_MODEL=v41-tiny DI_BENCH_LAYERS=1 DI_BENCH_BATCH=1 DI_BENCH_ITERS=1 DI_AB_ROUNDS=1 "$@" \
    bash "$AB" "$switches" >/dev/null 2>&1
}

run_mode() {  # run_mode MODE EXPECTED-ROUND-LINES...
  local mode=$1
  shift
  ab "DEEPINFER_X DEEPINFER_Y" OUT="$WORK/$mode" DI_AB_BIN="$DEEPINFER" DI_AB_MODE="$mode" ||
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
ab DEEPINFER_X OUT="$WORK/all" DI_AB_FILE=second.txt DI_AB_BIN="$DEEPINFER" || bad "DI_AB_FILE: failed"
[[ $(grep -c '^round' "$WORK/all/second.txt") == 2 && $(grep -c '^round' "$WORK/all/ab_matrix.txt") == 4 ]] ||
  bad "DI_AB_FILE: second.txt or the first run's ab_matrix.txt is not as written"
# DI_AB_BINS: each combination on each binary in turn; with no switches, the binaries alone
ln -s "$DEEPINFER" "$WORK/other"
ab DEEPINFER_X OUT="$WORK/bins" DI_AB_BINS="$DEEPINFER $WORK/other" || bad "DI_AB_BINS: failed"
got=$(grep '^round' "$WORK/bins/ab_matrix.txt")
want=$(printf 'round 1: bin %s: %s\n' "$DEEPINFER" DEEPINFER_X=1 "$WORK/other" DEEPINFER_X=1 "$DEEPINFER" DEEPINFER_X=0 \
  "$WORK/other" DEEPINFER_X=0)
[[ $got == "$want" && $(grep -cE '^ +4096 +1 +[0-9.]+' "$WORK/bins/ab_matrix.txt") == 4 ]] || bad "DI_AB_BINS: got
$got
want:
$want"
ab "" OUT="$WORK/bins0" DI_AB_BINS="$DEEPINFER $WORK/other" DI_AB_MODE=each DI_AB_ROUNDS=2 ||
  bad "DI_AB_BINS without switches: failed"
[[ $(grep -c '^round' "$WORK/bins0/ab_matrix.txt") == 4 &&
  $(grep -cE '^ +4096 +1 +[0-9.]+' "$WORK/bins0/ab_matrix.txt") == 4 ]] ||
  bad "DI_AB_BINS without switches: not one run per binary and round"
# tests/gpu/pack_builds.sh + DI_AB_BUILDS: builds packed into one bundle (here two wrappers of the CPU binary),
# the first's files at the top, each build's deepinfer under its name, run in turn
PACK="$TESTS/gpu/pack_builds.sh"
for name in one two; do
  mkdir -p "$WORK/$name/tests"
  printf '#!/bin/sh\nexec "%s" "$@"\n' "$DEEPINFER" >"$WORK/$name/deepinfer"
  chmod +x "$WORK/$name/deepinfer"
  echo "$name" >"$WORK/$name/tests/gpu_tests"
  tar -cJf "$WORK/$name.tar.xz" -C "$WORK/$name" deepinfer tests/gpu_tests
done
DI_PACK_OUT="$WORK/packed.tar.xz" bash "$PACK" a="$WORK/one.tar.xz" b="$WORK/two.tar.xz" >/dev/null 2>&1 ||
  bad "pack_builds.sh failed"
got=$(tar -tJf "$WORK/packed.tar.xz" | sed 's|^\./||' | grep -v '/$' | sort | tr '\n' ' ')
[[ $got == "a/deepinfer b/deepinfer deepinfer tests/gpu_tests " ]] || bad "pack_builds.sh: the bundle holds: $got"
[[ $(tar -xJOf "$WORK/packed.tar.xz" ./tests/gpu_tests) == one ]] || bad "pack_builds.sh: not the first build's tests"
ab "" OUT="$WORK/builds" DI_AB_BUNDLE="$WORK/packed.tar.xz" DI_AB_BUILDS="a b" || bad "DI_AB_BUILDS: failed"
got=$(grep '^round' "$WORK/builds/ab_matrix.txt")
want=$(printf 'round 1: build %s: \n' a b)
[[ $got == "$want" && $(grep -cE '^ +4096 +1 +[0-9.]+' "$WORK/builds/ab_matrix.txt") == 2 ]] || bad "DI_AB_BUILDS: got
$got
want:
$want"
out=$(ab "" OUT="$WORK/builds" DI_AB_BUNDLE="$WORK/packed.tar.xz" DI_AB_BUILDS="a c" 2>&1; echo "rc $?")
[[ $out == "rc 2" ]] || bad "DI_AB_BUILDS with a build the bundle lacks: $out"
out=$(bash "$PACK" tests="$WORK/one.tar.xz" 2>&1)
[[ $? -ne 0 && $out == *"not deepinfer, tests or bench"* ]] || bad "pack_builds.sh with a build named tests: $out"
out=$(bash "$PACK" a="$WORK/missing.tar.xz" 2>&1)
[[ $? -ne 0 && $out == *"no bundle at"* ]] || bad "pack_builds.sh with a missing bundle: $out"
out=$(OUT="$WORK/none" DI_AB_BIN="$DEEPINFER" bash "$AB" 2>&1)
rc=$?
[[ $rc -ne 0 && $out == *usage* ]] || bad "no switches: rc $rc, output: $out"

((failed == 0)) && echo "ab_matrix_e2e: PASS" || echo "ab_matrix_e2e: $failed failure(s)"
exit $((failed > 0))
