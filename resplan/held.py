"""A graph launch, an event record and a host-to-device copy that keep the interpreter: the CUDA runtime called through
``ctypes.PyDLL``.

torch's ``CUDAGraph.replay`` and ``Event.record`` let the interpreter (the GIL) go around their CUDA call. Where
another thread of the process wants it (an in-process server's front end, any busy host), each such call hands it
over, and the caller waits to take it back for as long as that thread keeps it: up to the interpreter's switch
interval, 5 ms. A decode launch made two such calls a step (the replay, then the record of its readback's event).
``HeldCuda`` makes both through the ``libcudart`` torch itself loaded, with the interpreter held; each is a few
microseconds of host time, shorter than a hand-over. torch's asynchronous copy from pinned memory lets it go too;
``copy_h2d`` is one that does not, which ``Executor(held=...)`` flushes through. (The engine's copies stay torch's:
held, they gained its resident arm nothing measurable, and on a busy host at 64 requests its first tokens tended to
come later: models/bench/results/decode-floor-h200/held-copies-h100/.)

What a launch here leaves out of torch's replay: advancing torch's CUDA generators (its replay prologue), so a graph
launched here must draw no numbers from them (the engine's sampler hashes its own noise: ``models.engine.sampler``).
"""

from __future__ import annotations

import ctypes
import functools
import os
import warnings

import torch


def runtime_path(maps: str) -> str | None:
    """The CUDA runtime library (a ``libcudart.so*`` file) among the mappings of a ``/proc/<pid>/maps`` text, or
    None."""
    for line in maps.splitlines():
        fields = line.split(None, 5)
        if len(fields) == 6 and os.path.basename(fields[5].strip()).startswith("libcudart.so"):
            return fields[5].strip()
    return None


H2D = 1  # cudaMemcpyHostToDevice


def device_index(device: torch.device) -> int:
    """``device``'s index for ``current_raw_stream``: its own, else (CUDA without one) the current device's; 0 off
    CUDA."""
    if device.index is not None:
        return device.index
    return torch.cuda.current_device() if device.type == "cuda" else 0


def current_raw_stream(device: int) -> int:
    """The raw ``cudaStream_t`` of ``device``'s current stream: torch's ``current_stream(device).cuda_stream`` without
    building a ``torch.cuda.Stream`` (0.13 against 2.05 us a call on an H100 machine's host)."""
    return torch._C._cuda_getCurrentRawStream(device)


class HeldCuda:
    """``launch(graph_exec, stream)``, ``record(event, stream)`` and ``copy_h2d(dst, src, nbytes, stream)`` on raw CUDA
    handles and addresses (ints), the interpreter held. A failed call raises RuntimeError with the runtime's words."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        """``lib``: the CUDA runtime, loaded as ``ctypes.PyDLL`` (its calls keep the interpreter)."""
        self._launch = lib.cudaGraphLaunch
        self._record = lib.cudaEventRecord
        for f in (self._launch, self._record):
            f.argtypes, f.restype = (ctypes.c_void_p, ctypes.c_void_p), ctypes.c_int
        self._copy = lib.cudaMemcpyAsync
        self._copy.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)
        self._copy.restype = ctypes.c_int
        self._words = lib.cudaGetErrorString
        self._words.argtypes, self._words.restype = (ctypes.c_int,), ctypes.c_char_p

    @staticmethod
    @functools.cache
    def load() -> HeldCuda | None:
        """The process's CUDA runtime (the one torch loaded: call after CUDA is initialised), or None with a warning
        where it is not a shared library of its own (linked into torch): launches then let the interpreter go."""
        with open("/proc/self/maps") as f:
            path = runtime_path(f.read())
        if path is None:
            warnings.warn("no libcudart among this process's libraries: graph launches and event records go through "
                          "torch and let the interpreter go each time (slower on a busy host)",
                          RuntimeWarning, stacklevel=2)  # fmt: skip
            return None
        return HeldCuda(ctypes.PyDLL(path))

    def launch(self, graph_exec: int, stream: int) -> None:
        """``cudaGraphLaunch``: the instantiated graph ``graph_exec`` on ``stream`` (0: the legacy default stream)."""
        rc = self._launch(graph_exec, stream)
        if rc:
            raise RuntimeError(f"cudaGraphLaunch failed: {self._words(rc).decode()} (error {rc})")

    def copy_h2d(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        """``cudaMemcpyAsync`` host to device: ``nbytes`` from pinned host address ``src`` to device address ``dst``, on
        ``stream``. (torch's non-blocking copy also records an event for its pinned-block cache, and lets the
        interpreter go.)"""
        rc = self._copy(dst, src, nbytes, H2D, stream)
        if rc:
            raise RuntimeError(f"cudaMemcpyAsync failed: {self._words(rc).decode()} (error {rc})")

    def record(self, event: int, stream: int) -> None:
        """``cudaEventRecord``: ``event`` (made: a torch event recorded once by torch) marks ``stream``'s work."""
        rc = self._record(event, stream)
        if rc:
            raise RuntimeError(f"cudaEventRecord failed: {self._words(rc).decode()} (error {rc})")
