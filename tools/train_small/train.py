#!/usr/bin/env python3
"""Trains brown-small (v41_model.TrainOps) on the tokenized Brown corpus, then its DSpark head, on one
GPU in a fixed wall-clock budget. Writes the float weights (split into files under 15 MB), metrics and
a log to --out.

Phase 1, the model: next-token cross-entropy on random 512-token windows (each starting with BOS),
bf16 autocast, AdamW, warmup + cosine over the time budget, dropout 0.1 on sublayer outputs; the
lightning indexers learn from a KL loss towards their layer's attention mass over the compressed rows
(inputs detached, as DeepSeek's DSA); the router biases follow the auxiliary-loss-free balancing rule
(bias += gamma * sign(mean load - load)); the last 25% of the time adds quantization-aware training
(straight-through fake quant of every FP8 / FP4 weight and GEMM input, as the export formats).

Phase 2, DSpark: the backbone is frozen; the draft stages learn to draft the model's own
continuations: paths the model generated from training-text prefixes (greedy and sampled at T = 1)
plus real training text, teacher-forced. Each anchor's 5 draft rows learn the frozen model's next-
token distributions along the path (soft cross-entropy, Markov head included); the confidence head
learns, by BCE, whether each row's greedy draft equals the model's greedy token.

Evaluation: held-out perplexity (the 25 held-out documents, 512-token windows starting with BOS, every
token scored once) in float and with fake quant; greedy DSpark acceptance on the model's own greedy
continuations of held-out prefixes.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import v41_model as M  # noqa: E402
from v41_io import Config  # noqa: E402

T0 = time.time()


def log(*a):
    print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)


def windows(ids, B, T, rng, bos):
    starts = rng.integers(0, len(ids) - T, size=B)
    y = np.stack([ids[s:s + T] for s in starts]).astype(np.int64)
    x = np.concatenate([np.full((B, 1), bos), y[:, :-1]], 1)
    return torch.from_numpy(x), torch.from_numpy(y)


def eval_chunks(val, T, bos):
    """Every held-out token once: chunks of T tokens, input = BOS + chunk[:-1]."""
    out = []
    for c in range(0, len(val), T):
        y = val[c:c + T].astype(np.int64)
        x = np.concatenate([[bos], y[:-1]])
        out.append((x, y))
    return out


@torch.no_grad()
def held_out_nll(ops, chunks, dev, autocast, batch=16, limit=None):
    ops.train(False)
    tot, n = 0.0, 0
    full = [c for c in chunks if len(c[1]) == len(chunks[0][1])]
    rest = [c for c in chunks if len(c[1]) != len(chunks[0][1])]
    groups = [full[i:i + batch] for i in range(0, len(full), batch)] + [[c] for c in rest]
    if limit:
        groups = groups[:limit]
    for g in groups:
        x = torch.from_numpy(np.stack([c[0] for c in g])).to(dev)
        y = torch.from_numpy(np.stack([c[1] for c in g])).to(dev)
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=autocast):
            logits, _, _ = M.forward(ops, x)
        tot += F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="sum").item()
        n += y.numel()
    return tot / n, n


def split_state(ops):
    """Float weights for export: big matrices in bf16, the F32 checkpoint tensors in fp32."""
    out = {}
    for k, p in ops.params.items():
        name = k.replace("~", ".")
        keep32 = name.endswith(("_fn", "_base", "_scale", "attn_sink", "gate.bias"))
        out[name] = p.detach().float().cpu() if keep32 else p.detach().to(torch.bfloat16).cpu()
    return out


def save_weights(state, out_dir, max_bytes=14 << 20):
    files, cur, size = [], {}, 0
    for k, v in state.items():
        nb = v.numel() * v.element_size()
        if cur and size + nb > max_bytes:
            files.append(cur)
            cur, size = {}, 0
        cur[k] = v
        size += nb
    files.append(cur)
    for i, f in enumerate(files):
        torch.save(f, os.path.join(out_dir, f"weights_{i}.pt"))
    return len(files)


@torch.no_grad()
def generate(ops, prefix, n_new, greedy, dev, autocast, gen):
    ops.train(False)
    ids = prefix
    for _ in range(n_new):
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=autocast):
            logits, _, _ = M.forward(ops, ids)
        last = logits[:, -1].float()
        nxt = last.argmax(-1) if greedy else torch.multinomial(torch.softmax(last, -1), 1, generator=gen).squeeze(-1)
        ids = torch.cat([ids, nxt.view(-1, 1)], 1)
    return ids


def dspark_batch(ops, cfg, ids, lo, A, dev, autocast, rng):
    """Target forward (frozen) + draft rows for A anchors per sequence with p in [lo, T - L - 1]."""
    B, T = ids.shape
    L = cfg.block_size
    with torch.no_grad(), torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=autocast):
        tlogits, taps, _ = M.forward(ops, ids, want_taps=True)
    hi = T - L - 1
    p = torch.from_numpy(rng.integers(lo, hi + 1, size=(B, A))).to(dev)
    b = torch.arange(B, device=dev).view(B, 1).expand(B, A)
    p, b = p.flatten(), b.flatten()
    rows = p.view(-1, 1) + 1 + torch.arange(L, device=dev).view(1, L)  # positions p+1 .. p+L
    target = tlogits[b.view(-1, 1), rows].float()  # [N, L, V]: distribution of the token after each row
    prev = ids[b.view(-1, 1), rows]  # Markov inputs (teacher-forced along the path)
    with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=autocast):
        ctx_kv = M.dspark_context(ops, taps.float())
        x, base = M.dspark_block_rows(ops, ctx_kv, b, p, ids[b, p + 1])
        e, mb = M.markov_bias(ops, prev)
        conf = M.confidence(ops, x, e)
    logits = base.float() + mb.float()
    return logits, conf.float(), target


def dspark_losses(logits, conf, target):
    kd = -(torch.softmax(target, -1) * torch.log_softmax(logits, -1)).sum(-1).mean()
    match = (logits.argmax(-1) == target.argmax(-1)).float()
    bce = F.binary_cross_entropy_with_logits(conf, match)
    return kd, bce, match


@torch.no_grad()
def greedy_acceptance(ops, cfg, paths, lo, dev, autocast, rng, A=32):
    """On greedy paths the model's greedy continuation after any anchor is the path itself, so the
    leading matches of the drafts (Markov-corrected, teacher-forced prev = the path) are exactly the
    tokens a greedy verifier accepts."""
    logits, conf, target = dspark_batch(ops, cfg, paths, lo, A, dev, autocast, rng)
    m = (logits.argmax(-1) == target.argmax(-1)).float()  # [N, L]
    accepted = torch.cumprod(m, -1).sum(-1)
    return accepted.mean().item(), m.mean(0).tolist()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="out/train_small")
    ap.add_argument("--out", default=os.environ.get("OUT", "out/train_small/run"))
    ap.add_argument("--main-seconds", type=float, default=250)
    ap.add_argument("--dspark-seconds", type=float, default=90)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--max-epochs", type=float, default=10)
    ap.add_argument("--qat-from", type=float, default=0.75)
    ap.add_argument("--paths", type=int, default=256, help="generated paths per mode (greedy, sampled)")
    ap.add_argument("--smoke", action="store_true", help="a narrow model and tiny budgets, to test the script")
    ap.add_argument("--cpu", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    dev = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    autocast = dev.type == "cuda"
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.manual_seed(1)
    rng = np.random.default_rng(1)
    gen = torch.Generator(device=dev).manual_seed(2)

    tc = json.load(open(os.path.join(args.data, "config.json")))["text_config"]
    if args.smoke:  # a narrow model with the same schedule, to test the script quickly on a CPU
        from v41_io import engram_layout
        tc = dict(tc, hidden_size=64, q_lora_rank=32, head_dim=64, qk_rope_head_dim=16, num_attention_heads=2,
                  o_lora_rank=32, index_n_heads=2, index_head_dim=32, moe_intermediate_size=32, sliding_window=16,
                  index_topk=8, candidate_topk_blocks=2, candidate_block_size=4, engram_vocab_size=100)
        tc["engram_num_embeddings"] = [sum(p) for p in engram_layout(
            tc["engram_layer_ids"], tc["engram_max_ngram_size"], tc["engram_n_heads"], tc["engram_vocab_size"],
            tc["engram_compressed_vocab_size"])[0]]
    cfg = Config(tc)
    json.dump(tc, open(os.path.join(args.out, "text_config.json"), "w"), indent=1)
    tmap = json.load(open(os.path.join(args.data, "engram_token_map.json")))["token_map"]
    train_ids = np.load(os.path.join(args.data, "train_ids.npy"))
    val_ids = np.load(os.path.join(args.data, "val_ids.npy"))
    log(f"device {dev} ({torch.cuda.get_device_name() if dev.type == 'cuda' else 'cpu'}), torch {torch.__version__}; "
        f"train {len(train_ids)} tokens, held-out {len(val_ids)}")

    ops = M.TrainOps(cfg, tmap, seed=1).to(dev)
    ops.drop = 0.1
    n_params = {k: sum(p.numel() for n, p in ops.params.items() if n.startswith("mtp~") == (k == "dspark")) for k in ("main", "dspark")}
    log(f"parameters: main {n_params['main'] / 1e6:.2f} M (Engram tables "
        f"{sum(p.numel() for n, p in ops.params.items() if 'engram~embed' in n) / 1e6:.2f} M), DSpark {n_params['dspark'] / 1e6:.2f} M")
    metrics = {"params": n_params, "device": str(dev), "torch": torch.__version__}

    T = args.seq
    chunks = eval_chunks(val_ids, T, cfg.bos)
    main_params = [p for n, p in ops.params.items() if not n.startswith("mtp~") and p.requires_grad]
    decay = [p for p in main_params if p.dim() >= 2]
    no_decay = [p for p in main_params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    steps_per_epoch = len(train_ids) / (args.batch * T)
    max_steps = int(args.max_epochs * steps_per_epoch)
    warmup = 20 if args.smoke else 150
    step, t_main = 0, time.time()
    tokens = 0
    last_log = time.time()
    while True:
        frac = max((time.time() - t_main) / args.main_seconds, step / max_steps)
        if frac >= 1:
            break
        if not ops.qat and frac >= args.qat_from:
            ops.qat = True
            log(f"step {step}: quantization-aware training on")
        lr = args.lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        ops.train(True)
        x, y = windows(train_ids, args.batch, T, rng, cfg.bos)
        x, y = x.to(dev), y.to(dev)
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=autocast):
            logits, _, ctx = M.forward(ops, x)
        ce = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        aux = sum(ctx["aux"]) if ctx["aux"] else torch.zeros((), device=dev)
        loss = ce + 0.1 * aux
        aux = aux.detach()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(main_params, 1.0)
        opt.step()
        with torch.no_grad():  # auxiliary-loss-free balancing of the routers
            for l, load in ops._load.items():
                bias = ops.router_bias(l)
                bias += 1e-3 * torch.sign(load.float().mean() - load.float())
        ops._load.clear()
        step += 1
        tokens += x.numel()
        if step % 25 == 0 or step == 1:
            dt = time.time() - last_log
            log(f"step {step} ep {step / steps_per_epoch:.2f} loss {ce.item():.4f} aux {aux.item():.4f} "
                f"gnorm {float(gnorm):.2f} lr {lr:.2e} tok/s {tokens / max(dt, 1e-9):.0f}")
            tokens, last_log = 0, time.time()
        if step % 400 == 0:
            vl, _ = held_out_nll(ops, chunks, dev, autocast, limit=4)
            log(f"step {step}: held-out loss (first 64 windows) {vl:.4f} ppl {math.exp(vl):.1f}")
    metrics["main_steps"] = step
    metrics["main_epochs"] = step / steps_per_epoch
    metrics["main_seconds"] = time.time() - t_main
    metrics["train_loss_last"] = ce.item()

    lim = 2 if args.smoke else None
    ops.qat = False
    nll_f, n_tok = held_out_nll(ops, chunks, dev, autocast, limit=lim)
    ops.qat = True
    nll_q, _ = held_out_nll(ops, chunks, dev, autocast, limit=lim)
    metrics["held_out"] = {"tokens": n_tok, "nll_float": nll_f, "ppl_float": math.exp(nll_f),
                           "nll_fake_quant": nll_q, "ppl_fake_quant": math.exp(nll_q)}
    log(f"held-out ({n_tok} tokens): float ppl {math.exp(nll_f):.2f}, fake-quant ppl {math.exp(nll_q):.2f}")
    n_files = save_weights(split_state(ops), args.out)
    log(f"saved the backbone ({n_files} files)")

    # ---- phase 2: DSpark --------------------------------------------------------------------------
    for n, p in ops.params.items():
        p.requires_grad_(n.startswith("mtp~") and not n.endswith("gate~bias"))
    d_params = [p for p in ops.params.values() if p.requires_grad]
    opt2 = torch.optim.AdamW(d_params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    L0, G = (48, 16) if args.smoke else (192, 64)
    n_paths = 4 if args.smoke else args.paths
    t_gen = time.time()
    pools = {}
    for mode in ("greedy", "sampled"):
        outs = []
        for i in range(0, n_paths, 128):
            x, _ = windows(train_ids, min(128, n_paths - i), L0, rng, cfg.bos)
            outs.append(generate(ops, x.to(dev), G, mode == "greedy", dev, autocast, gen))
        pools[mode] = torch.cat(outs)
    log(f"generated {n_paths} greedy + {n_paths} sampled paths of {G} tokens in {time.time() - t_gen:.1f}s")
    val_x = torch.from_numpy(np.stack([c[0][:L0] for c in chunks[:64 if not args.smoke else 4]])).to(dev)
    val_greedy = generate(ops, val_x, G, True, dev, autocast, gen)
    acc0, _ = greedy_acceptance(ops, cfg, val_greedy, L0 - 1, dev, autocast, rng)
    log(f"DSpark before training: greedy accepted drafts / step on held-out {acc0:.3f}")

    step2, t_d = 0, time.time()
    Bd, A = (2, 4) if args.smoke else (24, 48)
    while True:
        frac = (time.time() - t_d) / args.dspark_seconds
        if frac >= 1:
            break
        lr = args.lr * min(1.0, (step2 + 1) / 30) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt2.param_groups:
            g["lr"] = lr
        kind = step2 % 3
        if kind < 2:
            pool = pools["greedy" if kind == 0 else "sampled"]
            sel = torch.from_numpy(rng.integers(0, len(pool), size=Bd)).to(dev)
            ids, lo = pool[sel], L0 - 1
        else:
            ids, _ = windows(train_ids, Bd, L0 + G, rng, cfg.bos)
            ids, lo = ids.to(dev), 0
        ops.train(False)
        logits, conf, target = dspark_batch(ops, cfg, ids, lo, A, dev, autocast, rng)
        kd, bce, match = dspark_losses(logits, conf, target)
        loss = kd + 0.2 * bce
        opt2.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(d_params, 1.0)
        opt2.step()
        ops._load.clear()
        step2 += 1
        if step2 % 25 == 0 or step2 == 1:
            log(f"dspark step {step2} ({['greedy', 'sampled', 'text'][kind]}) kd {kd.item():.4f} bce {bce.item():.4f} "
                f"row match {[round(v, 3) for v in match.mean(0).tolist()]} lr {lr:.2e}")
    acc1, rows = greedy_acceptance(ops, cfg, val_greedy, L0 - 1, dev, autocast, rng)
    metrics["dspark"] = {"steps": step2, "seconds": time.time() - t_d, "greedy_accepted_before": acc0,
                         "greedy_accepted": acc1, "row_match": rows}
    log(f"DSpark after {step2} steps: greedy accepted drafts / step on held-out {acc1:.3f} "
        f"(mean acceptance length {acc1 + 1:.3f} tokens per target step), row match {[round(v, 3) for v in rows]}")
    n_files = save_weights(split_state(ops), args.out)
    metrics["weight_files"] = n_files
    metrics["total_seconds"] = time.time() - T0
    json.dump(metrics, open(os.path.join(args.out, "metrics.json"), "w"), indent=1)
    log(f"saved {n_files} weight files and metrics.json to {args.out}")


if __name__ == "__main__":
    main()
