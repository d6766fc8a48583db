"""The serving benchmark's summary (models/bench/serve.py): ratios against host paired by round, on synthetic runs
whose ratios are known by construction."""

from __future__ import annotations

from pathlib import Path

import pytest

from models.bench.arms import Arm, Budget
from models.bench.serve import summarize
from models.engine import PrefillPlacement

ZERO = dict(ttft_p50_ms=5.0, step_us=1.0, plan_us=1.0, attn_schedule_us=0.0, launch_us=1.0, wait_us=1.0, gpu_us=1.0,
            h2d_copies=1.0, h2d_bytes=1.0, tokens=[(1, 2)])  # fmt: skip


HOST, XQA = (Arm.of(name, PrefillPlacement.BESIDE, Budget.WHOLE, "cuda") for name in ("host", "resident-xqa"))


def run(arm, rnd, tokps, itl_mean, decode_tokps, load=0.0, achieved=0.0):
    return dict(model="m", c=1, arm=arm.name, label=arm.label, tokps=tokps, itl_p50_ms=itl_mean,
                itl_mean_ms=itl_mean, decode_tokps=decode_tokps, host_load=load, host_load_achieved=achieved,
                **ZERO)  # fmt: skip


def test_ratios_against_host_are_paired_by_round():
    runs = [run(HOST, 0, 100.0, 2.0, 1000.0), run(XQA, 0, 130.0, 1.6, 1250.0),
            run(HOST, 1, 200.0, 4.0, 2000.0), run(XQA, 1, 220.0, 2.5, 2400.0)]  # fmt: skip
    md, rows = summarize(runs, [HOST, XQA])
    res = next(r for r in rows if r["arm"] == "resident-xqa")
    assert res["ratio_min"] == pytest.approx(220 / 200) and res["ratio_max"] == pytest.approx(130 / 100)
    line = next(line for line in md.splitlines() if "| resident-xqa |" in line)
    cols = [c.strip() for c in line.strip("|").split("|")]
    header = [c.strip() for c in md.splitlines()[0].strip("|").split("|")]
    per_token = cols[header.index("per token vs host (ITL mean)")]
    lo, hi = sorted([2.0 / 1.6, 4.0 / 2.5])  # 1.25, 1.6: paired by round
    assert per_token == f"{(lo + hi) / 2:.2f}x [{lo:.2f}-{hi:.2f}]"
    decode = [c for c, h in zip(cols, header, strict=True) if h == "vs host"][1]
    assert decode == f"{(1.25 + 1.2) / 2:.2f}x [1.20-1.25]"


def test_an_arm_is_paired_with_the_host_arm_at_its_own_placement_and_budget():
    host_in, xqa_in = (Arm.of(name, PrefillPlacement.IN_STEP, 1024, "cuda") for name in ("host", "resident-xqa"))
    runs = [run(HOST, 0, 100.0, 2.0, 1000.0), run(XQA, 0, 150.0, 1.6, 1250.0),
            run(host_in, 0, 50.0, 2.0, 1000.0), run(xqa_in, 0, 100.0, 1.6, 1250.0)]  # fmt: skip
    md, rows = summarize(runs, [HOST, XQA, host_in, xqa_in])
    ratio = {r["label"]: r["ratio_median"] for r in rows}
    assert ratio[XQA.label] == pytest.approx(1.5) and ratio[xqa_in.label] == pytest.approx(2.0)
    assert "| m c=1 | 0 | resident-xqa | in-step | 1024 |" in md
    assert "| m c=1 | 0 | resident-xqa | beside | whole |" in md


def test_every_arm_is_paired_with_host_triton_overlap_the_baseline_of_the_row_store():
    """resident-triton over host-triton-overlap (rows resident vs a host refill) in its own column, paired by round;
    the baseline itself has no ratio against itself."""
    base, res = (Arm.of(name, PrefillPlacement.BESIDE, Budget.WHOLE, "cuda")
                 for name in ("host-triton-overlap", "resident-triton"))  # fmt: skip
    runs = [run(HOST, 0, 100.0, 2.0, 1000.0), run(base, 0, 150.0, 1.6, 1250.0), run(res, 0, 165.0, 1.5, 1300.0),
            run(HOST, 1, 100.0, 2.0, 1000.0), run(base, 1, 200.0, 1.6, 1250.0), run(res, 1, 240.0, 1.5, 1300.0)]
    md, _ = summarize(runs, [HOST, base, res])
    header = [c.strip() for c in md.splitlines()[0].strip("|").split("|")]
    col = header.index("vs host-triton-overlap")
    cells = {cols[2]: cols[col] for cols in ([c.strip() for c in line.strip("|").split("|")]
                                             for line in md.splitlines()[2:])}  # fmt: skip
    assert cells["resident-triton"] == "1.15x [1.10-1.20]" and cells["host-triton-overlap"] == "-"
    assert cells["host"] == f"{(100 / 150 + 100 / 200) / 2:.2f}x [0.50-0.67]"


def test_each_host_load_is_a_cell_of_its_own_labelled_by_the_load_and_what_the_thread_achieved():
    """An arm at two host loads is two rows, each paired with the host arm at its own load, each naming its load and
    the fraction the load thread achieved (median over rounds)."""
    runs = [run(HOST, 0, 100.0, 2.0, 1000.0), run(XQA, 0, 150.0, 1.6, 1250.0),
            run(HOST, 0, 50.0, 4.0, 500.0, 0.6, 0.58), run(XQA, 0, 100.0, 2.0, 800.0, 0.6, 0.58),
            run(HOST, 1, 50.0, 4.0, 500.0, 0.6, 0.56), run(XQA, 1, 100.0, 2.0, 800.0, 0.6, 0.6)]  # fmt: skip
    md, rows = summarize(runs, [HOST, XQA])
    assert [(r["host_load"], r["arm"]) for r in rows] == [(0.0, "host"), (0.0, "resident-xqa"), (0.6, "host"),
                                                          (0.6, "resident-xqa")]  # fmt: skip
    assert [r["ratio_median"] for r in rows] == pytest.approx([1.0, 1.5, 1.0, 2.0])
    assert rows[3]["host_load_achieved"] == pytest.approx(0.59)  # the median of 0.58 and 0.6
    assert "| m c=1 | 0 | resident-xqa | beside | whole | 150 [150-150] | 1.50x [1.50-1.50] |" in md
    assert "| m c=1 | 0.6 (0.59) | resident-xqa | beside | whole | 100 [100-100] | 2.00x [2.00-2.00] |" in md


def test_the_host_yardstick_times_a_steady_planner_step():
    from models.bench.arms import planner_yardstick

    text = planner_yardstick(200)
    us = float(text.split("step ")[1].split(" us")[0])
    assert text.startswith("planner steady 64-row step") and 0 < us < 10_000


def test_a_run_gives_every_arm_at_every_load_alternated_each_row_labelled_by_its_load(tmp_path, monkeypatch):
    """``main`` with its timed runs stubbed (no GPU here): every engine arm and transformers at every host load of
    ``--host-load``, an arm's loads one after another, the whole order reversed in the second round; the report a
    cell per load, each row naming it."""
    from types import SimpleNamespace

    from models.bench import serve

    calls = []

    def fake_run(load, label, **more):
        calls.append((label, load))
        return dict(label=label, arm=label.split()[0], c=1, tokps=100.0, itl_p50_ms=1.0, itl_mean_ms=1.0,
                    decode_tokps=1.0, host_load=load, host_load_achieved=load * 0.9, **ZERO, **more)  # fmt: skip

    monkeypatch.setattr(serve.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(serve.torch.cuda, "get_device_name", lambda: "no GPU")
    monkeypatch.setattr(serve.torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(serve, "planner_yardstick", lambda: "-")
    monkeypatch.setattr(serve, "build_adapter", lambda *a, **k: SimpleNamespace(vocab_size=8))
    monkeypatch.setattr(serve, "engine_run", lambda adapter, arm, cfg, c, args, seed, engine_cache, load: fake_run(
        load, arm.label))  # fmt: skip
    monkeypatch.setattr(serve, "transformers_run", lambda adapter, c, args, seed, load: fake_run(load, "transformers"))
    serve.main(["--arms", "host-triton-overlap,resident-triton,transformers", "--concurrency", "1",
                "--host-load", "0,0.6", "--out", str(tmp_path)])  # fmt: skip
    base, res = "host-triton-overlap beside whole", "resident-triton beside whole"
    order = [(a, f) for a in (base, res, "transformers") for f in (0.0, 0.6)]
    assert calls == order + order[::-1]
    md = (tmp_path / "results.md").read_text()
    assert "| qwen3_5-0.8b c=1 | 0 | resident-triton |" in md
    assert ("| qwen3_5-0.8b c=1 | 0.6 (0.54) | resident-triton | beside | whole | 100 [100-100] | - | - "
            "| 1.00x [1.00-1.00] |") in md  # no host arm ran; paired with host-triton-overlap at its load
    assert "Host load: 0, 0.6 (--host-load:" in md


def test_serve_http_alternates_http_and_in_process_rounds_and_pairs_them(tmp_path, monkeypatch):
    """serve_http with its server and traffic runs stubbed: each round of a workload runs once through HTTP and once
    in-process on the same draw (seed + round), the side going first alternating by round; the table pairs them by
    round (ratios and differences known by construction)."""
    from models.bench import serve_http

    calls = []
    tokps = {("http", 0): 90.0, ("engine", 0): 100.0, ("http", 1): 110.0, ("engine", 1): 100.0,
             ("http", 2): 95.0, ("engine", 2): 100.0}  # fmt: skip

    def traffic(args, w, out, url, rnd, rounds=1):
        side = "http" if url else "engine"
        calls.append((w, side, args.seed + rnd, rounds))
        t = tokps[(side, rnd)]
        return [dict(tokps=t, ttft_p50_ms=t / 10, itl_p50_ms=t / 100, failed=0, front_cpu_us_token=1.0,
                     engine_decode_step_ms=1.0, engine_beside_share=0.5, engine_intake_ms=1.0, decode_step_ms=1.0,
                     decode_steps=2, decode_beside_pass=1, front_gc_ms=rnd + 1.0, engine_gc_ms=10.0 * rnd,
                     request_ttft_ms=[t / 10 + 1, t / 5 + 1] if url else [10.0, 20.0], ttft_mean_ms=t / 10 + 2,
                     server_ttft_mean_ms=t / 10 + 1, engine_tokens_per_pass=600.0, engine_pass_ms=10.0,
                     prefill_tokens_per_pass=700.0, prefill_ms=9.0)]  # fmt: skip

    class Server:
        def __init__(self, args, log):
            self.ready_s, self.url, self.log = 1.0, "http://127.0.0.1:1", log
            log.write_text("[ 0.1 s] stage\n")

        def stop(self):
            return 0.5

    monkeypatch.setattr(serve_http, "traffic", traffic)
    monkeypatch.setattr(serve_http, "ServerProcess", Server)
    monkeypatch.setattr(serve_http, "first_ttfts_ms", lambda *a: [1.0, 2.0, 3.0])
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    serve_http.main(["--model-dir", str(tmp_path / "ckpt"), "--model", "qwen3_5-tiny", "--workloads", "burst",
                     "--rounds", "3", "--seed", "7", "--out", str(tmp_path / "out")])  # fmt: skip
    assert calls == [("burst", "http", 7, 1), ("burst", "engine", 7, 1), ("burst", "engine", 8, 1),
                     ("burst", "http", 8, 1), ("burst", "http", 9, 1), ("burst", "engine", 9, 1)]  # fmt: skip
    lines = (tmp_path / "out" / "results.md").read_text().splitlines()
    row = next(line for line in lines if line.startswith("| burst"))
    assert row.endswith("| 2.0 / 10.0 | 0.950 [0.900 - 1.100] | -0.5 [-1.0 - +1.0] | -0.05 [-0.10 - +0.10] | "
                        "+0.2 [-0.5 - +2.5] | +1.0 [+1.0 - +1.0] | -5.0 [-10.0 - +10.0] | 11.5 / 10.5 / 15.0 | "
                        "600 / 700; 10.00 / 9.00 |"), row  # (request by request:
    # d = [t/10 - 9, t/5 - 19] over in-process [10, 20]: slope t/100 - 1, intercept 1)
    pairs = (tmp_path / "out" / "burst-ttft-by-request.csv").read_text().splitlines()
    assert pairs[:3] == ["round,request,http_ms,in_process_ms", "0,0,10.000,10.000", "0,1,19.000,20.000"]
    assert len(pairs) == 1 + 3 * 2


def test_serve_http_pairs_each_request_and_splits_its_ttft_difference_into_a_fixed_cost_and_a_pace():
    """models.bench.serve_http's per-request columns on runs built as HTTP = fixed + (1 + pace) x in-process: the fit
    gives back each round's fixed ms and pace, a failed request (None) is left out of its pair."""
    import numpy as np

    from models.bench.serve_http import per_request

    rng = np.random.default_rng(0)
    engine, http, med = [], [], []
    for fixed, pace in ((2.0, 0.03), (4.0, 0.01), (3.0, 0.02)):
        x = rng.uniform(5, 900, 64)
        y = (fixed + (1 + pace) * x).tolist()
        y[7] = None  # (failed through HTTP)
        engine.append({"request_ttft_ms": x.tolist()})
        http.append({"request_ttft_ms": y})
        med.append(float(np.median(np.delete(fixed + pace * x, 7))))
    cells = [c.strip() for c in per_request(http, engine).split("|")]
    assert cells[0] == f"{np.median(med):+.1f} [{min(med):+.1f} - {max(med):+.1f}]"
    assert cells[1] == "+3.0 [+2.0 - +4.0]" and cells[2] == "+2.0 [+1.0 - +3.0]"
    failed = {"request_ttft_ms": [None] * 64}  # a round whose every request failed through HTTP: left out
    assert per_request([*http, failed], [*engine, engine[0]]) == per_request(http, engine)
    assert per_request([failed], [engine[0]]) == "- | - | -"


def test_serve_http_sends_poisson_and_burst_from_one_client_process_unless_told(tmp_path, monkeypatch):
    """Over one client process a burst reaches the server in request order, the in-process arm's; the thousand
    streams of connections are spread over four; --client-procs overrides both."""
    import json
    import subprocess

    from models.bench import serve_http

    cmds = []

    def run(cmd, **kw):
        cmds.append(cmd)
        out = Path(cmd[cmd.index("--out") + 1])
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps({"runs": []}))

    monkeypatch.setattr(subprocess, "run", run)

    def procs(workload, *flags):
        args = serve_http.parser().parse_args(["--model-dir", str(tmp_path), "--out", str(tmp_path), *flags])
        serve_http.traffic(args, workload, tmp_path / workload, "http://127.0.0.1:1", 0)
        return cmds[-1][cmds[-1].index("--client-procs") + 1]

    assert [procs(w) for w in ("poisson", "burst", "connections")] == ["1", "1", "4"]
    assert [procs(w, "--client-procs", "3") for w in ("burst", "connections")] == ["3", "3"]


def test_the_steady_step_column_is_the_loops_host_time_over_the_share_of_steps_that_only_decoded():
    """The steady-step host us (median over rounds) with the share of decode steps it covers; an arm without the
    counters (transformers) shows nan."""
    runs = [dict(run(HOST, 0, 100.0, 2.0, 1000.0), steady_host_us=80.0, steady_frac=0.9),
            dict(run(HOST, 1, 100.0, 2.0, 1000.0), steady_host_us=90.0, steady_frac=0.8),
            run(XQA, 0, 100.0, 2.0, 1000.0)]  # fmt: skip
    md, rows = summarize(runs, [HOST, XQA])
    header = [c.strip() for c in md.splitlines()[0].strip("|").split("|")]
    col = header.index("steady-step host us (share of steps)")
    cells = {cols[2]: cols[col] for cols in ([c.strip() for c in line.strip("|").split("|")]
                                             for line in md.splitlines()[2:])}  # fmt: skip
    assert cells == {"host": "85 (85%)", "resident-xqa": "nan (nan%)"}
    assert len(header) == len(md.splitlines()[1].strip("|").split("|"))
