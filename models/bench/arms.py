"""The engine arms the serving benchmarks compare, and what ``serve`` and ``traffic`` share: an arm's engine
config, the frozen heap a timed run starts from, and the host yardstick a report carries.

Arms (planning, decode attention, overlap):
  host            every decode step rebuilds its buffers from the host streams (one H2D), copies its input ids, and
                  plans fa2 on the host before the GPU may start it: the classic synchronous engine
  host-overlap    the strongest host-planned design, what engines with asynchronous scheduling run: host-planned and
                  fa2 as ``host``, but step N+1's buffers are filled, copied and planned while step N runs on the GPU,
                  and its input ids come from the device (the last step's sampled tokens)
  resident-fa2    rows resident in the device store (resplan), fa2 still planned every step: isolates the table gain
  resident-xqa    rows resident, FlashInfer XQA reads the gathered tables in the graph: no host plan at all; each
                  decode step is launched before the last one's tokens are read (overlap)
  resident-triton the same with our split-KV Triton attention, which reads the tables in the graph too
  resident-xqa-sync, resident-triton-sync  the same without overlap (isolates what planning alone gains)
  host-torch, resident-torch  plain-torch attention (resident with overlap): the arms a CPU runs

Any arm may end in ``/async`` (its prefill passes on a stream of their own, beside its decode steps:
``EngineConfig.async_prefill``), ``/async-prio`` (the same, its decode steps on a stream of higher priority than the
passes': ``EngineConfig.decode_priority``) or ``/in-step`` (each pass inside its step, the decode rows waiting for
it), and then in ``@N`` (a token budget of N prefill tokens a step), so that one run alternates them:
``resident-triton/async@4096``.
A plain name takes the benchmark's ``--async-prefill`` and ``--token-budget``.
"""

from __future__ import annotations

import contextlib
import gc

import attrs
import numpy as np

from models.engine import EngineConfig, Planning
from models.layers.decode_attention import Backend


@attrs.frozen
class Arm:
    planning: Planning
    attention: Backend
    overlap: bool


ARMS = {
    "host": Arm(Planning.HOST, Backend.FA2, False),
    "host-overlap": Arm(Planning.HOST, Backend.FA2, True),
    "resident-fa2": Arm(Planning.RESIDENT, Backend.FA2, False),
    "resident-xqa": Arm(Planning.RESIDENT, Backend.XQA, True),
    "resident-triton": Arm(Planning.RESIDENT, Backend.TRITON, True),
    "resident-xqa-sync": Arm(Planning.RESIDENT, Backend.XQA, False),
    "resident-triton-sync": Arm(Planning.RESIDENT, Backend.TRITON, False),
    "host-torch": Arm(Planning.HOST, Backend.TORCH, False),
    "resident-torch": Arm(Planning.RESIDENT, Backend.TORCH, True),
}
CUDA_ONLY = frozenset({Backend.FA2, Backend.XQA})
# an arm's /suffix -> the EngineConfig fields it sets
PREFILL_MODES = {"async": dict(async_prefill=True), "in-step": dict(async_prefill=False),
                 "async-prio": dict(async_prefill=True, decode_priority=-1)}  # fmt: skip


def split_arm(name: str) -> tuple[str, dict]:
    """An arm's name as (the ``ARMS`` name, the EngineConfig fields its suffixes set: ``/async``, ``/async-prio`` or
    ``/in-step`` the async_prefill (and decode_priority), ``@N`` the token_budget); ValueError for a suffix it does not
    know."""
    rest, at, budget = name.partition("@")
    base, _, mode = rest.partition("/")
    fields: dict = {}
    if mode:
        if mode not in PREFILL_MODES:
            raise ValueError(f"arm {name!r}: an engine arm takes the suffix /{' or /'.join(PREFILL_MODES)}")
        fields.update(PREFILL_MODES[mode])
    if at:
        if not budget.isdigit() or int(budget) < 1:
            raise ValueError(f"arm {name!r}: @ takes a token budget, a positive whole number")
        fields["token_budget"] = int(budget)
    return base, fields


def parse_arms(text: str, device: str, extra: tuple[str, ...] = ()) -> list[str]:
    """``--arms``: comma-separated names of ``ARMS`` (or of ``extra``), each with optional suffixes (``/async``,
    ``/async-prio`` or ``/in-step``, then ``@N``); ValueError naming the first bad one."""
    arms = [a for a in text.split(",") if a]
    if not arms:
        raise ValueError("no arm named")
    for name in arms:
        a, fields = split_arm(name)
        if a not in ARMS and a not in extra:
            raise ValueError(f"unknown arm {a!r}; known: {', '.join([*ARMS, *extra])}")
        if fields and a not in ARMS:
            raise ValueError(f"arm {name!r}: {a} is not an engine arm and takes no suffix")
        if a in ARMS and device != "cuda" and ARMS[a].attention in CUDA_ONLY:
            raise ValueError(f"arm {a!r} runs {ARMS[a].attention.value} attention, which needs CUDA (on a CPU: "
                             "host-torch, resident-torch)")  # fmt: skip
    if len(set(arms)) != len(arms):
        raise ValueError(f"an arm is named twice: {text}")
    return arms


def arm_config(arm: str, **knobs) -> EngineConfig:
    """The engine config of ``arm`` with the benchmark's engine knobs (device, dtype, max_running, ...); its
    suffixes, if any, override the knobs' async_prefill and token_budget."""
    name, fields = split_arm(arm)
    a = ARMS[name]
    return EngineConfig(planning=a.planning, attention=a.attention, overlap=a.overlap, **{**knobs, **fields})


@contextlib.contextmanager
def frozen_heap():
    """Collect, then freeze every live object out of the collector's reach for the timed run (serving engines do
    this after start-up): without it, objects another arm left behind (transformers' especially) make the
    collections a run triggers slower, and an arm that allocates more per step pays for that arm's heap."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def planner_yardstick(steps: int = 5000) -> str:
    """This machine's host speed, for the report: the planner benchmark's steady 64-row step (the ratios depend on the
    host CPU, since the host arm's planning is host time and the GPU graphs are not)."""
    from models.bench.planner import scenario

    r = scenario("steady-64", 64, 0, False, steps)
    return f"planner steady 64-row step {r['median']:.1f} us (median of {steps}; `python -m models.bench.planner`)"


def paired_ratio(runs: list[dict], base: list[dict], key: str, invert: bool = False) -> str:
    """``runs[i][key] / base[i][key]`` (``invert``: base over run) paired by round, as "median [min-max]x"; "-" when
    there is no base to pair with."""
    ratios = [(b[key] / r[key]) if invert else (r[key] / b[key]) for r, b in zip(runs, base, strict=False)]
    if not ratios:
        return "-"
    return f"{np.median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]"
