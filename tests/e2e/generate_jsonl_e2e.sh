#!/usr/bin/env bash
# End-to-end: `deepinfer generate --prompts IN.jsonl --output OUT.jsonl` on the tiny golden model:
# results in input order with text, token_ids, finish_reason and usage; the JSON summary line on
# stderr; a malformed line is an error naming its line; `stop` cuts the text before the match; a seed
# reproduces a sampled generation (in the batch and across runs); a request the engine rejects fails
# alone; prefix-cache hits are counted (and exact hits change no token). Also `generate --prompt`
# (streaming, one prompt). Prompts are drawn fresh each run (seed printed).
# Usage: bash generate_jsonl_e2e.sh <deepinfer-binary> <repo>/tests
set -uo pipefail

DEEPINFER=$(realpath "$1")
TESTS=$(realpath "$2")
MODEL="$TESTS/data/golden_dev/model"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
SEED=${DI_SEED:-$(date +%s%N | tail -c 10)}
echo "seed $SEED (DI_SEED=$SEED replays)"

passed=0
failed=0
ok() { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); echo "FAIL: $1"; }

# check NAME PYTHON-CODE: runs the code with W = the work dir; a failed assert fails the check.
check() {
  local name=$1
  if python3 -c "import json, os, sys
W = '$WORK'
def lines(p): return [json.loads(l) for l in open(os.path.join(W, p)) if l.strip()]
$2" > "$WORK/check.log" 2>&1; then ok; else bad "$name"; cat "$WORK/check.log"; fi
}

# run_gen NAME ARGS...: generate --prompts; expects exit status 0.
run_gen() {
  local name=$1
  shift
  if "$DEEPINFER" generate --model "$MODEL" "$@" > "$WORK/stdout" 2> "$WORK/stderr"; then ok; else
    bad "$name: exit status $?"; cat "$WORK/stderr"; fi
}

# expect_error NAME MESSAGE-SUBSTRING ARGS...
expect_error() {
  local name=$1 msg=$2
  shift 2
  local rc=0
  "$DEEPINFER" generate --model "$MODEL" "$@" > "$WORK/stdout" 2> "$WORK/stderr" || rc=$?
  if [ "$rc" -ne 1 ]; then bad "$name: exit status $rc, expected 1"; cat "$WORK/stderr"; return; fi
  if ! grep -qF -- "$msg" "$WORK/stderr"; then bad "$name: stderr lacks '$msg'"; cat "$WORK/stderr"; return; fi
  ok
}

# Fresh prompts: a few random words each.
python3 - "$SEED" "$WORK" <<'PY'
import json, random, sys
rng = random.Random(int(sys.argv[1]))
words = "the a cat dog sat on mat river stone quick brown fox jumps over lazy sun moon green tree".split()
def prompt(): return " ".join(rng.choice(words) for _ in range(rng.randint(2, 8)))
with open(sys.argv[2] + "/prompts.txt", "w") as f:
    for _ in range(6): f.write(prompt() + "\n")
PY
mapfile -t P < "$WORK/prompts.txt"

# --- order, fields, usage, summary -----------------------------------------------------------
cat > "$WORK/in.jsonl" <<JSONL
{"prompt": "${P[0]}", "max_tokens": 3, "temperature": 0, "id": "first"}
{"prompt": "${P[1]}", "max_tokens": 9, "temperature": 0, "ignore_eos": true}

{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "${P[2]}"}], "max_tokens": 5, "temperature": 0}
{"prompt": "${P[3]}", "max_tokens": 1, "temperature": 0.7, "top_p": 0.9, "top_k": 20, "seed": 1}
{"prompt": "${P[4]}", "max_tokens": 7, "temperature": 0, "ignore_eos": true, "id": 42}
JSONL
run_gen "batch" --prompts "$WORK/in.jsonl" --output "$WORK/out.jsonl"
check "output order and fields" '
out = lines("out.jsonl")
assert len(out) == 5, len(out)
assert [o["index"] for o in out] == [0, 1, 2, 3, 4]
assert out[0]["id"] == "first" and out[4]["id"] == 42 and "id" not in out[1]
for o, limit in zip(out, [3, 9, 5, 1, 7]):
    assert list(o) == ["index"] + ["id"] * ("id" in o) + ["text", "token_ids", "finish_reason", "usage"], list(o)
    assert isinstance(o["text"], str) and all(isinstance(t, int) for t in o["token_ids"]), o
    assert o["finish_reason"] in ("stop", "length"), o
    u = o["usage"]
    assert u["completion_tokens"] == len(o["token_ids"]) <= limit, o
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], o
    assert u["prompt_tokens"] >= 2 and 0 <= u["cached_tokens"] <= u["prompt_tokens"], o
    if o["finish_reason"] == "length": assert len(o["token_ids"]) == limit, o
assert out[1]["finish_reason"] == "length" and len(out[1]["token_ids"]) == 9
assert out[4]["finish_reason"] == "length" and len(out[4]["token_ids"]) == 7
'
check "summary line" '
s = json.loads(open(os.path.join(W, "stderr")).read().strip().splitlines()[-1])
out = lines("out.jsonl")
assert s["requests"] == 5 and s["failed"] == 0, s
assert s["completion_tokens"] == sum(o["usage"]["completion_tokens"] for o in out), s
assert s["prompt_tokens"] == sum(o["usage"]["prompt_tokens"] for o in out), s
assert s["output_tokens_per_s"] > 0 and s["elapsed_s"] > 0, s
for k in ("prefix_hit_tokens", "cached_tokens", "total_tokens_per_s", "requests_per_s"): assert k in s, k
'

# The chat line is the same as its prompt rendered by encode-chat: prompt_tokens agree.
cat > "$WORK/chat_req.json" <<JSON
{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "${P[2]}"}]}
JSON
"$DEEPINFER" encode-chat --model "$MODEL" --request "$WORK/chat_req.json" > "$WORK/encoded.json"
check "messages line uses the chat encoding" '
ids = json.load(open(os.path.join(W, "encoded.json")))["ids"]
assert lines("out.jsonl")[2]["usage"]["prompt_tokens"] == len(ids), (len(ids), lines("out.jsonl")[2])
'

# Modes and stdout output: the same greedy results with every prefix-cache mode, batch invariance,
# and synchronous scheduling (and --fast-fp4-gemm, a CUDA option the CPU backend accepts and ignores).
for mode in "--prefix-cache off" "--prefix-cache exact --batch-invariant" "--prefix-cache replay --no-async" \
  "--fast-fp4-gemm"; do
  # shellcheck disable=SC2086
  run_gen "modes $mode" --prompts "$WORK/in.jsonl" --output - $mode
  cp "$WORK/stdout" "$WORK/out_mode.jsonl"
  check "greedy results with $mode" '
a, b = lines("out.jsonl"), lines("out_mode.jsonl")
for i in (0, 1, 2, 4): assert a[i]["token_ids"] == b[i]["token_ids"], (i, a[i], b[i])
'
done

# --- prefix cache -----------------------------------------------------------------------------
# Four prompts sharing a prefix of >= 80 tokens (past one 64-token prefix block), one at a time: the
# later ones hit the cache; with exact hits the greedy tokens equal those without a cache.
python3 - "$SEED" "$DEEPINFER" "$MODEL" <<'PY' > "$WORK/shared.jsonl"
import json, random, subprocess, sys
rng = random.Random(int(sys.argv[1]) + 1)
words = "the a cat dog sat on mat river stone quick brown fox jumps over lazy sun moon green tree".split()
prefix = []
def n_tokens(text):
    out = subprocess.run([sys.argv[2], "tokenize", "--model", sys.argv[3], "--text", text], capture_output=True, text=True, check=True)
    return len(json.loads(out.stdout)["ids"])
while n_tokens(" ".join(prefix)) < 80: prefix.append(rng.choice(words))
for i in range(4):
    print(json.dumps({"prompt": " ".join(prefix + [rng.choice(words)]), "max_tokens": 4, "temperature": 0, "ignore_eos": True}))
PY
for mode in off exact; do
  run_gen "prefix cache $mode" --prompts "$WORK/shared.jsonl" --output "$WORK/shared_$mode.jsonl" --prefix-cache $mode --max-running 1
  tail -n 1 "$WORK/stderr" > "$WORK/summary_$mode.json"
done
check "prefix cache hits, exact hits change nothing" '
off, exact = lines("shared_off.jsonl"), lines("shared_exact.jsonl")
s_off, s_exact = (json.load(open(os.path.join(W, "summary_%s.json" % m))) for m in ("off", "exact"))
assert s_off["prefix_hit_tokens"] == 0 and s_off["cached_tokens"] == 0, s_off
assert s_exact["prefix_hit_tokens"] >= 3 * 64, s_exact
assert s_exact["cached_tokens"] == sum(o["usage"]["cached_tokens"] for o in exact) == s_exact["prefix_hit_tokens"], s_exact
assert exact[0]["usage"]["cached_tokens"] == 0 and all(o["usage"]["cached_tokens"] >= 64 for o in exact[1:]), exact
assert [o["token_ids"] for o in off] == [o["token_ids"] for o in exact]
'

# --- stop -----------------------------------------------------------------------------------
printf '{"prompt": "%s", "max_tokens": 24, "temperature": 0, "ignore_eos": true}\n' "${P[5]}" > "$WORK/nostop.jsonl"
run_gen "no stop" --prompts "$WORK/nostop.jsonl" --output "$WORK/nostop_out.jsonl"
python3 - "$WORK" <<'PY' > "$WORK/stop.jsonl"
import json, sys
o = json.loads(open(sys.argv[1] + "/nostop_out.jsonl").readline())
req = json.loads(open(sys.argv[1] + "/nostop.jsonl").readline())
t = o["text"]
# a stop string from the middle of the text: two characters starting a third of the way in
k = max(1, len(t) // 3)
req["stop"] = [t[k:k + 2]] if len(t) >= 4 else ["\u2603"]
print(json.dumps(req))
PY
run_gen "stop" --prompts "$WORK/stop.jsonl" --output "$WORK/stop_out.jsonl"
check "stop honoured" '
full = lines("nostop_out.jsonl")[0]["text"]
stop = lines("stop.jsonl")[0]["stop"][0]
o = lines("stop_out.jsonl")[0]
assert len(full) >= 4, "text too short to test stop: %r" % full
assert o["finish_reason"] == "stop", o
assert o["text"] == full[: full.find(stop)], (full, stop, o["text"])
'

# --- seeds -----------------------------------------------------------------------------------
python3 - "$WORK" "${P[0]}" <<'PY' > "$WORK/seeds.jsonl"
import json, sys
for seed in (11, 11, 12, 13, 14):
    print(json.dumps({"prompt": sys.argv[2], "max_tokens": 12, "temperature": 1.0, "ignore_eos": True, "seed": seed}))
PY
run_gen "seeds 1" --prompts "$WORK/seeds.jsonl" --output "$WORK/seeds1.jsonl" --batch-invariant
run_gen "seeds 2" --prompts "$WORK/seeds.jsonl" --output "$WORK/seeds2.jsonl" --batch-invariant
check "seed reproducibility" '
a, b = lines("seeds1.jsonl"), lines("seeds2.jsonl")
assert [o["token_ids"] for o in a] == [o["token_ids"] for o in b], "runs differ"
assert a[0]["token_ids"] == a[1]["token_ids"], "same seed, same batch: different tokens"
assert len({tuple(o["token_ids"]) for o in a[1:]}) > 1, "four seeds gave the same tokens"
'

# --- errors ----------------------------------------------------------------------------------
printf '{"prompt": "a"}\n\n{"prompt": "b", }\n' > "$WORK/broken.jsonl"
expect_error "malformed line" "broken.jsonl:3: invalid JSON" --prompts "$WORK/broken.jsonl" --output "$WORK/o.jsonl"
printf '{"prompt": "a", "max_token": 3}\n' > "$WORK/unknown.jsonl"
expect_error "unknown field" "unknown.jsonl:1: unknown field 'max_token'" --prompts "$WORK/unknown.jsonl" --output "$WORK/o.jsonl"
printf '{"prompt": "a"}\n{"prompt": "b", "temperature": "hot"}\n' > "$WORK/type.jsonl"
expect_error "bad type" "type.jsonl:2: field 'temperature': expected a number" --prompts "$WORK/type.jsonl" --output "$WORK/o.jsonl"
printf '{"prompt": "a", "messages": []}\n' > "$WORK/both.jsonl"
expect_error "prompt and messages" "both.jsonl:1: expected exactly one of" --prompts "$WORK/both.jsonl" --output "$WORK/o.jsonl"
expect_error "missing file" "cannot open" --prompts "$WORK/nope.jsonl" --output "$WORK/o.jsonl"
expect_error "no output" "--prompts needs --output" --prompts "$WORK/in.jsonl"
expect_error "prompt and prompts" "exactly one of --prompt" --prompt x --prompts "$WORK/in.jsonl" --output "$WORK/o.jsonl"
expect_error "bad mode" "--prefix-cache: expected off, replay or exact" --prompts "$WORK/in.jsonl" --output "$WORK/o.jsonl" --prefix-cache maybe

# A request the engine rejects fails alone: its line carries the error, the others complete, exit 1.
printf '{"prompt": "%s", "max_tokens": 2}\n{"prompt": "x", "temperature": -1}\n{"prompt": "%s", "max_tokens": 2}\n' \
  "${P[0]}" "${P[1]}" > "$WORK/reject.jsonl"
expect_error "rejected request" "1 of 3 requests failed" --prompts "$WORK/reject.jsonl" --output "$WORK/reject_out.jsonl"
check "rejected request fails alone" '
out = lines("reject_out.jsonl")
assert [o["finish_reason"] for o in out][1] == "error" and "temperature" in out[1]["error"], out[1]
assert out[0]["finish_reason"] != "error" and out[2]["finish_reason"] != "error", out
'

# --- --prompt: one prompt, streamed; sampled with seed 0 unless --seed, so it repeats -----------
one() { "$DEEPINFER" generate "$@" --prompt "${P[0]}" --max-tokens 6 2>> "$WORK/err"; }
if one --model "$MODEL" > "$WORK/one_a" && one --model "$MODEL" > "$WORK/one_b" && one > "$WORK/one_default"; then
  ok
  if cmp -s "$WORK/one_a" "$WORK/one_b"; then ok; else bad "--prompt: two runs differ"; fi
else
  bad "--prompt: exit status"; cat "$WORK/err"
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
