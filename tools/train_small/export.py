#!/usr/bin/env python3
"""Exports trained float weights (train.py's weights_*.pt) to a DeepInfer / DeepSeek-V4.1 model
directory in the released formats, and writes the engine test's reference data.

Formats (spec §4.1): attention, shared-expert, indexer-query, Engram-projection and DSpark main_proj
matrices FP8 e4m3 with one UE8M0 scale per 32x32 block (s = 2^ceil(log2(amax / 448)));
routed experts MXFP4 (E2M1 pairs in I8, even column in the low nibble, one UE8M0 scale per row per
32 inputs, s = 2^ceil(log2(amax / 6))); Engram tables FP8 rows with one UE8M0 scale per 32 columns;
norms, embedding, head, router weights, compressor / indexer-key projections, Markov and confidence
heads bf16; mHC, attention sinks and router biases f32.

    python3 tools/train_small/export.py --weights RUN_DIR --data out/train_small --out models/brown-small \
        [--test-data tests/data/brown_small]

--test-data: fixed prompts run through v41_model.RefOps (this checkpoint, the engine's CPU numerics
and quantization points) -> reference.json + fp16 logits rows and DSpark drafts for
tests/golden/brown_small_test.cpp.
"""
import argparse
import glob
import json
import os
import shutil
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import v41_model as M  # noqa: E402
import v41_quant as Q  # noqa: E402
from brown_config import write_configs  # noqa: E402
from v41_io import Config, bf16_bits, tensor_specs, write_safetensors  # noqa: E402

# Fixed prompts of the engine test: the first is held-out Brown text (long enough that the sliding
# window, the top-k selections and the candidate blocks all restrict), the others short phrases.
TEST_PROMPTS = [None, "The jury said that the city", "She looked at him for a long moment and then"]


def load_weights(run_dir):
    state = {}
    for f in sorted(glob.glob(os.path.join(run_dir, "weights_*.pt"))):
        state.update(torch.load(f, map_location="cpu"))
    return {k: v.float() for k, v in state.items()}


def quantize(cfg, state):
    out = []
    for name, fmt, shape in tensor_specs(cfg):
        if fmt == "fp4":
            stem, e, w = name.rsplit(".", 3)[0], int(name.split(".")[-3]), name.split(".")[-2]
            full = state[f"{stem}.{w}"][e]
            vals, k = Q.fp4_row_weight(full)
            out.append((name, "I8", Q.pack_e2m1(Q.e2m1_codes(vals)).numpy()))
            out.append((name.replace(".weight", ".scale"), "F8_E8M0", (k + 127).to(torch.uint8).numpy()))
            continue
        t = state[name]
        assert list(t.shape) == shape, (name, list(t.shape), shape)
        if fmt == "fp8":
            vals, k = Q.fp8_block_weight(t)
        elif fmt == "fp8row":
            vals, k = Q.fp8_row_weight(t)
        if fmt in ("fp8", "fp8row"):
            out.append((name, "F8_E4M3", Q.e4m3_codes(vals).numpy()))
            out.append((name.replace(".weight", ".scale"), "F8_E8M0", (k + 127).to(torch.uint8).numpy()))
        elif fmt == "bf16":
            out.append((name, "BF16", bf16_bits(t)))
        else:
            out.append((name, "F32", t.float().numpy()))
    return out


def bpe_encode(data_dir, text):
    from train_bpe import Bpe
    tok = json.load(open(os.path.join(data_dir, "tokenizer.json")))
    bpe = Bpe(tok["model"]["vocab"], [tuple(m) for m in tok["model"]["merges"]])
    return bpe.encode(text)


def write_test_data(model_dir, data_dir, out_dir):
    cfg = Config(json.load(open(os.path.join(model_dir, "config.json")))["text_config"])
    tmap = json.load(open(os.path.join(data_dir, "engram_token_map.json")))["token_map"]
    ops = M.RefOps(cfg, tmap, os.path.join(model_dir, "model.safetensors"))
    val = np.load(os.path.join(data_dir, "val_ids.npy")).astype(np.int64)
    starts = json.load(open(os.path.join(data_dir, "val_docs.json")))["starts"]
    os.makedirs(out_dir, exist_ok=True)
    ref = {"model": "models/brown-small", "vocab_size": cfg.vocab_size, "block_size": cfg.block_size,
           "made_by": "tools/train_small/export.py (v41_model.RefOps on the exported checkpoint)",
           "logits": "float16 little-endian [rows, vocab], the prefill logits at `positions`",
           "drafts": "float16 [block, vocab] Markov-corrected draft logits after the prefill seeded "
                     "positions 0..p, anchor = the prompt token at p + 1", "prompts": []}
    for i, text in enumerate(TEST_PROMPTS):
        if text is None:
            ids = [cfg.bos] + val[starts[3]:starts[3] + 179].tolist()
        else:
            ids = [cfg.bos] + bpe_encode(data_dir, text)
        T = len(ids)
        with torch.no_grad():
            logits, taps, _ = M.forward(ops, torch.tensor([ids]), want_taps=True)
        positions = sorted(set(list(range(0, T, max(1, T // 12))) + [T - 2, T - 1]))
        rows = logits[0, positions].numpy().astype(np.float16)
        lf = f"p{i}_logits.f16"
        rows.tofile(os.path.join(out_dir, lf))
        entry = {"ids": ids, "positions": positions, "logits_file": lf, "text": text}
        if T > 60:  # DSpark drafts at two anchors inside the prompt
            ctx_kv = M.dspark_context(ops, taps)
            entry["drafts"] = []
            for k, p in enumerate((T // 2, T - 2)):
                with torch.no_grad():
                    d_ids, d_logits, d_conf = M.dspark_draft(ops, ctx_kv, 0, p, ids[p + 1])
                df = f"p{i}_draft{k}.f16"
                d_logits.numpy().astype(np.float16).tofile(os.path.join(out_dir, df))
                entry["drafts"].append({"p": p, "anchor": ids[p + 1], "ids": d_ids, "logits_file": df,
                                        "confidence": d_conf.tolist()})
        ref["prompts"].append(entry)
        print(f"test prompt {i}: {T} tokens, {len(positions)} rows")
    json.dump(ref, open(os.path.join(out_dir, "reference.json"), "w"), indent=1)
    json.dump({"token_map": tmap, "compressed_vocab_size": cfg.engram_cvocab},
              open(os.path.join(out_dir, "engram_token_map.json"), "w"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", required=True, help="directory with train.py's weights_*.pt")
    ap.add_argument("--data", default="out/train_small")
    ap.add_argument("--out", default="models/brown-small")
    ap.add_argument("--test-data", default=None)
    args = ap.parse_args()
    tc_path = os.path.join(args.weights, "text_config.json")  # the config the run trained
    tc = json.load(open(tc_path)) if os.path.exists(tc_path) else \
        json.load(open(os.path.join(args.data, "config.json")))["text_config"]
    cfg = Config(tc)
    state = load_weights(args.weights)
    os.makedirs(os.path.join(args.out, "inference"), exist_ok=True)
    write_safetensors(os.path.join(args.out, "model.safetensors"), quantize(cfg, state))
    write_configs(tc, args.out)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(args.data, f), os.path.join(args.out, f))
    print(f"wrote {args.out}: model.safetensors {os.path.getsize(os.path.join(args.out, 'model.safetensors')) / 1e6:.2f} MB")
    if args.test_data:
        write_test_data(args.out, args.data, args.test_data)


if __name__ == "__main__":
    main()
