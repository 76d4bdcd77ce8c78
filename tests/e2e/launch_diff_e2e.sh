#!/usr/bin/env bash
# `deepinfer bench --graph` / `--graph-layers` off the GPU or out of range fails with a message, and
# bench/gpu/launch_diff.py reads a launch log (DEEPINFER_LAUNCH_LOG; a hand-made one: the real ones need a GPU):
# steps split at the embed launches, kernels inserted in one step reported, and per kernel which parameters changed
# (an address, a grid, a parameter of other bytes).
# Usage: bash launch_diff_e2e.sh <deepinfer-binary> <repo>/tests
set -uo pipefail

DEEPINFER=$(realpath "$1")
TESTS=$(realpath "$2")
DIFF="$TESTS/../bench/gpu/launch_diff.py"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

failed=0
bad() { failed=$((failed + 1)); echo "FAIL: $1"; }
has() {  # has NAME PATTERN FILE: FILE holds a line matching the extended regex PATTERN
  grep -Eq -- "$2" "$3" || { bad "$1: no line matching '$2' in"; cat "$3"; }
}

for args in "--device cpu --graph" "--device cpu --graph-layers 2" "--device cuda --graph-layers -1"; do
  out=$("$DEEPINFER" bench --synthetic v41-tiny --no-ceilings $args 2>&1)
  rc=$?
  [[ $rc -ne 0 && $out == *"--graph"* ]] || bad "bench $args: rc $rc, output: $out"
done

# three steps; steps 1 and 2: gemv's output address changes, norm's grid changes, step 2 has one more kernel (pool)
# and quant's 4-byte parameter changes; copy is identical.
T=$'\t'
{
  echo "di::embed_kernel<float>${T}8,1,1${T}256,1,1${T}0${T}0${T}00007f0000001000 00000001 "
  echo "di::embed_kernel<float>${T}8,1,1${T}256,1,1${T}0${T}0${T}00007f0000001000 00000001 "
  echo "dense::gemv_kernel<1, 1>${T}64,1,1${T}128,1,1${T}0${T}0${T}00007f0000002000 00007f0000003000 "
  echo "di::norm_kernel${T}1,1,1${T}256,1,1${T}0${T}1${T}00007f0000004000 "
  echo "di::quant_kernel${T}20,1,1${T}256,1,1${T}0${T}0${T}00000010 "
  echo "di::copy_kernel${T}4,1,1${T}128,1,1${T}0${T}0${T}00007f0000005000 "
  echo "di::embed_kernel<float>${T}8,1,1${T}256,1,1${T}0${T}0${T}00007f0000001000 00000001 "
  echo "dense::gemv_kernel<1, 1>${T}64,1,1${T}128,1,1${T}0${T}0${T}00007f0000002000 00007f0000009000 "
  echo "di::norm_kernel${T}2,1,1${T}256,1,1${T}0${T}1${T}00007f0000004000 "
  echo "di::pool_kernel${T}1,1,1${T}32,1,1${T}0${T}0${T}00007f0000006000 "
  echo "di::quant_kernel${T}20,1,1${T}256,1,1${T}0${T}0${T}00000011 "
  echo "di::copy_kernel${T}4,1,1${T}128,1,1${T}0${T}0${T}00007f0000005000 "
} >"$WORK/launch.log"
if ! python3 "$DIFF" "$WORK/launch.log" >"$WORK/out.txt" 2>&1; then
  bad "launch_diff.py failed"; cat "$WORK/out.txt"
fi
has "header" "3 steps; comparing step 1 \(5 launches\) with step 2 \(6 launches\)" "$WORK/out.txt"
has "the inserted kernel" "insert: .*pool_kernel" "$WORK/out.txt"
has "counts" "^5 matched launches: 2 identical, 3 with a changed parameter" "$WORK/out.txt"
has "an address" "^ +1x +p1:ptr$" "$WORK/out.txt"
has "a grid" "^ +1x +grid$" "$WORK/out.txt"
has "other bytes" "^ +1x +p0:4B$" "$WORK/out.txt"
python3 "$DIFF" "$WORK/launch.log" --steps 0 1 >"$WORK/same.txt" 2>&1 || bad "launch_diff.py --steps 0 1 failed"
has "a step against an identical one" "^1 matched launches: 1 identical, 0 with a changed parameter" "$WORK/same.txt"

if [[ $failed -ne 0 ]]; then
  echo "$failed check(s) failed"
  exit 1
fi
echo "launch_diff_e2e: all checks passed"
