"""Where an engine's steps spend their time under traffic: the host's phases, and the GPU's kernels.

    python -m models.bench.step_profile --arms resident-triton --rate 40 --num-requests 64 [--prefill in-pass]

Takes the traffic benchmark's options (``models.bench.traffic``; one arm: one engine arm, one ``--prefill``
placement, one ``--token-budget``). Builds that arm's engine as the benchmark does, serves its warm-up and the round
once untimed, then serves the round again under ``torch.profiler`` (CPU and CUDA). The host's phases are
``record_function`` ranges put around the engine parts' methods by this tool (the engine carries no profiling code):
``step.*`` (the engine's step and its kinds), ``prefill.*`` (a pass, in the step or beside the decode steps: its launch
with its inputs, the graph run, its landing with the first tokens), ``decode.*`` (a decode step's prepare, launch and
landing), ``admission.*`` (the admit transaction, a request's release, and the prefix cache's bookkeeping: a finished
stream kept, a pass's saves chosen, a landed pass's pages and checkpoints indexed). Prints the phases by total host
time, the CUDA runtime calls by self host time (a ``cudaStreamSynchronize`` there is the host waiting), and the CUDA
kernels by GPU time, with the wall time and the step counts of the profiled round.
"""

from __future__ import annotations

import contextlib
import functools

import torch

from models.bench.traffic import parser as traffic_parser
from models.bench.traffic import serve, setup_run
from models.engine import Engine, build_adapter
from models.engine.admission import Admission
from models.engine.launcher import Launcher
from models.engine.prefill import Prefill
from models.engine.prefill_graphs import PrefillGraphs
from models.engine.sampler import Sampler

# (owner, method, range name): the phases profiled, outermost first
PHASES = (
    (Engine, "step", "step"),
    (Engine, "_admit_step", "step.admit"),
    (Engine, "_drain", "step.land_in_flight"),
    (Engine, "_decode_launch", "step.decode_launch"),
    (Engine, "_decode_land", "step.decode_land"),
    (Engine, "_prefill_step", "step.prefill"),
    (Engine, "_prepare_next", "step.prepare_next"),
    (Prefill, "launch", "prefill.launch"),
    (Prefill, "land", "prefill.land"),
    (PrefillGraphs, "run", "prefill.graph_run"),
    (Sampler, "__call__", "sampler"),
    (Launcher, "launch", "decode.launch"),
    (Launcher, "land", "decode.land"),
    (Admission, "admit", "admission.admit"),
    (Admission, "release", "admission.release"),
    (Admission, "keep", "admission.keep"),
    (Admission, "saves", "admission.saves"),
    (Admission, "landed", "admission.landed"),
)


@contextlib.contextmanager
def phases():
    """Every PHASES method wrapped in a ``record_function`` range of its name while active."""
    saved = []
    for owner, name, label in PHASES:
        fn = getattr(owner, name)
        saved.append((owner, name, fn))

        def wrapped(*a, _fn=fn, _label=label, **k):
            with torch.profiler.record_function(_label):
                return _fn(*a, **k)

        setattr(owner, name, functools.wraps(fn)(wrapped))
    try:
        yield
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)


def parser():
    ap = traffic_parser("python -m models.bench.step_profile", __doc__, run_options=False)
    ap.add_argument("--warmup", type=int, default=None, help="warm-up requests (default 2 x max-running)")
    ap.add_argument("--top", type=int, default=25, help="rows of each table (default 25)")
    return ap


def main(argv: list[str] | None = None) -> None:
    ap = parser()
    args = ap.parse_args(argv)
    args.rounds = 1
    run = setup_run(ap, args)
    if run.device != "cuda":
        ap.error("step_profile profiles GPU kernels: it needs CUDA (--device cuda on a machine with a GPU)")
    if len(run.arms) != 1:
        ap.error(f"argument --arms: one arm (one engine arm, one --prefill, one --token-budget), got "
                 f"{', '.join(a.label for a in run.arms)}")  # fmt: skip
    (arm,) = run.arms
    adapter = build_adapter(args.model, seed=0, device=run.device, dtype=run.dtype)
    try:
        engine = Engine(adapter, run.config(arm))
    except ValueError as e:
        ap.error(f"engine {arm.label}: {e}")
    serve(engine, run.warmup, run.warmup.requests(adapter.vocab_size, run.sampling, args.seed + 1, "warm-"),
          wait=False)  # fmt: skip
    work = run.rounds[0]
    serve(engine, work, work.requests(adapter.vocab_size, run.sampling, args.seed, "pre-"))
    st = engine.stats
    before = (st.decode_steps, st.mixed_steps, st.prefill_steps, st.tokens)
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with phases(), torch.profiler.profile(activities=acts) as prof:
        _, _, wall = serve(engine, work, work.requests(adapter.vocab_size, run.sampling, args.seed, "prof-"))
        torch.cuda.synchronize()
    d = [a - b for a, b in zip((st.decode_steps, st.mixed_steps, st.prefill_steps, st.tokens), before, strict=True)]
    events = prof.key_averages()
    kernel_us = sum(e.self_device_time_total for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
    print(f"# {arm.label}, {run.description}\n")
    print(f"wall {wall * 1e3:.0f} ms (profiled: slower than a timed run); {d[0]} decode, {d[1]} mixed, {d[2]} "
          f"prefill steps; {d[3]} tokens; CUDA kernels {kernel_us / 1e3:.0f} ms in all\n")  # fmt: skip
    ours = [e for e in events if e.key.split(".")[0] in {label.split(".")[0] for _, _, label in PHASES}]
    print("| phase | calls | host ms in all | host us a call |\n|---|---|---|---|")
    for e in sorted(ours, key=lambda e: -e.cpu_time_total):
        print(f"| {e.key} | {e.count} | {e.cpu_time_total / 1e3:.1f} | {e.cpu_time_total / max(e.count, 1):.0f} |")
    print("\nCUDA runtime calls, by self host time:\n")
    runtime = [e for e in events if e.key.startswith("cuda")]
    print("| call | calls | host ms in all | host us a call |\n|---|---|---|---|")
    for e in sorted(runtime, key=lambda e: -e.self_cpu_time_total)[: args.top]:
        print(f"| {e.key} | {e.count} | {e.self_cpu_time_total / 1e3:.1f} | "
              f"{e.self_cpu_time_total / max(e.count, 1):.1f} |")  # fmt: skip
    print("\nCUDA kernels, by GPU time:\n")
    print(events.table(sort_by="self_cuda_time_total", row_limit=args.top, max_name_column_width=70))


if __name__ == "__main__":
    main()
