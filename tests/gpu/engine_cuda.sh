#!/usr/bin/env bash
# The engine on the GPU (brown-small, the default model): async scheduling on vs off gives the same
# outputs, and in batch-invariant mode a batch of requests gives what each request gives alone
# (--max-running 1), and `score --batch-invariant` gives the same logits bit for bit whatever the
# prefill chunking; the side stream changes no bit (DEEPINFER_SIDE_STREAM=0 runs one stream), nor do the
# fused small chains (DEEPINFER_FUSED_CHAINS=0 runs the separate ops). Prints
# the summary lines (host gap per step, throughput) for bench/RESULTS.md.
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

# chunking: a 150-token prompt (random ids, fresh each run) prefilled whole and in chunks of 1, 7, 64
MODEL=$(cd "$(dirname "$0")/../.." && pwd)/models/brown-small
rand_ids() { python3 -c "import random,sys; print(','.join(str(random.randrange(1, 4000)) for _ in range(int(sys.argv[1]))))" "$1"; }
PROMPT=$(rand_ids 150) FORCED=$(rand_ids 12)
for c in 0 1 7 64; do
  "$BIN" score --model "$MODEL" --prompt-ids "$PROMPT" --forced-ids "$FORCED" --chunk $c --batch-invariant \
    --device "${DI_DEVICE:-cuda}" --out "$DEST/chunk$c.f32" 2>>"$DEST/chunk.err" || { echo "FAIL score --chunk $c"; status=1; }
done
for c in 1 7 64; do
  cmp -s "$DEST/chunk0.f32" "$DEST/chunk$c.f32" && echo "PASS batch-invariant: chunks of $c == whole prefill" \
    || { echo "FAIL batch-invariant: chunks of $c != whole prefill"; status=1; }
done

# the side stream (Backend::side_begin: hc_mixes and the shared expert beside the main chain) changes
# no bit: the same batch of requests and the same logits with everything on one stream
export DEEPINFER_SIDE_STREAM=0
run one_stream
cmp <(ids "$DEST/async.jsonl") <(ids "$DEST/one_stream.jsonl") && echo "PASS side stream == one stream (generate)" \
  || { echo "FAIL side stream != one stream (generate)"; status=1; }
"$BIN" score --model "$MODEL" --prompt-ids "$PROMPT" --forced-ids "$FORCED" --chunk 0 \
  --batch-invariant --device "${DI_DEVICE:-cuda}" --out "$DEST/one_stream.f32" 2>>"$DEST/chunk.err" \
  || { echo "FAIL score one stream"; status=1; }
unset DEEPINFER_SIDE_STREAM
cmp -s "$DEST/chunk0.f32" "$DEST/one_stream.f32" && echo "PASS side stream == one stream (score)" \
  || { echo "FAIL side stream != one stream (score)"; status=1; }

# the fused small chains (rmsnorm_rope_qdq, rope_qdq, concat_paged_rows: one launch each) change no
# bit: the same requests and the same logits with the Backend's separate ops
export DEEPINFER_FUSED_CHAINS=0
run unfused
cmp <(ids "$DEST/async.jsonl") <(ids "$DEST/unfused.jsonl") && echo "PASS fused chains == unfused (generate)" \
  || { echo "FAIL fused chains != unfused (generate)"; status=1; }
"$BIN" score --model "$MODEL" --prompt-ids "$PROMPT" --forced-ids "$FORCED" --chunk 7 --batch-invariant \
  --device "${DI_DEVICE:-cuda}" --out "$DEST/unfused.f32" 2>>"$DEST/chunk.err" || { echo "FAIL score unfused"; status=1; }
unset DEEPINFER_FUSED_CHAINS
cmp -s "$DEST/chunk7.f32" "$DEST/unfused.f32" && echo "PASS fused chains == unfused (score, chunks of 7)" \
  || { echo "FAIL fused chains != unfused (score, chunks of 7)"; status=1; }
exit $status
