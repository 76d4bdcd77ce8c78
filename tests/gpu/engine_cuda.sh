#!/usr/bin/env bash
# The engine on the GPU (brown-small, the default model): async scheduling on vs off gives the same
# outputs, and in batch-invariant mode a batch of requests gives what each request gives alone
# (--max-running 1). Prints the summary lines (host gap per step, throughput) for bench/RESULTS.md.
# usage: engine_cuda.sh DEEPINFER [OUTDIR]   (DI_DEVICE=cpu runs the same checks on the CPU)
set -uo pipefail
BIN=$1
DEST=${2:-${OUT:-/tmp}/engine_cuda}
mkdir -p "$DEST"
P=$DEST/prompts.jsonl
starts=("The president said" "When he came home that night, he" "In the morning" "The church" "She looked at"
        "It was not" "The city council" "After the war" "His father" "The old man")
: >"$P"
for i in $(seq 0 39); do
  s=${starts[$((i % 10))]}
  printf '{"prompt": "%s", "max_tokens": %d, "temperature": %s, "seed": %d}\n' "$s" $((16 + i % 5 * 8)) \
    "$([[ $((i % 2)) == 0 ]] && echo 0 || echo 0.8)" "$i" >>"$P"
done
status=0
run() {  # name, flags...
  local name=$1; shift
  "$BIN" generate --prompts "$P" --output "$DEST/$name.jsonl" --device "${DI_DEVICE:-cuda}" "$@" 2>"$DEST/$name.err"
  local rc=$?
  echo "$name rc=$rc $(tail -1 "$DEST/$name.err")"
  ((rc)) && status=1
}
ids() { python3 -c 'import json,sys; [print(json.loads(l)["token_ids"]) for l in open(sys.argv[1])]' "$1"; }
run async
run sync --no-async
run invariant_batch --batch-invariant
run invariant_alone --batch-invariant --max-running 1
cmp <(ids "$DEST/async.jsonl") <(ids "$DEST/sync.jsonl") && echo "PASS async == sync" || { echo "FAIL async != sync"; status=1; }
cmp <(ids "$DEST/invariant_batch.jsonl") <(ids "$DEST/invariant_alone.jsonl") \
  && echo "PASS batch-invariant: batch == alone" || { echo "FAIL batch-invariant: batch != alone"; status=1; }
exit $status
