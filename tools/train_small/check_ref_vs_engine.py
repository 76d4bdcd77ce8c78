#!/usr/bin/env python3
"""Checks the PyTorch reference forward (v41_model.RefOps) against the DeepInfer engine on any model
directory: logits of every position (engine: `deepinfer score --no-reference-quirks`, which makes
one-token decode equal a prefill) and the DSpark drafts after every step.

    python3 tools/train_small/check_ref_vs_engine.py --model tests/data/golden_dev/model \
        --deepinfer build/deepinfer --ids 0,5,9,...
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import v41_model as M  # noqa: E402
from v41_io import engram_token_map, load_config  # noqa: E402


def rel_l2(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--deepinfer", required=True)
    ap.add_argument("--ids", required=True, help="comma-separated token ids (first = prompt)")
    ap.add_argument("--prompt-len", type=int, default=1)
    args = ap.parse_args()
    ids = [int(v) for v in args.ids.split(",")]
    cfg = load_config(args.model)
    tmap = engram_token_map(os.path.join(args.model, "tokenizer.json"))[0] if cfg.engram_layers else None
    ops = M.RefOps(cfg, tmap, os.path.join(args.model, "model.safetensors"))
    with torch.no_grad():
        logits, taps, _ = M.forward(ops, torch.tensor([ids]), want_taps=cfg.n_mtp > 0)
    logits = logits[0].numpy()
    P = args.prompt_len
    with tempfile.TemporaryDirectory() as td:
        cmd = [args.deepinfer, "score", "--model", args.model, "--prompt-ids", ",".join(map(str, ids[:P])),
               "--out", f"{td}/l.f32"]
        if P < len(ids):  # one-token decode equals prefill only without the reference's decode quirks
            cmd += ["--forced-ids", ",".join(map(str, ids[P:])), "--no-reference-quirks"]
        if cfg.n_mtp and P < len(ids):
            cmd += ["--draft-out", f"{td}/d"]
        subprocess.run(cmd, check=True, stderr=subprocess.DEVNULL)
        eng = np.fromfile(f"{td}/l.f32", dtype=np.float32).reshape(-1, cfg.vocab_size)
        has_drafts = cfg.n_mtp and P < len(ids)
        drafts = json.load(open(f"{td}/d_draft_ids.json")) if has_drafts else []
        dlog = np.fromfile(f"{td}/d_draft_logits.f32", dtype=np.float32).reshape(-1, cfg.block_size, cfg.vocab_size) if has_drafts else None
    worst = 0.0
    for r in range(eng.shape[0]):
        e = rel_l2(logits[P - 1 + r], eng[r])
        worst = max(worst, e)
        print(f"row {r:3d} pos {P - 1 + r:3d}: rel L2 {e:.2e}  argmax ref {logits[P - 1 + r].argmax()} engine {eng[r].argmax()}")
    print(f"logits: worst rel L2 {worst:.3e} over {eng.shape[0]} rows")
    if drafts:
        ctx_kv = M.dspark_context(ops, taps)
        dworst = 0.0
        for k, d in enumerate(drafts):
            p = P + k
            with torch.no_grad():
                rid, rlog, _ = M.dspark_draft(ops, ctx_kv, 0, p, d[0])
            e = rel_l2(rlog.numpy(), dlog[k])
            dworst = max(dworst, e)
            print(f"draft {k:3d} p {p}: rel L2 {e:.2e} ids ref {rid} engine {d}")
        print(f"drafts: worst rel L2 {dworst:.3e} over {len(drafts)} steps")


if __name__ == "__main__":
    main()
