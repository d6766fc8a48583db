"""The benchmarks' busy host (models/bench/host_load.py): a thread that holds the interpreter the fraction of each
millisecond it is asked for, measured from the main thread (how many GIL-releasing loop turns it completes), and
that is gone once its block ends, however it ends; a load outside [0, 1) refused where the option is read."""

from __future__ import annotations

import argparse
import re
import threading
import time

import pytest

from models.bench.arms import host_loads, round_order
from models.bench.host_load import HostLoad, load_fraction


def turns(seconds: float) -> int:
    """Loop turns the calling thread completes in ``seconds``, each a sleep(0) that lets go of the interpreter and
    takes it back (as an engine loop does around its GPU calls): a thread holding it makes each turn wait."""
    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        time.sleep(0)
        n += 1
    return n


def load_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "host-load"]


def test_the_load_holds_the_interpreter_the_fraction_asked_and_no_load_holds_nothing():
    """At 0.6 the main thread completes clearly fewer turns (about 0.4 of them) and the thread says it held about 0.6
    of the time; at 0 there is no thread and no fewer turns. Relative, with wide margins: a loaded 2-core box."""
    free = turns(0.3)
    with HostLoad(0.0) as none:
        assert not load_threads()
        idle = turns(0.3)
    with HostLoad(0.6) as busy:
        assert len(load_threads()) == 1
        held = turns(0.3)
    print(f"\nturns in 0.3 s: {free} free, {idle} at load 0, {held} at load 0.6 (achieved {busy.achieved:.2f})")
    assert none.achieved == 0.0 and idle > 0.75 * free
    assert held < 0.75 * min(free, idle)
    assert 0.3 < busy.achieved < 0.75  # 0.48-0.60 on the 2-core dev box with both cores kept busy besides


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
