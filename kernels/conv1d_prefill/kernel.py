"""Causal depthwise conv of a batched prefill, one kernel: ``models.layers.gdn.causal_conv1d_prefill_batch``'s
output, channels last.

``conv1d_prefill(xs, weight, T) -> out [R, T, C]``: xs [R, K + T, C] is each chunk's last K conv inputs (its state)
followed by its T_max (padded) inputs; out[r, t, c] = silu(sum_j weight[c, j] xs[r, t + 1 + j, c]), accumulated in
float32 and stored in xs's dtype. One program per (chunk, token block, channel block) loads the K shifted
[BLOCK_T, BLOCK_C] tiles (contiguous in channels). F.conv1d's generic depthwise kernel took 38 ms of a 64-prompt
prefill on the H200 (``models.bench.prefill_profile``); padding rows get junk, as there.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _conv1d_prefill_kernel(
    xs_ptr, w_ptr, out_ptr, T, C, xs_r, xs_t, o_r, o_t,
    K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0)
    t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)  # [BT]
    c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)  # [BC]
    c_ok = c < C
    mask = (t[:, None] < T) & c_ok[None, :]  # [BT, BC]
    acc = tl.zeros((BLOCK_T, BLOCK_C), dtype=tl.float32)
    for j in tl.static_range(K):
        x = tl.load(xs_ptr + r * xs_r + (t[:, None] + 1 + j) * xs_t + c[None, :], mask=mask, other=0.0)
        w = tl.load(w_ptr + c * K + j, mask=c_ok, other=0.0)
        acc += x.to(tl.float32) * w.to(tl.float32)[None, :]
    y = acc / (1.0 + tl.exp(-acc))  # silu
    tl.store(out_ptr + r * o_r + t[:, None] * o_t + c[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)


def conv1d_prefill(xs: torch.Tensor, weight: torch.Tensor, T: int, block_t: int = 32, block_c: int = 128
                   ) -> torch.Tensor:  # fmt: skip
    """xs [R, K + T, C] contiguous, weight [C, K] -> silu(causal depthwise conv) [R, T, C] in xs's dtype."""
    R, KT, C = xs.shape
    K = weight.shape[1]
    if KT != K + T or not xs.is_contiguous():
        raise ValueError(f"xs must be contiguous [R, K + T, C] = [R, {K + T}, C], got {tuple(xs.shape)}")
    out = torch.empty(R, T, C, dtype=xs.dtype, device=xs.device)
    grid = (R, triton.cdiv(T, block_t), triton.cdiv(C, block_c))
    _conv1d_prefill_kernel[grid](xs, weight.contiguous(), out, T, C, xs.stride(0), xs.stride(1), out.stride(0),
                                 out.stride(1), K=K, BLOCK_T=block_t, BLOCK_C=block_c)  # fmt: skip
    return out
