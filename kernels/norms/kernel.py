"""Row norms of the fused decode step and the prefill pass, one program per row (or per tile of (row, head) pairs),
float32 math.

``add_rms_norm_``: the residual add and the next pre-norm in one pass::

    h <- round(h + delta)                       (in place, h's dtype; skipped when delta is None)
    out = round(h * rsqrt(mean(h^2) + eps) * w')   w' = 1 + w (zero-centred, Qwen3.5) or w

``gated_rms_norm``: Qwen3.5's GDN output norm, per value head of width dv::

    out[r, h] = round(round(w * normalize(round(o[r, h]))) * silu(z[r, h]))

with each ``round`` a cast to the model dtype where the torch path (``GatedRMSNorm``) casts, so that in float32 the
two agree to reduction order. Both are CUDA-graph safe (no host sync, no allocation beyond ``out``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.pdl import launch_options, pdl_wait


@triton.jit
def _add_rms_norm_kernel(
    h_ptr,
    d_ptr,
    w_ptr,
    out_ptr,
    h_b,
    d_b,
    o_b,
    eps,
    N: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_DELTA: tl.constexpr,
    ZERO_CENTERED: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_wait(PDL)  # kernels/pdl.py: nothing the step's earlier kernels write is touched before the wait
    r = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    m = offs < N
    x = tl.load(h_ptr + r * h_b + offs, mask=m, other=0.0)
    if HAS_DELTA:
        d = tl.load(d_ptr + r * d_b + offs, mask=m, other=0.0)
        x = (x.to(tl.float32) + d.to(tl.float32)).to(h_ptr.dtype.element_ty)  # rounded as h + delta is
        tl.store(h_ptr + r * h_b + offs, x, mask=m)
    xf = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, axis=0) / N + eps)
    w = tl.load(w_ptr + offs, mask=m, other=0.0).to(tl.float32)
    if ZERO_CENTERED:
        w = w + 1.0
    tl.store(out_ptr + r * o_b + offs, (xf * rstd * w).to(out_ptr.dtype.element_ty), mask=m)


def add_rms_norm_(
    h: torch.Tensor,  # [n, N], updated in place when delta is given
    delta: torch.Tensor | None,  # [n, N] or None
    weight: torch.Tensor,  # [N]
    eps: float,
    *,
    zero_centered: bool = True,
    out: torch.Tensor | None = None,  # [n, N], h's dtype unless given
    pdl: bool | None = None,  # launch with PDL (kernels.pdl); None reads the process default: an engine passes a bool
) -> torch.Tensor:
    """h += delta (rounded to h's dtype), then out = rms_norm(h) * (1 + w) (or * w); returns out. See module doc."""
    n, N = h.shape
    assert h.stride(-1) == 1 and weight.shape == (N,), (h.shape, h.stride(), weight.shape)
    if delta is not None:
        assert delta.shape == h.shape and delta.stride(-1) == 1, (delta.shape, h.shape)
    if out is None:
        out = torch.empty_like(h)
    assert out.shape == h.shape and out.stride(-1) == 1
    if n == 0:
        return out
    _add_rms_norm_kernel[(n,)](
        h,
        h if delta is None else delta,
        weight,
        out,
        h.stride(0),
        0 if delta is None else delta.stride(0),
        out.stride(0),
        float(eps),
        N=N,
        BLOCK=triton.next_power_of_2(N),
        HAS_DELTA=delta is not None,
        ZERO_CENTERED=zero_centered,
        num_warps=4 if N <= 2048 else 8,
        **launch_options(pdl),
    )
    return out


@triton.jit
def _gated_rms_norm_kernel(
    o_ptr,
    z_ptr,
    w_ptr,
    out_ptr,
    o_b,
    o_h,
    z_b,
    out_b,
    n_heads,
    H,
    eps,
    D: tl.constexpr,
    BLOCK: tl.constexpr,
    ROWS: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_wait(PDL)  # kernels/pdl.py: nothing the step's earlier kernels write is touched before the wait
    i = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)  # [ROWS] (row, head) pairs, i = r * H + h
    r = i // H
    h = i % H
    offs = tl.arange(0, BLOCK)
    m = (i < n_heads)[:, None] & (offs < D)[None, :]  # [ROWS, BLOCK]
    dt = out_ptr.dtype.element_ty
    x = tl.load(o_ptr + (r * o_b + h * o_h)[:, None] + offs[None, :], mask=m, other=0.0).to(dt).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / D + eps)  # [ROWS]
    w = tl.load(w_ptr + offs, mask=offs < D, other=0.0).to(tl.float32)[None, :]
    y = (w * (x * rstd[:, None]).to(dt).to(tl.float32)).to(dt).to(tl.float32)
    z = tl.load(z_ptr + (r * z_b + h * D)[:, None] + offs[None, :], mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + (r * out_b + h * D)[:, None] + offs[None, :], (y * z * tl.sigmoid(z)).to(dt), mask=m)


def gated_rms_norm(
    o: torch.Tensor,  # [n, H, D] (any float dtype; float32 from the GDN kernel)
    z: torch.Tensor,  # [n, H * D], row stride free, unit column stride
    weight: torch.Tensor,  # [D], the model dtype
    eps: float,
    out: torch.Tensor | None = None,  # [n, H * D], weight's dtype unless given
    pdl: bool | None = None,  # launch with PDL (kernels.pdl); None reads the process default: an engine passes a bool
    rows: int | None = None,  # (row, head) pairs a program (a power of two); None: by size, see ``_rows``
) -> torch.Tensor:
    """out[r, h] = (w * rms_normalize(o[r, h])) * silu(z[r, h]) per head, rounded where GatedRMSNorm rounds."""
    n, H, D = o.shape
    assert z.shape == (n, H * D) and z.stride(-1) == 1 and o.stride(-1) == 1, (o.shape, z.shape)
    assert weight.shape == (D,)
    if out is None:
        out = torch.empty(n, H * D, dtype=weight.dtype, device=o.device)
    assert out.shape == (n, H * D) and out.stride(-1) == 1
    if n == 0:
        return out
    R = rows or _rows(n * H, D)
    assert R & (R - 1) == 0, R
    _gated_rms_norm_kernel[(triton.cdiv(n * H, R),)](
        o, z, weight, out, o.stride(0), o.stride(1), z.stride(0), out.stride(0), n * H, H, float(eps),
        D=D, BLOCK=triton.next_power_of_2(D), ROWS=R, num_warps=4, **launch_options(pdl),
    )  # fmt: skip
    return out


def _rows(pairs: int, D: int) -> int:
    """(row, head) pairs a program: one while there are few (a decode step's, each program one head), else a
    [rows, D] tile of ~1k elements (8 of 128 on the H200: 28 us for an 8192-token pass of 16 heads, against 101 us at
    one and 30 at 16; ``python -m models.bench.prefill_kernels``)."""
    if pairs <= 4096:
        return 1
    return max(1, min(16, 1024 // triton.next_power_of_2(D)))
