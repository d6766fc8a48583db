"""A release fence for kernels whose last program to finish reads what the others stored (a count of done programs,
``tl.atomic_add`` with ``sem="acq_rel"``, orders the counting thread's own stores only)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def release_fence(t):
    """``fence.acq_rel.gpu`` in every thread (``t`` only gives the asm a shape): the thread's earlier stores are
    visible GPU-wide before its later ones. Compiled only (the interpreter runs programs one after another)."""
    return tl.inline_asm_elementwise("fence.acq_rel.gpu; mov.b32 $0, $1;", "=r,r", [t], dtype=tl.int32,
                                     is_pure=False, pack=1)  # fmt: skip
