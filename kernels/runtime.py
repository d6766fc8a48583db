"""Where the kernels run: compiled on a GPU, or in Triton's interpreter (``TRITON_INTERPRET`` set, how they run on a
CPU and in CI). Triton reads the variable where each kernel is defined (``triton.jit``, at the import of its module),
so it must be set before the kernels are imported, and a later change reaches no kernel: ``interpreted`` reads it
once a process as well, and launch paths ask it at no cost."""

from __future__ import annotations

import functools
import os


@functools.cache
def interpreted() -> bool:
    """Whether Triton kernels run in the interpreter (TRITON_INTERPRET set to anything but "" or "0"), read once."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
