"""Where the kernels run: compiled on a GPU, or in Triton's interpreter (``TRITON_INTERPRET`` set, how they run on a
CPU and in CI). Read at import by ``triton.jit``, so it must be set before the kernels are imported."""

from __future__ import annotations

import os


def interpreted() -> bool:
    """Whether Triton kernels run in the interpreter (TRITON_INTERPRET set to anything but "" or "0")."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
