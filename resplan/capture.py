"""What may be resident, decided once at build and capture time, with typed reasons.

* ``resident_refusal(resource)``: why a resource cannot keep rows on the device (the node then stays host-planned
  and says why), or None.
* ``capture_streams(walk, ...)``: the stream record of every resource of a declared decode walk, or a
  ``CaptureError`` whose ``problem`` names what is wrong.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence

import attrs

from resplan.layout import StreamMode
from resplan.records import ResidentStream


class ResourceKind(enum.Enum):
    KV = "kv"
    RECURRENT = "recurrent"
    POSITIONS = "positions"
    SAMPLER = "sampler"


class Refusal(enum.Enum):
    """Why a resource stays host-planned."""

    NO_TABLE = "the resource keeps no per-request table the device could mirror"
    SHARED_POOL = "the pool is shared by several nodes, so no one node's rows describe it"
    CROSS_NODE_READ = "another node reads the pool, and its steps would not mark these rows stale"
    SLIDING_WINDOW = "a sliding window frees pages behind the row, which a row's span cannot express"
    NO_SINK_PAGE = "the pool has no sink page for padding rows to read and write"
    CONTEXT_IN_QUERY_POOL = "cross attention keeps its context in the query's own pool (two streams, one key)"


@attrs.frozen
class ResourceInfo:
    """What the planner needs to know about one resource of a node."""

    key: str
    kind: ResourceKind
    has_table: bool = True
    shared_by_nodes: bool = False
    read_across_nodes: bool = False
    sliding_window: int | None = None
    has_sink: bool = True
    context_pool: str | None = None  # cross attention: the pool its context lives in
    query_pool: str | None = None  # cross attention: the pool its queries' own stream lives in


def resident_refusal(res: ResourceInfo) -> Refusal | None:
    """The first reason ``res`` cannot be resident, checked in a fixed order; None when it can."""
    if not res.has_table:
        return Refusal.NO_TABLE
    if res.shared_by_nodes:
        return Refusal.SHARED_POOL
    if res.read_across_nodes:
        return Refusal.CROSS_NODE_READ
    if res.sliding_window is not None:
        return Refusal.SLIDING_WINDOW
    if res.kind is ResourceKind.KV and not res.has_sink:
        return Refusal.NO_SINK_PAGE
    if res.context_pool is not None and res.context_pool == res.query_pool:
        return Refusal.CONTEXT_IN_QUERY_POOL
    return None


class CaptureProblem(enum.Enum):
    UNKNOWN_RESOURCE = "the walk names a resource the node does not have"
    TWO_LABELS = "more than one stream label on one resource in one walk"
    MIXED_SPANS = "spans other than all 1 (append a token a row) or all 0 (read only)"
    POSITIONS_OFF_POOL = "positions are not one appending stream with the pool they name"
    RECURRENT_ONLY_READ = "a recurrent pool that the walk only reads"
    REFUSED = "a resource of the walk refuses resident planning"


class CaptureError(ValueError):
    """A declared walk that cannot be captured resident; ``problem`` says which rule it broke."""

    def __init__(self, problem: CaptureProblem, detail: str) -> None:
        super().__init__(f"{problem.name}: {problem.value}: {detail}")
        self.problem = problem


@attrs.frozen
class Segment:
    """One run of a step's tokens on a resource: its stream label and tokens per row (1 = append, 0 = read)."""

    label: str
    span: int


def capture_streams(
    walk: Mapping[str, Sequence[Segment]],
    resources: Mapping[str, ResourceInfo],
    positions_pool: str | None = None,
) -> dict[str, ResidentStream]:
    """The stream record of each resource of a declared walk, checking every capture rule."""
    out: dict[str, ResidentStream] = {}
    for key, segments in walk.items():
        if key not in resources:
            raise CaptureError(CaptureProblem.UNKNOWN_RESOURCE, f"{key!r} (the node has {sorted(resources)})")
        refusal = resident_refusal(resources[key])
        if refusal is not None:
            raise CaptureError(CaptureProblem.REFUSED, f"{key!r}: {refusal.name}: {refusal.value}")
        labels = sorted({s.label for s in segments})
        if len(labels) != 1:
            raise CaptureError(CaptureProblem.TWO_LABELS, f"{key!r} has labels {labels}")
        spans = sorted({s.span for s in segments})
        if spans not in ([0], [1]):
            raise CaptureError(CaptureProblem.MIXED_SPANS, f"{key!r} has spans {spans}")
        mode = StreamMode.APPEND if spans == [1] else StreamMode.READ
        if resources[key].kind is ResourceKind.RECURRENT and mode is StreamMode.READ:
            raise CaptureError(CaptureProblem.RECURRENT_ONLY_READ, f"{key!r}")
        out[key] = ResidentStream(labels[0], mode)
    pos = [k for k, r in resources.items() if r.kind is ResourceKind.POSITIONS and k in out]
    for key in pos:
        pool = out.get(positions_pool) if positions_pool is not None else None
        if pool is None or pool.mode is not StreamMode.APPEND or pool.label != out[key].label:
            raise CaptureError(
                CaptureProblem.POSITIONS_OFF_POOL,
                f"positions {key!r} ride pool {positions_pool!r} whose stream is {pool}; they need one appending "
                f"stream with label {out[key].label!r}",
            )
    return out
