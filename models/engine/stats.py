"""The engine's counters, summed in one place: each part returns a ``Counts`` record of what it did, and
``EngineStats.add`` adds every field of it into the counter of the same name (a field that names no counter is an
error when it is added, and ``tests/test_engine_parts.py`` checks every record class for it)."""

from __future__ import annotations

import functools

import attrs

from resplan import Mismatch


class Counts:
    """Base of the records parts return for counting: every attrs field is a number summed into ``EngineStats``."""

    __slots__ = ()


@attrs.frozen(slots=False)
class StepCounts(Counts):
    """A step ran: a decode step (its rows' tokens, whether a pass was in flight beside it, whether it overlapped the
    step before, whether it ran more than a token a row, whether it was steady and then its host time), a mixed step
    or a prefill step; its wall time, counted as a decode step's or a mixed step's."""

    steps: int = 0
    decode_steps: int = 0
    decode_rows: int = 0
    decode_beside_pass: int = 0
    overlapped: int = 0
    mixed_steps: int = 0
    prefill_steps: int = 0
    decode_ns: int = 0
    mixed_ns: int = 0
    multi_token_steps: int = 0
    steady_steps: int = 0
    steady_host_ns: int = 0


@attrs.frozen(slots=False)
class Tokens(Counts):
    """Tokens emitted."""

    tokens: int = 0


@attrs.frozen(slots=True)
class EarlySteps(Counts):
    """Next steps prepared early."""

    early_steps: int = 0


EARLY_STEP, NO_EARLY_STEP = EarlySteps(1), EarlySteps(0)  # (records are values: one of each serves every step)


@attrs.frozen(slots=True)
class Events(Counts):
    """What happened to requests, less often than every step."""

    finished: int = 0
    pass_rows: int = 0
    rows_decoded: int = 0
    refused_admits: int = 0
    offloads: int = 0
    reloads: int = 0
    spills: int = 0
    pages_spilled: int = 0
    early_drops: int = 0


@attrs.define(slots=True)
class EngineStats:
    """Counters over an engine's life. "decode steps" are steps of decode rows only (resident in the resident arm)."""

    steps: int = 0
    decode_steps: int = 0
    mixed_steps: int = 0  # host-planned: prefill chunks and decode rows
    pass_rows: int = 0  # decode rows that rode in a prefill pass (PrefillPlacement.IN_PASS), of rows_decoded
    prefill_steps: int = 0  # prefill chunks only (host-planned, or a pass launched beside no decode rows)
    decode_beside_pass: int = 0  # decode steps launched while a prefill pass was in flight beside them
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
    launch_ns: int = 0  # decode steps: input ids copy (if any) + graph replay launch (its readback in the graph)
    wait_ns: int = 0  # decode steps: waiting for the sampled tokens (the GPU finishing the step)
    decode_ns: int = 0  # decode steps: wall time of the whole step() (compose, admit, plan, replay, emit, pre-plan)
    decode_rows: int = 0  # decode steps: real rows' tokens they produced (rows x tokens a row)
    multi_token_steps: int = 0  # decode steps of more than one token a row (EngineConfig.tokens_per_launch)
    steady_steps: int = 0  # decode steps that only decoded: no transition (arrival, admission, landed pass, finish,
    #   abort, reload; the scheduler's version unmoved) and no pass launched
    steady_host_ns: int = 0  # their wall time less their wait for the GPU: the decode loop's own host time
    gpu_ms: float = 0.0  # decode steps: graph time on the GPU (CUDA events; with timing on)
    itl: list = attrs.Factory(list)  # with timing on: per step, [n] gaps since each row's last token (s)
    early_steps: int = 0  # next decode steps prepared early (a resident plan, or the host arm's fill)
    early_hits: int = 0  # decode steps that ran what was prepared for them early
    early_drops: int = 0  # early plans dropped because pages their program named were given back
    refused_admits: int = 0
    offloads: int = 0
    reloads: int = 0
    spills: int = 0  # offloaded requests whose kept cached pages went to the host too (nothing else could run)
    pages_spilled: int = 0  # the cached pages they let go
    prefix_hits: int = 0  # prefix cache: requests that restored a checkpoint
    prefix_cached_tokens: int = 0  # prompt tokens they did not prefill (their checkpoints' positions)
    checkpoints_taken: int = 0  # recurrent-state checkpoints saved (in passes, and at streams' ends)
    checkpoints_evicted: int = 0  # checkpoints whose slot a newer one took (least recently used first)
    cached_pages_evicted: int = 0  # cached KV pages nobody held, handed out again (least recently let go first)
    row_checks: int = 0
    mismatches: int = 0
    first_mismatches: list[Mismatch] = attrs.Factory(list)

    def add(self, counts: Counts) -> None:
        """Add every field of ``counts`` into the counter of the same name."""
        _adder(type(counts))(self, counts)

    def sample_itl(self, gaps) -> None:
        """One step's inter-token gaps ([k] seconds; with timing on)."""
        self.itl.append(gaps)

    def add_check(self, checked: tuple[Counts, list[Mismatch]] | None) -> None:
        """A row check (its counts and first mismatches; the first ten over the engine's life are kept), if any."""
        if checked is not None:
            self.add(checked[0])
            self.first_mismatches.extend(checked[1][: max(0, 10 - len(self.first_mismatches))])


@functools.cache
def _adder(cls: type):
    """``add`` for records of ``cls``, generated once: one ``+=`` a field (a name that is no counter raises)."""
    names = [f.name for f in attrs.fields(cls)]
    src = "def add(stats, c):\n" + "".join(f"    stats.{n} += c.{n}\n" for n in names) + "    return None\n"
    scope: dict = {}
    exec(compile(src, f"<EngineStats.add of {cls.__name__}>", "exec"), scope)
    return scope["add"]


def counters() -> frozenset[str]:
    """The names of ``EngineStats``' number counters (what a ``Counts`` field may be called)."""
    return frozenset(f.name for f in attrs.fields(EngineStats) if f.type in ("int", "float", int, float))
