#!/usr/bin/env bash
# Plain decode steps for every on/off combination of a few DEEPINFER_* switches, in rounds on one
# machine (starts differ by a few % between machines: compare only within one run), from the repo root:
#   bash bench/gpu/ab_matrix.sh "DEEPINFER_A DEEPINFER_B"
# Binaries: build-gpu/bin.tar.xz (tests/gpu/build_portable.sh). Writes $OUT/ab_matrix.txt (DI_AB_FILE names
# another, so that a second run keeps the first's; ./build-gpu-run/out without $OUT): per combination and
# round, the bench's "decode steps" table. With DI_AB_TRACE=1 also a kernel trace of the all-on and all-off
# combinations at batch 1 (trace_on.csv, trace_off.csv) and their bench/gpu/trace_summary.py --waits (traces.txt).
# DI_AB_MODE=each: instead of every combination, all on, each switch off alone, all off (n + 2 runs a round);
# DI_AB_MODE=alone: all off, each switch on alone, all on.
# DI_AB_BINS="A B ...": deepinfer binaries to compare (a branch's build against main's, say): every combination
# runs on each of them in turn, in each round ("round R: bin A: switches"); the switch list may then be empty
# (ab_matrix.sh ""), for the binaries alone. The traces take the first binary.
# DI_AB_BUILDS="main pr ...": the same with the binaries NAME/deepinfer of the bundle (tests/gpu/pack_builds.sh
# packs several builds into one; DI_AB_BUNDLE names another bundle than build-gpu/bin.tar.xz).
# Env: DI_BENCH_BATCH (default 1,2,8,64), DI_AB_ROUNDS (default 2), DI_BENCH_LAYERS (default 8),
# DI_BENCH_ITERS (default 7), DI_AB_BIN (a deepinfer binary to use instead of the bundle's); DI_DEVICE=cpu and
# DI_BENCH_MODEL=v41-tiny check the script off the GPU (tests/e2e/ab_matrix_e2e.sh).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
switches=(${1-})
if ((${#switches[@]} == 0)) && [[ -z ${DI_AB_BINS:-}${DI_AB_BUILDS:-} ]]; then
  echo 'usage: ab_matrix.sh "DEEPINFER_A DEEPINFER_B ..." (an empty list only with DI_AB_BINS or DI_AB_BUILDS)' >&2
  exit 2
fi
DEST=${OUT:-$PWD/build-gpu-run/out}
mkdir -p "$DEST" || exit 2
bins=(${DI_AB_BINS:-${DI_AB_BIN:-}})  # the binaries to run, else the bundle's
labels=()                             # per binary, how its runs are named in the table
for bin in "${bins[@]}"; do labels+=("${DI_AB_BINS:+bin $bin: }"); done
if ((${#bins[@]} == 0)); then
  BIN_DIR=build-gpu-run/ab
  rm -rf "$BIN_DIR" && mkdir -p "$BIN_DIR" && tar -xJf "${DI_AB_BUNDLE:-build-gpu/bin.tar.xz}" -C "$BIN_DIR" || exit 2
  for name in ${DI_AB_BUILDS:-.}; do
    [[ -x $BIN_DIR/$name/deepinfer ]] || { echo "ab_matrix.sh: the bundle has no build '$name'" >&2; exit 2; }
    bins+=("$BIN_DIR/$name/deepinfer")
    labels+=("${DI_AB_BUILDS:+build $name: }")
  done
fi
n=${#switches[@]} status=0
switch_env() {  # switch_env MASK: the switches' assignments, switch i on where bit i of MASK is set
  env_set=()
  for ((i = 0; i < n; ++i)); do env_set+=("${switches[i]}=$((($1 >> i) & 1))"); done
}
bench() {  # bench BINARY ARGS...: one plain decode run of the model, switches as in env_set, with ARGS added
  local binary=$1
  shift
  env "${env_set[@]}" "$binary" bench --synthetic "${DI_BENCH_MODEL:-v41-flash}" --layers "${DI_BENCH_LAYERS:-8}" \
    --device "${DI_DEVICE:-cuda}" --context 4096 --prefill 0 --no-profile --no-ceilings "$@"
}
out="$DEST/${DI_AB_FILE:-ab_matrix.txt}"
{ nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null; echo "commit $(git rev-parse --short HEAD 2>/dev/null)"; } >"$out"
all=$(((1 << n) - 1)) masks=()
if ((n == 0)); then
  masks=(0)  # the binaries alone
elif [[ ${DI_AB_MODE:-all} == each ]]; then
  masks=("$all")
  for ((i = 0; i < n; ++i)); do masks+=("$((all & ~(1 << i)))"); done
  masks+=(0)
elif [[ ${DI_AB_MODE:-all} == alone ]]; then
  masks=(0)
  for ((i = 0; i < n; ++i)); do masks+=("$((1 << i))"); done
  masks+=("$all")
else
  for ((mask = all; mask >= 0; --mask)); do masks+=("$mask"); done  # all on first, all off last
fi
for round in $(seq "${DI_AB_ROUNDS:-2}"); do
  for mask in "${masks[@]}"; do
    switch_env "$mask"
    for b in "${!bins[@]}"; do
      echo "round $round: ${labels[b]}${env_set[*]}" >>"$out"
      bench "${bins[b]}" --batch "${DI_BENCH_BATCH:-1,2,8,64}" --iters "${DI_BENCH_ITERS:-7}" 2>/dev/null |
        sed -n '/^decode steps/,/^$/p' >>"$out" || status=1
    done
  done
done
if [[ ${DI_AB_TRACE:-0} == 1 ]]; then
  : >"$DEST/traces.txt"
  for side in on off; do
    switch_env "$([[ $side == on ]] && echo "$all" || echo 0)"
    bench "${bins[0]}" --batch 1 --iters 3 --kernel-trace "$DEST/trace_$side.csv" >/dev/null 2>&1 || status=1
    { echo "== ${env_set[*]}"; python3 bench/gpu/trace_summary.py --waits "$DEST/trace_$side.csv"; } >>"$DEST/traces.txt" 2>&1
  done
fi
cat "$out"
exit $status
