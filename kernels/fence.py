"""A release fence for kernels whose programs hand results to the last one of a group to finish (split-K's partial
sums, a row's chunk maxima): each program stores its partial, fences, then counts itself done with an acq_rel atomic;
the program that counts last reads every partial back from L2."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def release_fence(t):
    """``fence.acq_rel.gpu`` in every thread (``t`` only gives the asm a shape): the thread's earlier stores are
    visible GPU-wide before its later ones. Compiled only (Triton's interpreter runs programs one at a time)."""
    return tl.inline_asm_elementwise("fence.acq_rel.gpu; mov.b32 $0, $1;", "=r,r", [t], dtype=tl.int32,
                                     is_pure=False, pack=1)  # fmt: skip
