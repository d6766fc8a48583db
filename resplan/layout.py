"""Row layouts: which cells of a store row hold which piece of a decode request's state.

A row is the narrow cells (each KV pool's stored length, the position offset, the recurrent slot, the sampler's
scalars) followed by one block-table span per KV pool. Every cell is one int32; floats are bit-cast. A span's width is
derived from its pool, never configured: ``min(ceil(max_seq_len / page_size), usable_pages)``, since a stream's pages
are distinct pool pages and the pool therefore caps it.
"""

from __future__ import annotations

import enum
import math

import attrs
import numpy as np

CELL_DTYPE = np.int32  # one integer dtype for every cell of every row
CELL_BYTES = 4
SINK_PAGE = 0  # page 0 of every pool: padding rows read and write it
SINK_SLOT = 0  # recurrent slot 0: padding rows read and write it
TRASH_ROW = 0  # store row 0: all zero, what padding entries of a slot row point at

class SamplerCell(enum.IntEnum):
    """The sampler's cells of a row, in order (an index into them): temperature and top_p are float32 bit patterns.
    A token drawn at a position below MIN_POSITION is never one of the STOP cells' ids (-1: none): a request's
    ``min_tokens``. Sixteen in all (the row gather kernel moves a power of two)."""

    TEMPERATURE = 0
    TOP_P = 1
    TOP_K = 2  # 0 = off
    SEED = 3
    MIN_POSITION = 4  # 0: no minimum
    STOP_0 = 5  # .. STOP_10: the stop ids banned below MIN_POSITION, -1 padded
    STOP_1 = 6
    STOP_2 = 7
    STOP_3 = 8
    STOP_4 = 9
    STOP_5 = 10
    STOP_6 = 11
    STOP_7 = 12
    STOP_8 = 13
    STOP_9 = 14
    STOP_10 = 15


BANNED_STOPS = SamplerCell.STOP_10 - SamplerCell.STOP_0 + 1  # stop ids a row can ban while under its minimum


SAMPLER_CELLS = tuple(c.name.lower() for c in SamplerCell)  # their names, in order


class StreamMode(enum.Enum):
    """How a decode walk uses a pool: APPEND writes one token a row per step; READ only reads (cross-attn context)."""

    APPEND = "append"
    READ = "read"


class ColumnKind(enum.Enum):
    KV_LEN = "kv_len"  # stored tokens of a pool before this step (the step writes token KV_LEN)
    POS_OFFSET = "pos_offset"  # position = KV_LEN(positions pool) + offset
    RECURRENT_SLOT = "recurrent_slot"  # row of the recurrent-state pool (0 = sink)
    SAMPLER = "sampler"


def _positive(_inst, attribute, value) -> None:
    if value <= 0:
        raise ValueError(f"{attribute.name} must be > 0, got {value}")


@attrs.frozen
class KVPool:
    """A paged KV pool as the layout sees it. Page 0 is the sink page, so ``num_pages - 1`` pages are usable."""

    key: str
    page_size: int = attrs.field(validator=_positive)
    num_pages: int = attrs.field()
    max_seq_len: int = attrs.field(validator=_positive)
    mode: StreamMode = StreamMode.APPEND

    @num_pages.validator
    def _check_pages(self, _attribute, value: int) -> None:
        if value < 2:
            raise ValueError(f"pool {self.key!r}: num_pages must be >= 2 (page 0 is the sink), got {value}")

    @property
    def span_width(self) -> int:
        """Block-table cells a row holds: min(ceil(max_seq_len / page_size), num_pages - 1)."""
        return min(math.ceil(self.max_seq_len / self.page_size), self.num_pages - 1)


@attrs.frozen
class Column:
    """One narrow cell of a row."""

    name: str
    kind: ColumnKind
    index: int
    pool: str | None = None  # the KV pool a KV_LEN column belongs to


@attrs.frozen
class Span:
    """One pool's block-table cells: row[start : start + width] holds the stream's page ids in order."""

    pool: str
    start: int
    width: int
    page_size: int
    mode: StreamMode


@attrs.frozen
class RowLayout:
    """Narrow cells then one span per KV pool. Static: hashable, it keys captured graphs."""

    pools: tuple[KVPool, ...]
    positions_pool: str | None
    recurrent: bool
    sampler: bool
    columns: tuple[Column, ...] = attrs.field(init=False)
    spans: tuple[Span, ...] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        keys = [p.key for p in self.pools]
        if len(set(keys)) != len(keys):
            raise ValueError(f"pool keys must be distinct, got {keys}")
        if self.positions_pool is not None:
            if self.positions_pool not in keys:
                raise ValueError(f"positions name pool {self.positions_pool!r}, which is not one of {keys}")
            if self.pool(self.positions_pool).mode is not StreamMode.APPEND:
                raise ValueError(f"positions must ride an APPEND pool; {self.positions_pool!r} is only read")
        cols: list[Column] = []
        for p in self.pools:
            cols.append(Column(f"{p.key}.len", ColumnKind.KV_LEN, len(cols), p.key))
        if self.positions_pool is not None:
            cols.append(Column("pos_offset", ColumnKind.POS_OFFSET, len(cols)))
        if self.recurrent:
            cols.append(Column("recurrent_slot", ColumnKind.RECURRENT_SLOT, len(cols)))
        if self.sampler:
            for name in SAMPLER_CELLS:
                cols.append(Column(name, ColumnKind.SAMPLER, len(cols)))
        spans, start = [], len(cols)
        for p in self.pools:
            spans.append(Span(p.key, start, p.span_width, p.page_size, p.mode))
            start += p.span_width
        object.__setattr__(self, "columns", tuple(cols))
        object.__setattr__(self, "spans", tuple(spans))

    # -- sizes ---------------------------------------------------------------------------------------------------
    @property
    def narrow(self) -> int:
        """Narrow cells at the head of a row."""
        return len(self.columns)

    @property
    def width(self) -> int:
        """Cells in a row."""
        return self.narrow + sum(s.width for s in self.spans)

    @property
    def row_bytes(self) -> int:
        return self.width * CELL_BYTES

    def store_bytes(self, n_slots: int) -> int:
        return n_slots * self.row_bytes

    # -- lookups (build time only; the planner caches what it needs) ---------------------------------------------
    def pool(self, key: str) -> KVPool:
        for p in self.pools:
            if p.key == key:
                return p
        raise KeyError(f"unknown pool {key!r}; this layout has {[p.key for p in self.pools]}")

    def span(self, key: str) -> Span:
        for s in self.spans:
            if s.pool == key:
                return s
        raise KeyError(f"unknown pool {key!r}; this layout has {[p.key for p in self.pools]}")

    def len_col(self, key: str) -> int:
        self.pool(key)
        return next(c.index for c in self.columns if c.kind is ColumnKind.KV_LEN and c.pool == key)

    @property
    def pos_col(self) -> int | None:
        return next((c.index for c in self.columns if c.kind is ColumnKind.POS_OFFSET), None)

    @property
    def rec_col(self) -> int | None:
        return next((c.index for c in self.columns if c.kind is ColumnKind.RECURRENT_SLOT), None)

    @property
    def sampler_col(self) -> int | None:
        """First of the len(SAMPLER_CELLS) sampler cells."""
        return next((c.index for c in self.columns if c.kind is ColumnKind.SAMPLER), None)

    @property
    def append_pools(self) -> tuple[KVPool, ...]:
        return tuple(p for p in self.pools if p.mode is StreamMode.APPEND)

    @property
    def read_pools(self) -> tuple[KVPool, ...]:
        return tuple(p for p in self.pools if p.mode is StreamMode.READ)

    @property
    def append_keys(self) -> tuple[str, ...]:
        """The APPEND pools' keys, in order."""
        return tuple(p.key for p in self.append_pools)

    def describe(self, n_slots: int | None = None) -> str:
        """One line a log can print: cells by part, and bytes."""
        parts = [f"{self.narrow} narrow cells"] + [f"{s.width} {s.pool} pages ({s.mode.value})" for s in self.spans]
        text = f"row of {self.width} cells ({self.row_bytes} B): " + " + ".join(parts)
        if n_slots is not None:
            text += f"; {n_slots} slots, {self.store_bytes(n_slots) / 2**20:.2f} MiB"
        return text


def float_bits(x: np.ndarray | float) -> np.ndarray:
    """float32 values -> their int32 bit patterns (how a float travels in a cell)."""
    return np.asarray(x, dtype=np.float32).view(np.int32)


def bits_float(x: np.ndarray) -> np.ndarray:
    """int32 bit patterns -> float32 values."""
    return np.asarray(x, dtype=np.int32).view(np.float32)
