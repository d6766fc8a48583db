"""The executor: the device store, a pinned stager ring, ``flush(program)``, and the in-graph part of a step.

Host side, before a replay: ``flush`` turns a ``FlushProgram`` into H2D copies on the step's stream, in order: the
slot row (if changed), one copy per whole-row run, one copy of the staged cells. In the graph: ``scatter`` the staged
cells into the store, ``gather`` the step's rows by the slot row into the bucket's ``StepBuffers``, the forward,
``commit`` +1 to every APPEND length of the real rows. A steady step's program is empty: no H2D at all.
"""

from __future__ import annotations

import enum
import gc
import warnings
from collections.abc import Callable

import attrs
import numpy as np
import torch

from kernels.runtime import interpreted
from resplan.buffers import StepBuffers
from resplan.layout import RowLayout
from resplan.pinned import PinnedRing, host_zeros
from resplan.records import FlushProgram

POOL_STREAMS = 32  # the streams of one priority that torch.cuda.Stream() hands out in turn (c10's kStreamsPerPool)


class KernelImpl(enum.Enum):
    """Which implementation runs the in-graph kernels."""

    TRITON = "triton"  # the Triton kernels (GPU, or the CPU under TRITON_INTERPRET=1)
    REFERENCE = "reference"  # their torch references (any device)

    @classmethod
    def default(cls, device: torch.device) -> KernelImpl:
        """Triton where it can run (CUDA, or Triton's interpreter: ``kernels.runtime.interpreted``), else the
        references."""
        if device.type == "cuda" or interpreted():
            return cls.TRITON
        return cls.REFERENCE


def _kernels(impl: KernelImpl):
    import kernels.rows as rows  # (when an executor is built: kernels.rows imports resplan's records back)

    if impl is KernelImpl.TRITON:
        return rows.scatter_cells, rows.gather_rows, rows.commit_lengths
    return rows.scatter_cells_ref, rows.gather_rows_ref, rows.commit_lengths_ref


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


class Graph:
    """``torch.cuda.CUDAGraph`` of ``fn`` on CUDA; on the CPU an eager replay of the same callable."""

    def __init__(self, fn: Callable[[], None], device: torch.device, pool=None, warmup: int = 1,
                 stream: torch.cuda.Stream | None = None) -> None:  # fmt: skip
        """``stream``: the capture stream (None: torch's default one). A captured GEMM keeps the cuBLAS workspace of
        the stream it was captured on (torch keys workspaces by handle and stream), so graphs that may replay at
        the same time on two streams must be captured on two streams: their split-K partials and semaphores would
        share memory otherwise (seen on the H200 as a hang)."""
        self.fn = fn
        self.device = device
        self.stream = stream
        self.graph = None
        if device.type == "cuda":
            if warmup:
                side = torch.cuda.Stream(device)
                side.wait_stream(torch.cuda.current_stream(device))
                with torch.cuda.stream(side):
                    for _ in range(warmup):
                        fn()
                torch.cuda.current_stream(device).wait_stream(side)
            self.graph = self._capture(fn, pool, stream=stream)

    @staticmethod
    def _capture(fn: Callable[[], None], pool, attempts: int = 2, *, new_graph=None, capturing=None, stream=None):
        """Capture ``fn`` with the garbage collector paused (a collection during capture can free CUDA objects of
        dead engines, e.g. pinned buffers, whose release is not capture-safe). An invalidated capture is retried once,
        with a warning; the second failure raises. Seen twice in the H200 test runs (a capture after other engines'
        tests in the same process); the cause is not pinned down."""
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


@attrs.frozen(eq=False)
class _Stager:
    """One ring entry of the executor's stager: host buffers for a slot row [B], B whole rows [B * width] and the whole
    staging buffer, with the numpy views and per-bucket slices a flush writes and copies from."""

    slot: torch.Tensor
    slot_views: dict[int, torch.Tensor]  # bucket -> slot[:b]
    rows: torch.Tensor
    stage: torch.Tensor
    slot_np: np.ndarray
    rows_np: np.ndarray
    stage_np: np.ndarray

    @classmethod
    def make(cls, B: int, width: int, staging_cap: int, buckets, pinned: bool) -> _Stager:
        slot, rows = host_zeros(B, torch.int32, pinned), host_zeros(B * width, torch.int32, pinned)
        stage = host_zeros(2 + 2 * staging_cap, torch.int32, pinned)
        return cls(slot, {b: slot[:b] for b in buckets}, rows, stage, slot.numpy(), rows.numpy(), stage.numpy())

    @property
    def nbytes(self) -> int:
        return 4 * (self.slot.numel() + self.rows.numel() + self.stage.numel())


class Executor:
    """Owns the store, the staging buffer, each bucket's slot row and StepBuffers, and the pinned stager ring.

    The stager is sized at build for the largest flush any capture can issue (B full rows, a slot row and a full
    staging buffer) and never grows on the step path.
    """

    def __init__(
        self,
        layout: RowLayout,
        bucket_sizes: list[int] | tuple[int, ...],
        device: torch.device | str = "cpu",
        impl: KernelImpl | None = None,
        ring: int = 4,
    ) -> None:
        self.device = torch.device(device)
        self.layout = layout
        self.impl = impl or KernelImpl.default(self.device)
        self._scatter, self._gather, self._commit = _kernels(self.impl)
        B = max(bucket_sizes)
        self.n_slots = 2 * B + 1
        self.width = layout.width
        i32 = dict(dtype=torch.int32, device=self.device)
        self.store = torch.zeros(self.n_slots, layout.width, **i32)  # [S, width], row 0 the trash row
        self.staging_cap = B * max(1, len(layout.append_pools))
        self.staging = torch.zeros(2 + 2 * self.staging_cap, **i32)  # [count, _, (flat idx, value) * cap]
        self.slot_rows = {b: torch.zeros(b, **i32) for b in bucket_sizes}  # [b], 0 = trash row
        self.buffers = {b: StepBuffers.allocate(layout, b, self.device) for b in bucket_sizes}
        self.len_cols = tuple(layout.len_col(p.key) for p in layout.append_pools)
        # the stager ring: per entry a slot-row, a whole-rows and a staged-cells host buffer, with the views a flush
        # copies from made once here (a torch slice costs microseconds of host time)
        self._ring = PinnedRing(ring, lambda pinned: _Stager.make(B, layout.width, self.staging_cap, bucket_sizes,
                                                                  pinned), self.device.type == "cuda")  # fmt: skip
        self.copies = 0  # H2D copies issued, all time
        self.bytes = 0  # H2D bytes issued, all time

    @property
    def stager_bytes(self) -> int:
        return sum(e.nbytes for e in self._ring.entries)

    # -- host side ---------------------------------------------------------------------------------------------
    def flush(self, program: FlushProgram) -> None:
        """Issue the program's H2D copies on the current stream, in step order. An empty program issues none."""
        if program.empty:
            return
        _, st = self._ring.take()  # the copies that last read this entry, ring-1 flushes ago, are long done
        if program.slot_row is not None:
            b = program.slot_row.size
            st.slot_np[:b] = program.slot_row
            self.slot_rows[b].copy_(st.slot_views[b], non_blocking=True)
            self.copies += 1
        if program.run_len.size:
            buf = st.rows
            st.rows_np[: program.run_cells.size] = program.run_cells
            o = 0
            for slot, col, n in zip(program.run_slot.tolist(), program.run_col.tolist(), program.run_len.tolist(),
                                    strict=True):
                self.store[slot, col : col + n].copy_(buf[o : o + n], non_blocking=True)
                o += n
            self.copies += program.run_len.size
        k = program.staged_idx.size
        if k:
            if k > self.staging_cap:
                raise ValueError(f"{k} staged cells exceed the staging buffer's {self.staging_cap}")
            host = st.stage_np
            host[0] = k
            host[2 : 2 + 2 * k : 2] = program.staged_idx
            host[3 : 3 + 2 * k : 2] = program.staged_val
            self.staging.copy_(st.stage, non_blocking=True)  # fixed size: no slice on the step path
            self.copies += 1
        self.bytes += program.h2d_bytes
        self._ring.done()

    # -- in the graph ------------------------------------------------------------------------------------------
    def before_forward(self, bucket: int) -> None:
        """Scatter the staged cells into the store, then gather the bucket's rows into its StepBuffers."""
        self._scatter(self.store, self.staging)
        self._gather(self.store, self.slot_rows[bucket], self.layout, self.buffers[bucket])

    def after_forward(self, bucket: int) -> None:
        """+1 on the stored length of every APPEND pool for the bucket's real rows."""
        self._commit(self.store, self.slot_rows[bucket], self.len_cols)

    def store_numpy(self) -> np.ndarray:
        """A host copy of the store (debug: syncs)."""
        return self.store.cpu().numpy()
