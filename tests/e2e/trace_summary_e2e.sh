#!/usr/bin/env bash
# `deepinfer bench --kernel-trace` (and --hold-ms) off the GPU or out of range fails with a message, and bench/gpu/trace_summary.py reads a
# kernel trace (a hand-made one: the real ones need a GPU): per-stream intervals (a kernel's end minus the
# previous kernel's end on its stream, PDL overlap included) and --waits (idle gaps, by the other stream's
# kernel that ended last inside the gap, else the host).
# Usage: bash trace_summary_e2e.sh <deepinfer-binary> <repo>/tests
set -uo pipefail

DEEPINFER=$(realpath "$1")
TESTS=$(realpath "$2")
SUMMARY="$TESTS/../bench/gpu/trace_summary.py"
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
for args in "--device cpu --hold-ms 5" "--device cuda --hold-ms -1" "--device cuda --hold-ms 2000"; do
  out=$("$DEEPINFER" bench --synthetic v41-tiny --no-ceilings $args 2>&1)
  rc=$?
  [[ $rc -ne 0 && $out == *"--hold-ms"* ]] || bad "bench $args: rc $rc, output: $out"
done

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
if ! python3 "$SUMMARY" "$WORK/trace.csv" --waits --list >"$WORK/out.txt" 2>&1; then
  bad "trace_summary.py failed"; cat "$WORK/out.txt"
fi
has "header" "^context 4096, batch 1: 5 kernels, span 47.0 us" "$WORK/out.txt"
has "main intervals" "stream 7: intervals sum 47.0 us" "$WORK/out.txt"
has "b's interval is its end minus a's end" "^ +10\.0 +15\.0 +1x  dense::b_kernel$" "$WORK/out.txt"
has "names keep their template arguments" "a_kernel<1, 2>$" "$WORK/out.txt"
has "main idle" "stream 7: idle 20.0 us in gaps" "$WORK/out.txt"
has "the join" "^ +10\.0 +1x  moe::c_kernel  <- after moe::s_kernel$" "$WORK/out.txt"
has "the host" "^ +10\.0 +1x  d_kernel  <- host$" "$WORK/out.txt"

if [[ $failed -ne 0 ]]; then
  echo "$failed check(s) failed"
  exit 1
fi
echo "trace_summary_e2e: all checks passed"
