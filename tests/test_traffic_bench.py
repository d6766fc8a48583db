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
from models.engine import EngineConfig


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
    (["--arms", "resident-torch,resident-torch"], "argument --arms: an arm is named twice"),
    (["--arms", "resident-torch/async"], "argument --arms: unknown arm 'resident-torch/async'"),  # no suffixes
    (["--prefill", "fast"], "argument --prefill: 'fast' is not a placement (in-step, in-pass, beside, "
                            "beside-priority)"),
    (["--prefill", "in-step,beside,in-step"], "argument --prefill: in-step is named twice"),
    (["--prefill", ","], "argument --prefill: no placement named"),
    (["--prefill", "beside-priority"], "argument --prefill: prefill BESIDE_PRIORITY ranks the steps' CUDA stream "
                                       "above the passes'; device cpu has no streams"),
    (["--token-budget", "0"], "argument --token-budget: '0' is not auto, whole or an integer >= 1"),
    (["--token-budget", "auto,lots"], "argument --token-budget: 'lots' is not auto, whole or an integer >= 1"),
    (["--token-budget", "512,whole,512"], "argument --token-budget: 512 is named twice"),
    (["--prefill-graphs", "-1"], "argument --prefill-graphs: must be >= 0, got -1"),
    (["--host-load", "1"], "argument --host-load: must be in [0, 1), got 1"),
    (["--host-load", "0,-0.2"], "argument --host-load: must be in [0, 1), got -0.2"),
    (["--host-load", "0.3,lots"], "argument --host-load: 'lots' is not a number"),
    (["--host-load", "0.3,0.3"], "argument --host-load: 0.3 is named twice"),
    # a placement and budget the engine config refuses, refused when the run builds the configs, not dropped
    (["--arms", "resident-torch", "--prefill", "in-step,in-pass", "--token-budget", "4"],
     "arm resident-torch in-pass 4: prefill IN_PASS: token_budget 4 leaves no prompt token beside 4 decode rows"),
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


def test_a_run_has_every_arm_at_every_placement_and_budget_each_resolved_as_its_config_resolves_it():
    from models.bench.arms import Arm, Budget, budgets, build_arms, placements
    from models.engine import BESIDE_TOKEN_BUDGET, IN_STEP_TOKEN_BUDGET, PrefillPlacement

    IN_STEP, IN_PASS, BESIDE = PrefillPlacement.IN_STEP, PrefillPlacement.IN_PASS, PrefillPlacement.BESIDE
    assert placements("beside,in-step") == (BESIDE, IN_STEP) and budgets("auto,4096,whole") == (
        Budget.AUTO, 4096, Budget.WHOLE)  # fmt: skip
    arms = build_arms(["resident-torch", "host-torch"], (BESIDE, IN_STEP), (Budget.AUTO, 4096), "cpu")
    assert [a.label for a in arms] == [  # arm, then placement, then budget; auto as the placement resolves it
        f"resident-torch beside {BESIDE_TOKEN_BUDGET}", "resident-torch beside 4096",
        f"resident-torch in-step {IN_STEP_TOKEN_BUDGET}", "resident-torch in-step 4096",
        f"host-torch beside {BESIDE_TOKEN_BUDGET}", "host-torch beside 4096",
        f"host-torch in-step {IN_STEP_TOKEN_BUDGET}", "host-torch in-step 4096"]  # fmt: skip
    cfg = arms[3].config(max_running=4)
    assert (cfg.prefill, cfg.token_budget, cfg.overlap, cfg.max_running) == (IN_STEP, 4096, True, 4)
    assert arms[4].config().overlap is False and arms[4].config().prefill is BESIDE
    for a in arms:  # each arm's fields are the ones its config resolves
        assert (a.config().prefill, a.config().token_budget) == (a.prefill, a.token_budget)
    auto = EngineConfig(device="cpu", prefill=IN_PASS).token_budget  # auto and the number it stands for: one arm
    assert build_arms(["resident-torch"], (IN_PASS,), (Budget.AUTO, auto), "cpu") == [
        Arm.of("resident-torch", IN_PASS, auto, "cpu")]  # fmt: skip
    whole = Arm.of("resident-torch", IN_STEP, Budget.WHOLE, "cpu")
    assert whole.config().token_budget is None and whole.label == "resident-torch in-step whole"
    prio = Arm.of("host-torch", PrefillPlacement.BESIDE_PRIORITY, Budget.AUTO, "cuda")
    assert prio.config(device="cuda").prefill is PrefillPlacement.BESIDE_PRIORITY
    assert prio.token_budget == BESIDE_TOKEN_BUDGET and prio.peer("resident-torch").label == (
        f"resident-torch beside-priority {BESIDE_TOKEN_BUDGET}")  # fmt: skip
    with pytest.raises(ValueError, match="device cpu has no streams"):
        Arm.of("host-torch", PrefillPlacement.BESIDE_PRIORITY, Budget.AUTO, "cpu")


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


def test_a_run_alternates_placements_and_budgets_and_its_report_labels_each(tmp_path):
    """One engine arm at two placements and two budgets is four arms, alternated round by round, each its own row
    (arm, placement, budget) and each named in the header as its config resolved it (auto: the engine's 1024 in
    the step and in the pass)."""
    from models.engine import IN_STEP_TOKEN_BUDGET

    out = tmp_path / "out"
    runs = traffic.main([*CPU, "--arms", "resident-torch", "--prefill", "in-step,in-pass", "--token-budget",
                         "auto,12", "--num-requests", "8", "--rate", "inf", "--prompt-len", "uniform:3,30",
                         "--gen-len", "uniform:2,6", "--rounds", "2", "--warmup", "0", "--no-prerun", "--out",
                         str(out)])  # fmt: skip
    auto = IN_STEP_TOKEN_BUDGET
    labels = [f"resident-torch in-step {auto}", "resident-torch in-step 12", f"resident-torch in-pass {auto}",
              "resident-torch in-pass 12"]  # fmt: skip
    assert [(r["round"], r["label"]) for r in runs] == [(0, x) for x in labels] + [(1, x) for x in labels[::-1]]
    assert {(r["prefill"], r["token_budget"]) for r in runs} == {(p, b) for p in ("in-step", "in-pass")
                                                                 for b in (auto, 12)}  # fmt: skip
    for r in runs:
        assert len(r["tokens"]) == 8 and r["arm"] == "resident-torch"
        assert r["prefill_tokens_per_pass"] <= r["token_budget"]
    report = (out / "results.md").read_text()
    assert "; ".join(labels) in report.split("\n\n")[0]
    for p in ("in-step", "in-pass"):
        for b in (auto, 12):
            assert f"| resident-torch | {p} | {b} |" in report
    data = json.loads((out / "results.json").read_text())
    assert [r["label"] for r in data["rows"]] == labels


def test_host_triton_overlap_is_resident_triton_with_its_rows_refilled_on_the_host():
    """The baseline of the row store: host-planned, overlapped, the plan-free Triton attention; its engine config
    differs from resident-triton's in the planning alone, and the GPU runs of both benchmarks run it by default."""
    import attrs

    from models.bench import serve
    from models.bench.arms import Arm, Budget, parse_arms
    from models.engine import Planning, PrefillPlacement
    from models.layers.decode_attention import Backend

    arm = Arm.of("host-triton-overlap", PrefillPlacement.IN_STEP, Budget.AUTO, "cpu")
    cfg = arm.config(max_running=4)
    assert (cfg.planning, cfg.attention, cfg.overlap) == (Planning.HOST, Backend.TRITON, True)
    assert attrs.evolve(arm.peer("resident-triton").config(max_running=4), planning=Planning.HOST) == cfg
    assert parse_arms("host-triton-overlap", "cpu") == ["host-triton-overlap"]  # Triton interprets on a CPU
    assert "host-triton-overlap" in traffic.GPU_ARMS.split(",")
    served = serve.parser().parse_args(["--out", "x"]).arms
    assert "host-triton-overlap" in parse_arms(served, "cuda", extra=(serve.TRANSFORMERS,))


def test_a_run_on_a_busy_host_runs_every_arm_at_every_load_and_reports_what_the_load_thread_achieved(tmp_path):
    """Two host loads alternated with the arm round by round (an arm's loads one after another, the order reversed
    every other round), the same tokens at both loads, each run's load thread held the interpreter some of the time
    and none at load 0, and the report names both. Tiny on purpose: a load slows the eager CPU engine several times
    over (the 24-request run above took 9 s without one and 54 s at 0.3 on the 2-core dev box)."""
    out = tmp_path / "out"
    runs = traffic.main([*CPU, "--arms", "resident-torch", "--num-requests", "4", "--rate", "inf", "--prompt-len",
                         "fixed:8", "--gen-len", "fixed:4", "--rounds", "2", "--warmup", "0", "--no-prerun",
                         "--host-load", "0,0.3", "--out", str(out)])  # fmt: skip
    assert [(r["round"], r["host_load"]) for r in runs] == [(0, 0.0), (0, 0.3), (1, 0.3), (1, 0.0)]
    assert all((r["host_load_achieved"] > 0) == (r["host_load"] > 0) for r in runs)
    assert runs[0]["tokens"] == runs[1]["tokens"] and runs[2]["tokens"] == runs[3]["tokens"]
    report = (out / "results.md").read_text()
    assert "Host load: 0, 0.3 (--host-load: during every timed run a thread held the interpreter" in report
    assert "| resident-torch | in-step | 1024 | 0 |" in report and "| resident-torch | in-step | 1024 | 0.3 (" in report
    assert json.loads((out / "results.json").read_text())["rows"][1]["host_load"] == 0.3


def test_each_host_load_is_a_block_of_rows_each_arm_paired_with_the_host_arm_at_its_own_load():
    """The report's rows: the loads one block after another, every arm in each, its ratio paired with the host arm
    at its own load, its load and the fraction its thread achieved (median over rounds) in its own column."""
    from models.bench.arms import Arm

    host, res = (Arm.of(a, traffic.PrefillPlacement.IN_STEP, 12, "cpu") for a in ("host-torch", "resident-torch"))

    def run(arm, tokps, load, achieved):
        return {**{key: 1.0 for _, key, _ in traffic.COLUMNS}, "tokps": tokps, "label": arm.label, "host_load": load,
                "host_load_achieved": achieved, "tokens": [(1,)]}

    runs = [run(host, 100.0, 0.0, 0.0), run(res, 120.0, 0.0, 0.0), run(host, 50.0, 0.6, 0.58),
            run(res, 90.0, 0.6, 0.5), run(host, 50.0, 0.6, 0.56), run(res, 100.0, 0.6, 0.6)]  # fmt: skip
    md, rows = traffic.summarize(runs, [host, res], (0.0, 0.6))
    assert [(r["arm"], r["host_load"], r["vs_host"]) for r in rows] == [
        ("host-torch", 0.0, "-"), ("resident-torch", 0.0, "1.20x [1.20-1.20]"), ("host-torch", 0.6, "-"),
        ("resident-torch", 0.6, "1.90x [1.80-2.00]")]  # fmt: skip
    assert rows[3]["host_load_achieved"] == pytest.approx(0.55)
    assert "| resident-torch | in-step | 12 | 0 | 120 | 1.20x [1.20-1.20] |" in md
    assert "| resident-torch | in-step | 12 | 0.6 (0.55) | 95 [90-100] | 1.90x [1.80-2.00] |" in md


def test_a_tensor_parallel_run_places_its_passes_in_the_step():
    """``RankEngine`` refuses a pass beside the decode steps: under torchrun the default is in the step, and a beside
    placement asked for is refused naming --prefill."""
    from models.bench.arms import Budget
    from models.engine import IN_STEP_TOKEN_BUDGET, PrefillPlacement

    auto = (Budget.AUTO,)
    assert [a.label for a in traffic.arms_for(["resident-torch"], None, auto, "cuda", ranks=2)] == [
        f"resident-torch in-step {IN_STEP_TOKEN_BUDGET}"]  # fmt: skip
    assert [a.prefill for a in traffic.arms_for(["resident-torch"], None, auto, "cuda", ranks=1)] == [
        PrefillPlacement.BESIDE]  # fmt: skip
    assert [a.prefill for a in traffic.arms_for(["resident-torch"], (PrefillPlacement.IN_PASS,), auto, "cuda",
                                                ranks=2)] == [PrefillPlacement.IN_PASS]  # fmt: skip
    with pytest.raises(WorkloadError, match="argument --prefill: beside: a tensor-parallel engine runs its passes in "
                                            "the step"):  # fmt: skip
        traffic.arms_for(["resident-torch"], (PrefillPlacement.IN_STEP, PrefillPlacement.BESIDE), auto, "cuda", 2)


def test_the_report_names_each_request_whose_tokens_differ_and_where():
    """``token_differences`` names each request whose tokens differ from the other arm's, round by round: its index,
    the first token that differs, both lengths (a shorter stream that is a prefix of the other differs where it
    ends); ``same_tokens`` counts from them the requests equal in their first token and in all (the lowest round)."""
    base = [{"tokens": [(1, 2, 3), (4, 5), (6,)]}, {"tokens": [(7, 8), (9,), (1, 1)]}]
    runs = [{"tokens": [(1, 2, 3), (4, 6), (6, 0)]}, {"tokens": [(7, 8), (9,), (2, 1)]}]
    diffs = traffic.token_differences(runs, base)
    assert diffs == [[[1, 1, 2, 2], [2, 1, 2, 1]], [[2, 0, 2, 2]]]
    assert traffic.same_tokens(diffs, 3) == ("2/3", "1/3")
    assert traffic.token_differences(base, base) == [[], []]
    assert traffic.same_tokens(traffic.token_differences(runs, []), 3) == ("-", "-")  # nothing to compare with


def test_an_arm_of_k_tokens_a_launch_is_compared_with_its_one_token_twin(tmp_path):
    """``resident-torch-k4`` beside ``resident-torch``: its row says how many requests got its twin's tokens (all of
    them: sampled rows and stop tokens included) and its throughput against the twin's."""
    out = tmp_path / "out"
    traffic.main([*CPU, "--arms", "resident-torch,resident-torch-k4", "--num-requests", "12", "--rate", "inf",
                  "--prompt-len", "uniform:3,20", "--gen-len", "uniform:4,20", "--sampled-frac", "0.3", "--stop-frac",
                  "0.3", "--rounds", "1", "--warmup", "0", "--no-prerun", "--out", str(out)])  # fmt: skip
    rows = {r["arm"]: r for r in json.loads((out / "results.json").read_text())["rows"]}
    assert rows["resident-torch-k4"]["tokens_same_twin"] == "12/12" and rows["resident-torch-k4"]["vs_twin"] != "-"
    assert rows["resident-torch"]["tokens_same_twin"] == "-"  # (no twin: it is the one-token arm)
