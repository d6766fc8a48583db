"""The engine's counters, summed in one place (``EngineStats.add``) from the records its parts return."""

from __future__ import annotations

import functools

import attrs

from resplan import Mismatch


@attrs.define
class EngineStats:
    """Counters over an engine's life. "decode steps" are steps of decode rows only (resident in the resident arm)."""

    steps: int = 0
    decode_steps: int = 0
    mixed_steps: int = 0  # host-planned: prefill chunks and decode rows
    pass_rows: int = 0  # decode rows that rode in a prefill pass (decode_in_pass), of rows_decoded
    prefill_steps: int = 0  # prefill chunks only (host-planned, or async_prefill: a pass launched with no decode rows)
    decode_beside_pass: int = 0  # async_prefill: decode steps launched while a prefill pass was in flight
    prefill_chunks: int = 0
    rows_decoded: int = 0  # real decode rows run (every kind of step)
    padded_rows: int = 0
    tokens: int = 0  # tokens generated, a prefill's first token included
    finished: int = 0
    rows_whole: int = 0  # resident: rows written whole (new, displaced earlier, stale)
    new_rows: int = 0  # resident: rows that took a slot
    crossings: int = 0  # resident: block-table cells staged because a row's token opened a page
    displacements: int = 0  # resident: requests that lost their slot to a step
    h2d_copies: int = 0  # decode steps: planning H2D (flush program, or the host fill's) and input-ids copies
    h2d_bytes: int = 0
    ids_copies: int = 0  # decode steps whose input ids (and sources) changed, so the host copied them
    overlapped: int = 0  # decode steps launched before the previous decode step's tokens were read
    discarded: int = 0  # rows a step ran for a request that had stopped on a token meanwhile (overlap)
    empty_flushes: int = 0  # resident decode steps that issued no H2D at all
    prefill_passes: int = 0  # prefill passes, eager or replayed (one a step with prefill work)
    prefill_tokens: int = 0  # prompt tokens they ran
    prefill_ns: int = 0  # their wall time: inputs, the pass, first-token sampling and readback
    prefill_host_ns: int = 0  # of which the host spent enqueueing them, until it waits for the first tokens
    prefill_gpu_ms: float = 0.0  # their GPU time, the pass and first-token sampling (CUDA events; with timing on)
    mixed_ns: int = 0  # wall time of the mixed steps (decode rows beside prefill chunks), whole step() each
    plan_ns: int = 0  # decode steps: plan + flush (resident) or fill + copy (host), wherever it ran
    attn_schedule_ns: int = 0  # decode steps: the attention's host schedule (fa2's plan()), with its table build
    launch_ns: int = 0  # decode steps: input ids copy (if any) + graph replay launch + token readback enqueue
    wait_ns: int = 0  # decode steps: waiting for the sampled tokens (the GPU finishing the step)
    decode_ns: int = 0  # decode steps: wall time of the whole step() (compose, admit, plan, replay, emit, pre-plan)
    decode_rows: int = 0  # decode steps: real rows (tokens) they produced
    gpu_ms: float = 0.0  # decode steps: graph time on the GPU (CUDA events; with timing on)
    itl: list = attrs.Factory(list)  # with timing on: per step, [n] gaps since each row's last token (s)
    preplans: int = 0  # next decode steps prepared early (a resident plan, or the host arm's early fill)
    preplan_hits: int = 0
    preplan_drops: int = 0  # dropped because pages its program named were given back
    refused_admits: int = 0
    offloads: int = 0
    reloads: int = 0
    row_checks: int = 0
    mismatches: int = 0
    first_mismatches: list[Mismatch] = attrs.Factory(list)

    def per_decode_step(self, value: int) -> float:
        return value / self.decode_steps if self.decode_steps else 0.0

    def add(self, record) -> None:
        """Sum an attrs record a part returned into the counters of the same names (its other fields are not
        counters)."""
        for name in _counted(type(record)):
            setattr(self, name, getattr(self, name) + getattr(record, name))


@functools.cache
def _counted(cls: type) -> tuple[str, ...]:
    """The number fields of record class ``cls`` that name an EngineStats counter."""
    numbers = ("int", "float", int, float)
    counters = {f.name for f in attrs.fields(EngineStats) if f.type in numbers}
    return tuple(f.name for f in attrs.fields(cls) if f.name in counters and f.type in numbers)
