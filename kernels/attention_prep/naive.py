"""The attention prologue in plain torch: partial RoPE (NeoX half-rotation on the leading channels), the paged K/V
write, and the reference of the fused prologue kernel built from them. The model's attention uses this math."""

from __future__ import annotations

import torch

from kernels.norms.naive import rms_normalize


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """[x1, x2] -> [-x2, x1] on the last dim."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [n, h, d]; cos, sin [n, r]: x[..., :r] * cos + rotate_half(x[..., :r]) * sin, x[..., r:] unchanged."""
    r = cos.shape[-1]
    rot, rest = x[..., :r], x[..., r:]
    cos, sin = cos[:, None, :], sin[:, None, :]  # [n, 1, r]
    return torch.cat([rot * cos + rotate_half(rot) * sin, rest], dim=-1)


def write_kv(kv: torch.Tensor, write_loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """kv[loc // ps, :, loc % ps] = (k, v) for each token. kv [pages, 2, ps, h, d]; write_loc [n]; k, v [n, h, d]."""
    ps = kv.shape[2]
    loc = write_loc.long()
    page, off = loc // ps, loc % ps
    kv[page, 0, off] = k.to(kv.dtype)
    kv[page, 1, off] = v.to(kv.dtype)


def attention_prep_ref(qkv, q_weight, k_weight, cos, sin, kv, write_loc, num_q_heads, eps, q_out=None):
    """GatedAttention._qkv's norms and RoPE on the fused projection, K/V written at write_loc; returns q."""
    n = qkv.shape[0]
    hq, hk, d = num_q_heads, kv.shape[3], kv.shape[4]
    q = qkv[:, : hq * 2 * d].reshape(n, hq, 2 * d)[..., :d]
    k = qkv[:, hq * 2 * d : hq * 2 * d + hk * d].reshape(n, hk, d)
    v = qkv[:, hq * 2 * d + hk * d :].reshape(n, hk, d)

    def norm(x, w):
        return rms_normalize(x, eps, 1.0 + w.float()).to(x.dtype)

    q = _rope_f32(norm(q, q_weight), cos, sin)
    k = _rope_f32(norm(k, k_weight), cos, sin)
    write_kv(kv, write_loc, k, v)
    return q if q_out is None else q_out.copy_(q)


def _rope_f32(x, cos, sin):
    """apply_partial_rope in float32, cast back once (the kernel rounds once where the torch path rounds thrice)."""
    return apply_partial_rope(x.float(), cos.float(), sin.float()).to(x.dtype)
