#!/usr/bin/env bash
# bench's GPU-only flags off the GPU, and the readers of what they write, on hand-made inputs (the real ones need a
# GPU):
#  - `deepinfer bench --kernel-trace`, --hold-ms, --graph and --graph-layers off the GPU or out of range fail with a
#    message;
#  - bench/gpu/trace_summary.py reads a kernel trace: per-stream intervals (a kernel's end minus the previous
#    kernel's end on its stream, PDL overlap included) and --waits (idle gaps, by the other stream's kernel that
#    ended last inside the gap, else the host) and --frontier (how far each kernel moved the step's latest end);
#  - bench/gpu/launch_diff.py reads a launch log (DEEPINFER_LAUNCH_LOG): steps split at the embed launches, kernels
#    inserted in one step reported, and per kernel which parameters changed (an address, a grid, other bytes).
# Usage: bash bench_gpu_tools_e2e.sh <deepinfer-binary> <repo>/tests
set -uo pipefail

DEEPINFER=$(realpath "$1")
TESTS=$(realpath "$2")
SUMMARY="$TESTS/../bench/gpu/trace_summary.py"
DIFF="$TESTS/../bench/gpu/launch_diff.py"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

failed=0
bad() { failed=$((failed + 1)); echo "FAIL: $1"; }
has() {  # has NAME PATTERN FILE: FILE holds a line matching the extended regex PATTERN
  grep -Eq -- "$2" "$3" || { bad "$1: no line matching '$2' in"; cat "$3"; }
}

# off the GPU: a clear error, no trace file
out=$("$DEEPINFER" bench --synthetic v41-tiny --device cpu --no-ceilings --kernel-trace "$WORK/t.csv" 2>&1)
rc=$?
[[ $rc -ne 0 && $out == *"--kernel-trace needs --device cuda"* ]] || bad "cpu --kernel-trace: rc $rc, output: $out"
[[ ! -e $WORK/t.csv ]] || bad "cpu --kernel-trace wrote a file"
# ARGS | what the error must name
while IFS='|' read -r args want; do
  out=$("$DEEPINFER" bench --synthetic v41-tiny --no-ceilings $args 2>&1)
  rc=$?
  [[ $rc -ne 0 && $out == *"$want"* ]] || bad "bench $args: rc $rc, output: $out"
done <<'CASES'
--device cpu --hold-ms 5|--hold-ms
--device cuda --hold-ms -1|--hold-ms
--device cuda --hold-ms 2000|--hold-ms
--device cpu --graph|--graph
--device cpu --graph-layers 2|--graph
--device cuda --graph-layers -1|--graph-layers
CASES

# main stream 7: a (0-10), b launched early under PDL (5-20), c starts at 30 after the side kernel s ended at
# 28 (a join: 10 us idle), d starts at 45 with nothing ending in its gap (the host: 10 us idle).
# Side stream 13: s (22-28). Names as CUPTI gives them, with namespaces, templates and commas.
cat >"$WORK/trace.csv" <<'CSV'
context,batch,start_us,end_us,stream,ctas,name
4096,1,0.000,10.000,7,20,"void di::cuda::(anonymous namespace)::a_kernel<1, 2>(float const*, int)"
4096,1,5.000,20.000,7,640,"void di::cuda::dense::b_kernel(float*)"
4096,1,22.000,28.000,13,64,"void di::cuda::moe::s_kernel(int)"
4096,1,30.000,35.000,7,20,"void di::cuda::moe::c_kernel(float*)"
4096,1,45.000,47.000,7,1,"void di::cuda::d_kernel()"
CSV
if ! python3 "$SUMMARY" "$WORK/trace.csv" --waits --list --frontier >"$WORK/out.txt" 2>&1; then
  bad "trace_summary.py failed"; cat "$WORK/out.txt"
fi
has "header" "^context 4096, batch 1: 5 kernels, span 47.0 us" "$WORK/out.txt"
has "main intervals" "stream 7: intervals sum 47.0 us" "$WORK/out.txt"
has "b's interval is its end minus a's end" "^ +10\.0 +15\.0 +1x  dense::b_kernel$" "$WORK/out.txt"
has "names keep their template arguments" "a_kernel<1, 2>$" "$WORK/out.txt"
has "main idle" "stream 7: idle 20.0 us in gaps" "$WORK/out.txt"
has "the join" "^ +10\.0 +1x  moe::c_kernel  <- after moe::s_kernel$" "$WORK/out.txt"
has "the host" "^ +10\.0 +1x  d_kernel  <- host$" "$WORK/out.txt"
# frontier: a 0 -> 10, b 10 -> 20, s 20 -> 28, c 28 -> 35, d 35 -> 47
has "frontier total" "frontier: 47.0 us moved" "$WORK/out.txt"
has "d moved the end from c's 35 to 47" "^ +12\.0 +1x  d_kernel$" "$WORK/out.txt"
has "s, on the side stream, moved it from 20 to 28" "^ +8\.0 +1x  moe::s_kernel$" "$WORK/out.txt"

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
echo "bench_gpu_tools_e2e: all checks passed"
