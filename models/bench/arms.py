"""The engine arms the serving benchmarks compare, and what ``serve`` and ``traffic`` share: the arms a run asks
for, each one's engine config, the frozen heap a timed run starts from, and the host yardstick a report carries.

Engine arms (``ARMS``: planning, decode attention, overlap):
  host            every decode step rebuilds its buffers from the host streams (one H2D), copies its input ids, and
                  plans fa2 on the host before the GPU may start it: the classic synchronous engine
  host-overlap    the strongest host-planned design, what engines with asynchronous scheduling run: host-planned and
                  fa2 as ``host``, but step N+1's buffers are filled, copied and planned while step N runs on the GPU,
                  and its input ids come from the device (the last step's sampled tokens)
  host-triton-overlap  the honest baseline of the row store: host-planned, every decode step refills its buffers on
                  the host (one H2D), overlapped as ``host-overlap``, with the same plan-free Triton attention as
                  ``resident-triton``: what it isolates against resident-triton is rows resident vs a host refill
  resident-fa2    rows resident in the device store (resplan), fa2 still planned every step: isolates the table gain
  resident-xqa    rows resident, FlashInfer XQA reads the gathered tables in the graph: no host plan at all; each
                  decode step is launched before the last one's tokens are read (overlap)
  resident-triton the same with our split-KV Triton attention, which reads the tables in the graph too
  resident-xqa-sync, resident-triton-sync  the same without overlap (isolates what planning alone gains)
  resident-triton-cache, resident-torch-cache  resident-triton, resident-torch with the prefix cache on
                  (``EngineConfig.prefix_cache``: shared KV pages, recurrent-state checkpoints)
  resident-triton-k4, resident-torch-k4  resident-triton, resident-torch running 4 decode tokens a row in each graph
                  launch (``EngineConfig.tokens_per_launch``: the host plans, launches and reads back once per 4)
  host-torch, resident-torch  plain-torch attention (resident with overlap): the arms a CPU runs

What the reports' ratios (paired by round, at one placement, budget and host load) isolate: resident-triton over
host-triton-overlap, rows resident vs a host refill (same attention, same overlap); host-triton-overlap over
host-overlap, a plan-free attention vs fa2's host plan; host-overlap over host, overlap vs none.

A run's arms are every engine arm it names (``--arms``) in every prefill placement (``--prefill``: values of
``PrefillPlacement``; default the engine's for the device) and every token budget (``--token-budget``: ``auto``, the
engine's default for the placement; ``whole``, whole prompts; or a number) it asks for, alternated in one run. Each
is an ``Arm``, its placement and budget resolved as an ``EngineConfig`` resolves them when it is built, and labelled
by them in the reports: ``resident-triton beside 2048``. Every arm also runs at every host load of ``--host-load``
(``models/bench/host_load.py``: a thread holding the interpreter a fraction of each millisecond), the loads
alternated with the arms; a report's rows name their load.
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import gc

import attrs
import numpy as np

from models.bench.host_load import load_fraction
from models.cli import positive_int
from models.engine import BESIDE_TOKEN_BUDGET, IN_STEP_TOKEN_BUDGET, EngineConfig, Planning, PrefillPlacement
from models.layers.decode_attention import Backend
from models.server.heap import freeze_heap


@attrs.frozen
class Decoding:
    """How an engine arm runs its decode steps: its planning, decode attention and overlap; whether its prefix cache
    is on, and the decode tokens a row each graph launch runs."""

    planning: Planning
    attention: Backend
    overlap: bool
    prefix_cache: bool = False
    tokens_per_launch: int = 1


ARMS = {
    "host": Decoding(Planning.HOST, Backend.FA2, False),
    "host-overlap": Decoding(Planning.HOST, Backend.FA2, True),
    "host-triton-overlap": Decoding(Planning.HOST, Backend.TRITON, True),
    "resident-fa2": Decoding(Planning.RESIDENT, Backend.FA2, False),
    "resident-xqa": Decoding(Planning.RESIDENT, Backend.XQA, True),
    "resident-triton": Decoding(Planning.RESIDENT, Backend.TRITON, True),
    "resident-xqa-sync": Decoding(Planning.RESIDENT, Backend.XQA, False),
    "resident-triton-sync": Decoding(Planning.RESIDENT, Backend.TRITON, False),
    "host-torch": Decoding(Planning.HOST, Backend.TORCH, False),
    "resident-torch": Decoding(Planning.RESIDENT, Backend.TORCH, True),
    "resident-triton-cache": Decoding(Planning.RESIDENT, Backend.TRITON, True, prefix_cache=True),
    "resident-torch-cache": Decoding(Planning.RESIDENT, Backend.TORCH, True, prefix_cache=True),
    "resident-triton-k4": Decoding(Planning.RESIDENT, Backend.TRITON, True, tokens_per_launch=4),
    "resident-torch-k4": Decoding(Planning.RESIDENT, Backend.TORCH, True, tokens_per_launch=4),
}
CUDA_ONLY = frozenset({Backend.FA2, Backend.XQA})


def twin(name: str) -> str | None:
    """The arm that is ``name`` with its prefix cache off and one decode token a launch (whose tokens ``name``'s must
    equal), or None where that is ``name`` itself."""
    plain = attrs.evolve(ARMS[name], prefix_cache=False, tokens_per_launch=1)
    return next((n for n, d in ARMS.items() if d == plain and n != name), None)


class Budget(enum.Enum):
    """A token budget asked for by name, not by number (``--token-budget``)."""

    AUTO = "auto"  # the engine's default for the arm's placement (EngineConfig.token_budget)
    WHOLE = "whole"  # whole prompts (EngineConfig.token_budget None)


@attrs.frozen
class Arm:
    """One arm of a run: an engine arm's decoding (``ARMS[name]``) with the prefill placement and token budget it
    runs with, both resolved (``token_budget`` None: whole prompts)."""

    name: str
    planning: Planning
    attention: Backend
    overlap: bool
    prefill: PrefillPlacement
    token_budget: int | None
    prefix_cache: bool = False
    tokens_per_launch: int = 1

    @classmethod
    def of(cls, name: str, prefill: PrefillPlacement, budget: int | Budget, device: str) -> Arm:
        """The engine arm ``name`` at ``prefill`` and ``budget`` on ``device`` (``Budget.AUTO`` resolved by the
        config, as an engine's is); ValueError where the config refuses the placement on the device."""
        auto = EngineConfig(device=device, prefill=prefill).token_budget  # (the config checks the placement)
        tokens = auto if budget is Budget.AUTO else None if budget is Budget.WHOLE else budget
        d = ARMS[name]
        return cls(name, d.planning, d.attention, d.overlap, prefill, tokens, d.prefix_cache, d.tokens_per_launch)

    @property
    def label(self) -> str:
        """The arm in reports and logs: ``resident-triton beside 2048``."""
        return f"{self.name} {self.prefill.value} {budget_text(self.token_budget)}"

    def config(self, **knobs) -> EngineConfig:
        """The arm's engine config with the benchmark's engine knobs (device, dtype, max_running, ...)."""
        return EngineConfig(planning=self.planning, attention=self.attention, overlap=self.overlap,
                            prefill=self.prefill, token_budget=self.token_budget, prefix_cache=self.prefix_cache,
                            tokens_per_launch=self.tokens_per_launch, **knobs)  # fmt: skip

    def peer(self, name: str) -> Arm:
        """The engine arm ``name`` at this arm's placement and budget (what a ratio against ``name`` pairs with)."""
        d = ARMS[name]
        return attrs.evolve(self, name=name, planning=d.planning, attention=d.attention, overlap=d.overlap,
                            prefix_cache=d.prefix_cache, tokens_per_launch=d.tokens_per_launch)  # fmt: skip


def budget_text(tokens: int | None) -> str:
    """A resolved token budget as reports write it: the number, or ``whole``."""
    return Budget.WHOLE.value if tokens is None else str(tokens)


def default_placement(device: str) -> PrefillPlacement:
    """The placement an engine on ``device`` runs by default (``EngineConfig.prefill``)."""
    return EngineConfig(device=device).prefill


def _listed(text: str, what: str, parse) -> tuple:
    """Comma-separated values, each parsed and each named once; ArgumentTypeError naming the first bad one."""
    items = [x for x in text.split(",") if x]
    if not items:
        raise argparse.ArgumentTypeError(f"no {what} named")
    out = tuple(parse(x) for x in items)
    for i, x in enumerate(out):
        if x in out[:i]:
            raise argparse.ArgumentTypeError(f"{items[i]} is named twice")
    return out


def _placement(text: str) -> PrefillPlacement:
    try:
        return PrefillPlacement(text)
    except ValueError:
        known = ", ".join(p.value for p in PrefillPlacement)
        raise argparse.ArgumentTypeError(f"{text!r} is not a placement ({known})") from None


def _budget(text: str) -> int | Budget:
    if text in {b.value for b in Budget}:
        return Budget(text)
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not auto, whole or an integer >= 1") from None


def placements(text: str) -> tuple[PrefillPlacement, ...]:
    """``--prefill``: comma-separated values of ``PrefillPlacement`` (in-step, in-pass, beside, beside-priority)."""
    return _listed(text, "placement", _placement)


def budgets(text: str) -> tuple[int | Budget, ...]:
    """``--token-budget``: comma-separated ``auto``, ``whole`` or integers >= 1."""
    return _listed(text, "token budget", _budget)


def host_loads(text: str) -> tuple[float, ...]:
    """``--host-load``: comma-separated fractions in [0, 1) (``models/bench/host_load.py``)."""
    return _listed(text, "host load", load_fraction)


def parse_arms(text: str, device: str, extra: tuple[str, ...] = ()) -> list[str]:
    """``--arms``: comma-separated names of ``ARMS`` (or of ``extra``); ValueError naming the first bad one."""
    names = [a for a in text.split(",") if a]
    if not names:
        raise ValueError("no arm named")
    for a in names:
        if a not in ARMS and a not in extra:
            raise ValueError(f"unknown arm {a!r}; known: {', '.join([*ARMS, *extra])}")
        if a in ARMS and device != "cuda" and ARMS[a].attention in CUDA_ONLY:
            raise ValueError(f"arm {a!r} runs {ARMS[a].attention.value} attention, which needs CUDA (on a CPU: "
                             "host-torch, resident-torch)")  # fmt: skip
    if len(set(names)) != len(names):
        raise ValueError(f"an arm is named twice: {text}")
    return names


def build_arms(names: list[str], prefill: tuple[PrefillPlacement, ...], budget: tuple[int | Budget, ...],
               device: str) -> list[Arm]:  # fmt: skip
    """Every engine arm of ``names`` at every placement and budget, in that order (arm, then placement, then
    budget), each distinct arm once (``auto`` and the number it resolves to are one arm); ValueError where a
    config refuses a placement on ``device``."""
    out: list[Arm] = []
    for name in names:
        for p in prefill:
            for b in budget:
                arm = Arm.of(name, p, b, device)
                if arm not in out:
                    out.append(arm)
    return out


def round_order(arms: list, loads: tuple[float, ...], rnd: int) -> list[tuple]:
    """Round ``rnd``'s timed runs in order, as (arm, host load): every arm at every load, an arm's loads one after
    another (an engine kept for one arm at a time serves them all), the order reversed every other round."""
    order = [(arm, load) for arm in arms for load in loads]
    return order if rnd % 2 == 0 else order[::-1]


@contextlib.contextmanager
def frozen_heap():
    """Collect, then freeze every live object out of the collector's reach for the timed run (serving engines do
    this after start-up): without it, objects another arm left behind (transformers' especially) make the
    collections a run triggers slower, and an arm that allocates more per step pays for that arm's heap."""
    freeze_heap()
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


def add_arm_options(g, budget_default: str, prefill_note: str = "") -> None:
    """``--prefill`` and ``--token-budget`` on argparse group ``g``: the placements and budgets every arm runs at."""
    g.add_argument("--prefill", type=placements, default=None, metavar="P[,P...]",
                   help="where the arms' prefill passes run, comma-separated: in-step (inside the step, its decode "
                        "rows waiting for the pass), in-pass (the decode rows ride in the pass, a token each of the "
                        "budget), beside (on a CUDA stream of its own while the decode steps go on), beside-priority "
                        "(beside, the decode steps on a stream of higher priority); every arm runs at each, "
                        "alternated in one run (default: the engine's for the device, beside on CUDA and in-step "
                        f"on a CPU{prefill_note})")  # fmt: skip
    g.add_argument("--token-budget", type=budgets, default=budget_default, metavar="B[,B...]",
                   help="prompt tokens a step's pass holds, comma-separated: auto (the engine's default for the "
                        f"placement: {BESIDE_TOKEN_BUDGET} beside the decode steps, {IN_STEP_TOKEN_BUDGET} in the "
                        "step), whole (whole prompts) or a number; every arm runs at each, alternated in one run "
                        f"(auto and the number it stands for run once; default {budget_default})")  # fmt: skip


def add_host_load_option(g, note: str = "") -> None:
    """``--host-load`` on argparse group ``g``: the host loads every arm runs at."""
    g.add_argument("--host-load", type=host_loads, default=(0.0,), metavar="F[,F...]",
                   help="a busy host: during every timed run a background thread holds the interpreter (spins in "
                        "Python) a fraction F of each millisecond and sleeps the rest, as an in-process server does "
                        "while it detokenizes and writes streams; comma-separated fractions in [0, 1), every arm runs "
                        "at each, alternated in one run, the report giving each row's F and the fraction the thread "
                        f"achieved (models/bench/host_load.py; default 0: no thread{note})")  # fmt: skip
