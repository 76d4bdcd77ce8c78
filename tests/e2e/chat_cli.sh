#!/usr/bin/env bash
# End-to-end: `deepinfer encode-chat` (request file → V4.1 prompt text and ids) and
# `deepinfer parse-completion` (completion on stdin → reasoning, content, tool calls), including the
# exit status and message of invalid input. Ids are checked against `deepinfer tokenize` on the
# golden dev tokenizer.
# Usage: bash chat_cli.sh <deepinfer-binary> <repo>/tests
set -uo pipefail

DEEPINFER=$(realpath "$1")
TESTS=$(realpath "$2")
MODEL="$TESTS/data/golden_dev/model"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

passed=0
failed=0
ok() { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); echo "FAIL: $1"; }

# expect_out NAME EXPECTED ACTUAL
expect_out() { if [ "$2" == "$3" ]; then ok; else bad "$1"; echo "  expected: $2"; echo "  actual:   $3"; fi; }

# expect_error NAME MESSAGE-SUBSTRING COMMAND... (stdin from $STDIN_FILE if set)
expect_error() {
  local name=$1 msg=$2
  shift 2
  local rc=0
  "$@" < "${STDIN_FILE:-/dev/null}" > "$WORK/out" 2> "$WORK/err" || rc=$?
  if [ "$rc" -ne 1 ]; then bad "$name: exit status $rc, expected 1"; return; fi
  if ! grep -qF -- "$msg" "$WORK/err"; then bad "$name: stderr lacks '$msg'"; cat "$WORK/err"; return; fi
  ok
}

# --- encode-chat -----------------------------------------------------------------------------
cat > "$WORK/chat.json" <<'JSON'
{"model": "x", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi \"there\""}]}
JSON
expect_out "encode-chat text" \
  '{"text":"<｜begin▁of▁sentence｜><｜System｜>Be brief.<｜User｜>Hi \"there\"<｜Assistant｜></think>"}' \
  "$("$DEEPINFER" encode-chat --request "$WORK/chat.json")"

expect_out "encode-chat from stdin" \
  '{"text":"<｜begin▁of▁sentence｜><｜System｜>Reasoning Effort: 75 (range 1-100, the higher the value, the more thorough the reasoning)\n\n<｜User｜>q<｜Assistant｜><think>"}' \
  "$(echo '{"thinking": true, "reasoning_effort": "xhigh", "messages": [{"role": "user", "content": "q"}]}' |
     "$DEEPINFER" encode-chat --request -)"

out=$("$DEEPINFER" encode-chat --model "$MODEL" --request "$WORK/chat.json")
text=$(printf '%s' "$out" | sed -e 's/^{"text":"//' -e 's/","ids":.*$//' -e 's/\\"/"/g')
ids=$(printf '%s' "$out" | sed -e 's/^.*"ids":\[//' -e 's/\]}$//' | tr -d ' ')
want=$("$DEEPINFER" tokenize --model "$MODEL" --text "$text" | sed -e 's/^{"ids": \[//' -e 's/\]}$//' | tr -d ' ')
expect_out "encode-chat ids = tokenize(text)" "$want" "$ids"
case "$ids" in 0,*) ok ;; *) bad "encode-chat ids start with BOS (0): $ids" ;; esac

echo '{"messages": [{"role": "user", "content": "a"}, {"role": "foo", "content": "b"}]}' > "$WORK/bad_role.json"
expect_error "bad role" "messages[1].role: expected one of system, user, assistant, tool, developer, latest_reminder, got 'foo'" \
  "$DEEPINFER" encode-chat --request "$WORK/bad_role.json"
echo '{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}' > "$WORK/image.json"
expect_error "image" "image content is not supported" "$DEEPINFER" encode-chat --request "$WORK/image.json"
echo '{"reasoning_effort": "medium", "messages": [{"role": "user", "content": "a"}]}' > "$WORK/effort.json"
expect_error "bad effort" "reasoning_effort: expected" "$DEEPINFER" encode-chat --request "$WORK/effort.json"
echo '{"messages": [' > "$WORK/broken.json"
expect_error "broken JSON" "invalid JSON" "$DEEPINFER" encode-chat --request "$WORK/broken.json"
expect_error "missing file" "cannot open" "$DEEPINFER" encode-chat --request "$WORK/nope.json"

# --- parse-completion --------------------------------------------------------------------------
printf '%s' 'Need the weather.</think>Let me check.

<｜DSML｜ calls>
<｜DSML｜ invoke name="get_weather">
<｜DSML｜ parameter name="city" string="true">Paris</｜DSML｜ parameter>
<｜DSML｜ parameter name="days" string="false">3</｜DSML｜ parameter>
</｜DSML｜ invoke>
</｜DSML｜ calls><｜end▁of▁sentence｜>' > "$WORK/completion.txt"
expect_out "parse-completion tool call" \
  '{"reasoning_content":"Need the weather.","content":"Let me check.","tool_calls":[{"name":"get_weather","arguments":"{\"city\": \"Paris\", \"days\": 3}"}]}' \
  "$("$DEEPINFER" parse-completion --thinking true < "$WORK/completion.txt")"
expect_out "parse-completion chat" \
  '{"reasoning_content":"","content":"Hello.","tool_calls":[]}' \
  "$(printf 'Hello.<｜end▁of▁sentence｜>' | "$DEEPINFER" parse-completion --thinking false)"

printf 'x\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name="f">\n<｜DSML｜ parameter name="a" string="false">oops</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>' > "$WORK/malformed.txt"
STDIN_FILE="$WORK/malformed.txt" expect_error "malformed DSML" "malformed completion" \
  "$DEEPINFER" parse-completion --thinking false
STDIN_FILE="$WORK/malformed.txt" expect_error "bad --thinking" "--thinking: expected true or false" \
  "$DEEPINFER" parse-completion --thinking maybe

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
