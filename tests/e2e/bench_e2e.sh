#!/usr/bin/env bash
# End-to-end: `deepinfer bench --json` on the CPU backend, with the golden dev model and with a tiny
# synthetic checkpoint: every JSON line parses, every measurement kind is there with its fields, the
# numbers are finite and plausible (times > 0, bytes and FLOPs > 0 where work was done), every layer
# and layer kind of the schedule is reported, and bad option combinations fail with a message.
# Usage: bash bench_e2e.sh <deepinfer-binary> <repo>/tests
set -uo pipefail

DEEPINFER=$(realpath "$1")
TESTS=$(realpath "$2")
MODEL="$TESTS/data/golden_dev/model"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
SEED=${DI_TEST_SEED:-$(( (RANDOM << 15) | RANDOM ))}
echo "seed $SEED (replay with DI_TEST_SEED=$SEED)"

passed=0
failed=0
ok() { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); echo "FAIL: $1"; }

expect_error() {
  local name=$1 msg=$2
  shift 2
  local rc=0
  "$@" > "$WORK/out" 2> "$WORK/err" || rc=$?
  if [ "$rc" -ne 1 ]; then bad "$name: exit status $rc, expected 1"; return; fi
  if ! grep -qF -- "$msg" "$WORK/err"; then bad "$name: stderr lacks '$msg'"; cat "$WORK/err"; return; fi
  ok
}

# check_records NAME FILE N_LAYERS "BATCHES" "KINDS": the JSON lines of FILE
check_records() {
  local name=$1 file=$2 n_layers=$3 batches=$4 kinds=$5
  if python3 - "$file" "$n_layers" "$batches" "$kinds" <<'PY'; then ok; else bad "$name"; fi
import json, math, sys
path, n_layers, batches, kinds = sys.argv[1], int(sys.argv[2]), [int(b) for b in sys.argv[3].split(",")], sys.argv[4].split(",")
recs = []
for line in open(path):
    if line.startswith("{"):
        recs.append(json.loads(line))  # every JSON line must parse
errors = []
def need(r, *fields):
    for f in fields:
        if f not in r:
            errors.append(f"{r['kind']} record lacks '{f}': {r}")
        elif isinstance(r[f], float) and not math.isfinite(r[f]):
            errors.append(f"{r['kind']} record has non-finite '{f}': {r}")
by = {}
for r in recs:
    by.setdefault(r.get("kind"), []).append(r)
for k in ["ceiling", "memory", "decode", "prefill", "layer", "op", "profile"]:
    if not by.get(k):
        errors.append(f"no '{k}' records")
ceil = {r["name"]: r for r in by.get("ceiling", [])}
if set(ceil) != {"copy", "gemm_bf16", "gemm_fp8"} or not ceil["copy"]["tb_s"] > 0:
    errors.append(f"ceilings: {ceil}")
decode = by.get("decode", [])
if sorted(r["batch"] for r in decode) != sorted(batches):
    errors.append(f"decode batches {[r['batch'] for r in decode]} != {batches}")
for r in decode:
    need(r, "context", "batch", "step_ms", "tok_s", "bytes", "flops", "tb_s", "tflop_s", "floor_us", "efficiency")
    if not (r["step_ms"] > 0 and r["tok_s"] > 0 and r["bytes"] > 0 and r["flops"] > 0):
        errors.append(f"implausible decode record {r}")
    if abs(r["tok_s"] - r["batch"] / (r["step_ms"] / 1e3)) > 0.01 * r["tok_s"]:
        errors.append(f"tok_s disagrees with step_ms: {r}")
for r in by.get("prefill", []):
    need(r, "tokens", "chunk", "time_ms", "tok_s", "bytes", "flops", "tb_s", "tflop_s")
    if not (r["time_ms"] > 0 and r["flops"] > 0):
        errors.append(f"implausible prefill record {r}")
want_layers = {str(i) for i in range(n_layers)} | {"embed", "head"}
passes = {(r["phase"], r["context"], r["batch"]) for r in by.get("layer", [])}
if not any(p[0] == "prefill" for p in passes) or not any(p[0] == "decode" for p in passes):
    errors.append(f"layer records only for {passes}")
for p in passes:
    rows = [r for r in by["layer"] if (r["phase"], r["context"], r["batch"]) == p]
    got = {r["layer"] for r in rows}
    if got != want_layers:
        errors.append(f"{p}: layers {sorted(got)} != {sorted(want_layers)}")
    for r in rows:
        need(r, "layer_kind", "time_us", "bytes", "flops", "tb_s", "tflop_s", "floor_us", "efficiency")
        if r["layer"] not in ("embed",) and not (r["time_us"] > 0 and r["bytes"] > 0):
            errors.append(f"implausible layer record {r}")
    found = {r["layer_kind"] for r in rows}
    for k in kinds:
        if k and k not in found:
            errors.append(f"{p}: no layer of kind '{k}' (have {sorted(found)})")
ops = by.get("op", [])
for r in ops:
    need(r, "layer", "layer_kind", "op", "calls", "time_us", "host_us", "bytes", "flops", "tb_s", "tflop_s", "efficiency")
    if r["calls"] < 1 or r["time_us"] < 0:
        errors.append(f"implausible op record {r}")
names = {r["op"] for r in ops}
for op in ["moe_experts", "sparse_attention", "hc_mixes", "rmsnorm"]:
    if op not in names:
        errors.append(f"no '{op}' op record")
if not any(n.startswith("linear fp8") for n in names):
    errors.append("no FP8 linear op record")
# the op-synced sum of a profiled decode step covers the layers' ops: within 2x of the plain step or more
for r in by.get("profile", []):
    need(r, "sum_op_ms")
for r in by.get("memory", []):
    need(r, "phase", "weights_bytes", "cache_bytes", "workspace_peak_bytes")
    if r["weights_bytes"] <= 0:
        errors.append(f"memory record without weights {r}")
    if r["phase"] == "decode" and r["cache_bytes"] <= 0:
        errors.append(f"decode memory record without caches {r}")
for e in errors[:20]:
    print("  " + e)
sys.exit(1 if errors else 0)
PY
}

# --- golden dev model -------------------------------------------------------------------------------
if "$DEEPINFER" bench --model "$MODEL" --device cpu --batch 1,2 --context 64 --prefill 32 --prefill-chunk 16 \
    --iters 2 --seed "$SEED" --json > "$WORK/dev.txt" 2> "$WORK/dev.err"; then
  ok
  check_records "golden dev model records" "$WORK/dev.txt" 7 "1,2" "SWA,SWA+Engram,r2 Full+Engram,r2 Reuse,r1 Full+cand,r1 Reuse,r1 Reindex"
  grep -q "^decode steps" "$WORK/dev.txt" && grep -q "^layers, decode, context 64, batch 1" "$WORK/dev.txt" && ok ||
    bad "golden dev model: tables missing"
else
  bad "bench on the golden dev model failed"; cat "$WORK/dev.err"
fi

# --- synthetic checkpoint (every layer kind of the released schedule) --------------------------------
if "$DEEPINFER" bench --synthetic v41-tiny --layers 8 --device cpu --batch 1,3 --context 200 --prefill 48 \
    --prefill-chunk 32 --iters 1 --seed "$SEED" --json > "$WORK/syn.txt" 2> "$WORK/syn.err"; then
  ok
  check_records "synthetic records" "$WORK/syn.txt" 8 "1,3" "SWA,SWA+Engram,r2 Full,r2 Reuse,r1 Full+cand,r1 Reuse,r1 Reindex"
  grep -q "40-layer step projected" "$WORK/syn.txt" && ok || bad "synthetic: no 40-layer projection"
else
  bad "bench on a synthetic checkpoint failed"; cat "$WORK/syn.err"
fi

# --- errors -------------------------------------------------------------------------------------------
expect_error "model and synthetic" "exactly one of --model" "$DEEPINFER" bench --model "$MODEL" --synthetic v41-tiny
expect_error "unknown preset" "unknown preset 'v5'" "$DEEPINFER" bench --synthetic v5 --device cpu --no-ceilings
expect_error "too many layers" "--layers: expected 1..40" "$DEEPINFER" bench --synthetic v41-tiny --layers 41 --no-ceilings
expect_error "context too long" "exceeds the model's max_position_embeddings" \
  "$DEEPINFER" bench --model "$MODEL" --context 4096 --no-ceilings
expect_error "bad batch" "--batch" "$DEEPINFER" bench --model "$MODEL" --batch 0 --no-ceilings

echo "bench_e2e: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
