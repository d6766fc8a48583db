"""The executor: the device store, a pinned stager ring, ``flush(program)``, and the in-graph part of a step.

Host side, before a replay: ``flush`` turns a ``FlushProgram`` into H2D copies on the step's stream, in order: the
slot row (if changed), one copy per whole-row run, one copy of the staged cells. In the graph: ``scatter`` the staged
cells into the store, ``gather`` the step's rows by the slot row into the bucket's ``StepBuffers``, the forward,
``commit`` +1 to every APPEND length of the real rows. A steady step's program is empty: no H2D at all.

The in-graph ops are ``kernels.rows``, which take plain tensors and integers: the executor describes its layout's
columns and its buffers to them once, at construction (``row_columns``, ``gather_targets``).
"""

from __future__ import annotations

import enum

import attrs
import numpy as np
import torch

import kernels.rows as rows
from kernels.runtime import interpreted
from resplan.buffers import StepBuffers
from resplan.held import HeldCuda, current_raw_stream, device_index
from resplan.layout import SAMPLER_CELLS, RowLayout, StreamMode
from resplan.pinned import PinnedRing, host_zeros
from resplan.records import FlushProgram


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
    if impl is KernelImpl.TRITON:
        return rows.scatter_cells, rows.gather_rows, rows.commit_lengths
    return rows.scatter_cells_ref, rows.gather_rows_ref, rows.commit_lengths_ref


def row_columns(layout: RowLayout) -> rows.RowColumns:
    """Where ``kernels.rows.gather_rows`` finds each piece of a row of ``layout`` (-1: a cell the layout lacks)."""
    pools = tuple(rows.PoolSpan(sp.start, sp.width, layout.len_col(sp.pool), sp.page_size,
                                sp.mode is StreamMode.APPEND) for sp in layout.spans)  # fmt: skip
    pos = layout.positions_pool
    return rows.RowColumns(
        width=layout.width, pools=pools, pos_len_col=-1 if pos is None else layout.len_col(pos),
        pos_col=-1 if pos is None else layout.pos_col, rec_col=layout.rec_col if layout.recurrent else -1,
        sampler_col=layout.sampler_col if layout.sampler else -1, sampler_cells=len(SAMPLER_CELLS),
    )  # fmt: skip


def gather_targets(layout: RowLayout, bufs: StepBuffers) -> rows.GatherTargets:
    """``bufs`` as the buffers ``kernels.rows.gather_rows`` fills, each pool's in ``layout``'s order (views: the
    same memory)."""
    keys = [sp.pool for sp in layout.spans]
    return rows.GatherTargets(
        size=bufs.size, block_tables=tuple(bufs.block_tables[k] for k in keys),
        seq_lens=tuple(bufs.seq_lens[k] for k in keys), write_loc=tuple(bufs.write_loc.get(k) for k in keys),
        positions=bufs.positions, recurrent_slots=bufs.recurrent_slots, sampler=bufs.sampler,
    )  # fmt: skip


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
        held: HeldCuda | None = None,
    ) -> None:
        """``held``: issue the flush's copies and mark them through it (resplan.held: the interpreter kept, none of
        torch's per-copy bookkeeping; the current device's only); None: through torch."""
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
        self.columns = row_columns(layout)  # the gather's view of a row
        self.targets = {b: gather_targets(layout, bufs) for b, bufs in self.buffers.items()}  # its view of the buffers
        self.len_cols = tuple(layout.len_col(p.key) for p in layout.append_pools)
        # the stager ring: per entry a slot-row, a whole-rows and a staged-cells host buffer, with the views a flush
        # copies from made once here (a torch slice costs microseconds of host time)
        make = lambda pinned: _Stager.make(B, layout.width, self.staging_cap, bucket_sizes, pinned)  # noqa: E731
        self._ring = PinnedRing(ring, make, self.device.type == "cuda", held)
        self.held = held
        self._index = device_index(self.device)  # (the raw stream's device)
        # held copies name raw addresses: the device tensors', and each ring entry's host buffers', found once here
        self._store_ptr, self._staging_ptr = self.store.data_ptr(), self.staging.data_ptr()
        self._slot_ptrs = {b: t.data_ptr() for b, t in self.slot_rows.items()}
        self._host_ptrs = [(e.slot.data_ptr(), e.rows.data_ptr(), e.stage.data_ptr()) for e in self._ring.entries]
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
        if self.held is not None:
            return self._flush_held(program)
        _, st = self._ring.take()  # the copies that last read this entry, ring-1 flushes ago, are long done
        staged = self._write_host(st, program)
        if program.slot_row is not None:
            b = program.slot_row.size
            self.slot_rows[b].copy_(st.slot_views[b], non_blocking=True)
            self.copies += 1
        if program.run_len.size:
            buf = st.rows
            o = 0
            for slot, col, n in zip(program.run_slot.tolist(), program.run_col.tolist(), program.run_len.tolist(),
                                    strict=True):
                self.store[slot, col : col + n].copy_(buf[o : o + n], non_blocking=True)
                o += n
            self.copies += program.run_len.size
        if staged:
            self.staging.copy_(st.stage, non_blocking=True)  # fixed size: no slice on the step path
            self.copies += 1
        self.bytes += program.h2d_bytes
        self._ring.done()

    def _flush_held(self, program: FlushProgram) -> None:
        """``flush`` through resplan.held: the same copies, from the same host buffers, by raw address (int32 cells)."""
        i, st = self._ring.take()
        slot_src, rows_src, stage_src = self._host_ptrs[i]
        copy, s = self.held.copy_h2d, current_raw_stream(self._index)
        staged = self._write_host(st, program)
        if program.slot_row is not None:
            copy(self._slot_ptrs[program.slot_row.size], slot_src, 4 * program.slot_row.size, s)
            self.copies += 1
        if program.run_len.size:
            dst = (program.run_slot * self.width + program.run_col).tolist()  # [runs] the first cell of each run
            ns = program.run_len.tolist()
            o = 0
            for d, n in zip(dst, ns, strict=True):
                copy(self._store_ptr + 4 * d, rows_src + 4 * o, 4 * n, s)
                o += n
            self.copies += len(ns)
        if staged:
            copy(self._staging_ptr, stage_src, st.stage_np.nbytes, s)
            self.copies += 1
        self.bytes += program.h2d_bytes
        self._ring.done_on(s)

    def _write_host(self, st: _Stager, program: FlushProgram) -> int:
        """Write what the program copies into stager ``st``'s host buffers: its slot row, its runs' cells, and its k
        staged cells ([count, _, (flat index, value) * k]); returns k (0: no staging copy)."""
        if program.slot_row is not None:
            st.slot_np[: program.slot_row.size] = program.slot_row
        if program.run_len.size:
            st.rows_np[: program.run_cells.size] = program.run_cells
        k = program.staged_idx.size
        if k:
            if k > self.staging_cap:
                raise ValueError(f"{k} staged cells exceed the staging buffer's {self.staging_cap}")
            host = st.stage_np
            host[0] = k
            host[2 : 2 + 2 * k : 2] = program.staged_idx
            host[3 : 3 + 2 * k : 2] = program.staged_val
        return k

    # -- in the graph ------------------------------------------------------------------------------------------
    def before_forward(self, bucket: int) -> None:
        """Scatter the staged cells into the store, then gather the bucket's rows into its StepBuffers."""
        self._scatter(self.store, self.staging)
        self._gather(self.store, self.slot_rows[bucket], self.columns, self.targets[bucket])

    def after_forward(self, bucket: int) -> None:
        """+1 on the stored length of every APPEND pool for the bucket's real rows."""
        self._commit(self.store, self.slot_rows[bucket], self.len_cols)

    def store_numpy(self) -> np.ndarray:
        """A host copy of the store (debug: syncs)."""
        return self.store.cpu().numpy()
