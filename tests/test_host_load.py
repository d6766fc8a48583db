"""The benchmarks' busy host (models/bench/host_load.py): a thread that holds the interpreter the fraction of each
millisecond it is asked for (its schedule checked on a fake clock: no wall-clock timing in a test), and that is gone
once its block ends, however it ends; a load outside [0, 1) refused where the option is read."""

from __future__ import annotations

import argparse
import re
import threading

import numpy as np
import pytest

from models.bench.arms import host_loads, round_order
from models.bench.host_load import HostLoad, load_fraction


def load_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "host-load"]


class FakeTime:
    """A clock that moves 1 us a reading and by exactly what is slept (plus ``overshoot``, and ``stall`` once, at the
    ``stall_at``-th sleep: the thread waited that long for the interpreter); it stops the load after ``periods``
    sleeps. It records every sleep asked for."""

    def __init__(self, load: HostLoad, periods: int, overshoot: float = 0.0, stall: float = 0.0, stall_at: int = -1):
        self.load, self.periods, self.overshoot, self.stall, self.stall_at = load, periods, overshoot, stall, stall_at
        self.now, self.asked = 0.0, []

    def clock(self) -> float:
        self.now += 1e-6
        return self.now

    def sleep(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("sleep length must be non-negative")  # as time.sleep
        self.asked.append(seconds)
        self.now += seconds + self.overshoot + (self.stall if len(self.asked) == self.stall_at else 0.0)
        if len(self.asked) == self.periods:
            self.load._stop.set()


@pytest.mark.parametrize("fraction", [0.3, 0.6, 0.9])
def test_the_thread_spins_the_fraction_asked_of_each_period(fraction):
    """On an exact clock the thread spins F of every 1 ms period and sleeps the rest, so it reports F held."""
    load = HostLoad(fraction)
    fake = FakeTime(load, periods=200)
    load._spin(fake.clock, fake.sleep)
    assert load.achieved == pytest.approx(fraction, abs=0.01)
    assert np.allclose(fake.asked, (1 - fraction) * 1e-3, atol=5e-6)


def test_a_sleep_that_overshoots_is_taken_back_from_the_next_period():
    """Sleeps that each wake 0.1 ms late still give F: the periods are anchored to the clock, not to the wake-ups."""
    load = HostLoad(0.6)
    fake = FakeTime(load, periods=200, overshoot=1e-4)
    load._spin(fake.clock, fake.sleep)
    assert load.achieved == pytest.approx(0.6, abs=0.01)
    assert np.allclose(fake.asked[1:], 0.3e-3, atol=5e-6)  # 0.4 ms asked, 0.1 ms of it taken by the last overshoot


def test_a_thread_that_fell_periods_behind_starts_afresh_and_does_not_spin_to_catch_up():
    """A 5 ms stall (the thread waited for the interpreter): the next sleep is the rest of one period, never negative
    (time.sleep would raise), and the spin per period stays F of it, so the held fraction only drops."""
    load = HostLoad(0.6)
    fake = FakeTime(load, periods=100, stall=5e-3, stall_at=50)
    load._spin(fake.clock, fake.sleep)
    assert min(fake.asked) >= 0 and np.allclose(fake.asked, 0.4e-3, atol=5e-6)
    assert load._held_s == pytest.approx(100 * 0.6e-3, rel=0.01)
    assert load.achieved == pytest.approx(100 * 0.6e-3 / (100e-3 + 5e-3), abs=0.01)


def test_no_load_starts_no_thread_and_reports_nothing_held():
    with HostLoad(0.0) as none:
        assert not load_threads()
    assert none.achieved == 0.0


def test_the_thread_ends_with_its_block_and_when_the_block_raises():
    with HostLoad(0.5):
        assert load_threads()
    assert not load_threads()
    with pytest.raises(KeyError), HostLoad(0.5):
        assert load_threads()
        raise KeyError("the run failed")
    assert not load_threads()


@pytest.mark.parametrize("text, words", [
    ("1", "must be in [0, 1), got 1"),
    ("-0.1", "must be in [0, 1), got -0.1"),
    ("nan", "must be in [0, 1), got nan"),
    ("busy", "'busy' is not a number"),
])  # fmt: skip
def test_a_load_outside_zero_to_one_is_refused(text, words):
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape(words)):
        load_fraction(text)


def test_a_load_of_one_is_refused_where_it_is_built():
    with pytest.raises(ValueError, match=r"a host load is a fraction in \[0, 1\)"):
        HostLoad(1.0)


def test_every_arm_runs_at_every_load_alternated_as_the_arms_are():
    assert host_loads("0,0.3,0.6") == (0.0, 0.3, 0.6)
    assert round_order(["a", "b"], (0.0, 0.6), 0) == [("a", 0.0), ("a", 0.6), ("b", 0.0), ("b", 0.6)]
    assert round_order(["a", "b"], (0.0, 0.6), 1) == [("b", 0.6), ("b", 0.0), ("a", 0.6), ("a", 0.0)]
    with pytest.raises(argparse.ArgumentTypeError, match="0.30 is named twice"):
        host_loads("0.3,0.30")


def test_serve_refuses_a_bad_load_in_one_line_as_it_reads_it(tmp_path, capsys):
    """(traffic's refusals are in tests/test_traffic_bench.py's table.)"""
    from models.bench import serve

    with pytest.raises(SystemExit) as info:
        serve.main(["--host-load", "0,0.6,1.2", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert err == "python -m models.bench.serve: error: argument --host-load: must be in [0, 1), got 1.2\n"
