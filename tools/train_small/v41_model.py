"""The DeepSeek-V4.1 forward in PyTorch, written once over two sets of ops:

- TrainOps: float master weights (nn.Parameters), bf16 autocast GEMMs, dense masked attention,
  dense MoE; optional quantization-aware training (straight-through fake quant at the points of
  spec §2.8 and of the checkpoint formats). Used by train.py on the GPU.
- RefOps: the exported checkpoint (FP8 32x32, MXFP4 experts, FP8 Engram tables, bf16, f32) with
  DeepInfer's CPU numerics (src/backend/cpu): FP8 activation quantization and 32-wide block
  accumulation in every FP8/FP4 GEMM, bf16 rounding wherever the engine rounds, the online softmax
  over blocks of 64 keys with bf16 probabilities, torch top-k. Batch 1, prefill from position 0.
  Used by export.py to write the reference logits of the engine test and to measure perplexity and
  DSpark acceptance of the exported model.

The control flow mirrors src/model/model.cpp and attention.cpp: embedding on 4 streams, single-pass
mHC, Engram before its blocks, CSA2 compressed attention (Full / Reindex / Reuse, two-level
candidates), sqrt-softplus MoE, final collapse with the last FFN-site pre, fp32 head; DSpark: feature
taps -> main_proj -> 3 stages over a window of context KV + the draft block -> Markov + confidence.
"""
import ctypes
import ctypes.util
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import v41_quant as Q
from v41_io import engram_hash, engram_layout, rope_freqs, tensor_specs, read_safetensors, bf16_from_bits

NEG_INF = float("-inf")


def f32_inv_sqrt(n):
    """1.0f / std::sqrt(float(n)), in fp32 as the engine computes it."""
    return float(np.float32(1.0) / np.sqrt(np.float32(n)))


def expert_key(prefix, w):
    """Stacked routed-expert tensor name used by both op sets ([E, out, in])."""
    return f"{prefix}ffn.experts.{w}"


# ==================================================================================================
# shared pieces
# ==================================================================================================

class Common:
    def __init__(self, cfg, token_map):
        self.cfg = cfg
        self.freqs = [rope_freqs(cfg, ls) for ls in cfg.layers]
        self.token_map = torch.tensor(token_map, dtype=torch.int64) if token_map is not None else None
        if cfg.engram_layers:
            self.eng_primes, self.eng_offsets, self.eng_mults = engram_layout(
                cfg.engram_layers, cfg.engram_max_ngram, cfg.engram_heads, cfg.engram_vocab, cfg.engram_cvocab)
            self.eng_pad = int(self.token_map[cfg.engram_pad_id])

    def engram_cols(self, ids):
        if self.token_map.device != ids.device:
            self.token_map = self.token_map.to(ids.device)
        tm = self.token_map
        return engram_hash(ids, tm, self.eng_pad, self.eng_primes, self.eng_offsets, self.eng_mults,
                           self.cfg.engram_max_ngram, self.cfg.engram_heads)


def rope(ops, x, pos, freqs, inverse=False):
    """Interleaved pairs of the trailing rope dims of x [..., heads, dim]; pos broadcast to x[..., 0, 0]."""
    rd = freqs.numel() * 2
    ang = pos.to(torch.float32).unsqueeze(-1) * freqs.to(x.device)  # [..., rd/2] fp32, as torch.outer
    c, s = ops.cos(ang), ops.sin(ang)
    if inverse:
        s = -s
    c, s = c.unsqueeze(-2), s.unsqueeze(-2)  # broadcast over heads
    head, tail = x[..., :-rd], x[..., -rd:]
    a, b = tail[..., 0::2].float(), tail[..., 1::2].float()
    ra = ops.rb(a * c - b * s)
    rbv = ops.rb(a * s + b * c)
    tail = torch.stack([ra, rbv], -1).flatten(-2)
    return torch.cat([head.to(tail.dtype), tail], -1)


def hc_mixes(ops, h, p, site):
    """h [..., hc, D] -> [..., (2+hc)*hc] pre | post | comb (rows = input stream)."""
    cfg = ops.cfg
    hc = cfg.hc
    x = h.flatten(-2).float()
    fn, base, scale = ops.w(p + f"hc_{site}_fn"), ops.w(p + f"hc_{site}_base"), ops.w(p + f"hc_{site}_scale")
    rs = 1.0 / torch.sqrt(ops.mean_sq(x) + cfg.eps)
    m = ops.f32_mm(x, fn) * rs.unsqueeze(-1)
    pre = ops.sigmoid(m[..., :hc] * scale[0] + base[:hc]) + cfg.hc_eps
    post = 2.0 * ops.sigmoid(m[..., hc:2 * hc] * scale[1] + base[hc:2 * hc])
    comb = (m[..., 2 * hc:] * scale[2] + base[2 * hc:]).unflatten(-1, (hc, hc))
    comb = ops.softmax_last(comb) + cfg.hc_eps
    comb = comb / (ops.small_sum(comb, -2) + cfg.hc_eps)
    for _ in range(cfg.sinkhorn_iters - 1):
        comb = comb / (ops.small_sum(comb, -1) + cfg.hc_eps)
        comb = comb / (ops.small_sum(comb, -2) + cfg.hc_eps)
    return torch.cat([pre, post, comb.flatten(-2)], -1)


def hc_pre(ops, h, mix):
    hc = ops.cfg.hc
    if not ops.exact:
        return torch.einsum("...k,...kd->...d", mix[..., :hc].to(h.dtype), h)
    acc = mix[..., 0:1] * h[..., 0, :].float()
    for k in range(1, hc):
        acc = acc + mix[..., k:k + 1] * h[..., k, :].float()
    return ops.rb(acc)


def hc_post(ops, y, res, mix):
    hc = ops.cfg.hc
    post, comb = mix[..., hc:2 * hc], mix[..., 2 * hc:].unflatten(-1, (hc, hc))
    if not ops.exact:
        return post.unsqueeze(-1) * y.float().unsqueeze(-2) + torch.einsum("...jk,...jd->...kd", comb, res.float())
    outs = []
    for k in range(hc):
        acc = comb[..., 0, k:k + 1] * res[..., 0, :].float()
        for j in range(1, hc):
            acc = acc + comb[..., j, k:k + 1] * res[..., j, :].float()
        outs.append(ops.rb(post[..., k:k + 1] * y.float() + acc))
    return torch.stack(outs, -2)


def stream_mean(ops, h):
    if not ops.exact:
        return h.float().mean(-2)
    acc = h[..., 0, :].float()
    for k in range(1, ops.cfg.hc):
        acc = acc + h[..., k, :].float()
    return ops.rb(acc / float(ops.cfg.hc))


def engram(ops, layer, h, cols):
    cfg = ops.cfg
    p = cfg.prefix(layer)
    rows = ops.engram_rows(cols, p + "engram.embed.weight")  # [..., ncols*hd]
    kv = ops.fp8_linear(rows, p + "engram.wkv.weight").float()
    D, hc = cfg.dim, cfg.hc
    key = kv[..., :hc * D].unflatten(-1, (hc, D))
    val = kv[..., hc * D:].unsqueeze(-2)
    wgt = ops.w(p + "engram.q_weight").float() * ops.w(p + "engram.k_weight").float()
    hf = h.float()
    hh = ops.mean_sq(hf)
    kk = ops.mean_sq(key)
    rstd = (1.0 / torch.sqrt(hh + cfg.eps)) * (1.0 / torch.sqrt(kk + cfg.eps))
    dot = ops.seq_dot(hf * wgt, key) * rstd * f32_inv_sqrt(D)
    mag = torch.sqrt(torch.clamp(dot.abs(), min=1e-6))
    gate = ops.sigmoid(torch.where(dot < 0, -mag, mag))
    return ops.rb(hf + gate.unsqueeze(-1) * val)


def block(ops, layer, h, pre, attn_fn):
    p = ops.cfg.prefix(layer)
    a_mix = hc_mixes(ops, h, p, "attn")
    x = ops.rmsnorm(hc_pre(ops, h, pre), p + "attn_norm.weight")
    y = ops.dropout(attn_fn(x))
    h1 = hc_post(ops, y, h, a_mix)
    f_mix = hc_mixes(ops, h1, p, "ffn")
    x = ops.rmsnorm(hc_pre(ops, h1, a_mix), p + "ffn_norm.weight")
    y = ops.dropout(ops.moe(x, layer))
    return hc_post(ops, y, h1, f_mix), f_mix


def attention_output(ops, layer, o, pos):
    cfg = ops.cfg
    p = cfg.prefix(layer)
    o = rope(ops, o, pos, ops.freqs[layer], inverse=True)  # [..., H, Dh]
    z = ops.grouped_linear(o.flatten(-2), p + "attn.wo_a.weight", cfg.o_groups)
    return ops.fp8_linear(z, p + "attn.wo_b.weight")


def qkv(ops, layer, x, pos):
    cfg = ops.cfg
    p = cfg.prefix(layer)
    qr = ops.rmsnorm(ops.fp8_linear(x, p + "attn.wq_a.weight"), p + "attn.q_norm.weight")
    q = ops.fp8_linear(qr, p + "attn.wq_b.weight").unflatten(-1, (cfg.n_heads, cfg.head_dim))
    q = rope(ops, q, pos, ops.freqs[layer])
    kv = ops.rmsnorm(ops.fp8_linear(x, p + "attn.wkv.weight"), p + "attn.kv_norm.weight").unsqueeze(-2)
    kv = ops.qdq(rope(ops, kv, pos, ops.freqs[layer]), "fp8").squeeze(-2)
    return qr, q, kv


# ---- CSA2 compressed branch ----------------------------------------------------------------------

def compress(ops, layer, x):
    """Full layer: x [B, T, D] -> (cache rows [B, Tc, Dh], index keys [B, Tc, ihd])."""
    cfg = ops.cfg
    ls = cfg.layers[layer]
    p = cfg.prefix(layer)
    r = ls.ratio
    B, T, _ = x.shape
    Tc = T // r
    if r == 1:
        latent = ops.rmsnorm(ops.bf16_linear(x, p + "attn.compressor.wkv.weight"), p + "attn.compressor.norm.weight")
    else:
        kvf = ops.f32_linear(x[:, :Tc * r], p + "attn.compressor.wkv.weight").unflatten(1, (Tc, r))
        sc = ops.f32_linear(x[:, :Tc * r], p + "attn.compressor.wgate.weight").unflatten(1, (Tc, r))
        latent = ops.rb(ops.softmax_pool(kvf, sc))
        latent = ops.rmsnorm(latent, p + "attn.compressor.norm.weight")
    gpos = (torch.arange(Tc, device=x.device) * r).expand(B, Tc)
    lat_i = ops.indexer_input(latent)
    k = ops.rmsnorm(ops.bf16_linear(lat_i, p + "attn.indexer.wk.weight"), p + "attn.indexer.k_norm.weight")
    k = ops.qdq(rope(ops, k.unsqueeze(-2), gpos, ops.freqs[layer]), "fp4_ue8m0").squeeze(-2)
    rows = ops.qdq(rope(ops, latent.unsqueeze(-2), gpos, ops.freqs[layer]), "fp4_e4m3").squeeze(-2)
    return rows, k


def index_scores(ops, layer, x, qr, keys, pos):
    cfg = ops.cfg
    p = cfg.prefix(layer)
    nh, ihd = cfg.index_heads, cfg.index_head_dim
    qi = ops.fp8_linear(ops.indexer_input(qr), p + "attn.indexer.wq_b.weight").unflatten(-1, (nh, ihd))
    qi = ops.qdq(rope(ops, qi, pos, ops.freqs[layer]), "fp4_ue8m0")
    w = ops.bf16_linear(ops.indexer_input(x), p + "attn.indexer.weights_proj.weight")
    w = ops.rb(w.float() * float(np.float32(ihd ** -0.5 * nh ** -0.5)))
    return ops.index_scores(qi, keys, w)  # [B, T, Tc]


def select_candidates(scores, visible, topk_blocks, bs):
    """Two-level selection, level one: mask [B, T, Tc] of the kept blocks."""
    B, T, Tc = scores.shape
    nb = (Tc + bs - 1) // bs
    pad = nb * bs - Tc
    s = F.pad(scores, (0, pad), value=NEG_INF) if pad else scores
    blk = s.unflatten(-1, (nb, bs)).amax(-1)  # [B, T, nb]
    last = (visible - 1) // bs  # [T]
    pin = (visible > 0) & (last < nb)
    blk = blk.clone()
    ar = torch.arange(nb, device=scores.device)
    blk = torch.where(pin.view(1, T, 1) & (ar.view(1, 1, nb) == last.view(1, T, 1)), torch.full_like(blk, float("inf")), blk)
    keep = min(topk_blocks, nb)
    top = torch.topk(blk, keep, dim=-1)
    kept = torch.zeros_like(blk, dtype=torch.bool).scatter(-1, top.indices, top.values > NEG_INF)
    return kept.repeat_interleave(bs, -1)[..., :Tc]


def compressed_selection(ops, layer, x, qr, pos, ctx):
    """Full / Reindex layer: top-k (indices [B, T, k], valid [B, T, k]) over the kv source's rows."""
    cfg = ops.cfg
    ls = cfg.layers[layer]
    keys = ctx["ikeys"][ls.kv_source]
    T = x.shape[1]
    Tc = keys.shape[1]
    visible = (pos[0] + 1) // ls.ratio  # [T] (prefill from 0)
    scores = index_scores(ops, layer, x, qr, keys, pos)
    vis_mask = torch.arange(Tc, device=x.device).view(1, 1, Tc) < visible.view(1, T, 1)
    ctx["index_scores"][layer] = (scores, vis_mask)
    sel_scores = scores.detach().masked_fill(~vis_mask, NEG_INF)
    if ls.candidate_source:
        ctx["cand"] = select_candidates(sel_scores, visible, cfg.candidate_topk_blocks, cfg.candidate_block_size)
    elif ls.uses_candidates:
        sel_scores = sel_scores.masked_fill(~ctx["cand"], NEG_INF)
    k = min(cfg.index_topk, Tc)
    idx = ops.topk(sel_scores, k)
    valid = idx < visible.view(1, T, 1)
    return idx, valid


def attention(ops, layer, x, pos, ctx):
    cfg = ops.cfg
    ls = cfg.layers[layer]
    qr, q, kv = qkv(ops, layer, x, pos)
    comp = sel = None
    if ls.ratio > 0 and x.shape[1] // ls.ratio > 0:
        if ls.mode == "full":
            ctx["comp"][layer], ctx["ikeys"][layer] = compress(ops, layer, x)
        if ls.mode in ("full", "reindex"):
            ctx["topk"][layer] = compressed_selection(ops, layer, x, qr, pos, ctx)
        comp = ctx["comp"][ls.kv_source]
        sel = ctx["topk"][ls.index_source]
    o = ops.attn_core(layer, q, kv, comp, sel, pos, ctx)
    return attention_output(ops, layer, o, pos)


# ---- target forward ------------------------------------------------------------------------------

def forward(ops, ids, want_taps=False, trace=None):
    """ids [B, T] from position 0 -> (logits [B, T, V] fp32, taps [B, T, n_taps*D] or None, ctx)."""
    cfg = ops.cfg
    B, T = ids.shape
    pos = torch.arange(T, device=ids.device).expand(B, T)
    ctx = {"comp": {}, "ikeys": {}, "topk": {}, "index_scores": {}, "aux": [], "load": {}}
    cols = ops.common.engram_cols(ids) if cfg.engram_layers else None
    e = ops.embed(ids, "embed.weight")
    h = e.unsqueeze(-2).expand(*e.shape[:-1], cfg.hc, cfg.dim)
    pre = ops.one_hot_pre(B, T, h.device)
    taps = []
    for l in range(cfg.n_layers):
        ls = cfg.layers[l]
        if ls.engram_slot >= 0:
            h = engram(ops, l, h, cols[:, :, ls.engram_slot])
            if trace is not None:
                trace[f"l{l}_engram"] = h
        if ls.tap >= 0 and want_taps:
            taps.append(stream_mean(ops, h))

        def attn_fn(x, l=l):
            y = attention(ops, l, x, pos, ctx)
            if trace is not None:
                trace[f"l{l}_attn"] = y
            return y
        h, pre = block(ops, l, h, pre, attn_fn)
        if trace is not None:
            trace[f"l{l}"], trace[f"l{l}_premix"] = h, pre[..., :cfg.hc]
    x = ops.rmsnorm(hc_pre(ops, h, pre), "norm.weight")
    logits = ops.head(x, "head.weight")
    return logits, (torch.cat(taps, -1) if want_taps else None), ctx


# ---- DSpark --------------------------------------------------------------------------------------

def dspark_context(ops, taps):
    """Target features [B, T, n_taps*D] -> per stage the context KV rows [B, T, Dh] (FP8 qdq)."""
    cfg = ops.cfg
    B, T, _ = taps.shape
    pos = torch.arange(T, device=taps.device).expand(B, T)
    p0 = cfg.prefix(cfg.n_layers)
    main_x = ops.rmsnorm(ops.fp8_linear(taps, p0 + "main_proj.weight"), p0 + "main_norm.weight")
    out = []
    for s in range(cfg.n_mtp):
        layer = cfg.n_layers + s
        p = cfg.prefix(layer)
        kv = ops.rmsnorm(ops.fp8_linear(main_x, p + "attn.wkv.weight"), p + "attn.kv_norm.weight").unsqueeze(-2)
        out.append(ops.qdq(rope(ops, kv, pos, ops.freqs[layer]), "fp8").squeeze(-2))
    return out


def dspark_block_rows(ops, ctx_kv, anchors_b, anchors_p, anchor_ids):
    """Draft blocks for anchors (batch index b, last seeded position p, anchor token = the token at
    p + 1). ctx_kv: dspark_context output. -> (x [N, L, D] collapsed, logits base [N, L, V])."""
    cfg = ops.cfg
    L, W = cfg.block_size, cfg.window
    N = anchors_p.shape[0]
    dev = anchors_p.device
    ids = torch.full((N, L), cfg.noise_id, dtype=torch.int64, device=dev)
    ids[:, 0] = anchor_ids
    bpos = anchors_p.view(N, 1) + 1 + torch.arange(L, device=dev).view(1, L)  # [N, L]
    # context window rows: positions p - W + 1 .. p (engine ring slots), -1 where before position 0
    wpos = ops.window_positions(anchors_p, W)  # [N, W] (-1 = empty)
    e = ops.embed(ids, "embed.weight")
    h = e.unsqueeze(-2).expand(N, L, cfg.hc, cfg.dim)
    pre = ops.one_hot_pre(N, L, dev)
    for s in range(cfg.n_mtp):
        layer = cfg.n_layers + s
        ckv = ctx_kv[s][anchors_b.view(N, 1), wpos.clamp_min(0)]  # [N, W, Dh]

        def attn_fn(x, layer=layer, ckv=ckv):
            _, q, kv = qkv(ops, layer, x, bpos)
            o = ops.dspark_core(layer, q, kv, ckv, wpos >= 0)
            return attention_output(ops, layer, o, bpos)
        h, pre = block(ops, layer, h, pre, attn_fn)
    x = hc_pre(ops, h, pre)
    pl = cfg.prefix(cfg.n_total - 1)
    base = ops.head(ops.rmsnorm(x, pl + "norm.weight"), "head.weight")
    return x, base


def markov_bias(ops, prev):
    pl = ops.cfg.prefix(ops.cfg.n_total - 1)
    e = ops.embed(prev, pl + "markov_head.embed.weight")
    return e, ops.head(e, pl + "markov_head.head.weight")


def confidence(ops, x, e):
    pl = ops.cfg.prefix(ops.cfg.n_total - 1)
    return ops.head(torch.cat([x.float(), e.float()], -1), pl + "confidence_head.proj.weight").squeeze(-1)


def dspark_draft(ops, ctx_kv, b, p, anchor):
    """One greedy draft as the engine's Model::dspark_draft: -> (ids [L+1], logits [L, V], conf [L])."""
    cfg = ops.cfg
    dev = ctx_kv[0].device
    x, base = dspark_block_rows(ops, ctx_kv, torch.tensor([b], device=dev), torch.tensor([p], device=dev),
                                torch.tensor([anchor], device=dev))
    x, base = x[0], base[0]
    ids, embs, rows = [anchor], [], []
    for i in range(cfg.block_size):
        e, bias = markov_bias(ops, torch.tensor([ids[-1]], device=dev))
        row = base[i] + bias[0]
        rows.append(row)
        embs.append(e[0])
        ids.append(int(torch.argmax(row)))
    conf = confidence(ops, x, torch.stack(embs))
    return ids, torch.stack(rows), conf


# ==================================================================================================
# TrainOps: float weights, bf16 autocast, optional fake quant
# ==================================================================================================

class _Ste(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, q):
        return q

    @staticmethod
    def backward(ctx, g):
        return g, None


def ste(x, fq):
    with torch.no_grad():
        q = fq(x.detach()).to(x.dtype)
    return x + (q - x).detach()


class TrainOps(nn.Module):
    exact = False

    def __init__(self, cfg, token_map, seed=0):
        super().__init__()
        self.cfg = cfg
        self.common = Common(cfg, token_map)
        self.freqs = self.common.freqs
        self.qat = False         # fake-quant weights and GEMM inputs
        self.kv_quant = True     # fake-quant the cache points (window KV, compressed rows, index q/k)
        self.drop = 0.0          # dropout on the sublayer outputs (training only)
        self.params = nn.ParameterDict()
        self._load = {}
        g = torch.Generator().manual_seed(seed)
        for name, fmt, shape in tensor_specs(cfg):
            if ".ffn.experts." in name:
                continue
            self.params[self._k(name)] = nn.Parameter(self._init(name, shape, g))
        for l in range(cfg.n_total):
            p = cfg.prefix(l)
            E, _ = cfg.layer_experts(l)
            I, D = cfg.inter, cfg.dim
            for w, shape in (("w1", [E, I, D]), ("w2", [E, D, I]), ("w3", [E, I, D])):
                fan = shape[2]
                std = 1.0 / math.sqrt(fan) * (0.5 / math.sqrt(cfg.n_layers) if w == "w2" else 1.0)
                self.params[self._k(expert_key(p, w))] = nn.Parameter(torch.randn(shape, generator=g) * std)
        # the router bias is updated by the load-balancing rule, not by gradients
        for l in range(cfg.n_total):
            self.params[self._k(cfg.prefix(l) + "ffn.gate.bias")].requires_grad_(False)

    @staticmethod
    def _k(name):
        return name.replace(".", "~")

    def _init(self, name, shape, g):
        cfg = self.cfg
        if name.endswith("norm.weight") or name.endswith("q_weight") or name.endswith("k_weight"):
            return torch.ones(shape)
        if name.endswith("attn_sink") or name.endswith("gate.bias"):
            return torch.zeros(shape)
        if name.endswith("_fn"):
            return torch.randn(shape, generator=g) / math.sqrt(shape[1])
        if name.endswith("_scale"):
            return torch.full(shape, 0.1)
        if name.endswith("_base"):
            hc = cfg.hc
            b = torch.zeros(shape)
            b[:hc] = math.log(1.0 / (hc - 1))  # pre ~ 1/hc: the collapse starts as the stream mean
            b[2 * hc:] = 4.0 * torch.eye(hc).flatten()  # comb starts near identity
            return b
        if name == "embed.weight":
            return torch.randn(shape, generator=g)
        if name.endswith("engram.embed.weight") or name.endswith("markov_head.embed.weight"):
            return torch.randn(shape, generator=g) * 0.5
        fan = shape[-1]
        std = 1.0 / math.sqrt(fan)
        if name.endswith("wo_b.weight") or name.endswith("shared_experts.w2.weight") or name.endswith("engram.wkv.weight"):
            std *= 0.5 / math.sqrt(cfg.n_layers)
        if name.endswith("markov_head.head.weight") or name.endswith("confidence_head.proj.weight"):
            std *= 0.1
        return torch.randn(shape, generator=g) * std

    def w(self, name):
        return self.params[self._k(name)]

    def router_bias(self, layer):
        return self.w(self.cfg.prefix(layer) + "ffn.gate.bias")

    # ---- elementwise ------------------------------------------------------------------------------
    def rb(self, x):
        return x

    def dropout(self, y):
        return F.dropout(y, self.drop, self.training) if self.drop > 0 else y

    def cos(self, x):
        return torch.cos(x)

    def sin(self, x):
        return torch.sin(x)

    def sigmoid(self, x):
        return torch.sigmoid(x)

    def softmax_last(self, x):
        return torch.softmax(x, -1)

    def mean_sq(self, x):
        x = x.float()
        return (x * x).mean(-1)

    def seq_dot(self, a, b):
        return (a.float() * b.float()).sum(-1)

    def softmax_pool(self, kv, sc):
        return (torch.softmax(sc.float(), 2) * kv.float()).sum(2)

    def small_sum(self, x, dim):
        return x.sum(dim, keepdim=True)

    def f32_mm(self, x, w):
        with torch.autocast(device_type=x.device.type, enabled=False):
            return x.float() @ w.float().t()

    def qdq(self, x, kind):
        if not self.kv_quant:
            return x
        fq = {"fp8": Q.fp8_qdq, "fp4_e4m3": Q.fp4_e4m3_qdq, "fp4_ue8m0": Q.fp4_ue8m0_qdq}[kind]
        return ste(x.float(), fq)

    def one_hot_pre(self, B, T, dev):
        pre = torch.zeros(B, T, self.cfg.hc, device=dev)
        pre[..., 0] = 1.0
        return pre

    def embed(self, ids, name):
        return F.embedding(ids, self.w(name))

    def rmsnorm(self, x, name):
        x = x.float()
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + self.cfg.eps) * self.w(name).float()

    def indexer_input(self, x):
        return x.detach()  # the indexer learns from its own loss only (as DeepSeek's DSA)

    # ---- GEMMs ------------------------------------------------------------------------------------
    def _wq_fp8(self, name):
        w = self.w(name)
        if not self.qat:
            return w
        return ste(w, lambda t: Q.fp8_block_dequant(*Q.fp8_block_weight(t)))

    def _act(self, x):
        return ste(x.float(), Q.fp8_qdq) if self.qat else x

    def fp8_linear(self, x, name):
        return F.linear(self._act(x), self._wq_fp8(name))

    def bf16_linear(self, x, name):
        return F.linear(x, self.w(name))

    def f32_linear(self, x, name):
        with torch.autocast(device_type=x.device.type, enabled=False):
            return F.linear(x.float(), self.w(name).float())

    def head(self, x, name):
        return F.linear(x, self.w(name)).float()

    def grouped_linear(self, x, name, groups):
        w = self._wq_fp8(name)
        G = groups
        wv = w.view(G, w.shape[0] // G, w.shape[1])
        xg = x.unflatten(-1, (G, x.shape[-1] // G))
        return torch.einsum("...gk,grk->...gr", xg, wv).flatten(-2)

    def engram_rows(self, cols, name):
        t = self.w(name)
        rows = F.embedding(cols, t)  # [..., ncols, hd]
        if self.qat:
            rows = ste(rows.float(), Q.fp8_qdq)
        return rows.flatten(-2)

    # ---- MoE ----------------------------------------------------------------------------------------
    def moe(self, x, layer):
        cfg = self.cfg
        p = cfg.prefix(layer)
        E, k = cfg.layer_experts(layer)
        lim = cfg.swiglu_limit
        with torch.autocast(device_type=x.device.type, enabled=False):
            logits = x.float() @ self.w(p + "ffn.gate.weight").float().t() / cfg.gate_temp
            s = torch.sqrt(F.softplus(logits))
            idx = torch.topk(s + self.router_bias(layer), k, dim=-1).indices
            wsel = torch.gather(s, -1, idx)
            wsel = wsel / (wsel.sum(-1, keepdim=True) + 1e-20) * cfg.route_scale
            dense = torch.zeros_like(s).scatter(-1, idx, wsel)
        if self.training:
            self._load[layer] = torch.bincount(idx.flatten(), minlength=E).detach()
        xa = self._act(x)
        w1, w2, w3 = (self.w(expert_key(p, n)) for n in ("w1", "w2", "w3"))
        if self.qat:
            fq = lambda t: Q.fp4_row_dequant(*Q.fp4_row_weight(t))
            w1, w2, w3 = ste(w1, fq), ste(w2, fq), ste(w3, fq)
        g = torch.einsum("...d,eid->...ei", xa, w1)
        u = torch.einsum("...d,eid->...ei", xa, w3)
        u = torch.clamp(u, -lim, lim)
        g = torch.clamp(g, max=lim)
        hmid = F.silu(g) * u * dense.unsqueeze(-1).to(g.dtype)
        y = torch.einsum("...ei,edi->...d", self._act(hmid), w2)
        sg = F.linear(xa, self._wq_fp8(p + "ffn.shared_experts.w1.weight"))
        su = F.linear(xa, self._wq_fp8(p + "ffn.shared_experts.w3.weight"))
        sh = F.silu(torch.clamp(sg, max=lim)) * torch.clamp(su, -lim, lim)
        ys = F.linear(self._act(sh), self._wq_fp8(p + "ffn.shared_experts.w2.weight"))
        return y + ys

    # ---- attention cores -------------------------------------------------------------------------
    def index_scores(self, qi, keys, w):
        s = torch.einsum("btnd,bcd->btnc", qi, keys.to(qi.dtype))
        return (F.relu(s).float() * w.float().unsqueeze(-1)).sum(2)

    def topk(self, scores, k):
        return torch.topk(scores, k, dim=-1).indices

    def attn_core(self, layer, q, kv, comp, sel, pos, ctx):
        cfg = self.cfg
        B, T, H, Dh = q.shape
        scale = f32_inv_sqrt(Dh)
        sink = self.w(cfg.prefix(layer) + "attn.attn_sink")
        s_w = torch.einsum("bthd,bsd->bhts", q, kv.to(q.dtype)).float() * scale
        i = torch.arange(T, device=q.device)
        wmask = (i.view(T, 1) >= i.view(1, T)) & (i.view(T, 1) - i.view(1, T) < cfg.window)
        s_w = s_w.masked_fill(~wmask, NEG_INF)
        parts = [s_w]
        if comp is not None:
            Tc = comp.shape[1]
            idx, valid = sel
            smask = torch.zeros(B, T, Tc, dtype=torch.bool, device=q.device).scatter(-1, idx, valid)
            s_c = torch.einsum("bthd,bcd->bhtc", q, comp.to(q.dtype)).float() * scale
            ls = cfg.layers[layer]
            if ls.mode in ("full", "reindex") and layer in ctx["index_scores"]:
                self._indexer_loss(ctx, layer, s_c.detach())
            parts.append(s_c.masked_fill(~smask.unsqueeze(1), NEG_INF))
        parts.append(sink.float().view(1, H, 1, 1).expand(B, H, T, 1))
        prob = torch.softmax(torch.cat(parts, -1), -1)
        o = torch.einsum("bhts,bsd->bthd", prob[..., :T].to(kv.dtype), kv)
        if comp is not None:
            o = o + torch.einsum("bhtc,bcd->bthd", prob[..., T:T + comp.shape[1]].to(comp.dtype), comp)
        return o

    def _indexer_loss(self, ctx, layer, s_c):
        # KL(attention mass over the visible compressed rows, mean over heads || indexer softmax);
        # finite fill values keep rows with nothing visible free of NaN (they are dropped)
        scores, vis = ctx["index_scores"][layer]  # [B, T, Tc]
        rows = vis.any(-1)
        target = torch.softmax(s_c.masked_fill(~vis.unsqueeze(1), -1e9), -1).mean(1) * vis
        logq = torch.log_softmax(scores.float().masked_fill(~vis, -1e9), -1)
        kl = (target * (torch.log(target.clamp_min(1e-12)) - logq)).sum(-1)
        ctx["aux"].append((kl * rows).sum() / rows.sum().clamp_min(1))

    def window_positions(self, p, W):
        wp = p.view(-1, 1) - (W - 1) + torch.arange(W, device=p.device).view(1, W)
        return torch.where(wp >= 0, wp, torch.full_like(wp, -1))

    def dspark_core(self, layer, q, kv, ckv, cvalid):
        """q [N, L, H, Dh], kv [N, L, Dh] block rows, ckv [N, W, Dh] context rows (cvalid [N, W])."""
        N, L, H, Dh = q.shape
        scale = f32_inv_sqrt(Dh)
        sink = self.w(self.cfg.prefix(layer) + "attn.attn_sink")
        s_c = torch.einsum("nlhd,nwd->nhlw", q, ckv.to(q.dtype)).float() * scale
        s_c = s_c.masked_fill(~cvalid.view(N, 1, 1, -1), NEG_INF)
        s_b = torch.einsum("nlhd,nmd->nhlm", q, kv.to(q.dtype)).float() * scale
        prob = torch.softmax(torch.cat([s_c, s_b, sink.float().view(1, H, 1, 1).expand(N, H, L, 1)], -1), -1)
        W = ckv.shape[1]
        return (torch.einsum("nhlw,nwd->nlhd", prob[..., :W].to(ckv.dtype), ckv) +
                torch.einsum("nhlm,nmd->nlhd", prob[..., W:W + L].to(kv.dtype), kv))


# ==================================================================================================
# RefOps: the exported checkpoint with the engine's CPU numerics (batch 1)
# ==================================================================================================

def dot8(a, b):
    """cpu::dot: fp32 products, eight running partial sums, then a fixed pairwise combine. [..., n]."""
    p = a.float() * b.float()
    n = p.shape[-1]
    assert n % 8 == 0, f"dot8 needs a multiple of 8, got {n}"
    p = p.unflatten(-1, (n // 8, 8))
    s = p[..., 0, :]
    for i in range(1, n // 8):
        s = s + p[..., i, :]
    return ((s[..., 0] + s[..., 1]) + (s[..., 2] + s[..., 3])) + ((s[..., 4] + s[..., 5]) + (s[..., 6] + s[..., 7]))


def dot8_mm(x, w, rows=16):
    """x [S, K] . w [N, K]^T with cpu::dot per entry -> [S, N] fp32."""
    out = [dot8(x[i:i + rows].unsqueeze(1), w.unsqueeze(0)) for i in range(0, x.shape[0], rows)]
    return torch.cat(out, 0) if out else torch.zeros(0, w.shape[0])


class _Libm:
    """The C library's float functions (expf, cosf, sinf, log1pf), which the engine calls through
    std::exp / std::cos / ... on floats. They are not always correctly rounded (about 0.07% of expf
    and 1% of cosf results differ from the rounded exact value), so the reference calls them too."""

    def __init__(self):
        lib = ctypes.CDLL(ctypes.util.find_library("m"))
        self.f = {}
        for name in ("expf", "cosf", "sinf", "log1pf"):
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float]
            self.f[name] = np.frompyfunc(fn, 1, 1)

    def __call__(self, name, x):
        a = x.detach().float().contiguous().numpy()
        return torch.from_numpy(self.f[name](a).astype(np.float32).reshape(a.shape))


LIBM = _Libm()


class RefOps:
    exact = True

    def __init__(self, cfg, token_map, safetensors_path):
        self.cfg = cfg
        self.common = Common(cfg, token_map)
        self.freqs = self.common.freqs
        self.W = {}      # dequantized float weights
        self.Q = {}      # FP8 / FP4 GEMM weights: (raw values [.., out, in], scales [.., out, in/32])
        e4m3 = Q.e4m3_decode_table()
        e2m1 = Q.e2m1_decode_table()
        raw = read_safetensors(safetensors_path)
        for name, fmt, shape in tensor_specs(cfg):
            if fmt in ("fp8", "fp8row"):
                dt, a = raw[name]
                assert dt == "F8_E4M3", (name, dt)
                vals = e4m3[torch.from_numpy(a.astype(np.int64))]
                sk = torch.from_numpy(raw[name.replace(".weight", ".scale")][1].astype(np.int32)) - 127
                s = Q._pow2(sk).repeat_interleave(32, 0)[:shape[0]] if fmt == "fp8" else Q._pow2(sk)
                self.Q[name] = (vals, s)
                self.W[name] = Q.round_bf16((vals.view(*vals.shape[:-1], -1, 32) * s.unsqueeze(-1)).flatten(-2))
            elif fmt == "bf16":
                self.W[name] = bf16_from_bits(raw[name][1])
            elif fmt == "f32":
                self.W[name] = torch.from_numpy(raw[name][1].astype(np.float32))
        for l in range(cfg.n_total):
            p = cfg.prefix(l)
            E, _ = cfg.layer_experts(l)
            for w in ("w1", "w2", "w3"):
                vals, scs = [], []
                for e in range(E):
                    n = f"{p}ffn.experts.{e}.{w}.weight"
                    vals.append(e2m1[Q.unpack_e2m1(torch.from_numpy(raw[n][1].copy())).long()])
                    scs.append(Q._pow2(torch.from_numpy(raw[n.replace(".weight", ".scale")][1].astype(np.int32)) - 127))
                self.Q[expert_key(p, w)] = (torch.stack(vals), torch.stack(scs))

    def w(self, name):
        return self.W[name]

    # ---- elementwise, in the engine's fp32 / bf16 steps -----------------------------------------
    def rb(self, x):
        return Q.round_bf16(x.float())

    def dropout(self, y):
        return y

    def exp(self, x):
        return LIBM("expf", x)

    def cos(self, x):
        return LIBM("cosf", x)

    def sin(self, x):
        return LIBM("sinf", x)

    def sigmoid(self, x):
        return 1.0 / (1.0 + self.exp(-x))

    def small_sum(self, x, dim):
        """Sequential fp32 sum over a short dim (the engine's loops)."""
        acc = x.select(dim, 0)
        for k in range(1, x.shape[dim]):
            acc = acc + x.select(dim, k)
        return acc.unsqueeze(dim)

    def softmax_last(self, x):
        e = self.exp(x - x.amax(-1, keepdim=True))
        return e / self.small_sum(e, -1)

    def mean_sq(self, x):
        x = x.float()
        return dot8(x, x) / float(x.shape[-1])

    def seq_dot(self, a, b):
        p = a.float() * b.float()
        acc = p[..., 0]
        for i in range(1, p.shape[-1]):
            acc = acc + p[..., i]
        return acc

    def f32_mm(self, x, w):
        return (x.double() @ w.double().t()).float()

    def qdq(self, x, kind):
        fq = {"fp8": Q.fp8_qdq, "fp4_e4m3": Q.fp4_e4m3_qdq, "fp4_ue8m0": Q.fp4_ue8m0_qdq}[kind]
        return fq(x.float())

    def one_hot_pre(self, B, T, dev):
        pre = torch.zeros(B, T, self.cfg.hc)
        pre[..., 0] = 1.0
        return pre

    def embed(self, ids, name):
        return F.embedding(ids, self.W[name])

    def rmsnorm(self, x, name):
        x = x.float()
        inv = 1.0 / torch.sqrt(self.mean_sq(x) + self.cfg.eps)
        return self.rb(self.W[name] * (x * inv.unsqueeze(-1)))

    def indexer_input(self, x):
        return x

    # ---- GEMMs as src/backend/cpu/cpu_linear.cpp ------------------------------------------------
    def _quantized(self, x, vals, scales):
        """x [..., K]; vals [N, K] raw e4m3/e2m1 values, scales [N, K/32] -> bf16 [..., N]."""
        shp = x.shape[:-1]
        x2 = x.reshape(-1, x.shape[-1]).float()
        xq, xs = Q.fp8_act_quant(x2)  # [S, K], [S, nb]
        S, K = xq.shape
        N, nb = vals.shape[0], K // 32
        wv = vals.view(N, nb, 32)
        part = torch.cat([dot8(xq[i:i + 16].view(-1, 1, nb, 32), wv.unsqueeze(0)) for i in range(0, S, 16)], 0)
        acc = torch.zeros(S, N)
        for b in range(nb):
            acc = acc + part[:, :, b] * xs[:, b:b + 1] * scales[:, b].view(1, -1)
        return self.rb(acc).reshape(*shp, N)

    def fp8_linear(self, x, name):
        return self._quantized(x, *self.Q[name])

    def bf16_linear(self, x, name):
        shp = x.shape[:-1]
        y = dot8_mm(x.reshape(-1, x.shape[-1]).float(), self.W[name])
        return self.rb(y).reshape(*shp, -1)

    def f32_linear(self, x, name):
        return (x.double() @ self.W[name].double().t()).float()

    def head(self, x, name):
        return self.f32_linear(x, name)

    def grouped_linear(self, x, name, groups):
        w = self.W[name]
        G, R = groups, w.shape[0] // groups
        shp = x.shape[:-1]
        xg = x.reshape(-1, G, x.shape[-1] // G).float()
        outs = [dot8_mm(xg[:, g], w[g * R:(g + 1) * R]) for g in range(G)]
        return self.rb(torch.cat(outs, -1)).reshape(*shp, G * R)

    def engram_rows(self, cols, name):
        return F.embedding(cols, self.W[name]).flatten(-2)

    def softmax_pool(self, kv, sc):
        """kv, sc [B, G, r, Dh] -> [B, G, Dh] as CpuBackend::softmax_pool (fp32, in order)."""
        mx = sc.amax(2, keepdim=True)
        e = self.exp(sc - mx)
        tot = self.small_sum(e, 2).squeeze(2)
        acc = kv[:, :, 0] * (e[:, :, 0] / tot)
        for t in range(1, e.shape[2]):
            acc = acc + kv[:, :, t] * (e[:, :, t] / tot)
        return acc

    def moe(self, x, layer):
        cfg = self.cfg
        p = cfg.prefix(layer)
        E, k = cfg.layer_experts(layer)
        lim = float(np.float32(cfg.swiglu_limit))
        shp = x.shape
        x2 = x.reshape(-1, shp[-1]).float()
        S = x2.shape[0]
        logits = self.f32_linear(x2, p + "ffn.gate.weight") / float(np.float32(cfg.gate_temp))
        sp = torch.where(logits > 20, logits, LIBM("log1pf", self.exp(logits)))
        s = torch.sqrt(sp)
        idx = torch.topk(s + self.W[p + "ffn.gate.bias"], k, dim=-1).indices
        wsel = torch.gather(s, -1, idx)
        if k > 1:
            wsel = wsel / (self.small_sum(wsel, -1) + 1e-20)
        wsel = wsel * float(np.float32(cfg.route_scale))
        acc = torch.zeros(S, shp[-1])
        w1, w2, w3 = (self.Q[expert_key(p, n)] for n in ("w1", "w2", "w3"))
        for e in range(E):
            rows, slot = torch.nonzero(idx == e, as_tuple=True)
            if rows.numel() == 0:
                continue
            y = self._expert(x2[rows], (w1[0][e], w1[1][e]), (w2[0][e], w2[1][e]), (w3[0][e], w3[1][e]),
                             wsel[rows, slot], lim)
            acc[rows] = acc[rows] + y
        sq = lambda n: self.Q[p + f"ffn.shared_experts.{n}.weight"]
        ys = self._expert(x2, sq("w1"), sq("w2"), sq("w3"), None, lim)
        return self.rb(acc + ys).reshape(shp)

    def _expert(self, x, w1, w2, w3, rw, lim):
        g = self._quantized(x, *w1)
        u = self._quantized(x, *w3)
        u = torch.clamp(u, -lim, lim)
        g = torch.clamp(g, max=lim)
        h = g / (1.0 + self.exp(-g)) * u
        if rw is not None:
            h = rw.view(-1, 1) * h
        return self._quantized(self.rb(h), *w2)

    # ---- attention ---------------------------------------------------------------------------------
    def index_scores(self, qi, keys, w):
        qk = self.rb(dot8(qi.unsqueeze(3), keys.unsqueeze(1).unsqueeze(1)))  # [B, T, nh, Tc]
        terms = self.rb(F.relu(qk) * w.unsqueeze(-1))
        acc = terms[:, :, 0]
        for h in range(1, terms.shape[2]):
            acc = acc + terms[:, :, h]
        return self.rb(acc)

    def topk(self, scores, k):
        return torch.topk(scores, k, dim=-1).indices

    def _online(self, q, keys, idx, sink, scale):
        """CpuBackend::sparse_attention: q [T, H, Dh], keys [Nk, Dh], idx [T, L] (-1 = skip): online
        softmax over blocks of 64 entries, bf16 probabilities into fp32 accumulators, entry order."""
        T, H, Dh = q.shape
        Lk = idx.shape[1]
        valid = idx >= 0
        g = keys[idx.clamp_min(0)]  # [T, L, Dh]
        s = dot8(q.unsqueeze(2), g.unsqueeze(1)) * scale  # [T, H, L]
        s = s.masked_fill(~valid.unsqueeze(1), NEG_INF)
        run_max = torch.full((T, H), -1e30)
        tot = torch.zeros(T, H)
        acc = torch.zeros(T, H, Dh)
        for b0 in range(0, Lk, 64):
            sb = s[:, :, b0:b0 + 64]
            new_max = torch.maximum(run_max, sb.amax(-1))
            resc = self.exp(run_max - new_max)
            tot = tot * resc
            acc = acc * resc.unsqueeze(-1)
            for j in range(sb.shape[-1]):
                ok = valid[:, b0 + j].view(T, 1)
                pj = self.exp(sb[:, :, j] - new_max)
                tot = torch.where(ok, tot + pj, tot)
                term = self.rb(pj).unsqueeze(-1) * g[:, b0 + j].unsqueeze(1)
                acc = torch.where(ok.unsqueeze(-1), acc + term, acc)
            run_max = new_max
        tot = tot + self.exp(sink.view(1, H) - run_max)
        return self.rb(acc / tot.unsqueeze(-1))

    def attn_core(self, layer, q, kv, comp, sel, pos, ctx):
        cfg = self.cfg
        B, T, H, Dh = q.shape
        assert B == 1, "RefOps runs batch 1"
        W = cfg.window
        Lw = min(T, W)
        i = torch.arange(T).view(T, 1)
        wp = torch.clamp(i - W + 1, min=0) + torch.arange(Lw).view(1, Lw)
        idx = torch.where(wp > i, torch.full_like(wp, -1), wp)
        keys = kv[0]
        if comp is not None:
            # ascending; entries past the visible rows are the largest, so they come last as -1
            sidx, valid = sel
            order, perm = torch.sort(sidx[0], -1)
            cidx = torch.where(valid[0].gather(-1, perm), order + T, torch.full_like(order, -1))
            idx = torch.cat([idx, cidx], 1)
            keys = torch.cat([keys, comp[0]], 0)
        sink = self.W[cfg.prefix(layer) + "attn.attn_sink"]
        return self._online(q[0], keys, idx, sink, f32_inv_sqrt(Dh)).unsqueeze(0)

    def window_positions(self, p, W):
        """Ring slot order as the engine: slots 0..filled-1, slot s holds p - ((p - s) mod W)."""
        out = []
        for pv in p.tolist():
            filled = min(W, pv + 1)
            out.append([pv - ((pv - s) % W) for s in range(filled)] + [-1] * (W - filled))
        return torch.tensor(out, dtype=torch.int64)

    def dspark_core(self, layer, q, kv, ckv, cvalid):
        N, L, H, Dh = q.shape
        sink = self.W[self.cfg.prefix(layer) + "attn.attn_sink"]
        outs = []
        for n in range(N):
            filled = int(cvalid[n].sum())
            keys = torch.cat([ckv[n, :filled], kv[n]], 0)
            idx = torch.arange(filled + L).view(1, -1).expand(L, -1)
            outs.append(self._online(q[n], keys, idx, sink, f32_inv_sqrt(Dh)))
        return torch.stack(outs)
