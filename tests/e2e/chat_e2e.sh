#!/usr/bin/env bash
# End-to-end: `deepinfer chat` with stdin on a pipe, on the tiny golden model. Two turns: the second
# turn's request holds the first reply as the assistant message, and the engine's prompt for it has
# exactly the tokens `deepinfer encode-chat` gives for that history (so the reply went back through
# the V4.1 chat encoding); the greedy first reply equals `generate --prompts` on the same messages.
# /exit and EOF end the session; --thinking sends thinking mode. User turns are fresh each run.
# Usage: bash chat_e2e.sh <deepinfer-binary> <repo>/tests
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

check() {
  local name=$1
  if python3 -c "import json, os, sys
W = '$WORK'
def requests(p): return [json.loads(l[len('request: '):]) for l in open(os.path.join(W, p)) if l.startswith('request: ')]
def usages(p): return [json.loads(l[len('usage: '):]) for l in open(os.path.join(W, p)) if l.startswith('usage: ')]
$2" > "$WORK/check.log" 2>&1; then ok; else bad "$name"; cat "$WORK/check.log"; fi
}

chat() { "$DEEPINFER" chat --model "$MODEL" --max-tokens 8 --temperature 0 --show-request "$@"; }

python3 - "$SEED" > "$WORK/turns.txt" <<'PY'
import random, sys
rng = random.Random(int(sys.argv[1]))
words = "hello how are you today tell me about the river stone and green tree please".split()
for _ in range(2): print(" ".join(rng.choice(words) for _ in range(rng.randint(2, 6))))
PY
mapfile -t T < "$WORK/turns.txt"

# --- two turns through a pipe ---------------------------------------------------------------
if chat < "$WORK/turns.txt" > "$WORK/out" 2> "$WORK/err"; then ok; else bad "two turns: exit status"; cat "$WORK/err"; fi
check "two requests, the second holds the first reply" '
r = requests("err")
u = usages("err")
assert len(r) == 2 and len(u) == 2, (r, u)
t = open(os.path.join(W, "turns.txt")).read().splitlines()
assert r[0]["messages"] == [{"role": "user", "content": t[0]}], r[0]
m = r[1]["messages"]
assert [x["role"] for x in m] == ["user", "assistant", "user"], m
assert m[0]["content"] == t[0] and m[2]["content"] == t[1], m
assert r[0]["thinking"] is False and r[1]["thinking"] is False
assert all(x["finish_reason"] in ("stop", "length") for x in u), u
assert 1 <= u[0]["completion_tokens"] <= 8
out = open(os.path.join(W, "out"), newline="").read()  # replies may hold \r
assert out.startswith(m[1]["content"] + "\n"), (out, m[1]["content"])
json.dump(r[1], open(os.path.join(W, "turn2.json"), "w"))
json.dump({"messages": r[0]["messages"], "max_tokens": 8, "temperature": 0}, open(os.path.join(W, "turn1.jsonl"), "w"))
'
"$DEEPINFER" encode-chat --model "$MODEL" --request "$WORK/turn2.json" > "$WORK/turn2_encoded.json"
check "second prompt = encode-chat of the history" '
ids = json.load(open(os.path.join(W, "turn2_encoded.json")))["ids"]
u = usages("err")
assert u[1]["prompt_tokens"] == len(ids), (u[1], len(ids))
assert u[1]["prompt_tokens"] > u[0]["prompt_tokens"] + u[0]["completion_tokens"] - 1, u
'
"$DEEPINFER" generate --model "$MODEL" --prompts "$WORK/turn1.jsonl" --output "$WORK/turn1_out.jsonl" 2> /dev/null
check "first reply = generate on the same messages" '
g = json.loads(open(os.path.join(W, "turn1_out.jsonl")).readline())
assert requests("err")[1]["messages"][1]["content"] == g["text"], (g, requests("err")[1])
'

# --- /exit, EOF, blank lines ------------------------------------------------------------------
printf '\n%s\n/exit\n%s\n' "${T[0]}" "${T[1]}" | chat > "$WORK/out2" 2> "$WORK/err2"
rc=$?
[ "$rc" -eq 0 ] && ok || bad "/exit: exit status $rc"
check "/exit ends the session" 'assert len(requests("err2")) == 1, requests("err2")'
if chat < /dev/null > "$WORK/out3" 2> "$WORK/err3" && [ ! -s "$WORK/out3" ]; then ok; else bad "EOF at once"; fi

# --- --thinking and --system ----------------------------------------------------------------
chat --thinking --system "Be brief." < "$WORK/turns.txt" > "$WORK/out4" 2> "$WORK/err4" || bad "--thinking: exit status"
check "--thinking sends thinking mode; the reply goes back with its reasoning split off" '
r = requests("err4")
assert len(r) == 2 and r[0]["thinking"] is True, r
m = r[1]["messages"]
assert m[0] == {"role": "system", "content": "Be brief."}, m
assert m[2]["role"] == "assistant" and "reasoning_content" in m[2], m
'

# --- errors -----------------------------------------------------------------------------------
if "$DEEPINFER" chat --model "$MODEL" --prefix-cache maybe < /dev/null 2> "$WORK/err5"; then
  bad "bad option accepted"
elif grep -qF -- "--prefix-cache: expected off, replay or exact" "$WORK/err5"; then ok; else bad "bad option message"; cat "$WORK/err5"; fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
