"""Where an eager batched prefill spends its time on the GPU: wall time, GPU kernel time, and the top kernels.

    python -m models.bench.prefill_profile --model qwen3_5-0.8b --prompt-len 512 --requests 1,16,64

For each R, R prompts go through one ``prefill_batch`` pass (as the engine runs a step's chunks): the wall time
(median of ``--repeats``, CUDA-synchronised), then one pass under ``torch.profiler``: the summed time of its CUDA
kernels (the rest of the wall is the host dispatching them, or the GPU idle) and the kernels taking the most of it.
``--modes`` times several ways of running the same pass, alternated: ``inference`` (eager under inference_mode, what
``prefill_batch`` does), ``no_grad`` (eager), ``graph`` (the pass captured once and replayed, inputs built and copied
in each time: what an engine with ``prefill_graphs`` does, models/engine/prefill_graphs.py).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from models.bench.prefill_ops import prefill_inputs
from models.cli import OneLineParser
from models.engine import build_adapter
from models.engine.prefill_graphs import PrefillGraphs

MODES = ("inference", "no_grad", "graph")


def grad_mode(name: str):
    """The autograd mode a pass runs under: ``inference`` (what prefill_batch uses) or ``no_grad``."""
    return torch.inference_mode() if name == "inference" else torch.no_grad()


def profile(model, R: int, T: int, ps: int, repeats: int, top: int, modes: list[str], by_op: bool = False) -> str:
    state, chunks = prefill_inputs(model, R, T, ps, "cuda", torch.bfloat16, seed=R)
    raw = type(model).prefill_forward.__wrapped__  # without its decorator: each mode sets its own
    graphs = PrefillGraphs(lambda batch: model.prefill_forward(state, batch), "cuda")

    def run(mode: str = modes[0]) -> None:
        if mode == "graph":  # (the first run captures the pass's shape)
            batch = model.prefill_inputs(state, chunks)
            graphs.run(batch) if graphs.graphs else graphs.capture(batch)
            return
        with grad_mode(mode):
            raw(model, state, model.prefill_inputs(state, chunks))

    walls = {m: [] for m in modes}
    for m in modes:
        run(m)
    torch.cuda.synchronize()
    for _ in range(repeats):  # modes alternated
        for m in modes:
            t0 = time.perf_counter()
            run(m)
            torch.cuda.synchronize()
            walls[m].append(time.perf_counter() - t0)
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        run(modes[0])
        torch.cuda.synchronize()
    kernels = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    gpu_us = sum(e.self_device_time_total for e in kernels)
    launches = sum(e.count for e in kernels)
    wall = float(np.median(walls[modes[0]]))
    others = "".join(f"; under {m}: {np.median(walls[m]) * 1e3:.1f} ms" for m in modes[1:])
    lines = [f"## R = {R} prompts of {T} tokens\n",
             f"wall {wall * 1e3:.1f} ms under {modes[0]} (median of {repeats}; {R * T / wall:.0f} tok/s{others}), "
             f"GPU kernels {gpu_us / 1e3:.1f} ms in {launches} launches\n",
             "| kernel | launches | GPU ms | share |", "|---|---|---|---|"]
    for e in sorted(kernels, key=lambda e: -e.self_device_time_total)[:top]:
        lines.append(f"| `{e.key[:90]}` | {e.count} | {e.self_device_time_total / 1e3:.2f} | "
                     f"{e.self_device_time_total / max(gpu_us, 1):.0%} |")
    if by_op:
        lines += ["", *op_table(lambda: raw(model, state, model.prefill_inputs(state, chunks)), top)]
    return "\n".join(lines) + "\n"


def op_table(run, top: int) -> list[str]:
    """The torch operators (with their input shapes) whose own kernels take the most GPU time in one eager pass."""
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.inference_mode(), torch.profiler.profile(activities=acts, record_shapes=True) as prof:
        run()
        torch.cuda.synchronize()
    ops = [e for e in prof.key_averages(group_by_input_shape=True)
           if e.device_type == torch.autograd.DeviceType.CPU and e.self_device_time_total > 0]  # fmt: skip
    total = sum(e.self_device_time_total for e in ops)
    lines = [f"Eager pass by operator (its own kernels' GPU time; {total / 1e3:.1f} ms in all):\n",
             "| operator | input shapes | calls | GPU ms | share |", "|---|---|---|---|---|"]
    for e in sorted(ops, key=lambda e: -e.self_device_time_total)[:top]:
        lines.append(f"| `{e.key}` | `{str(e.input_shapes)[:80]}` | {e.count} | {e.self_device_time_total / 1e3:.2f} | "
                     f"{e.self_device_time_total / max(total, 1):.0%} |")
    return lines


def parser() -> argparse.ArgumentParser:
    ap = OneLineParser(prog="python -m models.bench.prefill_profile", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--model", default="qwen3_5-0.8b", help="model shape (random weights; default qwen3_5-0.8b)")
    ap.add_argument("--prompt-len", type=int, default=512, help="tokens each prompt has (default 512)")
    ap.add_argument("--page-size", type=int, default=16, help="tokens a KV page holds (default 16)")
    ap.add_argument("--requests", default="1,16,64", help="prompts a pass, comma-separated")
    ap.add_argument("--repeats", type=int, default=3, help="timed passes per mode (default 3)")
    ap.add_argument("--top", type=int, default=12, help="kernels listed per pass")
    ap.add_argument("--by-op", action="store_true", help="also the torch operators taking the most GPU time (eager)")
    ap.add_argument("--modes", default="inference",
                    help=f"ways to run the pass, timed alternated (the first is profiled): {', '.join(MODES)}")
    return ap


def main(argv: list[str] | None = None) -> None:
    a = parser().parse_args(argv)
    if set(a.modes.split(",")) - set(MODES):
        raise SystemExit(f"--modes takes {', '.join(MODES)}, got {a.modes!r}")
    if not torch.cuda.is_available():
        raise SystemExit("prefill_profile measures the GPU: run it on the H200")
    model = build_adapter(a.model, seed=0, device="cuda", dtype=torch.bfloat16).model
    print(f"# Batched prefill on {torch.cuda.get_device_name()}: {a.model}, bf16\n")
    with torch.no_grad():
        for R in (int(r) for r in a.requests.split(",")):
            report = profile(model, R, a.prompt_len, a.page_size, a.repeats, a.top, a.modes.split(","), a.by_op)
            print(report, flush=True)


if __name__ == "__main__":
    main()
