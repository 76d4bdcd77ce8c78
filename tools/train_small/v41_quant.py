"""The V4.1 number formats in PyTorch, bit-exact with src/model/quant.cpp (spec §2.8, §4.1).

Every quantizer first rounds its input to bf16 and then works in fp32, as the reference kernels do.
Grid rounding is round-to-nearest-even on a float with few mantissa bits: e4m3 (3 bits, smallest
normal exponent -6) and e2m1 (1 bit, smallest normal exponent 0); scales are powers of two
2^ceil(log2(amax / max)) (UE8M0) or, for compressed KV, an e4m3 value.

Also the export encoders: e4m3 / e8m0 / e2m1 byte codes of already-rounded values.
"""
import torch

FP8_MAX, FP4_MAX = 448.0, 6.0
INV_448 = torch.tensor(1.0 / 448.0, dtype=torch.float32).item()  # fp32(1/448), as the reference
INV_6 = torch.tensor(1.0 / 6.0, dtype=torch.float32).item()


def round_bf16(x):
    return x.to(torch.bfloat16).to(torch.float32)


def _pow2(k):
    return torch.ldexp(torch.ones_like(k, dtype=torch.float32), k.to(torch.int32))


def _grid_round(x, mant_bits, min_exp):
    """RNE onto a float grid with `mant_bits` mantissa bits and subnormals below 2^min_exp."""
    a = x.abs()
    _, e = torch.frexp(a)  # a = m * 2^e, m in [0.5, 1)
    e = torch.clamp(e.to(torch.int32) - 1, min=min_exp)
    quantum = _pow2(e - mant_bits)
    return torch.copysign(torch.round(a / quantum) * quantum, x)


def e4m3_round(x):
    """x already clamped to +-448."""
    return _grid_round(x, 3, -6)


def e2m1_round(x):
    """x already clamped to +-6: the grid {0, .5, 1, 1.5, 2, 3, 4, 6}, ties to the even code."""
    return _grid_round(x, 1, 0)


def pow2_scale_exponent(amax, max_inv):
    """ceil(log2(amax * max_inv)) from the fp32 product, as the reference's fast_round_scale."""
    v = amax.to(torch.float32) * torch.tensor(max_inv, dtype=torch.float32)
    m, e = torch.frexp(v)
    e = e.to(torch.int32)
    return torch.where(m == 0.5, e - 1, e)


def _blocks(x, block):
    assert x.shape[-1] % block == 0, f"last dim {x.shape[-1]} not a multiple of {block}"
    return x.reshape(*x.shape[:-1], x.shape[-1] // block, block)


def fp8_act_quant(x, block=32):
    """-> (e4m3 values [.., n], scales [.., n/block]); qdq = bf16(values * scales)."""
    xb = _blocks(round_bf16(x.float()), block)
    amax = xb.abs().amax(-1, keepdim=True).clamp_min(1e-4)
    s = _pow2(pow2_scale_exponent(amax, INV_448))
    q = e4m3_round(torch.clamp(xb / s, -FP8_MAX, FP8_MAX))
    return q.reshape(x.shape), s.squeeze(-1)


def fp8_qdq(x, block=32):
    xb = _blocks(round_bf16(x.float()), block)
    amax = xb.abs().amax(-1, keepdim=True).clamp_min(1e-4)
    s = _pow2(pow2_scale_exponent(amax, INV_448))
    q = e4m3_round(torch.clamp(xb / s, -FP8_MAX, FP8_MAX))
    return round_bf16(q * s).reshape(x.shape)


def fp4_e4m3_qdq(x):
    """Compressed KV rows: FP4 with one e4m3 scale per 16."""
    xb = _blocks(round_bf16(x.float()), 16)
    amax = xb.abs().amax(-1, keepdim=True).clamp_min(6.0 * 2.0 ** -9)
    s = e4m3_round(torch.clamp(amax / FP4_MAX, -FP8_MAX, FP8_MAX))
    q = e2m1_round(torch.clamp(xb / s, -FP4_MAX, FP4_MAX))
    return round_bf16(q * s).reshape(x.shape)


def fp4_ue8m0_qdq(x):
    """Indexer keys and queries: FP4 with one UE8M0 scale per 32."""
    xb = _blocks(round_bf16(x.float()), 32)
    amax = xb.abs().amax(-1, keepdim=True).clamp_min(6.0 * 2.0 ** -126)
    s = _pow2(pow2_scale_exponent(amax, INV_6))
    q = e2m1_round(torch.clamp(xb / s, -FP4_MAX, FP4_MAX))
    return round_bf16(q * s).reshape(x.shape)


# ---- weights -------------------------------------------------------------------------------------

def fp8_block_weight(w, block=32):
    """[out, in] -> (e4m3 values [out, in], scale exponents [out/32, in/32]): 32x32 blocks,
    s = 2^ceil(log2(amax / 448)), q = e4m3(w / s)."""
    o, i = w.shape
    assert o % block == 0 and i % block == 0, f"FP8 weight {tuple(w.shape)} not in whole 32x32 blocks"
    wb = w.float().reshape(o // block, block, i // block, block)
    amax = wb.abs().amax(dim=(1, 3), keepdim=True).clamp_min(1e-30)
    k = pow2_scale_exponent(amax, INV_448)
    q = e4m3_round(torch.clamp(wb / _pow2(k), -FP8_MAX, FP8_MAX))
    return q.reshape(o, i), k.reshape(o // block, i // block)


def fp8_block_dequant(q, k, block=32):
    s = _pow2(k).repeat_interleave(block, 0).repeat_interleave(block, 1)
    return q * s


def fp4_row_weight(w):
    """[.., out, in] -> (e2m1 values, scale exponents [.., out, in/32]): one UE8M0 scale per row per 32."""
    wb = _blocks(w.float(), 32)
    amax = wb.abs().amax(-1, keepdim=True).clamp_min(1e-30)
    k = pow2_scale_exponent(amax, INV_6)
    q = e2m1_round(torch.clamp(wb / _pow2(k), -FP4_MAX, FP4_MAX))
    return q.reshape(w.shape), k.squeeze(-1)


def fp4_row_dequant(q, k):
    return (_blocks(q, 32) * _pow2(k).unsqueeze(-1)).reshape(q.shape)


def fp8_row_weight(w):
    """Engram tables: [rows, hd] -> (e4m3 values, scale exponents [rows, hd/32]) (the activation rule)."""
    q, s = fp8_act_quant(w)
    _, k = torch.frexp(s)
    return q, (k.to(torch.int32) - 1)


# ---- byte codes ----------------------------------------------------------------------------------

def e4m3_codes(v):
    """Exact e4m3 values -> uint8 codes (OCP e4m3fn)."""
    a = v.abs().float()
    sign = (torch.signbit(v).to(torch.int32) << 7)
    m, e = torch.frexp(a)
    e = e.to(torch.int32) - 1  # a = (2m) * 2^e, 2m in [1, 2)
    normal = a >= 2.0 ** -6
    exp_field = torch.where(normal, e + 7, torch.zeros_like(e))
    mant = torch.where(normal, torch.round((a / _pow2(e) - 1.0) * 8), torch.round(a * 512)).to(torch.int32)
    code = sign | (exp_field << 3) | mant
    return code.to(torch.uint8)


def e4m3_decode_table():
    t = torch.zeros(256, dtype=torch.float32)
    for c in range(256):
        e, m = (c >> 3) & 15, c & 7
        if e == 15 and m == 7:
            v = float("nan")
        elif e == 0:
            v = m * 2.0 ** -9
        else:
            v = (8 + m) * 2.0 ** (e - 10)
        t[c] = -v if c & 0x80 else v
    return t


E2M1_MAGS = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def e2m1_codes(v):
    a = v.abs()
    idx = torch.zeros_like(a, dtype=torch.int32)
    for i, mag in enumerate(E2M1_MAGS):
        idx = torch.where(a == mag, torch.full_like(idx, i), idx)
    return (idx | (torch.signbit(v).to(torch.int32) << 3)).to(torch.uint8)


def e2m1_decode_table():
    return torch.tensor([m for m in E2M1_MAGS] + [-m for m in E2M1_MAGS], dtype=torch.float32)


def pack_e2m1(codes):
    """[.., n] nibble codes -> [.., n/2] bytes, even element in the low nibble."""
    c = codes.to(torch.int32)
    return (c[..., 0::2] | (c[..., 1::2] << 4)).to(torch.uint8)


def unpack_e2m1(packed):
    p = packed.to(torch.int32)
    lo, hi = p & 15, (p >> 4) & 15
    return torch.stack([lo, hi], -1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)
