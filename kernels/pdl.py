"""Programmatic dependent launch (PDL, sm_90+) for the decode step's Triton kernels.

A kernel launched with PDL may start while the kernel before it on the stream is still running: its programs are
scheduled once every program of the previous kernel has signalled (``gdc_launch_dependents``) or exited, and each
waits (``gdc_wait``) until the previous kernel has completed and its writes are visible. In a graph of ~260 small
kernels this hides the launch and ramp-up of each kernel behind the tail of the one before, and lets a weight
stream read its first tile (constant for the whole step) before it waits.

The contract every kernel that takes ``PDL`` keeps: nothing it reads that an earlier kernel of the step writes, and
nothing it writes, is touched before ``gdc_wait`` (only weights are). Waiting is transitive: a kernel's wait returns
after the previous kernel completed, which itself waited for the one before. Kernels launched without PDL (torch's,
cuBLAS) wait for full completion as usual.

Supported on CUDA devices of compute capability >= 9 when Triton can launch with PDL, never in Triton's interpreter.
Each kernel wrapper takes ``pdl``: True or False (where unsupported, False either way), or None for the process
default, ``RESPLAN_PDL`` (on unless "0"), read at that launch: a convenience for standalone callers (tests,
benchmarks). An engine resolves it once, at construction (``KernelChoices.resolved``), and passes the bool down its
walks, so nothing on its step path reads the environment; a captured graph keeps what its launches were given.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from kernels.runtime import interpreted

try:  # Triton >= 3.3
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - older Triton: PDL stays off, the names are never traced
    gdc_launch_dependents = gdc_wait = None

@functools.cache
def _supported() -> bool:
    if interpreted() or gdc_wait is None:
        return False
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        return False
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:  # pragma: no cover
        return False
    return "launch_pdl" in getattr(CUDAOptions, "__dataclass_fields__", {})


def process_default() -> bool:
    """What None asks for: ``RESPLAN_PDL`` (on unless "0"), read from the environment at this call."""
    return os.environ.get("RESPLAN_PDL", "1") != "0"


def enabled(pdl: bool | None = None) -> bool:
    """Whether a launch asked for ``pdl`` (None: ``process_default()``) runs with PDL here."""
    asked = process_default() if pdl is None else pdl
    return asked and _supported()


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """In a kernel launched with ``launch_options()``: under PDL, let the next kernel launch and wait for the previous
    one to complete (its writes visible); without PDL nothing (the branch is static). Every PDL kernel calls it
    before its first access to memory another kernel of the step writes."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()


def launch_options(pdl: bool | None = None) -> dict:
    """Keyword arguments for a kernel launch asked for ``pdl`` (``enabled``): ``PDL`` (the kernel's constexpr) and
    Triton's ``launch_pdl``."""
    on = enabled(pdl)
    return {"PDL": True, "launch_pdl": True} if on else {"PDL": False}

