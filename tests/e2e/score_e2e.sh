#!/usr/bin/env bash
# `deepinfer score` end to end: golden layout of logits and drafts, chunked prefill, bad input.
# usage: score_e2e.sh <deepinfer> <repo>/tests
set -uo pipefail
BIN=$1
DATA=$2/data/golden_dev
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
pass=0
fail=0
check() {  # check NAME CONDITION...
  local name=$1
  shift
  if "$@"; then pass=$((pass + 1)); else echo "FAIL: $name"; fail=$((fail + 1)); fi
}
size_is() { [[ $(stat -c %s "$1") == "$2" ]]; }

# prompt 1 of the golden case: 5 prompt tokens, 24 forced, vocab 512, block 5
P=0,330,235,72,252
F=84,412,178,76,223,405,185,65,325,495,433,72,235,16,261,150,157,376,497,366,249,418,23,114
"$BIN" score --model "$DATA/model" --prompt-ids $P --forced-ids "$F" --out "$TMP/l.f32" --draft-out "$TMP/d" 2>"$TMP/err"
check "score exits 0" [ $? -eq 0 ]
check "logits [25, 512] f32" size_is "$TMP/l.f32" $((25 * 512 * 4))
check "draft logits [24, 5, 512]" size_is "$TMP/d_draft_logits.f32" $((24 * 5 * 512 * 4))
check "confidence [24, 5]" size_is "$TMP/d_confidence.f32" $((24 * 5 * 4))
check "draft ids json" grep -q '^\[\[' "$TMP/d_draft_ids.json"

# chunked prefill (consistent mode) equals one prefill, here with a boundary inside a ratio-2 group
"$BIN" score --model "$DATA/model" --prompt-ids $P --forced-ids 84,412 --out "$TMP/a.f32" --no-reference-quirks 2>/dev/null
"$BIN" score --model "$DATA/model" --prompt-ids $P --forced-ids 84,412 --out "$TMP/b.f32" --chunk 3 --no-reference-quirks 2>/dev/null
check "--chunk 3 equals one prefill" cmp "$TMP/a.f32" "$TMP/b.f32"

# bad input: clear errors, exit 1
"$BIN" score --model "$DATA/model" --prompt-ids 0,999999 --out "$TMP/x.f32" 2>"$TMP/err"
check "out-of-range id exits 1" [ $? -eq 1 ]
check "out-of-range id is named" grep -q "999999" "$TMP/err"
"$BIN" score --model "$DATA/model" --prompt-ids 0,abc --out "$TMP/x.f32" 2>"$TMP/err"
check "non-numeric id exits 1" [ $? -eq 1 ]
check "the option is named" grep -q -- "--prompt-ids" "$TMP/err"
"$BIN" score --model "$TMP/nowhere" --prompt-ids 0 --out "$TMP/x.f32" 2>"$TMP/err"
check "missing model exits 1" [ $? -eq 1 ]
"$BIN" score --model "$DATA/model" --prompt-ids 0 --out "$TMP/x.f32" --device tpu 2>"$TMP/err"
check "unknown device exits 1" [ $? -eq 1 ]

echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
