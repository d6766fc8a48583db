"""Which forms a model's kernels take, in the decode step and in the prefill pass: one value, fixed when a step is
built (an engine's, a benchmark's variant, a test's) and passed down the model's walks, instead of module or model
state a caller mutates.

A captured graph keeps the choices it was captured with; two engines in one process may differ.
"""

from __future__ import annotations

import enum

import attrs

from kernels import pdl as _pdl
from kernels.gemv import MAX_ROWS, gemv_wins, norm_fold_wins, silu_mul_fold_wins


class GemvPick(enum.Enum):
    """Where a decode GEMM runs as the Triton weight stream (``kernels.gemv``) instead of cuBLAS."""

    MEASURED = "measured"  # the shapes where it was measured faster (kernels.gemv.GEMV_CONFIGS)
    EVERY = "every"  # every skinny GEMM (<= MAX_ROWS rows), default configs where unmeasured: a what-if
    NEVER = "never"  # none: cuBLAS everywhere


@attrs.frozen
class KernelChoices:
    """PDL launches, the two one-row folds into the weight stream, where the weight stream runs at all, and which
    path the model's decode and prefill take (its Triton / CUDA kernels or the torch references)."""

    pdl: bool | None = None  # launch with programmatic dependent launch; None: the process default (``resolved``)
    fold_silu_mul: bool = True  # SwiGLU's silu_mul folded into the down GEMM where measured (SILU_MUL_CONFIGS)
    fold_norm: bool = True  # a sublayer's pre-norm folded into its first GEMM where configured (NORM_CONFIGS)
    gemv: GemvPick = GemvPick.MEASURED
    fused_decode: bool | None = None  # decode on the Triton kernels (fused step, GDN conv/delta rule); None: on CUDA
    prefill_kernels: bool | None = None  # prefill mixers on fla-core / FlashInfer; None: CUDA weights in 16 bits
    prefill_fused: bool | None = None  # prefill's row-wise work on our Triton kernels; None: where weights are on CUDA
    row_kernels: bool | None = None  # the executor's in-graph row ops (scatter, gather, commit: kernels.rows) on
    # Triton, else their torch references; None: on CUDA (off it, Triton's interpreter is for the kernels' own tests)
    argmax: bool | None = None  # greedy steps draw with kernels.argmax, else torch's argmax; None: on CUDA (the
    # kernel measured 0.5-1.6% off the H100's step at 1-64 rows; off it, the interpreter is for the kernel's own tests)
    sampler: bool | None = None  # sampled steps (and prefills' first tokens) draw with kernels.sample, else torch's
    # topk and its ~20 ops; None: on CUDA

    def streams(self, rows: int, n: int, k: int) -> bool:
        """Whether the GEMM [rows, k] x [n, k]^T runs as the weight stream."""
        if self.gemv is GemvPick.MEASURED:
            return gemv_wins(rows, n, k)
        return self.gemv is GemvPick.EVERY and 1 <= rows <= MAX_ROWS

    def folds_silu_mul(self, rows: int, n: int, k: int) -> bool:
        """Whether silu_mul folds into this down GEMM (``kernels.gemv.gemv_silu_mul``)."""
        return self.fold_silu_mul and silu_mul_fold_wins(rows, n, k)

    def folds_norm(self, rows: int, n: int, k: int) -> bool:
        """Whether the pre-norm folds into this GEMM (``kernels.gemv.gemv_add_rms_norm``)."""
        return self.fold_norm and norm_fold_wins(rows, n, k)

    def runs_row_kernels(self, cuda: bool) -> bool:
        """Whether an engine (on CUDA or not) runs its executor's row ops on Triton (``row_kernels``)."""
        return self.row_kernels if self.row_kernels is not None else cuda

    def draws_argmax_kernel(self, cuda: bool) -> bool:
        """Whether a greedy step (on CUDA or not) draws its tokens with ``kernels.argmax`` (``argmax``)."""
        return self.argmax if self.argmax is not None else cuda

    def draws_sample_kernel(self, cuda: bool) -> bool:
        """Whether sampled draws (on CUDA or not) run ``kernels.sample`` (``sampler``)."""
        return self.sampler if self.sampler is not None else cuda

    def launches_pdl(self) -> bool:
        """Whether the step's kernels launch with PDL on this machine (never in the interpreter or off sm_90+)."""
        return _pdl.enabled(self.pdl)

    def resolved(self) -> KernelChoices:
        """These choices with ``pdl`` None turned into the process default (``RESPLAN_PDL``, read here): what an engine
        keeps from its construction on, so that no launch of its steps reads the environment."""
        return self if self.pdl is not None else attrs.evolve(self, pdl=_pdl.process_default())


DEFAULT = KernelChoices()  # what a decode walk takes when its caller passes nothing
