"""``models.bench.host_step``: the engine's loop with the replays taken out runs to completion in both arms and reports
a positive host time and call count a decode step, and its torch calls a decode step (the host arm's refill, one copy
each; the resident arm's crossings, fewer; both arms' input ids where they changed); a bad argument is one line."""

from __future__ import annotations

import re

import pytest

from models.bench import host_step


def test_both_arms_report_a_host_time_and_calls_a_step(capsys):
    host_step.main(["--concurrency", "2", "--steps", "12", "--rounds", "1", "--profile", "5"])
    out = capsys.readouterr().out
    rows = re.findall(r"^\| (resident|host) \| 2 \| ([\d.]+) \[[\d.]+-[\d.]+\] \| [\d.]+ \| (\d+) \| ([\d.]+) \|$", out,
                      re.M)  # fmt: skip
    assert [r[0] for r in rows] == ["resident", "host"], out
    assert all(float(us) > 0 and int(calls) > 0 for _, us, calls, _ in rows)
    assert float(rows[0][3]) < float(rows[1][3]) and float(rows[1][3]) >= 1  # (and the steps whose ids changed)
    assert out.count("the costliest functions of one run under cProfile") == 2


@pytest.mark.parametrize("args", [["--arms", "fa2"], ["--concurrency", "0"], ["--steps", "1"]])
def test_bad_arguments_are_refused_in_one_line(args, capsys):
    with pytest.raises(SystemExit) as info:
        host_step.main(args)
    assert info.value.code == 2 and capsys.readouterr().err.count("\n") == 1
