#!/usr/bin/env bash
# `deepinfer score --device cuda` against `--device cpu` on the golden dev model, two prompts of the
# golden case, with drafts. Prints the relative L2 of every logits row and of every step's draft
# logits; passes when the first FIRST_ROWS (default 2: the prefill row and the first decode row)
# logits rows are within 1e-2 (the model amplifies summation-order differences step by step, so
# later rows are printed, not checked) and both devices ran. Comparison: od + awk, no other tools.
# usage: score_cuda_vs_cpu.sh <deepinfer-binary> [<repo>/tests]   (report also to $OUT if set)
set -uo pipefail
BIN=${1:?usage: score_cuda_vs_cpu.sh <deepinfer-binary> [<repo>/tests]}
TESTS=${2:-$(cd "$(dirname "$0")/.." && pwd)}
MODEL=$TESTS/data/golden_dev/model
FIRST_ROWS=${FIRST_ROWS:-2}
# Rows are checked on prompt 1 only: the 19-token prefill of prompt 2 crosses a point where an ulp of
# fp32 summation order flips an FP8/FP4 rounding or a tied top-k pick, and the official reference
# itself diverges from its golden file there (bench/RESULTS.md); its rows are printed, not checked.
CHECKED_PROMPTS=${CHECKED_PROMPTS:-1}
MAX_REL=${MAX_REL:-1e-2}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
REPORT=$TMP/report.txt
say() { echo "$*" | tee -a "$REPORT"; }

# Per row of W floats: "<row> <relative L2 of a vs b>" (b is the reference; nan when a value is not finite).
rel_rows() {
  paste <(od -An -v -t f4 -w4 "$1") <(od -An -v -t f4 -w4 "$2") | awk -v W="$3" '
    function finite(s) { return s ~ /^[ \t]*-?[0-9]/ && s !~ /inf|nan/ }
    { if (!finite($1) || !finite($2)) bad = 1; else { d = $1 - $2; num += d * d; den += $2 * $2 }
      if (++n % W == 0) {
        if (bad) printf "%d nan\n", n / W - 1; else printf "%d %.3e\n", n / W - 1, (den > 0 ? sqrt(num / den) : sqrt(num))
        num = den = bad = 0 } }'
}

# prompts 1 and 2 of tests/data/golden_dev/golden.json (5 and 19 prompt tokens, 24 forced each)
PROMPTS=("0,330,235,72,252" "0,295,251,494,126,296,37,163,174,420,17,103,133,128,209,461,498,472,374")
FORCED=("84,412,178,76,223,405,185,65,325,495,433,72,235,16,261,150,157,376,497,366,249,418,23,114"
        "295,123,502,181,183,90,319,99,355,227,37,367,75,472,165,178,458,6,58,473,328,433,92,364")
BLOCK=5  # golden block_size: draft logits are [forced, BLOCK, vocab]

fail=0
for p in 0 1; do
  say "== prompt $((p + 1)): ${PROMPTS[p]}"
  for dev in cpu cuda; do
    start=$(date +%s.%N)
    if ! "$BIN" score --model "$MODEL" --prompt-ids "${PROMPTS[p]}" --forced-ids "${FORCED[p]}" --device $dev \
        --out "$TMP/${dev}_$p.f32" --draft-out "$TMP/${dev}_$p" 2>"$TMP/${dev}_$p.err"; then
      say "FAIL: score --device $dev exited non-zero:"
      tail -5 "$TMP/${dev}_$p.err" | tee -a "$REPORT"
      fail=1
      continue 2
    fi
    say "score --device $dev: $(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.2f s", e - s }')"
  done
  rows=$((1 + $(tr -cd , <<<"${FORCED[p]}" | wc -c) + 1))
  vocab=$(($(stat -c %s "$TMP/cpu_$p.f32") / 4 / rows))
  if [[ $(stat -c %s "$TMP/cuda_$p.f32") != $(stat -c %s "$TMP/cpu_$p.f32") ]]; then
    say "FAIL: logits sizes differ"; fail=1; continue
  fi
  say "logits rows [$rows, $vocab], relative L2 cuda vs cpu (rows < $FIRST_ROWS must be <= $MAX_REL):"
  while read -r row e; do
    mark=""
    if ((row < FIRST_ROWS)) && [[ " $CHECKED_PROMPTS " == *" $((p + 1)) "* ]]; then
      if [[ $e == nan ]] || awk -v e="$e" -v m="$MAX_REL" 'BEGIN { exit !(e > m) }'; then mark="  <-- FAIL"; fail=1; fi
    fi
    say "  row $row: $e$mark"
  done < <(rel_rows "$TMP/cuda_$p.f32" "$TMP/cpu_$p.f32" "$vocab")
  # draft logits: worst row of each step's BLOCK rows
  say "draft logits, worst relative L2 per step:"
  rel_rows "$TMP/cuda_${p}_draft_logits.f32" "$TMP/cpu_${p}_draft_logits.f32" "$vocab" |
    awk -v B=$BLOCK '{ s = int($1 / B); if (!(s in w) || $2 == "nan" || ($2 + 0) > (w[s] + 0)) w[s] = $2; n = s }
                     END { line = ""; for (i = 0; i <= n; ++i) line = line sprintf(" %s", w[i]); print " " line }' |
    tee -a "$REPORT"
  if cmp -s "$TMP/cuda_${p}_draft_ids.json" "$TMP/cpu_${p}_draft_ids.json"; then
    say "draft ids: identical"
  else
    say "draft ids: differ (printed, not checked)"
  fi
done

if ((fail)); then say "score_cuda_vs_cpu: FAIL"; else say "score_cuda_vs_cpu: PASS"; fi
[[ -n ${OUT:-} ]] && cp "$REPORT" "$OUT/score_cuda_vs_cpu.txt"
exit $fail
