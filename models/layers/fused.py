"""Projections that share an input, run as one GEMM: their weights become row blocks of one fused weight.

``fused_weight(owner, name, *linears)`` concatenates the linears' weights once into ``W [sum(out_i), in]`` and re-points
each ``linear.weight`` at its block of W (a view), so ``state_dict``/``load_state_dict`` still read and write the same
storage and the fused GEMM ``x @ W^T`` sees every later weight update. The fusion is cached on ``owner`` and rebuilt
if a weight no longer lives in W (after ``.to()``, or a replaced parameter). Building allocates, so it must not happen
inside a CUDA-graph capture: call the model's ``fuse_projections()`` first (``build_adapter`` does).

Decode's GEMM dispatch is here too: ``decode_linear`` (the Triton weight stream where it was measured faster than
cuBLAS), and the forms with the op before the GEMM folded into its loads: ``decode_silu_mul_linear`` (SwiGLU's
silu_mul) and ``decode_normed_linear`` (the pre-norm, with the residual stream ``Residual`` it updates). Each takes
the step's ``KernelChoices`` (``kernels.choices``): which of those forms to take, and whether to launch with PDL.
"""

from __future__ import annotations

import attrs
import torch
import torch.nn.functional as F
from torch import nn

from kernels.choices import KernelChoices
from kernels.gates import silu_mul
from kernels.gemv import gemv, gemv_add_rms_norm, gemv_silu_mul
from kernels.norms import add_rms_norm_


def _is_fused(w: torch.Tensor, linears: tuple[nn.Linear, ...]) -> bool:
    """Every linear's weight is the matching row block of w."""
    row, offset = w.stride(0) * w.element_size(), 0
    for lin in linears:
        p = lin.weight
        if p.device != w.device or p.dtype != w.dtype or p.data_ptr() != w.data_ptr() + offset * row:
            return False
        offset += p.shape[0]
    return offset == w.shape[0]


def fused_weight(owner: nn.Module, name: str, *linears: nn.Linear) -> torch.Tensor:
    """The fused weight [sum(out_i), in] of ``linears`` (bias-free, one input width), built on first use."""
    cache = owner.__dict__.setdefault("_fused_weights", {})
    w = cache.get(name)
    if w is not None and _is_fused(w, linears):
        return w
    if any(lin.bias is not None for lin in linears) or len({lin.in_features for lin in linears}) != 1:
        raise ValueError(f"{name}: fuses bias-free linears of one input width only")
    if linears[0].weight.is_cuda and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"{name}: projections not fused before CUDA-graph capture; call fuse_projections() first")
    with torch.no_grad():
        w = torch.cat([lin.weight.detach() for lin in linears], dim=0)
    offset = 0
    for lin in linears:
        n = lin.weight.shape[0]
        lin.weight = nn.Parameter(w[offset : offset + n], requires_grad=lin.weight.requires_grad)
        offset += n
    cache[name] = w
    return w


def decode_linear(x: torch.Tensor, w: torch.Tensor, kc: KernelChoices) -> torch.Tensor:
    """x [M, K] @ w[N, K]^T for a decode step: the Triton weight stream (kernels.gemv) on CUDA where ``kc.streams``
    (by default the shapes where it was measured faster than cuBLAS, ``kernels.gemv.GEMV_CONFIGS``), else
    ``F.linear``."""
    if x.is_cuda and kc.streams(x.shape[0], w.shape[0], w.shape[1]):
        return gemv(x, w, pdl=kc.pdl)
    return F.linear(x, w)


def decode_silu_mul_linear(gu: torch.Tensor, w: torch.Tensor, kc: KernelChoices) -> torch.Tensor:
    """(silu(gu[:, :K]) * gu[:, K:]) @ w[N, K]^T for a decode step (gu [M, 2K], SwiGLU's gate|up output): on CUDA where
    ``kc.folds_silu_mul`` (measured faster), one kernel with silu_mul folded into its loads
    (kernels.gemv.gemv_silu_mul, equal to the two-step value bit for bit); else kernels.gates.silu_mul then
    ``decode_linear``."""
    if gu.is_cuda and kc.folds_silu_mul(gu.shape[0], w.shape[0], w.shape[1]):
        return gemv_silu_mul(gu, w, pdl=kc.pdl)
    return decode_linear(silu_mul(gu, pdl=kc.pdl), w, kc)


@attrs.define(eq=False)
class Residual:
    """The decode step's residual stream ``h`` [b, hidden] and a spare buffer of its shape. ``add_rms_norm_`` updates
    ``h`` in place; a pre-norm folded into the GEMM after it (kernels.gemv.gemv_add_rms_norm) cannot, its other
    programs still reading h, so it writes h + delta into the spare buffer, which becomes ``h`` (``swap``). Read ``h``
    after every sublayer; never keep a reference to an earlier one. Graph-safe: which buffer is current depends on
    shapes and flags only, and the spare is allocated (once, at capture) the first time a fold needs it."""

    h: torch.Tensor  # [b, hidden]
    spare: torch.Tensor | None = None  # [b, hidden], h's dtype; allocated on first use

    def take_spare(self) -> torch.Tensor:
        """The buffer that is not ``h`` (allocated the first time)."""
        if self.spare is None:
            self.spare = torch.empty_like(self.h)
        return self.spare

    def swap(self) -> None:
        """The spare buffer now holds the stream: make it ``h``."""
        self.h, self.spare = self.take_spare(), self.h


@attrs.frozen(eq=False)
class PendingNorm:
    """A pre-norm not yet applied: h <- round(h + delta) on the stream, x = rms_norm(h) * (1 + weight) (or * weight);
    its one consumer (``decode_normed_linear``) applies it, alone or folded into its GEMM. Apply it once."""

    res: Residual
    delta: torch.Tensor | None  # [b, hidden], the last sublayer's output, or None
    weight: torch.Tensor  # [hidden]
    eps: float
    zero_centered: bool = True

    def apply(self, kc: KernelChoices) -> torch.Tensor:
        """add_rms_norm_ on the stream (h updated in place): x [b, hidden]."""
        return add_rms_norm_(self.res.h, self.delta, self.weight, self.eps, zero_centered=self.zero_centered,
                             pdl=kc.pdl)  # fmt: skip


def norm_folds(p: PendingNorm, w: torch.Tensor, kc: KernelChoices) -> bool:
    """Whether ``decode_normed_linear(p, w, kc)`` runs as one kernel (gemv_add_rms_norm): on CUDA, where
    ``kc.folds_norm`` (one row, a shape where the fold is configured: ``kernels.gemv.NORM_CONFIGS``)."""
    return p.res.h.is_cuda and kc.folds_norm(p.res.h.shape[0], w.shape[0], w.shape[1])


def decode_normed_linear(x: torch.Tensor | PendingNorm, w: torch.Tensor, kc: KernelChoices) -> torch.Tensor:
    """x @ w[N, K]^T for a decode step, where x [b, K] may be a pre-norm not yet applied (``PendingNorm``): where
    ``norm_folds``, one kernel with the norm in its loads (kernels.gemv.gemv_add_rms_norm; the residual moves to the
    stream's spare buffer), else add_rms_norm_ (the residual updated in place) then ``decode_linear``. Both leave the
    updated residual in ``x.res.h``."""
    if isinstance(x, torch.Tensor):
        return decode_linear(x, w, kc)
    if norm_folds(x, w, kc):
        y = gemv_add_rms_norm(x.res.h, x.delta, x.weight, x.eps, w, x.res.take_spare(), zero_centered=x.zero_centered,
                              pdl=kc.pdl)  # fmt: skip
        x.res.swap()
        return y
    return decode_linear(x.apply(kc), w, kc)
