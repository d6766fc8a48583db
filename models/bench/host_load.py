"""A busy host for the serving benchmarks (``--host-load F``): a background thread that holds the interpreter a
fraction F of each millisecond while an arm's timed run goes on, as an in-process server does while it detokenizes
and writes streams.

The thread spins in pure Python (a loop on ``time.perf_counter``: it holds the GIL) for F of a 1 ms period, then
sleeps to the end of the period (which releases it). Its periods are anchored to the clock, so a sleep that overshoots
is taken back from the next one; a thread that fell a whole period behind (it waited for the interpreter) starts
afresh rather than spinning twice to catch up. It asks for the interpreter as any thread does: where the main thread
holds it without letting go (pure Python for longer than the interpreter's switch interval, 5 ms by default), the
load gets less than F. So the thread measures what it held: ``achieved``, the time it spun over the wall time it ran,
which the reports give beside F.
"""

from __future__ import annotations

import argparse
import threading
import time

import numpy as np

PERIOD_S = 1e-3  # the load's period: it holds the interpreter F of each


def load_fraction(text: str) -> float:
    """A host load: a number in [0, 1), the fraction of each millisecond the load thread holds the interpreter."""
    try:
        f = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= f < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text}")
    return f


def load_text(fraction: float, achieved: list[float]) -> str:
    """A report's host-load cell: F and, under a load, the fraction the thread achieved (median over the runs)."""
    return f"{fraction:g} ({np.median(achieved):.2f})" if fraction else "0"


def host_load_text(loads: tuple[float, ...]) -> str:
    """A report header's words on the host loads its arms ran at."""
    if not any(loads):
        return "none (no load thread)"
    return (
        f"{', '.join(f'{f:g}' for f in loads)} (--host-load: during every timed run a thread held the interpreter "
        "that fraction of each millisecond, spinning in Python, models/bench/host_load.py; a row gives its load "
        "F and, in parentheses, the fraction of the run's wall time the thread held it, median over rounds)"
    )


class HostLoad:
    """A context manager: a thread holds the interpreter ``fraction`` of each millisecond while the block runs."""

    def __init__(self, fraction: float, period_s: float = PERIOD_S) -> None:
        if not 0 <= fraction < 1:
            raise ValueError(f"a host load is a fraction in [0, 1), got {fraction}")
        self.fraction = fraction
        self.period_s = period_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._held_s = 0.0  # the time the thread spun (written by the thread as it ends)
        self._wall_s = 0.0  # the time it ran, start to stop

    def __enter__(self) -> HostLoad:
        self._stop.clear()
        if self.fraction > 0:  # no load: no thread
            self._thread = threading.Thread(target=self._spin, name="host-load", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None

    @property
    def achieved(self) -> float:
        """The fraction of its wall time the thread held the interpreter (spun), once the block has ended; 0 for no
        load."""
        return self._held_s / self._wall_s if self._wall_s else 0.0

    def _spin(self, clock=time.perf_counter, sleep=time.sleep) -> None:
        """The thread: spin ``fraction`` of a period, sleep to the period's end, until told to stop. (``clock`` and
        ``sleep`` are the tests' way in: a fake clock makes the schedule exact.)"""
        period = self.period_s
        spin = self.fraction * period
        start = due = clock()
        held = 0.0
        while not self._stop.is_set():
            t = clock()
            end = t + spin
            while clock() < end:
                pass
            now = clock()
            held += now - t
            due += period
            if due < now:  # a period behind: sleep the rest of this one and start afresh, no catching up
                due = now + period - spin
            sleep(due - now)
        self._held_s, self._wall_s = held, clock() - start
