"""The host's share of a decode step: the engine's loop with the device work taken out (runs on a CPU).

    python -m models.bench.host_step --concurrency 1,64 --steps 2000 [--arms resident,host,resident-k4] [--profile 25]

An engine of the tiny Qwen3.5 shape is built on the CPU for each arm and concurrency; its step graphs' replays are
replaced by nothing (``resplan.graph.Graph.replay``), so each decode step is only what the host does around a replay:
compose, admit, plan and flush (resident) or the host fill (host), stage the ids, land, emit, count. Every request
asks for ``--steps`` tokens (each drawn as token 0, never a stop), all admitted at once; after a warm-up run the timed
run's decode steps are counted. Reported per decode step: host microseconds (median over ``--rounds`` runs: the run's
wall time less its prefill passes', which on a CPU compute the prompts in torch), the Python function calls it
makes (one run under cProfile; ``--profile N`` prints its N costliest functions), the host microseconds a row's
decode token costs (a step's time over the tokens it drew a row: ``resident-k4`` draws 4), and the torch calls it makes
around its replay (one run counted by ``TorchCalls``, over the decode steps that launched and landed no pass): on
CUDA each such call may let the interpreter go, and on a busy host taking it back is a wait.

This is the part of a step that no GPU speeds up; on the H200 the same loop runs beside a replay and a wait
(``python -m models.bench.serve``'s phase columns). The CPU here and the GPU machine's host differ in speed, not in
what the loop does: compare arms and changes on one machine.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import pstats
import statistics
import time
from unittest import mock

import numpy as np
from torch.overrides import TorchFunctionMode

from models.cli import OneLineParser
from models.engine import Engine, EngineConfig
from models.engine.config import Planning
from models.engine.requests import Request, SamplingParams
from resplan.graph import Graph

ARMS = {"resident": (Planning.RESIDENT, 1), "host": (Planning.HOST, 1),  # (planning, tokens a row a launch)
        "resident-k4": (Planning.RESIDENT, 4)}


def parser() -> argparse.ArgumentParser:
    ap = OneLineParser(prog="python -m models.bench.host_step", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--concurrency", default="1,64", help="requests running at once, comma-separated (default 1,64)")
    ap.add_argument("--steps", type=int, default=2000, help="tokens each request asks for (default 2000)")
    ap.add_argument("--arms", default="resident,host",
                    help="arms: resident, host, resident-k4 (resident, 4 decode tokens a row a launch; "
                         "EngineConfig.tokens_per_launch); default resident,host")  # fmt: skip
    ap.add_argument("--rounds", type=int, default=3, help="timed runs per arm and concurrency (default 3)")
    ap.add_argument("--overlap", default="on", choices=["on", "off"], help="overlapped steps (default on)")
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="print the N costliest functions of a run")
    return ap


class TorchCalls(TorchFunctionMode):
    """Counts the torch functions and tensor methods called from Python while it is on (each one, on CUDA, may let
    the interpreter go to another thread: on a busy host, a wait to take it back)."""

    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def _requests(c: int, steps: int, rng: np.random.Generator) -> list[Request]:
    """c requests of a 16-token prompt asking for ``steps`` tokens each."""
    return [Request(tuple(rng.integers(1, 100, 16).tolist()), SamplingParams(max_tokens=steps, ignore_eos=True))
            for _ in range(c)]  # fmt: skip


def _decode_steps(engine: Engine) -> int:
    """The engine's decode steps so far."""
    return engine.stats.decode_steps


def torch_calls_a_step(engine: Engine, requests: list[Request]) -> float:
    """Serve ``requests`` step by step; the torch calls a decode step made, over the steps that ran no pass."""
    for r in requests:
        engine.submit(r)
    calls = steps = 0
    with TorchCalls() as counter:
        while engine.has_work():
            n, s = counter.n, engine.stats
            decode, passes = s.decode_steps, s.prefill_passes
            engine.step()
            if s.decode_steps == decode + 1 and s.prefill_passes == passes:
                calls, steps = calls + counter.n - n, steps + 1
    return calls / max(steps, 1)


def measure(arm: str, c: int, args) -> dict:
    """One arm at concurrency c: host us a decode step (median over rounds), calls a step, torch calls a step, the
    profile's text."""
    planning, tokens = ARMS[arm]
    cfg = EngineConfig(planning=planning, max_running=c, overlap=args.overlap == "on", max_seq_len=args.steps + 32,
                       tokens_per_launch=tokens)  # fmt: skip
    engine = Engine.build("qwen3_5-tiny", cfg)
    rng = np.random.default_rng(0)
    with mock.patch.object(Graph, "replay", lambda self: None):
        engine.run(_requests(c, min(args.steps, 64), rng))  # warm-up
        gc.collect()
        gc.freeze()
        per_step, per_token = [], []
        for _ in range(args.rounds):
            before, passes_ns, rows = _decode_steps(engine), engine.stats.prefill_ns, engine.stats.decode_rows
            t0 = time.perf_counter_ns()
            engine.run(_requests(c, args.steps, rng))
            # (less the passes' wall time: their CPU compute is the GPU's work on a GPU)
            host_ns = time.perf_counter_ns() - t0 - (engine.stats.prefill_ns - passes_ns)
            per_step.append(host_ns / 1e3 / (_decode_steps(engine) - before))
            per_token.append(host_ns / 1e3 / ((engine.stats.decode_rows - rows) / c))  # a row's decode tokens
        before = _decode_steps(engine)
        prof = cProfile.Profile()
        prof.enable()
        engine.run(_requests(c, args.steps, rng))
        prof.disable()
        steps = _decode_steps(engine) - before
        torch_calls = torch_calls_a_step(engine, _requests(c, args.steps, rng))
    gc.unfreeze()
    stats = pstats.Stats(prof)
    text = ""
    if args.profile:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(args.profile)
        text = out.getvalue()
    return dict(us=statistics.median(per_step), spread=(min(per_step), max(per_step)),
                token_us=statistics.median(per_token), calls=stats.total_calls / steps, torch_calls=torch_calls,
                profile=text)  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    ap = parser()
    a = ap.parse_args(argv)
    arms = [x for x in a.arms.split(",") if x]
    if not arms or not set(arms) <= set(ARMS):
        ap.error(f"--arms takes {', '.join(ARMS)}, comma-separated; got {a.arms!r}")
    try:
        cs = [int(x) for x in a.concurrency.split(",")]
    except ValueError:
        ap.error(f"--concurrency takes integers, comma-separated; got {a.concurrency!r}")
    if any(c < 1 for c in cs) or a.steps < 2 or a.rounds < 1:
        ap.error("--concurrency values must be >= 1, --steps >= 2 and --rounds >= 1")
    print("| arm | c | host us / decode step, median [min-max] | host us / a row's decode token | "
          "Python calls / decode step | torch calls / decode step |\n|---|---|---|---|---|---|")
    profiles = []
    for c in cs:
        for arm in arms:
            r = measure(arm, c, a)
            print(f"| {arm} | {c} | {r['us']:.1f} [{r['spread'][0]:.1f}-{r['spread'][1]:.1f}] | {r['token_us']:.1f} | "
                  f"{r['calls']:.0f} | {r['torch_calls']:.2f} |", flush=True)  # fmt: skip
            profiles.append((arm, c, r["profile"]))
    for arm, c, text in profiles:
        if text:
            print(f"\n## {arm} at c={c}: the costliest functions of one run under cProfile\n\n```\n{text.strip()}\n```")


if __name__ == "__main__":
    main()
