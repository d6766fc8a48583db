"""General CUDA utilities the executor's users capture steps with: ``Graph`` (a captured callable, or its eager replay
on a CPU), ``distinct_streams`` (capture streams that are pairwise distinct) and ``run_on`` (eager work on a capture
stream before its capture)."""

from __future__ import annotations

import gc
import warnings
from collections.abc import Callable

import torch

from resplan.held import HeldCuda

POOL_STREAMS = 32  # the streams of one priority that torch.cuda.Stream() hands out in turn (c10's kStreamsPerPool)


def distinct_streams(device: torch.device, n: int) -> tuple[torch.cuda.Stream, ...]:
    """``n`` CUDA streams, pairwise distinct and none of them the current stream or ``torch.cuda.graph``'s default
    capture stream. ``torch.cuda.Stream()`` hands out the streams of a pool of 32 in turn, so two streams drawn 32
    draws apart are one stream: graphs that may replay at the same time need capture streams drawn this way (Graph)."""
    taken = {torch.cuda.current_stream(device)}
    if torch.cuda.graph.default_capture_stream is not None:
        taken.add(torch.cuda.graph.default_capture_stream)
    out: list[torch.cuda.Stream] = []
    for _ in range(2 * POOL_STREAMS):
        s = torch.cuda.Stream(device)
        if s not in taken:
            out.append(s)
            taken.add(s)
            if len(out) == n:
                return tuple(out)
    raise RuntimeError(f"{2 * POOL_STREAMS} draws from torch's stream pool gave {len(out)} of {n} distinct streams")


def default_capture_stream(device: torch.device) -> torch.cuda.Stream:
    """``torch.cuda.graph``'s default capture stream (made as torch makes it, where no capture has made it yet)."""
    if torch.cuda.graph.default_capture_stream is None:
        torch.cuda.graph.default_capture_stream = torch.cuda.Stream(device)
    return torch.cuda.graph.default_capture_stream


def run_on(stream: torch.cuda.Stream | None, fn: Callable[[], object]) -> object:
    """``fn()`` on ``stream``, ordered after the caller's stream's work and before its later work; returns its value
    (``stream`` None, as on a CPU: ``fn()`` where it is called). Eager work before a capture on ``stream`` runs here,
    so that what it makes lazily per stream is made outside the capture (Graph)."""
    if stream is None:
        return fn()
    current = torch.cuda.current_stream(stream.device)
    stream.wait_stream(current)
    with torch.cuda.stream(stream):
        out = fn()
    current.wait_stream(stream)
    return out


class Graph:
    """``torch.cuda.CUDAGraph`` of ``fn`` on CUDA; on the CPU an eager replay of the same callable."""

    def __init__(self, fn: Callable[[], None], device: torch.device, pool=None, warmup: int = 1,
                 stream: torch.cuda.Stream | None = None) -> None:  # fmt: skip
        """``stream``: the capture stream (None: torch's default one). A captured GEMM keeps the cuBLAS workspace of
        the stream it was captured on (torch keys workspaces by handle and stream), so graphs that may replay at
        the same time on two streams must be captured on two streams: else their split-K partials and semaphores
        share memory, and the two replays can hang each other. The warm-up runs on the capture stream, so that the
        stream's workspaces (cuBLAS's, the GEMV's split-K one) are made by it and not during the capture: made
        during a capture, a workspace lives in the graph's private pool, where the intermediates of graphs captured
        earlier in the same pool alias it, and their replays overwrite it (``run_on``)."""
        self.fn = fn
        self.device = device
        self.graph = None
        self._exec: int | None = None  # the instantiated graph's cudaGraphExec_t, once launched through HeldCuda
        self.stream = stream
        if device.type == "cuda":
            self.stream = stream = stream or default_capture_stream(device)
            for _ in range(warmup):
                run_on(stream, fn)
            self.graph = self._capture(fn, pool, stream=stream)

    @staticmethod
    def _capture(fn: Callable[[], None], pool, attempts: int = 2, *, new_graph=None, capturing=None, stream=None):
        """Capture ``fn`` with the garbage collector paused (a collection during capture can free CUDA objects of
        dead engines, e.g. pinned buffers, whose release is not capture-safe). A capture that CUDA reports
        invalidated is retried once, with a warning, and a second failure raises: a capture made after other engines'
        work in the same process is, rarely, invalidated for a cause not pinned down."""
        new_graph = new_graph or torch.cuda.CUDAGraph  # both injectable: tests drive the retry on a CPU
        capturing = capturing or torch.cuda.graph
        for attempt in range(1, attempts + 1):
            graph = new_graph()
            collecting = gc.isenabled()
            gc.disable()
            try:
                # thread_local: an unsafe CUDA call made meanwhile by another thread must not invalidate this capture
                with capturing(graph, pool=pool, stream=stream, capture_error_mode="thread_local"):
                    fn()
                return graph
            except RuntimeError as e:
                if attempt == attempts or "capture" not in str(e):
                    raise
                warnings.warn(f"CUDA graph capture invalidated ({str(e).splitlines()[0]}); capturing again",
                              RuntimeWarning, stacklevel=3)  # fmt: skip
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
            finally:
                if collecting:
                    gc.enable()
        raise AssertionError("unreachable")

    @property
    def pool(self):
        return None if self.graph is None else self.graph.pool()

    def replay(self) -> None:
        if self.graph is None:
            self.fn()
        else:
            self.graph.replay()

    def launch(self, held: HeldCuda, stream: int) -> None:
        """``replay()`` on the stream whose raw handle is ``stream``, through ``held``: the interpreter kept
        (resplan.held; the graph must draw nothing from torch's CUDA generators). On a CPU, the eager replay."""
        if self.graph is None:
            self.fn()
            return
        if self._exec is None:  # (the handle lives as long as the graph: instantiated once, at capture's end)
            self._exec = self.graph.raw_cuda_graph_exec()
        held.launch(self._exec, stream)
