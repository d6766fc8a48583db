"""Elementwise gates of the fused decode step, float32 math, one rounding to the output dtype.

``silu_mul``: SwiGLU's middle, ``out = silu(gu[:, :I]) * gu[:, I:]`` on the one gate|up GEMM output [n, 2I].
``sigmoid_gate_mul``: Qwen3.5 attention's output gate, ``out[r, h] = o[r, h] * sigmoid(gate[r, h])`` where the gate of
head h sits beside its query in the fused projection: ``qkv[r, h * 2D + D : (h + 1) * 2D]``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.pdl import launch_options, pdl_wait

BLOCK_SILU = 1024


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, gu_b, out_b, INTER: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_wait(PDL)  # kernels/pdl.py: nothing the step's earlier kernels write is touched before the wait
    r = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = offs < INTER
    g = tl.load(gu_ptr + r * gu_b + offs, mask=m, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + r * gu_b + INTER + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + r * out_b + offs, (g * tl.sigmoid(g) * u).to(out_ptr.dtype.element_ty), mask=m)


def silu_mul(gu: torch.Tensor, out: torch.Tensor | None = None, *, pdl: bool | None = None) -> torch.Tensor:
    """gu [n, 2I] -> silu(gu[:, :I]) * gu[:, I:] [n, I] in gu's dtype (unless ``out`` says otherwise)."""
    n, two_i = gu.shape
    assert two_i % 2 == 0 and gu.stride(-1) == 1, (gu.shape, gu.stride())
    inter = two_i // 2
    if out is None:
        out = torch.empty(n, inter, dtype=gu.dtype, device=gu.device)
    assert out.shape == (n, inter) and out.stride(-1) == 1
    if n == 0:
        return out
    block = min(BLOCK_SILU, triton.next_power_of_2(inter))
    _silu_mul_kernel[(n, triton.cdiv(inter, block))](
        gu, out, gu.stride(0), out.stride(0), INTER=inter, BLOCK=block, num_warps=4, **launch_options(pdl)
    )
    return out


@triton.jit
def _sigmoid_gate_kernel(
    o_ptr, qkv_ptr, out_ptr, o_b, o_h, qkv_b, out_b, D: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr
):
    pdl_wait(PDL)  # kernels/pdl.py: nothing the step's earlier kernels write is touched before the wait
    r = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    offs = tl.arange(0, BLOCK)
    m = offs < D
    o = tl.load(o_ptr + r * o_b + h * o_h + offs, mask=m, other=0.0).to(tl.float32)
    gate = tl.load(qkv_ptr + r * qkv_b + h * 2 * D + D + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + r * out_b + h * D + offs, (o * tl.sigmoid(gate)).to(out_ptr.dtype.element_ty), mask=m)


def sigmoid_gate_mul(
    o: torch.Tensor,  # [n, H, D], the attention output
    qkv: torch.Tensor,  # [n, >= 2 H D], the fused projection: per head h, [query D | gate D] at h * 2D
    out: torch.Tensor | None = None,  # [n, H * D], o's dtype unless given
    pdl: bool | None = None,  # launch with PDL (kernels.pdl); None reads the process default: an engine passes a bool
) -> torch.Tensor:
    """out[r, h] = o[r, h] * sigmoid(gate[r, h]), flattened to [n, H * D] for o_proj."""
    n, H, D = o.shape
    assert o.stride(-1) == 1 and qkv.stride(-1) == 1 and qkv.shape[0] == n and qkv.shape[1] >= 2 * H * D
    if out is None:
        out = torch.empty(n, H * D, dtype=o.dtype, device=o.device)
    assert out.shape == (n, H * D) and out.stride(-1) == 1
    if n == 0:
        return out
    _sigmoid_gate_kernel[(n, H)](
        o, qkv, out, o.stride(0), o.stride(1), qkv.stride(0), out.stride(0),
        D=D, BLOCK=triton.next_power_of_2(D), num_warps=4, **launch_options(pdl),
    )  # fmt: skip
    return out
