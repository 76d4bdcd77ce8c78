"""V4.1 config (text_config fields, the per-layer schedule of src/model/config.cpp), the Engram
layout and token map (src/model/engram_hash.cpp, src/tokenizer/engram_token_map.cpp), the checkpoint
tensor list (src/model/checkpoint_manifest.cpp) and a minimal safetensors reader / writer."""
import ctypes
import ctypes.util
import json
import struct
import unicodedata

import numpy as np
import torch


# ---- config --------------------------------------------------------------------------------------

class Layer:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class Config:
    """text_config of config.json -> fields + derived schedule (`layers`)."""

    def __init__(self, tc):
        self.raw = tc
        g = tc.get
        self.vocab_size, self.dim, self.n_layers = tc["vocab_size"], tc["hidden_size"], tc["num_hidden_layers"]
        self.n_heads, self.head_dim, self.rope_dim = tc["num_attention_heads"], tc["head_dim"], tc["qk_rope_head_dim"]
        self.q_lora, self.o_lora, self.o_groups = tc["q_lora_rank"], tc["o_lora_rank"], tc["o_groups"]
        self.rope_theta, self.compress_rope_theta = tc["rope_theta"], tc["compress_rope_theta"]
        rs = g("rope_scaling") or {}
        self.yarn_factor = rs.get("factor", 1)
        self.beta_fast, self.beta_slow = rs.get("beta_fast", 32), rs.get("beta_slow", 1)
        self.yarn_orig = rs.get("original_max_position_embeddings", 0)
        self.max_position = tc["max_position_embeddings"]
        self.window = tc["sliding_window"]
        self.compress_ratios = tc["compress_ratios"]
        self.kv_sources, self.index_sources = tc["kv_source_layer_ids"], tc["index_source_layer_ids"]
        self.candidate_source = g("candidate_source_layer_id", -1)
        self.candidate_topk_blocks, self.candidate_block_size = g("candidate_topk_blocks", 0), g("candidate_block_size", 0)
        self.index_heads, self.index_head_dim, self.index_topk = tc["index_n_heads"], tc["index_head_dim"], tc["index_topk"]
        self.n_experts, self.top_k = tc["n_routed_experts"], tc["num_experts_per_tok"]
        self.inter = tc["moe_intermediate_size"]
        self.route_scale, self.gate_temp, self.swiglu_limit = tc["routed_scaling_factor"], tc["gate_temp"], tc["swiglu_limit"]
        self.hc, self.sinkhorn_iters, self.hc_eps = tc["hc_mult"], tc["hc_sinkhorn_iters"], tc["hc_eps"]
        self.eps = tc["rms_norm_eps"]
        self.engram_layers = g("engram_layer_ids", [])
        self.engram_rows = g("engram_num_embeddings", [])
        self.engram_max_ngram, self.engram_vocab = g("engram_max_ngram_size", 0), g("engram_vocab_size", 0)
        self.engram_heads, self.engram_head_dim = g("engram_n_heads", 0), g("engram_head_dim", 0)
        self.engram_pad_id, self.engram_cvocab = g("engram_pad_token_id", 2), g("engram_compressed_vocab_size", 0)
        self.n_mtp = g("num_nextn_predict_layers", 0)
        self.block_size, self.noise_id = g("dspark_block_size", 0), g("dspark_noise_token_id", 0)
        self.taps, self.markov_rank = g("dspark_target_layer_ids", []), g("dspark_markov_rank", 0)
        self.d_experts, self.d_top_k = g("dspark_n_routed_experts", 0), g("dspark_num_experts_per_tok", 0)
        self.bos, self.eos = tc.get("bos_token_id", 0), tc.get("eos_token_id", 1)
        self.layers = self._schedule()

    @property
    def n_total(self):
        return self.n_layers + self.n_mtp

    @property
    def engram_cols(self):
        return (self.engram_max_ngram - 1) * self.engram_heads

    def prefix(self, l):
        return f"layers.{l}." if l < self.n_layers else f"mtp.{l - self.n_layers}."

    def layer_experts(self, l):
        if l >= self.n_layers and self.d_experts > 0:
            return self.d_experts, self.d_top_k
        return self.n_experts, self.top_k

    def _schedule(self):
        layers, latest_kv, latest_idx = [], -1, -1
        for l in range(self.n_total):
            dspark = l >= self.n_layers
            ratio = self.compress_ratios[l]
            is_kv = not dspark and l in self.kv_sources
            is_idx = not dspark and l in self.index_sources
            latest_kv = l if is_kv else latest_kv
            latest_idx = l if is_idx else latest_idx
            mode = "window" if ratio == 0 else ("full" if is_kv else "reindex" if is_idx else "reuse")
            layers.append(Layer(
                layer=l, dspark=dspark, ratio=ratio, mode=mode,
                kv_source=latest_kv if ratio else -1, index_source=latest_idx if ratio else -1,
                candidate_source=False, uses_candidates=False,
                engram_slot=self.engram_layers.index(l) if (not dspark and l in self.engram_layers) else -1,
                tap=self.taps.index(l) if (not dspark and self.n_mtp and l in self.taps) else -1,
                theta=self.compress_rope_theta if ratio else self.rope_theta, yarn=bool(ratio and self.yarn_orig > 0)))
        cs = self.candidate_source
        if cs >= 0:
            layers[cs].candidate_source = True
            for l in range(cs + 1, self.n_layers):
                if layers[l].mode in ("full", "reindex"):
                    layers[l].uses_candidates = True
        return layers


def load_config(model_dir):
    return Config(json.load(open(f"{model_dir}/config.json"))["text_config"])


# ---- rope ----------------------------------------------------------------------------------------

def rope_freqs(cfg, layer):
    """src/model/rope_table.cpp: fp32 frequencies, YaRN blend for compressed layers."""
    rd = cfg.rope_dim
    half = rd // 2
    # 1.0f / powf(base, 2i / rd) in fp32 with the C library's powf, as the engine computes it
    powf = ctypes.CDLL(ctypes.util.find_library("m")).powf
    powf.restype, powf.argtypes = ctypes.c_float, [ctypes.c_float, ctypes.c_float]
    base = float(np.float32(layer.theta))
    e = [float(np.float32(2 * i) / np.float32(rd)) for i in range(half)]
    f = torch.tensor([np.float32(1.0) / np.float32(powf(base, v)) for v in e], dtype=torch.float32)
    if layer.yarn:
        import math
        corr = lambda rot: rd * math.log(cfg.yarn_orig / (rot * 2 * math.pi)) / (2 * math.log(layer.theta))
        low = max(math.floor(corr(cfg.beta_fast)), 0.0)
        high = min(math.ceil(corr(cfg.beta_slow)), float(rd - 1))
        span = torch.tensor(max(high - low, 1e-3), dtype=torch.float32)
        ramp = torch.clamp((torch.arange(half, dtype=torch.float32) - torch.tensor(low, dtype=torch.float32)) / span, 0, 1)
        smooth = 1 - ramp
        f = f / torch.tensor(float(cfg.yarn_factor)) * (1 - smooth) + f * smooth
    return f


# ---- Engram --------------------------------------------------------------------------------------

def _is_prime(n):
    if n < 2:
        return False
    for p in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37):
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d //= 2
        s += 1
    for a in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37):
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def engram_layout(layer_ids, max_ngram, n_heads, vocab, cvocab):
    """-> primes [slots][cols], offsets [slots][cols], multipliers [slots][max_ngram]."""
    seen, primes, offsets, mults = set(), [], [], []
    for layer in layer_ids:
        ps, offs, running = [], [], 0
        for _ in range(max_ngram - 1):
            cur = vocab - 1
            for _ in range(n_heads):
                cur += 1
                while not _is_prime(cur) or cur in seen:
                    cur += 1
                seen.add(cur)
                ps.append(cur)
                offs.append(running)
                running += cur
        primes.append(ps)
        offsets.append(offs)
        bound = max(1, (np.iinfo(np.int64).max // cvocab) // 2)
        r = np.random.default_rng(10007 * layer).integers(0, bound, size=max_ngram, dtype=np.int64)
        mults.append([int(v) * 2 + 1 for v in r])
    return primes, offsets, mults


def engram_normalize(text):
    if not text.isascii():
        text = unicodedata.normalize("NFKC", text)
        text = unicodedata.normalize("NFD", text)
        text = "".join(c for c in text if unicodedata.category(c) not in ("Mn", "Mc", "Me"))
    text = "".join(c.lower() for c in text)
    import re
    text = re.sub(r"[ \t\r\n]+", " ", text)
    if text == " ":
        return " "
    return text.strip()


def engram_token_map(tokenizer_json):
    """token id -> compressed class (classes numbered in first-seen order over ids), class count."""
    from train_bpe import CHAR_BYTE  # the byte-level alphabet
    tok = json.load(open(tokenizer_json))
    vocab = {i: s for s, i in tok["model"]["vocab"].items()}
    added = {a["id"]: a["content"] for a in tok["added_tokens"]}
    n = max(list(vocab) + list(added)) + 1
    classes, out = {}, []
    for i in range(n):
        if i in added:
            vocab_string = text = added[i]
        else:
            vocab_string = vocab[i]
            try:
                text = bytes(CHAR_BYTE[c] for c in vocab_string).decode("utf-8")
            except UnicodeDecodeError:
                text = None
        if text is None or "\ufffd" in text:
            key = vocab_string
        else:
            key = engram_normalize(text) or text
        out.append(classes.setdefault(key, len(classes)))
    return out, len(classes)


def engram_hash(ids, token_map, pad_class, primes, offsets, mults, max_ngram, n_heads):
    """ids [B, T] (each row a request from position 0) -> [B, T, slots, cols] global table rows."""
    c = token_map[ids]
    B, T = ids.shape
    out = []
    for s in range(len(primes)):
        rolling, cols = None, []
        for shift in range(max_ngram):
            src = torch.full_like(c, pad_class)
            if shift < T:
                src[:, shift:] = c[:, :T - shift]
            prod = src * mults[s][shift]  # int64, wraps as in the reference
            rolling = prod if shift == 0 else rolling ^ prod
            if shift == 0:
                continue
            for h in range(n_heads):
                col = (shift - 1) * n_heads + h
                cols.append(torch.remainder(rolling, primes[s][col]) + offsets[s][col])
        out.append(torch.stack(cols, -1))
    return torch.stack(out, 2)


# ---- checkpoint manifest -------------------------------------------------------------------------

def tensor_specs(cfg):
    """[(name, storage, shape)] in checkpoint order; storage: fp8 (32x32 blocks + .scale), fp4
    (routed experts), fp8row (Engram table), bf16, f32."""
    D, Dh, H = cfg.dim, cfg.head_dim, cfg.n_heads
    out = [("embed.weight", "bf16", [cfg.vocab_size, D]), ("head.weight", "bf16", [cfg.vocab_size, D]),
           ("norm.weight", "bf16", [D])]
    for ls in cfg.layers:
        p = cfg.prefix(ls.layer)
        if ls.engram_slot >= 0:
            out += [(p + "engram.embed.weight", "fp8row", [cfg.engram_rows[ls.engram_slot], cfg.engram_head_dim]),
                    (p + "engram.wkv.weight", "fp8", [D * (cfg.hc + 1), cfg.engram_cols * cfg.engram_head_dim]),
                    (p + "engram.q_weight", "bf16", [cfg.hc, D]), (p + "engram.k_weight", "bf16", [cfg.hc, D])]
        out += [(p + "attn_norm.weight", "bf16", [D]), (p + "attn.wq_a.weight", "fp8", [cfg.q_lora, D]),
                (p + "attn.q_norm.weight", "bf16", [cfg.q_lora]), (p + "attn.wq_b.weight", "fp8", [H * Dh, cfg.q_lora]),
                (p + "attn.wkv.weight", "fp8", [Dh, D]), (p + "attn.kv_norm.weight", "bf16", [Dh]),
                (p + "attn.wo_a.weight", "fp8", [cfg.o_groups * cfg.o_lora, H * Dh // cfg.o_groups]),
                (p + "attn.wo_b.weight", "fp8", [D, cfg.o_groups * cfg.o_lora]), (p + "attn.attn_sink", "f32", [H])]
        if ls.mode == "full":
            out.append((p + "attn.compressor.wkv.weight", "bf16", [Dh, D]))
            if ls.ratio > 1:
                out.append((p + "attn.compressor.wgate.weight", "bf16", [Dh, D]))
            out.append((p + "attn.compressor.norm.weight", "bf16", [Dh]))
        if ls.mode in ("full", "reindex"):
            out += [(p + "attn.indexer.wq_b.weight", "fp8", [cfg.index_heads * cfg.index_head_dim, cfg.q_lora]),
                    (p + "attn.indexer.weights_proj.weight", "bf16", [cfg.index_heads, D])]
        if ls.mode == "full":
            out += [(p + "attn.indexer.wk.weight", "bf16", [cfg.index_head_dim, Dh]),
                    (p + "attn.indexer.k_norm.weight", "bf16", [cfg.index_head_dim])]
        mix = (2 + cfg.hc) * cfg.hc
        for site in ("attn", "ffn"):
            out += [(p + f"hc_{site}_fn", "f32", [mix, cfg.hc * D]), (p + f"hc_{site}_base", "f32", [mix]),
                    (p + f"hc_{site}_scale", "f32", [3])]
        E, _ = cfg.layer_experts(ls.layer)
        I = cfg.inter
        out += [(p + "ffn_norm.weight", "bf16", [D]), (p + "ffn.gate.weight", "bf16", [E, D]), (p + "ffn.gate.bias", "f32", [E])]
        for e in range(E):
            q = p + f"ffn.experts.{e}."
            out += [(q + "w1.weight", "fp4", [I, D]), (q + "w2.weight", "fp4", [D, I]), (q + "w3.weight", "fp4", [I, D])]
        out += [(p + "ffn.shared_experts.w1.weight", "fp8", [I, D]), (p + "ffn.shared_experts.w2.weight", "fp8", [D, I]),
                (p + "ffn.shared_experts.w3.weight", "fp8", [I, D])]
        if ls.dspark:
            stage = ls.layer - cfg.n_layers
            if stage == 0:
                out += [(p + "main_proj.weight", "fp8", [D, D * len(cfg.taps)]), (p + "main_norm.weight", "bf16", [D])]
            if stage == cfg.n_mtp - 1:
                R = cfg.markov_rank
                out += [(p + "norm.weight", "bf16", [D]), (p + "markov_head.embed.weight", "bf16", [cfg.vocab_size, R]),
                        (p + "markov_head.head.weight", "bf16", [cfg.vocab_size, R]),
                        (p + "confidence_head.proj.weight", "bf16", [1, D + R])]
    return out


# ---- safetensors ---------------------------------------------------------------------------------

_DT = {"F32": (np.float32, 4), "BF16": (np.uint16, 2), "F8_E4M3": (np.uint8, 1), "F8_E8M0": (np.uint8, 1),
       "I8": (np.uint8, 1), "U8": (np.uint8, 1)}


def write_safetensors(path, tensors):
    """tensors: [(name, dtype string, numpy array of the storage bytes type)]."""
    header, offset, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for name, dt, arr in tensors:
        b = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
        blobs.append(b)
    text = json.dumps(header, separators=(",", ":"))
    text += " " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text.encode())
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    """-> {name: (dtype string, numpy array)}."""
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        np_t, _ = _DT[h["dtype"]]
        a, b = h["data_offsets"]
        out[name] = (h["dtype"], np.frombuffer(data[base + a:base + b], dtype=np_t).reshape(h["shape"]))
    return out


def bf16_bits(t):
    return t.detach().float().to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def bf16_from_bits(a):
    return torch.from_numpy((a.astype(np.uint32) << 16).view(np.float32).copy())
