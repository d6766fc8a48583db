"""GPU time of one captured decode step (model forward + sampler), and where it goes, kernel by kernel (GPU).

    python -m models.bench.decode_profile --model qwen3_5-0.8b --batches 1,16,64 --ctx 640 [--paths fused,torch]

Per batch b and decode path (``fused``: the Triton step of ``Qwen35Model._decode_fused``; ``torch``: plain-torch
layers), rows of ``--ctx`` tokens on random distinct pages, ``--attention`` XQA or our Triton split-KV kernel: the
step is captured once as the engine captures a bucket. Every step of the run (each batch, each A/B variant) is
captured first, then timed ``--iters`` replays a round over ``--rounds`` rounds, the steps alternated; reported:
median replay time (CUDA events), the host time of one ``replay()`` call, and from one profiled replay the kernel
count and the kernels taking the most GPU time. The profiles run after all timing: once ``torch.profiler`` has run in
a process, later replays there are slower (on the H200: two one-row steps that differ by ~2 us timed 743 us before
a profile and 792 after, with 7.4 and 53.5 us of host time a ``replay()``; 18 GDN mixers alone 141 and 152 us), which
favoured whichever variant was timed first.

The floor: the bytes a step must move (every weight read once, the lm_head included; per row its GDN and conv states
read and written, its KV read and one token's written) over the bandwidth a device-to-device copy reaches on this
GPU (bytes read plus written, a 1 GiB copy); "of the floor" is that time over the step's.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from types import SimpleNamespace

import attrs
import numpy as np
import torch

from kernels.choices import GemvPick, KernelChoices
from models.bench.timing import replay_us
from models.cli import OneLineParser, positive_int
from models.engine import build_adapter
from models.engine.sampler import Sampler, greedy
from models.layers.flashinfer_attention import Workspaces, XQADecode
from models.layers.triton_attention import TritonDecode
from models.qwen3_5 import KV_POOL
from resplan import Graph, KVPool, RowLayout, StepBuffers
from resplan.layout import SamplerCell

STATE_DTYPE_NAMES = {"float32": torch.float32, "bfloat16": torch.bfloat16}  # --state-dtype


def _bufs(layout, b, ctx, ps, W, num_pages, device, rng) -> StepBuffers:
    """StepBuffers of b rows of ``ctx`` tokens (this step's token the last), distinct pages, slots 1..b; every row's
    sampler cells at temperature 0.8, top-p 0.95, top-k 20, no stop ids (what the full samplers read)."""
    bufs = StepBuffers.allocate(layout, b, device)
    n = -(-ctx // ps)
    pages = rng.permutation(np.arange(1, num_pages))[: b * n].reshape(b, n)
    bt = np.zeros((b, W), np.int32)
    bt[:, :n] = pages
    bufs.block_tables[KV_POOL].copy_(torch.from_numpy(bt))
    bufs.seq_lens[KV_POOL].fill_(ctx)
    loc = pages[:, (ctx - 1) // ps] * ps + (ctx - 1) % ps
    bufs.write_loc[KV_POOL].copy_(torch.from_numpy(loc.astype(np.int32)))
    bufs.positions.fill_(ctx - 1)
    bufs.recurrent_slots.copy_(torch.arange(1, b + 1, dtype=torch.int32))
    bufs.sampler.zero_()
    bufs.sampler[:, SamplerCell.TEMPERATURE] = torch.tensor(0.8).view(torch.int32)
    bufs.sampler[:, SamplerCell.TOP_P] = torch.tensor(0.95).view(torch.int32)
    bufs.sampler[:, SamplerCell.TOP_K] = 20
    bufs.sampler[:, SamplerCell.SEED] = torch.arange(b, dtype=torch.int32)
    bufs.sampler[:, SamplerCell.STOP_0 :] = -1
    return bufs


def _kernel_table(prof, top: int) -> tuple[int, float, list[tuple[str, int, float]]]:
    """(kernel count, GPU us summed, [(name, count, us)] of the top kernels by GPU time) of one profiled replay."""
    agg: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            a = agg[ev.name[:90]]
            a[0] += 1
            a[1] += ev.device_time
    count = int(sum(a[0] for a in agg.values()))
    total = sum(a[1] for a in agg.values())
    rows = sorted(((k, int(c), us) for k, (c, us) in agg.items()), key=lambda r: -r[2])
    return count, total, rows[:top]


def copy_bandwidth(device: torch.device, nbytes: int = 1 << 30, iters: int = 10) -> float:
    """Bytes a second a device-to-device copy moves (read plus written), the median of ``iters`` copies."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # (warms up)
    return 2 * nbytes / (replay_us(SimpleNamespace(replay=lambda: dst.copy_(src)), iters) / 1e6)


def step_bytes(model, state, b: int, ctx: int) -> int:
    """The bytes one decode step of ``b`` rows of ``ctx`` tokens must move: every weight once (a tied lm_head once),
    each row's recurrent states read and written, its KV read (``ctx`` tokens) and one token's KV written."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    per_slot = sum(t[0].numel() * t.element_size() for t in (*state.ssm, *state.conv))  # one row's states
    kv_token = sum(t[0, :, 0].numel() * t.element_size() for t in state.kv)  # K and V of one token, every layer
    return weights + b * (2 * per_slot + (ctx + 1) * kv_token)


def parser() -> argparse.ArgumentParser:
    ap = OneLineParser(prog="python -m models.bench.decode_profile", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--model", default="qwen3_5-0.8b", help="model shape (random weights; default qwen3_5-0.8b)")
    ap.add_argument("--batches", default="1,16,64", help="rows a step, comma-separated (default 1,16,64)")
    ap.add_argument("--paths", default="fused,torch", help="decode paths: fused, torch")
    ap.add_argument("--ctx", type=int, default=640, help="tokens each row attends to")
    ap.add_argument("--page-size", type=int, default=16, help="tokens a KV page holds (default 16)")
    ap.add_argument("--iters", type=positive_int, default=100, help="graph replays timed a round (default 100)")
    ap.add_argument("--rounds", type=positive_int, default=1,
                    help="rounds over every (batch, variant) step, alternated; the table gives the median of the "
                         "rounds' medians and, from two rounds, their range (default 1)")
    ap.add_argument("--top", type=int, default=12, help="kernels listed per profile")
    ap.add_argument("--sampler", default="full",
                    help="full: the engine's in-graph sampler (kernels.sample on CUDA), every row at temperature 0.8, "
                         "top-p 0.95, top-k 20; full-torch: the same draw in torch ops (topk); greedy: argmax only; "
                         "comma-separated for an A/B (default full)")
    ap.add_argument("--argmax", default="triton",
                    help="greedy's argmax: triton (kernels.argmax, the engine's default on CUDA), torch, or "
                         "torch,triton (A/B)")
    ap.add_argument("--attention", default="xqa", choices=["xqa", "triton"], help="the plan-free decode attention")
    ap.add_argument("--gemv", default="measured", choices=["measured", "all"],
                    help="measured: the weight stream where GEMV_CONFIGS says it wins; all: every GEMM of <= 64 rows")
    ap.add_argument("--pdl", default="on", help="our kernels' programmatic dependent launch: on, off, or on,off (A/B)")
    ap.add_argument("--xqa-pdl", default="auto", choices=["auto", "on", "off"],
                    help="XQA's programmatic dependent launch (auto: FlashInfer's default, on for sm_90)")
    ap.add_argument("--state-dtype", default="float32",
                    help="the GDN state's dtype in its pool: float32, bfloat16, or float32,bfloat16 (A/B; the floor "
                         "counts each one's bytes)")
    ap.add_argument("--silu-mul", default="fold",
                    help="SwiGLU's silu_mul folded into the down GEMM's weight stream or a kernel of its own: fold, "
                         "split, or fold,split (A/B)")
    ap.add_argument("--norm", default="fold",
                    help="each sublayer's pre-norm folded into its first GEMM's weight stream (one row, NORM_CONFIGS "
                         "shapes) or a kernel of its own: fold, split, or fold,split (A/B)")
    return ap


def main(argv: list[str] | None = None) -> None:
    ap = parser()
    a = ap.parse_args(argv)
    for flag, value in (("--silu-mul", a.silu_mul), ("--norm", a.norm)):
        if not set(value.split(",")) <= {"fold", "split"}:
            ap.error(f"{flag} takes fold, split or fold,split; got {value!r}")
    if not set(a.argmax.split(",")) <= {"triton", "torch"}:
        ap.error(f"--argmax takes torch, triton or torch,triton; got {a.argmax!r}")
    if not set(a.sampler.split(",")) <= {"full", "full-torch", "greedy"}:
        ap.error(f"--sampler takes full, full-torch or greedy, comma-separated; got {a.sampler!r}")
    if not set(a.pdl.split(",")) <= {"on", "off"}:
        ap.error(f"--pdl takes on, off or on,off; got {a.pdl!r}")
    if not set(a.state_dtype.split(",")) <= set(STATE_DTYPE_NAMES):
        ap.error(f"--state-dtype takes {', '.join(STATE_DTYPE_NAMES)} or both comma-separated; got {a.state_dtype!r}")
    if not torch.cuda.is_available():
        raise SystemExit("decode_profile measures CUDA graphs: it needs a GPU")
    dev, dt, ps = torch.device("cuda"), torch.bfloat16, a.page_size
    # "all" is a what-if: the weight stream at every skinny shape (the default configs where unlisted)
    gemv_pick = GemvPick.EVERY if a.gemv == "all" else GemvPick.MEASURED
    adapter = build_adapter(a.model, seed=0, device=dev, dtype=dt)
    model = adapter.model
    batches = [int(x) for x in a.batches.split(",")]
    W = -(-max(a.ctx, 1) // ps) + 1
    num_pages = 1 + max(batches) * W
    layout = RowLayout((KVPool(KV_POOL, ps, num_pages, W * ps),), positions_pool=KV_POOL, recurrent=True,
                       sampler=True)  # fmt: skip
    states = {n: model.allocate_state(num_pages, ps, max(batches) + 1, dev, dt, ssm_dtype=STATE_DTYPE_NAMES[n])
              for n in a.state_dtype.split(",")}  # fmt: skip
    hq, hk, d, _ = adapter.attention_dims()
    pdl = {"auto": None, "on": True, "off": False}[a.xqa_pdl]
    if a.attention == "xqa":
        attn = XQADecode(hq, hk, d, ps, max_batch=max(batches), device=dev, enable_pdl=pdl, workspaces=Workspaces(dev))
    else:
        attn = None  # per variant below: its launches follow the variant's PDL choice
    rng = np.random.default_rng(0)
    print(f"# decode step on {torch.cuda.get_device_name()}: {a.model}, ctx {a.ctx}, page {ps}, "
          f"{'XQA (pdl ' + a.xqa_pdl + ')' if a.attention == 'xqa' else 'Triton attention'}, "
          f"bf16, sampler {a.sampler}, GEMMs: {a.gemv}\n")
    bandwidth = copy_bandwidth(dev)
    print(f"A device copy moves {bandwidth / 1e12:.2f} TB/s (read + written).\n")
    print("| b | path | GPU us / step (replay) | floor us | of the floor | host us / replay() | kernels / step | "
          "profiled GPU us |")
    print("|---|---|---|---|---|---|---|---|")
    steps = []  # (b, label, floor us, graph): every variant captured, then timed in alternating rounds
    for b in batches:
        bufs = _bufs(layout, b, a.ctx, ps, W, num_pages, dev, rng)
        ids = torch.randint(0, model.cfg.vocab_size, (b,), device=dev)
        out = torch.empty(b, dtype=torch.int64, device=dev)
        variants = [(p, m == "on", f, n, sd, g, s) for p in a.paths.split(",") for m in a.pdl.split(",")
                    for f in a.silu_mul.split(",") for n in a.norm.split(",")
                    for sd in a.state_dtype.split(",") for g in a.argmax.split(",")
                    for s in a.sampler.split(",")]  # fmt: skip
        for path, pdl_on, silu, norm, sd, arg, draw in variants:
            state = states[sd]
            floor_us = step_bytes(model, state, b, a.ctx) / bandwidth * 1e6
            kc = KernelChoices(pdl=pdl_on, fold_silu_mul=silu == "fold", fold_norm=norm == "fold", gemv=gemv_pick,
                               fused_decode={"fused": True, "torch": False}[path], argmax=arg == "triton")  # fmt: skip
            if a.attention != "xqa":
                attn = TritonDecode(hq, hk, d, ps, max_batch=max(batches), max_pages_per_row=W, device=dev, dtype=dt,
                                    pdl=pdl_on)  # fmt: skip
            label = path + ("" if kc.launches_pdl() else " (no PDL)")
            label += " (silu_mul split)" if silu == "split" and path == "fused" else ""
            label += " (norm split)" if norm == "split" and path == "fused" else ""
            label += f" ({sd} state)" if sd != "float32" else ""
            label += " (torch argmax)" if arg == "torch" and draw == "greedy" else ""
            label += {"greedy": "", "full": " (sampled)", "full-torch": " (sampled in torch ops)"}[draw]
            sampler = None if draw == "greedy" else Sampler(model.cfg.vocab_size, dev,
                                                            attrs.evolve(kc, sampler=draw == "full"))  # fmt: skip

            def step(ids=ids, bufs=bufs, out=out, attn=attn, kc=kc, state=state, sampler=sampler) -> None:
                logits = model.decode(state, ids, bufs, attn, kc)
                if sampler is None:
                    greedy(logits, out, kc)
                else:
                    sampler(logits, bufs.sampler, bufs.positions, out)

            steps.append((b, label, floor_us, Graph(step, dev)))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    gpu, host = defaultdict(list), defaultdict(list)  # step index -> per round: median GPU us, median host us
    for _ in range(a.rounds):
        for i, (*_, g) in enumerate(steps):
            round_gpu, round_host = [], []
            for _ in range(a.iters):
                torch.cuda.synchronize()
                start.record()
                t0 = time.perf_counter()
                g.replay()
                round_host.append((time.perf_counter() - t0) * 1e6)
                end.record()
                end.synchronize()
                round_gpu.append(start.elapsed_time(end) * 1e3)
            gpu[i].append(statistics.median(round_gpu))
            host[i].append(statistics.median(round_host))
    details = []
    for i, (b, label, floor_us, g) in enumerate(steps):  # profiled after every timing: see the module doc
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            g.replay()
            torch.cuda.synchronize()
        count, total, top = _kernel_table(prof, a.top)
        step_us = statistics.median(gpu[i])
        spread = f" [{min(gpu[i]):.0f}-{max(gpu[i]):.0f}]" if a.rounds > 1 else ""
        print(f"| {b} | {label} | {step_us:.0f}{spread} | {floor_us:.0f} | {floor_us / step_us:.0%} | "
              f"{statistics.median(host[i]):.1f} | {count} | {total:.0f} |", flush=True)  # fmt: skip
        details.append((b, label, top))
    for b, path, top in details:
        print(f"\n## b={b} {path}: top kernels by GPU time\n\n| kernel | count | us |\n|---|---|---|")
        for name, c, us in top:
            print(f"| `{name}` | {c} | {us:.1f} |")


if __name__ == "__main__":
    main()
