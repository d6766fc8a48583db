"""Where the kernels run: compiled on a GPU, or in Triton's interpreter (``TRITON_INTERPRET`` set, how they run on a
CPU and in CI). Triton reads the variable where each kernel is defined (``triton.jit``, at the import of its module),
so it must be set before the kernels are imported, and a later change reaches no kernel: ``interpreted`` reads it
once a process as well, and launch paths ask it at no cost."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")


@functools.cache
def interpreted() -> bool:
    """Whether Triton kernels run in the interpreter (TRITON_INTERPRET set to anything but "" or "0"), read once."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def stream_workspace(what: str, make: Callable[[torch.device], T]) -> Callable[[torch.device], T]:
    """``workspace(device)``: what ``make(device)`` made for the current stream, made at its first use there and kept
    for the process (a graph captured with it holds its address). The launches of one stream run one after another
    (under PDL a kernel touches it only after its wait), so they share it; graphs that may replay at the same time
    must be captured on distinct streams, as for cuBLAS's workspace (resplan.Graph). Never made during a capture: it
    would live in the graph's private pool, where the intermediates of graphs captured earlier in that pool alias it
    (their replays overwrite it), and any zeroing would run only in that graph's replays. ``what`` names it in the
    error."""

    @functools.cache
    def made(device: torch.device, stream: int) -> T:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"the {what} of a stream is made before a capture on that stream, not during it: run "
                               "the work once on the capture stream first (resplan.Graph's warm-up, run_on)")
        return make(device)

    def workspace(device: torch.device) -> T:
        return made(device, torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0)

    return workspace
