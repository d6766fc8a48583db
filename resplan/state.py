"""The planner's state: a static config (layout, buckets, sizes) and the slot ledger plus host mirror, as values.

Slots: the store has ``2B + 1`` rows, B the widest captured bucket. Row 0 is the trash row and never held. A slot is

* **held** when ``slot_owner[s] >= 0`` (the handle whose row it is),
* **cooling** when released (``slot_owner[s] == -1``) but a step that read it is not committed
  (``slot_read[s] > committed_seq``),
* **free** when released and ``slot_read[s] <= committed_seq``.

So commit never touches an array: cooling ends by the committed sequence number moving past the slot's last reader.
"""

from __future__ import annotations

import attrs
import numpy as np
from beartype import beartype

from resplan.layout import RowLayout, StreamMode
from resplan.records import BucketPlan

FREE = -1  # slot_owner of a released slot (free or cooling)
NEVER = -2  # slot_owner of the trash row: never handed out


class PlanError(ValueError):
    """A plan, commit or release that cannot be carried out; the state it was given is unchanged."""


@attrs.frozen(eq=False)
class PoolConsts:
    """Per-pool constants the step path reads, resolved once at build."""

    key: str
    mode: StreamMode
    page_size: int
    len_col: int
    span_start: int
    span_width: int
    opens_page: np.ndarray  # [width * page_size] bool: L % page_size == 0, indexed by stored length L
    page_col: np.ndarray  # [width * page_size] int64: L // page_size
    cell_base: np.ndarray  # [S] int64: flat store index of the span's first cell, by slot


@attrs.frozen(eq=False)
class PlannerConfig:
    """Static part of the planner: fixed at build, shared by every state."""

    layout: RowLayout
    buckets: tuple[BucketPlan, ...]  # sorted by size
    capacity: int  # handles are in [0, capacity)
    n_slots: int  # 2 * max bucket + 1
    pools: tuple[PoolConsts, ...]  # in layout order
    append_pools: tuple[PoolConsts, ...]
    read_pools: tuple[PoolConsts, ...]
    bucket_index: dict[int, int]  # bucket size -> index into buckets
    all_ok: tuple[bytes, ...]  # all_ok[n] = n bytes of 1: a step of n rows that all mirror the host

    @property
    def max_bucket(self) -> int:
        return self.buckets[-1].size


@attrs.frozen(eq=False, slots=True)
class Ledger:
    """Who holds which slot, and which handles' rows mirror the host. Shared, untouched, by steady steps."""

    slot_owner: np.ndarray  # [S] int32: handle, FREE, or NEVER (row 0)
    slot_taken: np.ndarray  # [S] int64: take order, ties of least-recently-run are broken by it
    slot_epoch: tuple[np.ndarray, ...]  # per READ pool, [S] int64: stream epoch the row holds
    slot_of: np.ndarray  # [H] int64 (it indexes on the step path): the handle's slot, 0 = none
    row_ok: np.ndarray  # [H] bool: holds a slot and the row mirrors the host (not stale)
    taken_count: int


@attrs.frozen(eq=False, slots=False)  # a dict class: its frozen __init__ is ~0.4 us cheaper, per plan and commit
class PlannerState:
    """The ledger, each slot's last reader, sequence numbers, and the slot row each bucket last uploaded.

    Arrays are never written after the state is built: every transition returns a new state, copying only the
    arrays it changes. Dropping a returned state (an abandoned plan) therefore undoes everything it did.
    """

    cfg: PlannerConfig
    ledger: Ledger
    slot_read: np.ndarray  # [S] int64: seq of the last planned step that read the slot, -1 never
    last_seq: int  # seq of the last plan adopted (-1 none)
    prev_seq: int  # seq of the plan adopted before it (-1 none)
    committed_seq: int  # every step with seq <= this has committed
    last_slot_rows: tuple[bytes, ...]  # per bucket: bytes of the real rows' slots last uploaded (b"" none)

    # -- derived views (tests, notebooks, logs; never on the step path) ------------------------------------------
    @property
    def slot_owner(self) -> np.ndarray:
        return self.ledger.slot_owner

    @property
    def slot_of(self) -> np.ndarray:
        return self.ledger.slot_of

    @property
    def row_ok(self) -> np.ndarray:
        return self.ledger.row_ok

    def held(self) -> np.ndarray:
        return np.flatnonzero(self.slot_owner >= 0)

    def cooling(self) -> np.ndarray:
        return np.flatnonzero((self.slot_owner == FREE) & (self.slot_read > self.committed_seq))

    def free(self) -> np.ndarray:
        return np.flatnonzero((self.slot_owner == FREE) & (self.slot_read <= self.committed_seq))

    def slot(self, handle: int) -> int:
        return int(self.slot_of[handle])

    def check(self) -> None:
        """Assert the ledger invariants (tests and debug only): held/cooling/free partition slots 1..S-1, and the
        handle map and the owners agree."""
        S = self.cfg.n_slots
        held, cooling, free = self.held(), self.cooling(), self.free()
        parts = np.concatenate([held, cooling, free])
        assert self.slot_owner[0] == NEVER, "the trash row was handed out"
        assert np.array_equal(np.sort(parts), np.arange(1, S)), "held/cooling/free do not partition the slots"
        owners = self.slot_owner[held]
        assert np.unique(owners).size == owners.size, "a handle holds two slots"
        assert np.array_equal(self.slot_of[owners], held), "slot_of disagrees with slot_owner"
        assert np.count_nonzero(self.slot_of) == held.size, "a handle maps to a slot it does not hold"
        assert not self.row_ok[self.slot_of == 0].any(), "a handle without a slot is marked ok"


@beartype  # the planner's construction is a boundary: check types once here, never in plan/commit
def build_planner(layout: RowLayout, buckets: list[BucketPlan] | tuple[BucketPlan, ...], capacity: int) -> PlannerState:
    """The initial state for ``layout``, sized from the widest bucket: 2B + 1 slots, every one free."""
    if not buckets:
        raise ValueError("a planner needs at least one captured bucket")
    if capacity <= 0:
        raise ValueError(f"capacity (handles) must be > 0, got {capacity}")
    sizes = [b.size for b in buckets]
    if len(set(sizes)) != len(sizes):
        raise ValueError(f"bucket sizes must be distinct, got {sizes}")
    modes = {p.key: p.mode for p in layout.pools}
    for b in buckets:
        keys = {k for k, _ in b.streams}
        missing = set(modes) - keys
        if missing:
            raise ValueError(f"bucket {b.size} has no stream record for pools {sorted(missing)}")
        for key, mode in modes.items():
            if b.stream(key).mode is not mode:
                raise ValueError(
                    f"bucket {b.size}: pool {key!r} is {b.stream(key).mode.value} in its stream record but "
                    f"{mode.value} in the layout"
                )
    ordered = tuple(sorted(buckets, key=lambda b: b.size))
    B = ordered[-1].size
    S = 2 * B + 1
    if S * layout.width >= 2**31:
        raise ValueError(f"{S} slots of {layout.width} cells overflow int32 flat indices")
    pools = tuple(_pool_consts(layout, p.key, S) for p in layout.pools)
    cfg = PlannerConfig(
        layout=layout,
        buckets=ordered,
        capacity=capacity,
        n_slots=S,
        pools=pools,
        append_pools=tuple(p for p in pools if p.mode is StreamMode.APPEND),
        read_pools=tuple(p for p in pools if p.mode is StreamMode.READ),
        bucket_index={b.size: i for i, b in enumerate(ordered)},
        all_ok=tuple(b"\x01" * n for n in range(B + 1)),
    )
    owner = np.full(S, FREE, np.int32)
    owner[0] = NEVER
    ledger = Ledger(
        slot_owner=owner,
        slot_taken=np.zeros(S, np.int64),
        slot_epoch=tuple(np.zeros(S, np.int64) for _ in cfg.read_pools),
        slot_of=np.zeros(capacity, np.int64),
        row_ok=np.zeros(capacity, bool),
        taken_count=0,
    )
    return PlannerState(cfg, ledger, np.full(S, -1, np.int64), -1, -1, -1, tuple(b"" for _ in ordered))


def _pool_consts(layout: RowLayout, key: str, n_slots: int) -> PoolConsts:
    p, sp = layout.pool(key), layout.span(key)
    lengths = np.arange(sp.width * p.page_size)
    return PoolConsts(
        key=key,
        mode=p.mode,
        page_size=p.page_size,
        len_col=layout.len_col(key),
        span_start=sp.start,
        span_width=sp.width,
        opens_page=(lengths % p.page_size) == 0,
        page_col=(lengths // p.page_size).astype(np.int64),
        cell_base=(np.arange(n_slots) * layout.width + sp.start).astype(np.int64),
    )
