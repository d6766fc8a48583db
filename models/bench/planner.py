"""Planner host-time benchmark: plan + commit per step on the CPU, median over many steps, and the H2D a step issues.

    python -m models.bench.planner [--steps N] [--out models/bench/results/planner.md]

Scenarios (Qwen3.5-like layout: one APPEND pool of 16-token pages over a 32768-token context, positions, recurrent
slot, sampler; buckets 1..256):
  steady-64 / steady-256: every row mirrors the host and no row opens a page this step;
  crossing-64-8: 64 rows of which 8 open a page this step;
  new-64: 64 rows that all take a slot and are written whole.
Each timed region is exactly ``plan(state, step, streams)`` followed by ``commit(state, seq - 1)``; the Step record
is built outside it (its cost is reported on its own line).
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import numpy as np

from models.cli import OneLineParser
from resplan import (
    BucketPlan,
    HostStreams,
    KVPool,
    ResidentStream,
    RowLayout,
    Step,
    StreamMode,
    build_planner,
    commit,
    plan,
    release,
)

PAGE = 16
BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def _setup(capacity: int = 4096):
    layout = RowLayout((KVPool("kv", PAGE, 8192, 32768),), "kv", recurrent=True, sampler=True)
    buckets = [BucketPlan.build(b, {"kv": ResidentStream("decode", StreamMode.APPEND)}, host_plan_free=True)
               for b in BUCKETS]  # fmt: skip
    state = build_planner(layout, buckets, capacity)
    streams = HostStreams.zeros(layout, capacity)
    kv = streams.kv["kv"]
    rng = np.random.default_rng(0)
    kv.pages[:] = rng.integers(1, 8192, size=kv.pages.shape, dtype=np.int32)
    streams.recurrent_slot[:] = np.arange(capacity, dtype=np.int32) + 1
    return layout, state, streams


def _bucket(n: int) -> int:
    return next(b for b in BUCKETS if b >= n)


def scenario(name: str, rows: int, crossings: int, new_rows: bool, steps: int) -> dict:
    """Median/min/max microseconds of plan+commit, and the H2D copies/bytes of the last program."""
    _, state, streams = _setup()
    kv = streams.kv["kv"]
    h = np.arange(rows, dtype=np.int64)
    times, programs = [], []
    b = _bucket(rows)
    for seq, i in enumerate(range(steps)):
        if new_rows:  # fresh handles each step: release last step's rows, admit new ones
            h = np.arange(rows, dtype=np.int64) + (i % 2) * rows
            state = release(state, h + (1 - 2 * (i % 2)) * rows) if i else state
        # lengths: `crossings` rows sit on a page boundary (L % PAGE == 0), the rest one past it
        L = 100 * PAGE + 1 + (i % (PAGE - 2))
        kv.lengths[h] = L
        kv.lengths[h[:crossings]] = 100 * PAGE + PAGE * (1 + i % 50)
        step = Step(h, b, seq)
        t0 = time.perf_counter_ns()
        state, program = plan(state, step, streams)
        state = commit(state, seq - 1)
        times.append(time.perf_counter_ns() - t0)
        programs.append(program)
    t = np.array(times[steps // 10 :]) / 1e3  # drop warm-up
    p = programs[-1]
    return dict(name=name, rows=rows, median=float(np.median(t)), p10=float(np.percentile(t, 10)),
                p90=float(np.percentile(t, 90)), copies=p.h2d_copies, bytes=p.h2d_bytes, crossings=p.crossings,
                whole=p.rows_whole)


def step_build_us(rows: int, steps: int) -> float:
    h = np.arange(rows, dtype=np.int64)
    t0 = time.perf_counter_ns()
    for i in range(steps):
        Step(h, _bucket(rows), i)
    return (time.perf_counter_ns() - t0) / steps / 1e3


def parser() -> argparse.ArgumentParser:
    ap = OneLineParser(prog="python -m models.bench.planner", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--steps", type=int, default=20000, help="steps per scenario (default 20000)")
    ap.add_argument("--out", type=Path, default=None, help="also write the markdown table here")
    return ap


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    results = [
        scenario("steady-64", 64, 0, False, args.steps),
        scenario("steady-256", 256, 0, False, args.steps),
        scenario("crossing-64-8", 64, 8, False, args.steps),
        scenario("new-64", 64, 0, True, max(200, args.steps // 10)),
    ]
    lines = [
        f"Planner host time, plan + commit per step (`python -m models.bench.planner --steps {args.steps}`), "
        f"{platform.processor() or platform.machine()}, Python {sys.version.split()[0]}, numpy {np.__version__}.",
        "",
        "| scenario | rows | median us | p10 us | p90 us | H2D copies | H2D bytes | crossings | rows whole |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(f"| {r['name']} | {r['rows']} | {r['median']:.1f} | {r['p10']:.1f} | {r['p90']:.1f} | "
                     f"{r['copies']} | {r['bytes']} | {r['crossings']} | {r['whole']} |")
    lines += ["", f"Step record construction (outside the timed region): {step_build_us(64, args.steps):.1f} us at "
              "64 rows."]
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
