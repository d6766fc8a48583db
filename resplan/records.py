"""Immutable records: stream records and bucket plans (static, they key captured graphs), steps and flush programs."""

from __future__ import annotations

import attrs
import numpy as np

from resplan.layout import CELL_BYTES, StreamMode


@attrs.frozen
class ResidentStream:
    """How one resource is used by a bucket's decode walk: the stream label and whether rows append or only read."""

    label: str
    mode: StreamMode


@attrs.frozen(cache_hash=True)  # it keys the captured graphs a step looks up
class BucketPlan:
    """A captured decode bucket: its size, the stream record of every resource, and whether it needs a host plan
    (False when every attention of the bucket reads its pages off the gathered tables)."""

    size: int = attrs.field()
    streams: tuple[tuple[str, ResidentStream], ...] = attrs.field()  # (resource key, record), sorted by key
    host_plan_free: bool = attrs.field()

    @size.validator
    def _check_size(self, _attribute, value: int) -> None:
        if value <= 0:
            raise ValueError(f"bucket size must be > 0, got {value}")

    @classmethod
    def build(cls, size: int, streams: dict[str, ResidentStream], host_plan_free: bool) -> BucketPlan:
        return cls(size, tuple(sorted(streams.items())), host_plan_free)

    def stream(self, key: str) -> ResidentStream:
        for k, s in self.streams:
            if k == key:
                return s
        raise KeyError(f"bucket {self.size} has no stream for resource {key!r}")


def _handles(_inst, _attribute, value: np.ndarray) -> None:
    if not isinstance(value, np.ndarray) or value.ndim != 1 or value.dtype.kind not in "iu":
        raise ValueError(f"handles must be a 1-D integer numpy array, got {getattr(value, 'dtype', type(value))}")
    if value.size and value.min() < 0:
        raise ValueError(f"handles must be >= 0, got {value.min()}")
    # distinct handles are checked by the planner where it builds a slot row: an unchanged slot row of distinct
    # slots implies distinct handles, so a steady step pays nothing for it


@attrs.frozen(eq=False, slots=True)
class Step:
    """The rows a resident decode step runs (handles in row order), its bucket size, its plan sequence number, and the
    tokens each row runs in it (a graph of ``tokens`` sub-steps, each gathering the rows and committing +1)."""

    handles: np.ndarray = attrs.field(validator=_handles)  # [n] int, n <= bucket
    bucket: int = attrs.field()
    seq: int = attrs.field()
    tokens: int = 1  # (checked by the planner where it is not 1: no validator on the step path)

    @bucket.validator
    def _check_bucket(self, _attribute, value: int) -> None:
        if self.handles.size > value:
            raise ValueError(f"a step of {self.handles.size} rows does not fit bucket {value}")

    @classmethod
    def trusted(cls, handles: np.ndarray, bucket: int, seq: int, tokens: int = 1) -> Step:
        """The step without ``Step``'s checks (~3 us of a ~45 us host step), for a caller whose handles come from its
        own admission: a 1-D integer array of at most ``bucket`` handles, each >= 0. The planner still refuses a
        handle past its capacity, a repeated one where it builds a slot row and a bucket it did not capture."""
        step = object.__new__(cls)  # (a frozen class's fields set as its own __init__ does, without the checks)
        object.__setattr__(step, "handles", handles)
        object.__setattr__(step, "bucket", bucket)
        object.__setattr__(step, "seq", seq)
        object.__setattr__(step, "tokens", tokens)
        return step


_EMPTY = np.zeros(0, np.int32)
_EMPTY.flags.writeable = False


@attrs.frozen(eq=False, slots=False)  # a dict class: its frozen __init__ (13 fields) is ~0.8 us cheaper, per plan
class FlushProgram:
    """What the executor does before one replay, and nothing else.

    * ``slot_row``: the bucket's slot row, present only when it differs from the last one this bucket uploaded.
    * runs: whole-row writes, run i = ``run_cells[off_i : off_i + run_len[i]]`` into ``store[run_slot[i],
      run_col[i] : run_col[i] + run_len[i]]``; one H2D each.
    * staged cells: ``store.flat[staged_idx[k]] = staged_val[k]``, one H2D into the staging buffer, scattered in-graph.
    """

    bucket: int
    seq: int
    slot_row: np.ndarray | None = None  # [b] int32, 0 = trash row
    run_slot: np.ndarray = _EMPTY  # [R] int32
    run_col: np.ndarray = _EMPTY  # [R] int32
    run_len: np.ndarray = _EMPTY  # [R] int32
    run_cells: np.ndarray = _EMPTY  # [sum(run_len)] int32
    staged_idx: np.ndarray = _EMPTY  # [K] int (int32 range), slot * row_width + col
    staged_val: np.ndarray = _EMPTY  # [K] int32
    rows_whole: int = 0  # rows written whole (new, displaced earlier, stale)
    new_rows: int = 0  # rows that took a slot this step
    crossings: int = 0  # block-table cells staged because a row's token opens a page
    displaced: np.ndarray = _EMPTY  # [v] handles that lost their slot to this step

    @property
    def empty(self) -> bool:
        """True when the step needs no H2D at all."""
        return self.slot_row is None and self.run_len.size == 0 and self.staged_idx.size == 0

    @property
    def h2d_copies(self) -> int:
        return int(self.slot_row is not None) + int(self.run_len.size) + int(self.staged_idx.size > 0)

    @property
    def h2d_bytes(self) -> int:
        slot = 0 if self.slot_row is None else self.slot_row.size * CELL_BYTES
        staged = (2 + 2 * self.staged_idx.size) * CELL_BYTES if self.staged_idx.size else 0  # cells that matter
        return slot + int(self.run_cells.size) * CELL_BYTES + staged
