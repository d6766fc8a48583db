"""The traffic benchmark (models/bench/traffic.py, models/bench/workload.py): length distributions and arrivals as
specified, bad arguments refused in one line naming the argument before any engine is built, and a whole run on the
CPU (tiny model, both torch arms) whose report holds what a run served."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from models.bench import traffic
from models.bench.workload import Lengths, WorkloadError, arrival_times, read_trace


def test_lengths_parse_and_sample_within_their_bounds():
    rng = np.random.default_rng(0)
    assert (Lengths.parse("--x", "fixed:512").sample(rng, 5) == 512).all()
    u = Lengths.parse("--x", "uniform:3,9").sample(rng, 4000)
    assert u.min() == 3 and u.max() == 9 and set(np.unique(u)) == set(range(3, 10))
    spec = Lengths.parse("--x", "lognormal:median=256,sigma=0.9,min=32,max=1536")
    x = spec.sample(rng, 20000)
    assert x.min() >= 32 and x.max() <= 1536
    assert abs(np.median(x) - 256) < 12  # truncation moves the median little: the bounds are ~2 sigma out
    assert (x == 32).mean() < 0.01 and (x == 1536).mean() < 0.01  # redrawn, not clipped: no mass at the bounds


@pytest.mark.parametrize("text, words", [
    ("512", "the kind must be fixed, uniform or lognormal"),
    ("uniform:9", "not enough values"),
    ("uniform:9,3", "1 <= min <= max"),
    ("fixed:0", "1 <= min <= max"),
    ("lognormal:median=256,sigma=0.9", "needs median=, sigma=, min= and max="),
    ("lognormal:median=4000,sigma=0.9,min=32,max=1536", "median must lie in [min, max]"),
    ("lognormal:median=x,sigma=0.9,min=32,max=1536", "could not convert"),
])  # fmt: skip
def test_a_malformed_distribution_names_its_argument(text, words):
    with pytest.raises(WorkloadError, match="argument --gen-len") as info:
        Lengths.parse("--gen-len", text)
    assert words in str(info.value)


def test_poisson_arrivals_have_the_rate():
    rng = np.random.default_rng(1)
    t = arrival_times(40.0, 20001, rng)
    assert t[0] == 0 and (np.diff(t) >= 0).all()
    assert abs(20000 / t[-1] - 40.0) < 1.0
    assert (arrival_times(math.inf, 7, rng) == 0).all()


@pytest.mark.parametrize("lines, words", [
    (['{"arrival_s": 0, "prompt_len": 8}'], ":1: no field 'output_len'"),
    (['{"arrival_s": 0, "prompt_len": 8, "output_len": 2}', "[1, 2]"], ":2: expected an object"),
    (['{"arrival_s": -1, "prompt_len": 8, "output_len": 2}'], "arrival_s must be a number >= 0"),
    (['{"arrival_s": 0, "prompt_len": 8.5, "output_len": 2}'], "prompt_len must be an integer >= 1"),
    (["not json"], ":1: not JSON"),
    ([""], "no requests"),
])  # fmt: skip
def test_a_bad_trace_line_is_named(tmp_path, lines, words):
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(WorkloadError, match="argument --trace") as info:
        read_trace(path)
    assert words in str(info.value)


def test_a_trace_is_read_in_arrival_order(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"arrival_s": 0.5, "prompt_len": 4, "output_len": 2}\n\n'
                    '{"arrival_s": 0.1, "prompt_len": 9, "output_len": 3, "note": "ok"}\n')  # fmt: skip
    a, p, o = read_trace(path)
    assert a.tolist() == [0.1, 0.5] and p.tolist() == [9, 4] and o.tolist() == [3, 2]


CPU = ["--model", "qwen3_5-tiny", "--device", "cpu", "--page-size", "4", "--max-running", "4", "--no-progress"]


@pytest.mark.parametrize("args, words", [
    (["--prompt-len", "uniform:5"], "argument --prompt-len:"),
    (["--gen-len", "gauss:3"], "argument --gen-len:"),
    (["--rate", "0"], "argument --rate: must be > 0"),
    (["--rate", "fast"], "argument --rate: 'fast' is not a number"),
    (["--sampled-frac", "1.5"], "argument --sampled-frac: must be in [0, 1]"),
    (["--prompt-len", "fixed:5000"], "argument --prompt-len/--gen-len: a request of"),
    (["--prompt-len", "fixed:40", "--max-seq-len", "32"], "does not fit --max-seq-len 32"),
    (["--max-seq-len", "9000"], "argument --max-seq-len: 9000 is over qwen3_5-tiny's context of 4096"),
    (["--arms", "host"], "argument --arms: arm 'host' runs fa2 attention, which needs CUDA"),
    (["--arms", "resident-torch,nope"], "argument --arms: unknown arm 'nope'"),
    (["--arms", "resident-torch/fast"], "argument --arms: arm 'resident-torch/fast': an engine arm takes the suffix "
                                        "/async or /in-step or /async-prio"),
    (["--arms", "resident-torch@0"], "argument --arms: arm 'resident-torch@0': @ takes a token budget, a positive "
                                     "whole number"),
    (["--arms", "resident-torch/async@lots"], "arm 'resident-torch/async@lots': @ takes a token budget"),
    (["--model", "whisper-test"], "argument --model: 'whisper-test': the traffic benchmark serves the text models"),
    (["--trace", "t.jsonl", "--rate", "3"], "argument --trace: a trace gives arrivals and lengths: drop --rate"),
    (["--trace", "missing.jsonl"], "argument --trace: missing.jsonl: No such file or directory"),
])  # fmt: skip
def test_bad_arguments_end_in_one_line_before_any_engine_is_built(args, words, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.jsonl").write_text('{"arrival_s": 0, "prompt_len": 4, "output_len": 2}\n')
    monkeypatch.setattr(traffic, "Engine", None)  # building one would raise TypeError, not exit 2
    monkeypatch.setattr(traffic, "build_adapter", None)
    with pytest.raises(SystemExit) as info:
        traffic.main([*CPU, *args, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert err.count("\n") == 1 and err.startswith("python -m models.bench.traffic: error: ")
    assert words in err, err


def test_an_arms_suffixes_set_async_prefill_and_the_token_budget_and_a_plain_name_takes_the_flags():
    from models.bench.arms import arm_config, parse_arms

    assert parse_arms("resident-torch/async,resident-torch/in-step,host-torch", "cpu") == [
        "resident-torch/async", "resident-torch/in-step", "host-torch"]  # fmt: skip
    assert arm_config("resident-torch/async", async_prefill=False).async_prefill is True
    assert arm_config("resident-torch/in-step", async_prefill=True).async_prefill is False
    assert arm_config("resident-torch", async_prefill=True).async_prefill is True
    assert arm_config("host-torch").overlap is False and arm_config("host-torch/async").async_prefill is True
    cfg = arm_config("resident-torch/in-step@4096", token_budget=1024, async_prefill=True)
    assert (cfg.token_budget, cfg.async_prefill) == (4096, False)
    assert arm_config("resident-torch@512", token_budget=1024).token_budget == 512
    assert arm_config("resident-torch", token_budget=1024).token_budget == 1024
    assert arm_config("host-torch/async-prio", device="cuda").decode_priority == -1


def test_a_cpu_run_reports_what_it_served(tmp_path):
    """24 requests arriving at 400/s, varied lengths, a token budget that chunks prompts, sampled rows and stop
    tokens, two rounds of both torch arms: every request served in every run, the same tokens in both arms of a
    round, the report and its plots written."""
    out = tmp_path / "out"
    runs = traffic.main([*CPU, "--num-requests", "24", "--rate", "400", "--prompt-len", "uniform:3,30",
                         "--gen-len", "lognormal:median=6,sigma=0.8,min=2,max=20", "--token-budget", "12",
                         "--sampled-frac", "0.3", "--stop-frac", "0.3", "--rounds", "2", "--out", str(out)])
    assert [(r["round"], r["arm"]) for r in runs] == [(0, "host-torch"), (0, "resident-torch"),
                                                       (1, "resident-torch"), (1, "host-torch")]  # fmt: skip
    for r in runs:
        assert len(r["tokens"]) == 24 and len(r["ttft_ms"]) == 24
        assert r["output_tokens"] == sum(len(t) for t in r["tokens"])
        assert r["mixed_steps"] > 0 and r["prefill_passes"] > 0 and r["decode_steps"] > 0
        assert sum(s[4] for s in r["steps"]) == pytest.approx(r["prefill_passes"] * r["prefill_tokens_per_pass"])
        assert 0 < r["ttft_p50_ms"] <= r["ttft_p90_ms"] <= r["ttft_p99_ms"]
        assert len(r["itl_ms"]) == r["output_tokens"] - 24  # a gap for every token after a request's first
    assert runs[0]["tokens"] == runs[1]["tokens"] and runs[2]["tokens"] == runs[3]["tokens"]  # per round
    assert runs[0]["tokens"] != runs[2]["tokens"]  # each round draws its own traffic
    report = (out / "results.md").read_text()
    assert "Command: `python -m models.bench.traffic" in report and "| resident-torch |" in report
    row = next(line for line in report.splitlines() if line.startswith("| resident-torch |"))
    assert row.rstrip(" |").endswith("24/24 | 24/24")
    data = json.loads((out / "results.json").read_text())
    assert {r["arm"] for r in data["rows"]} == {"host-torch", "resident-torch"} and len(data["runs"]) == 4
    for name in ("ttft_cdf.png", "itl_cdf.png", "timeline.png"):
        assert (out / name).stat().st_size > 1000


def test_decode_rows_in_the_pass_with_async_passes_is_refused_by_the_engine_not_dropped(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        traffic.main([*CPU, "--arms", "resident-torch", "--decode-in-pass", "--async-prefill", "--out",
                      str(tmp_path / "out")])  # fmt: skip
    assert info.value.code == 2
    assert "engine resident-torch: decode_in_pass and async_prefill" in capsys.readouterr().err
