"""The serving benchmark: arms alternated within one run, on the GPU.

    python -m models.bench.serve --model qwen3_5-0.8b --concurrency 1,16,64 --prompt-len 512 --gen 256 --rounds 2 \\
        --out models/bench/results/serve-h200

Arms (``--arms``): the engine arms of ``models/bench/arms.py`` (host, host-overlap, host-triton-overlap,
resident-fa2, resident-xqa, resident-triton, resident-xqa-sync, resident-triton-sync), each at every prefill
placement of ``--prefill`` and every token budget of ``--token-budget`` (default: the engine's placement, beside, and
whole prompts), labelled by the three (``resident-xqa beside whole``); and ``transformers``: transformers' own
Qwen3.5 ``generate`` with its cache (same weights). ``python -m models.bench.traffic`` measures the same arms under
arrivals and varied lengths.

Every request has a ``--prompt-len`` random prompt and generates exactly ``--gen`` tokens (no stop token). Per cell
and arm: output tok/s (all tokens / wall time of the run) and its ratio to host, host-overlap and host-triton-overlap
(paired by round; what each isolates: ``models/bench/arms.py``), ITL p50/mean (gaps between a request's consecutive
tokens), TTFT p50, and per decode step: host phases (plan: resident plan+flush or host fill; attention schedule: fa2's
table build and plan(); launch; wait for the GPU; rest), H2D copies and bytes, and the GPU graph time against the
step's wall time. A step's host time is its wall time less its wait; the steady-step column gives it over the decode
steps that only decoded (no arrival, admission, landed or launched pass, finish; ``EngineStats.steady_steps``), with
their share of the steps: the loop's own host time, where the step column also holds the passes' launches.
A busy host (``--host-load F[,F...]``, ``models/bench/host_load.py``): during every timed run a background thread
holds the interpreter a fraction F of each millisecond, as an in-process server does while it detokenizes and writes
streams; every arm runs at every load, alternated with the arms, and a cell is (model, concurrency, load), its rows
naming F and the fraction the thread achieved.
Every timed run starts from a collected and frozen heap (``gc.freeze()``, as serving engines do after start-up), so
one arm does not pay for the objects another left behind. Writes ``results.md``, ``results.json`` and ``tokps.png``
under ``--out``.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path

import numpy as np
import torch

from models.bench.arms import (
    Arm,
    add_arm_options,
    add_host_load_option,
    budget_text,
    build_arms,
    default_placement,
    frozen_heap,
    paired_ratio,
    parse_arms,
    planner_yardstick,
    round_order,
)
from models.bench.host_load import HostLoad, host_load_text, load_text
from models.cli import OneLineParser
from models.engine import Engine, EngineConfig, Request, SamplingParams, build_adapter

TRANSFORMERS = "transformers"  # the arm that is not an engine: transformers' generate


def requests(vocab: int, c: int, prompt_len: int, gen: int, seed: int) -> list[Request]:
    rng = np.random.default_rng(seed)
    return [Request(tuple(rng.integers(0, vocab, prompt_len).tolist()), SamplingParams(max_tokens=gen))
            for _ in range(c)]


def engine_config(arm: Arm, c: int, args) -> EngineConfig:
    """``arm``'s engine config in the cell of concurrency ``c``."""
    return arm.config(device="cuda", dtype=torch.bfloat16, max_running=c, page_size=args.page_size,
                      max_seq_len=args.prompt_len + args.gen, timing=True, prefill_graphs=args.prefill_graphs,
                      prefill_graph_tokens=args.prefill_graph_tokens)  # fmt: skip


def engine_run(adapter, arm: Arm, cfg: EngineConfig, c: int, args, seed: int, engine_cache: dict,
               load: float) -> dict:  # fmt: skip
    """One timed run of ``c`` requests in an engine of ``arm`` (``cfg``: its config in the cell; built for the run,
    warmed up first) under host load ``load``."""
    key = (arm, c)
    if key not in engine_cache:
        engine_cache.clear()
        gc.collect()
        torch.cuda.empty_cache()
        eng = Engine(adapter, cfg)
        for _ in range(2):  # warm-up: JIT, allocator; twice, so the prefill passes' keys are captured
            eng.run(requests(adapter.vocab_size, c, args.prompt_len, 8, seed + 99))
        engine_cache[key] = eng
    eng = engine_cache[key]
    before = {k: getattr(eng.stats, k) for k in ("decode_steps", "plan_ns", "attn_schedule_ns", "launch_ns", "wait_ns",
                                                   "decode_ns", "gpu_ms", "h2d_copies", "h2d_bytes", "tokens",
                                                   "empty_flushes", "mixed_steps", "decode_rows", "prefill_ns",
                                                   "prefill_passes", "steady_steps", "steady_host_ns")}
    eng.stats.itl.clear()
    reqs = requests(adapter.vocab_size, c, args.prompt_len, args.gen, seed)
    torch.cuda.synchronize()
    with frozen_heap(), HostLoad(load) as busy:
        t0 = time.perf_counter()
        results = eng.run(reqs)
        wall = time.perf_counter() - t0
    d = {k: getattr(eng.stats, k) - v for k, v in before.items()}
    steps = max(d["decode_steps"], 1)
    itl = np.concatenate(eng.stats.itl) if eng.stats.itl else np.array([np.nan])
    us = lambda ns: ns / steps / 1e3
    return dict(
        arm=arm.name, label=arm.label, prefill=arm.prefill.value, token_budget=arm.token_budget, c=c,
        tokps=d["tokens"] / wall, wall_s=wall, itl_p50_ms=float(np.median(itl) * 1e3),
        itl_mean_ms=float(np.mean(itl) * 1e3), ttft_p50_ms=float(np.median([r.ttft_s for r in results]) * 1e3),
        decode_steps=d["decode_steps"], mixed_steps=d["mixed_steps"], step_us=us(d["decode_ns"]),
        decode_tokps=d["decode_rows"] / max(d["decode_ns"] / 1e9, 1e-9),
        plan_us=us(d["plan_ns"]), attn_schedule_us=us(d["attn_schedule_ns"]), launch_us=us(d["launch_ns"]),
        wait_us=us(d["wait_ns"]), gpu_us=d["gpu_ms"] * 1e3 / steps, h2d_copies=d["h2d_copies"] / steps,
        steady_host_us=d["steady_host_ns"] / d["steady_steps"] / 1e3 if d["steady_steps"] else float("nan"),
        steady_frac=d["steady_steps"] / steps,
        h2d_bytes=d["h2d_bytes"] / steps, empty_flush_frac=d["empty_flushes"] / steps,
        prefill_ms=d["prefill_ns"] / max(d["prefill_passes"], 1) / 1e6, prefill_passes=d["prefill_passes"],
        tokens=[r.tokens for r in results], host_load=load, host_load_achieved=busy.achieved,
    )


def transformers_run(adapter, c: int, args, seed: int, load: float) -> dict:
    """transformers' generate on the same weights: one batch of c prompts (equal lengths, no padding), under host load
    ``load``."""
    import transformers

    hf = getattr(adapter, "_hf", None)
    if hf is None:
        hf = transformers.Qwen3_5ForCausalLM(adapter.model.cfg.to_hf()).to(device="cuda", dtype=torch.bfloat16)
        hf.load_state_dict(adapter.model.state_dict(), strict=True)
        adapter._hf = hf.eval()
    reqs = requests(adapter.vocab_size, c, args.prompt_len, args.gen, seed)
    ids = torch.tensor([r.prompt for r in reqs], device="cuda")
    # an explicit mask: without one, transformers masks every prompt token equal to pad_token_id
    kw = dict(do_sample=False, pad_token_id=0, eos_token_id=None, attention_mask=torch.ones_like(ids))
    hf.generate(ids, max_new_tokens=2, min_new_tokens=2, **kw)  # warm-up
    torch.cuda.synchronize()
    with frozen_heap(), HostLoad(load) as busy:
        t0 = time.perf_counter()
        hf.generate(ids, max_new_tokens=1, min_new_tokens=1, **kw)
        torch.cuda.synchronize()
        ttft = time.perf_counter() - t0
        t0 = time.perf_counter()
        out = hf.generate(ids, max_new_tokens=args.gen, min_new_tokens=args.gen, **kw)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    itl = (wall - ttft) / max(args.gen - 1, 1)
    return dict(arm=TRANSFORMERS, label=TRANSFORMERS, c=c, tokps=c * args.gen / wall, wall_s=wall, itl_p50_ms=itl * 1e3,
                itl_mean_ms=itl * 1e3, ttft_p50_ms=ttft * 1e3,
                tokens=[tuple(t) for t in out[:, ids.shape[1] :].tolist()], host_load=load,
                host_load_achieved=busy.achieved)


def _label(arm: Arm | str) -> str:
    return arm if isinstance(arm, str) else arm.label


def summarize(runs: list[dict], arms: list[Arm | str]) -> tuple[str, list[dict]]:
    """Per cell (model, concurrency, host load) and arm: median [min-max] over rounds, and ratios against host (and
    host-overlap, host-triton-overlap) at the arm's placement and budget in the cell (transformers: against the first
    host arm), paired by round."""
    rows, lines = [], []
    cells = sorted({(r["model"], r["c"], r["host_load"]) for r in runs})
    hosts = [a for a in arms if isinstance(a, Arm) and a.name == "host"]
    lines.append("| cell | host load (achieved) | arm | prefill | token budget | tok/s median [min-max] | vs host | "
                 "vs host-overlap | vs host-triton-overlap | decode tok/s | vs host | ITL p50/mean ms | per token vs "
                 "host (ITL mean) | TTFT p50 ms | step us | plan us | attn schedule us | launch us | GPU wait us | "
                 "GPU graph us | idle us | steady-step host us (share of steps) | H2D/step | H2D B/step | "
                 "same tokens as host |")  # fmt: skip
    lines.append("|" + "---|" * 25)
    for model, c, load in cells:
        cell = [r for r in runs if (r["model"], r["c"], r["host_load"]) == (model, c, load)]
        for arm in arms:
            rs = [r for r in cell if r["label"] == _label(arm)]
            if not rs:
                continue
            like = arm if isinstance(arm, Arm) else hosts[0] if hosts else None
            host = [r for r in cell if like is not None and r["label"] == like.peer("host").label]
            host_over = [r for r in cell if like is not None and r["label"] == like.peer("host-overlap").label]
            host_triton = [r for r in cell if like is not None and r["label"] == like.peer("host-triton-overlap").label]
            host_med = float(np.median([r["tokps"] for r in host])) if host else float("nan")
            name = arm.name if isinstance(arm, Arm) else arm
            t = [r["tokps"] for r in rs]
            med = float(np.median(t))
            ratios = [r["tokps"] / h["tokps"] for r, h in zip(rs, host, strict=False)] if host else []
            g = lambda k, rs=rs: float(np.median([r.get(k, np.nan) for r in rs]))
            same = "-"
            if host and rs is not host and name != "host":
                same = f"{sum(a == b for a, b in zip(rs[0]['tokens'], host[0]['tokens'], strict=True))}/{c}"
            prefill, budget = (arm.prefill.value, budget_text(arm.token_budget)) if isinstance(arm, Arm) else ("-",
                                                                                                             "-")
            achieved = [r["host_load_achieved"] for r in rs]
            row = dict(model=model, c=c, host_load=load, host_load_achieved=float(np.median(achieved)), arm=name,
                       label=_label(arm), prefill=prefill, token_budget=budget,
                       tokps_median=med, tokps_min=min(t), tokps_max=max(t),
                       ratio_median=med / host_med, ratio_min=min(ratios, default=np.nan),
                       ratio_max=max(ratios, default=np.nan), **{k: g(k) for k in (
                           "itl_p50_ms", "itl_mean_ms", "ttft_p50_ms", "step_us", "plan_us", "attn_schedule_us",
                           "launch_us", "wait_us", "gpu_us", "h2d_copies", "h2d_bytes", "decode_tokps",
                           "steady_host_us", "steady_frac")})
            rows.append(row)
            ratio = f"{row['ratio_median']:.2f}x [{row['ratio_min']:.2f}-{row['ratio_max']:.2f}]" if host else "-"
            dec = [r.get("decode_tokps", np.nan) for r in rs]
            dratio = paired_ratio(rs, host, "decode_tokps") if name != TRANSFORMERS else "-"
            iratio = paired_ratio(rs, host, "itl_mean_ms", invert=True)
            oratio = paired_ratio(rs, host_over, "tokps") if name not in ("host", "host-overlap") else "-"
            tratio = paired_ratio(rs, host_triton, "tokps") if name != "host-triton-overlap" else "-"
            idle = row["step_us"] - row["gpu_us"]
            lines.append(
                f"| {model} c={c} | {load_text(load, achieved)} | {name} | {prefill} | {budget} | "
                f"{med:.0f} [{min(t):.0f}-{max(t):.0f}] | {ratio} | "
                f"{oratio} | {tratio} | {np.median(dec):.0f} | {dratio} | "
                f"{row['itl_p50_ms']:.2f}/{row['itl_mean_ms']:.2f} | {iratio} | {row['ttft_p50_ms']:.0f} | "
                f"{row['step_us']:.0f} | {row['plan_us']:.1f} | {row['attn_schedule_us']:.1f} | "
                f"{row['launch_us']:.0f} | "
                f"{row['wait_us']:.0f} | {row['gpu_us']:.0f} | {idle:.0f} | "
                f"{row['steady_host_us']:.0f} ({row['steady_frac']:.0%}) | {row['h2d_copies']:.2f} | "
                f"{row['h2d_bytes']:.0f} | {same} |")
    return "\n".join(lines), rows


def plot(rows: list[dict], labels: list[str], loads: tuple[float, ...], path: Path) -> None:
    """Output tok/s by concurrency, an arm (by label) at a host load a line and a model a panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({r["model"] for r in rows})
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        for arm, load in ((a, f) for a in labels for f in loads):
            rs = sorted((r for r in rows if r["model"] == model and r["label"] == arm and r["host_load"] == load),
                        key=lambda r: r["c"])  # fmt: skip
            name = arm if len(loads) == 1 else f"{arm} load {load:g}"
            if rs:
                ax.errorbar([r["c"] for r in rs], [r["tokps_median"] for r in rs], marker="o", label=name,
                            yerr=[[r["tokps_median"] - r["tokps_min"] for r in rs],
                                  [r["tokps_max"] - r["tokps_median"] for r in rs]])
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("concurrency")
        ax.set_ylabel("output tok/s")
        ax.set_title(model)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def parser() -> argparse.ArgumentParser:
    ap = OneLineParser(prog="python -m models.bench.serve", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--model", default="qwen3_5-0.8b", help="model(s), comma-separated (random weights)")
    ap.add_argument("--concurrency", default="1,16,64", help="concurrency cells, comma-separated")
    ap.add_argument("--arms", default="host,host-overlap,host-triton-overlap,resident-fa2,resident-xqa-sync,"
                    "resident-xqa,resident-triton,transformers",
                    help="arms, comma-separated (see models/bench/arms.py); each engine arm runs at every --prefill "
                         "placement and --token-budget")  # fmt: skip
    add_arm_options(ap, "whole")
    add_host_load_option(ap, "; the transformers arm runs at each too")
    ap.add_argument("--transformers-c", default="1,16", help="cells where the transformers arm runs")
    ap.add_argument("--prompt-len", type=int, default=512, help="tokens each prompt has (default 512)")
    ap.add_argument("--gen", type=int, default=256, help="tokens each request generates (fixed)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds; the arm order alternates between rounds")
    ap.add_argument("--page-size", type=int, default=16, help="tokens a KV page holds (default 16)")
    ap.add_argument("--prefill-graphs", type=int, default=6,
                    help="token buckets of prefill CUDA graphs, halving down from --prefill-graph-tokens (default 6: "
                         "256 ... 8192), in every engine arm alike (0: eager prefill)")
    ap.add_argument("--prefill-graph-tokens", type=int, default=8192,
                    help="the largest token bucket; longer passes run eagerly (default 8192)")
    ap.add_argument("--out", type=Path, required=True, help="folder for results.md, results.json, tokps.png")
    ap.add_argument("--seed", type=int, default=0, help="seed of the weights and the prompts")
    return ap


def lineup(args) -> list[Arm | str]:
    """The run's arms in ``--arms`` order: each engine arm at every placement and budget, and ``transformers``;
    ValueError naming the option of the first bad value."""
    try:
        names = parse_arms(args.arms, "cuda", extra=(TRANSFORMERS,))
    except ValueError as e:
        raise ValueError(f"argument --arms: {e}") from None
    prefill = args.prefill or (default_placement("cuda"),)
    out: list[Arm | str] = []
    for name in names:
        out += [TRANSFORMERS] if name == TRANSFORMERS else build_arms([name], prefill, args.token_budget, "cuda")
    return out


def main(argv: list[str] | None = None) -> None:
    ap = parser()
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("the serving benchmark needs a CUDA GPU (run it on the H200)")
    cells = [int(c) for c in args.concurrency.split(",")]
    hf_cells = {int(c) for c in args.transformers_c.split(",")}
    try:
        arms = lineup(args)
    except ValueError as e:
        ap.error(str(e))
    configs = {}  # every engine arm's config in every cell, built once here: a refused one ends the run now
    for arm in (a for a in arms if isinstance(a, Arm)):
        for c in cells:
            try:
                configs[arm, c] = engine_config(arm, c, args)
            except ValueError as e:
                ap.error(f"arm {arm.label} at concurrency {c}: {e}")
    args.out.mkdir(parents=True, exist_ok=True)
    host_speed = planner_yardstick()
    print(f"host yardstick: {host_speed}", flush=True)
    width = max(len(_label(a)) for a in arms)
    runs: list[dict] = []
    for model in args.model.split(","):
        adapter = build_adapter(model, seed=args.seed, device="cuda", dtype=torch.bfloat16)
        for c in cells:
            cache: dict = {}
            for rnd in range(args.rounds):
                order = round_order(arms, args.host_load, rnd)
                for arm, load in order:
                    if arm == TRANSFORMERS:
                        if c not in hf_cells:
                            continue
                        r = transformers_run(adapter, c, args, seed=1000 * rnd + c, load=load)
                    else:
                        r = engine_run(adapter, arm, configs[arm, c], c, args, seed=1000 * rnd + c,
                                       engine_cache=cache, load=load)  # fmt: skip
                    r.update(model=model, round=rnd)
                    runs.append(r)
                    print(f"{model} c={c} round {rnd} {_label(arm):{width}s} host load "
                          f"{load_text(load, [r['host_load_achieved']]):11s} {r['tokps']:9.0f} tok/s  ITL p50 "
                          f"{r['itl_p50_ms']:.2f} ms  TTFT p50 {r['ttft_p50_ms']:.0f} ms  prefill "
                          f"{r.get('prefill_ms', float('nan')):.1f} ms a pass ({r.get('prefill_passes', 0)})",
                          flush=True)
            cache.clear()
        del adapter
        gc.collect()
        torch.cuda.empty_cache()
    table, rows = summarize(runs, arms)
    resolved = "; ".join(dict.fromkeys(f"{arm.name} {cfg.prefill.value} {budget_text(cfg.token_budget)}"
                                       for (arm, _), cfg in configs.items()))  # (the same in every cell)  # fmt: skip
    head = (f"Serving benchmark on {torch.cuda.get_device_name()} (torch {torch.__version__}): prompts "
            f"{args.prompt_len} tokens, {args.gen} new tokens each, page size {args.page_size}, {args.rounds} rounds "
            f"with the arm order alternated, random weights (bf16). Prefill passes of <= {args.prefill_graph_tokens} "
            f"tokens replayed from CUDA graphs in every engine arm: {'yes' if args.prefill_graphs else 'no'} "
            f"({args.prefill_graphs} token buckets up to {args.prefill_graph_tokens}, none past the smallest that "
            f"holds an arm's largest pass). Engine arms, each with the "
            f"prefill placement and token budget its engine config resolved (budget: prompt tokens a pass, or whole "
            f"prompts): {resolved}. Host load: {host_load_text(args.host_load)}. Host yardstick: {host_speed}.\n\n"
            "Command: `python -m models.bench.serve "
            + " ".join(argv if argv is not None else __import__("sys").argv[1:]) + "`\n\n")
    (args.out / "results.md").write_text(head + table + "\n")
    (args.out / "results.json").write_text(json.dumps(dict(rows=rows, runs=[{k: v for k, v in r.items()
                                                                              if k != "tokens"} for r in runs]),
                                                       indent=1))
    plot(rows, [_label(a) for a in arms], args.host_load, args.out / "tokps.png")
    print(table)


if __name__ == "__main__":
    main()
