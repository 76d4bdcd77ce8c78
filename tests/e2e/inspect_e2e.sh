#!/usr/bin/env bash
# `deepinfer inspect` on the golden checkpoint (must pass) and on corrupted copies (must exit 1
# with a message on stderr that names the problem); `deepinfer write-checkpoint` round trip.
# Usage: inspect_e2e.sh <deepinfer-binary> <repo>/tests
set -uo pipefail
BIN="$1"
TESTS="$2"
GOLDEN="$TESTS/data/golden_dev/model"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
fails=0

# Fresh copy of the golden model (config + checkpoint) in $WORK/$1.
fresh() {
  rm -rf "$WORK/$1"
  mkdir -p "$WORK/$1/inference"
  cp "$GOLDEN/config.json" "$GOLDEN/model.safetensors" "$WORK/$1/"
  cp "$GOLDEN/inference/config.json" "$WORK/$1/inference/"
}

# expect_ok NAME ARGS...: exit 0 and "ok:" on stdout.
expect_ok() {
  local name="$1"; shift
  if "$BIN" "$@" >"$WORK/out" 2>"$WORK/err" && grep -q "$OK_PATTERN" "$WORK/out"; then
    echo "PASS $name"
  else
    echo "FAIL $name: expected success"; cat "$WORK/out" "$WORK/err"; fails=$((fails + 1))
  fi
}

# expect_fail NAME NEEDLE ARGS...: exit status 1, NEEDLE (fixed string) on stderr.
expect_fail() {
  local name="$1" needle="$2"; shift 2
  "$BIN" "$@" >"$WORK/out" 2>"$WORK/err"
  local rc=$?
  if [[ $rc -eq 1 ]] && grep -qF -- "$needle" "$WORK/err"; then
    echo "PASS $name"
  else
    echo "FAIL $name: rc=$rc, expected 1 and stderr containing: $needle"; cat "$WORK/err"; fails=$((fails + 1))
  fi
}

OK_PATTERN="^ok: checkpoint matches the config"
expect_ok "golden" inspect --model "$GOLDEN"
grep -q "reindex  kv L4   index L6" "$WORK/out" || { echo "FAIL golden schedule line"; fails=$((fails + 1)); }
grep -q "tensors: 738" "$WORK/out" || { echo "FAIL golden tensor count"; fails=$((fails + 1)); }
expect_ok "golden --allow-unexpected" inspect --model "$GOLDEN" --allow-unexpected

# Checkpoint corruptions.
SIZE=$(stat -c %s "$GOLDEN/model.safetensors")
fresh trunc; head -c $((SIZE / 2)) "$GOLDEN/model.safetensors" >"$WORK/trunc/model.safetensors"
expect_fail "truncated file" "past the data section of" inspect --model "$WORK/trunc"
fresh tiny; head -c 5 "$GOLDEN/model.safetensors" >"$WORK/tiny/model.safetensors"
expect_fail "5-byte file" "shorter than the 8-byte header length" inspect --model "$WORK/tiny"
fresh hdrlen; { printf '\xff\xff\xff\x00\x00\x00\x00\x00'; tail -c +9 "$GOLDEN/model.safetensors"; } >"$WORK/hdrlen/model.safetensors"
expect_fail "header length past end" "header length" inspect --model "$WORK/hdrlen"
fresh badjson; { head -c 8 "$GOLDEN/model.safetensors"; printf 'X'; tail -c +10 "$GOLDEN/model.safetensors"; } >"$WORK/badjson/model.safetensors"
expect_fail "bad header JSON" "header is not valid JSON" inspect --model "$WORK/badjson"
# Renaming a tensor in place (same length) removes it and adds an unknown one.
fresh removed; LC_ALL=C sed -i 's/"layers\.3\.attn\.wq_a\.weight"/"layers.3.attn.wq_a.weighX"/' "$WORK/removed/model.safetensors"
expect_fail "tensor removed" "missing tensor 'layers.3.attn.wq_a.weight' (expected F8_E4M3 [64, 256])" inspect --model "$WORK/removed"
expect_fail "tensor removed, unexpected allowed" "missing tensor 'layers.3.attn.wq_a.weight'" inspect --model "$WORK/removed" --allow-unexpected
expect_fail "unexpected tensor" "unexpected tensor 'layers.3.attn.wq_a.weighX'" inspect --model "$WORK/removed"
# Same-length dtype swap (F8_E4M3 -> F8_E8M0, both 1 byte): the header stays valid.
fresh dtype; LC_ALL=C sed -i 's/"layers\.0\.attn\.wkv\.weight":{"dtype":"F8_E4M3"/"layers.0.attn.wkv.weight":{"dtype":"F8_E8M0"/; s/"layers\.0\.attn\.wkv\.weight": {"dtype": "F8_E4M3"/"layers.0.attn.wkv.weight": {"dtype": "F8_E8M0"/' "$WORK/dtype/model.safetensors"
if cmp -s "$WORK/dtype/model.safetensors" "$GOLDEN/model.safetensors"; then
  echo "SKIP wrong dtype (header layout not matched)"
else
  expect_fail "wrong dtype" "is F8_E8M0 [64, 256], expected F8_E4M3 [64, 256]" inspect --model "$WORK/dtype"
fi
rm -rf "$WORK/none"; mkdir -p "$WORK/none"; cp -r "$GOLDEN/config.json" "$GOLDEN/inference" "$WORK/none/"
expect_fail "no checkpoint files" "no model.safetensors" inspect --model "$WORK/none"

# Config corruptions.
fresh nofield; sed -i 's/"hidden_size": 256,//' "$WORK/nofield/config.json"
expect_fail "config field removed" "missing field 'text_config.hidden_size'" inspect --model "$WORK/nofield"
fresh wrongtype; sed -i 's/"num_hidden_layers": 7/"num_hidden_layers": "7"/' "$WORK/wrongtype/config.json"
expect_fail "config field wrong type" "field 'text_config.num_hidden_layers' = \"7\"" inspect --model "$WORK/wrongtype"
fresh disagree; sed -i 's/"dim": 256/"dim": 512/' "$WORK/disagree/inference/config.json"
expect_fail "inference config disagrees" "'dim' = 512" inspect --model "$WORK/disagree"
fresh badcfgjson; printf '{"architectures": [' >"$WORK/badcfgjson/config.json"
expect_fail "config not JSON" "config.json: not valid JSON" inspect --model "$WORK/badcfgjson"
fresh ratio; sed -i 's/"candidate_source_layer_id": 4/"candidate_source_layer_id": 6/' "$WORK/ratio/config.json"
sed -i 's/"candidate_source_layer": 4/"candidate_source_layer": 6/' "$WORK/ratio/inference/config.json"
expect_fail "candidate source not Full" "candidate_source_layer_id" inspect --model "$WORK/ratio"
expect_fail "missing directory" "no config.json" inspect --model "$WORK/does-not-exist"

# Config-only inspection of the full V4.1-Flash config: spec §6.1 / §3.1 numbers.
OK_PATTERN="tensors implied by the config"
expect_ok "flash config-only" inspect --model "$TESTS/data/configs/v41_flash" --config-only
grep -q "890.0 B/token" "$WORK/out" || { echo "FAIL flash global KV bytes/token"; fails=$((fails + 1)); }
grep -q "engram tables      202" "$WORK/out" || { echo "FAIL flash engram table bytes"; grep engram "$WORK/out"; fails=$((fails + 1)); }

# write-checkpoint: random checkpoint for the golden config, sharded, then inspected.
OK_PATTERN="validated"
expect_ok "write-checkpoint sharded" write-checkpoint --config "$GOLDEN" --out "$WORK/written" --seed 7 --shard-bytes 1000000
[[ -f "$WORK/written/model.safetensors.index.json" ]] || { echo "FAIL no index.json"; fails=$((fails + 1)); }
OK_PATTERN="^ok: checkpoint matches the config"
expect_ok "inspect written checkpoint" inspect --model "$WORK/written"
rm "$WORK/written/$(ls "$WORK/written" | grep -m1 'of-.*safetensors$')"
expect_fail "written checkpoint, shard deleted" "does not exist" inspect --model "$WORK/written"
OK_PATTERN="validated"
expect_ok "write-checkpoint from config file" write-checkpoint --config "$GOLDEN/config.json" --out "$WORK/written1"
expect_fail "write-checkpoint bad config" "missing field 'text_config.hidden_size'" write-checkpoint --config "$WORK/nofield" --out "$WORK/w2"

if [[ $fails -ne 0 ]]; then
  echo "$fails failure(s)"
  exit 1
fi
echo "all inspect e2e checks passed"
