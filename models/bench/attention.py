"""Decode attention backends replayed in a CUDA graph (GPU), and the host time of FA2's plan().

    python -m models.bench.attention [--head-dim 256 --q-heads 8 --kv-heads 2 --page-size 16 --ctx 4096]
                                     [--layers 8 --iters 200 --batches 1,16,64 --backends torch,fa2,xqa,triton]

Per batch size b: a bf16 cache of 1 + b * ceil(ctx / ps) pages, rows of length uniform in [ctx / 2, ctx] on
random distinct pages, in block tables as wide as ``--table-ctx`` tokens (an engine's context: a server at the model's
262k context has tables of 16384 pages however short its rows). For each backend a graph of ``--layers`` attention
calls (one per layer, distinct caches would not change the per-call time, so one cache is reused) is captured once
and replayed; the time per call is
the median replay time (CUDA events) / layers; the largest difference from the torch reference's output is reported
beside it. For fa2 also: plan() host time (median, GPU idle), and one step
"plan + replay" wall time against XQA's "write tables + replay" (what a decode step pays for attention metadata).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from models.bench.timing import replay_us
from models.cli import OneLineParser
from models.layers.flashinfer_attention import FA2Decode, TorchDecode, Workspaces, XQADecode
from models.layers.triton_attention import TritonDecode
from resplan import Graph


def _rows(rng, b, ps, W, ctx, num_pages):
    sl = rng.integers(max(1, ctx // 2), ctx + 1, size=b)
    npages = -(-sl // ps)
    bt = np.zeros((b, W), dtype=np.int32)
    bt[np.arange(W)[None, :] < npages[:, None]] = rng.permutation(np.arange(1, num_pages))[: int(npages.sum())]
    return bt, sl.astype(np.int32)


def _capture(fn):
    """Warm up on a side stream and capture: resplan's Graph, as the engine captures its buckets."""
    return Graph(fn, torch.device("cuda")).graph


def parser() -> argparse.ArgumentParser:
    ap = OneLineParser(prog="python -m models.bench.attention", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--head-dim", type=int, default=256, help="attention head width (default 256, Qwen3.5)")
    ap.add_argument("--q-heads", type=int, default=8, help="query heads (default 8)")
    ap.add_argument("--kv-heads", type=int, default=2, help="KV heads (default 2)")
    ap.add_argument("--page-size", type=int, default=16, help="tokens a KV page holds (default 16)")
    ap.add_argument("--ctx", type=int, default=4096, help="longest row's tokens; rows hold ctx/2 to ctx (default 4096)")
    ap.add_argument("--table-ctx", type=int, default=None,
                    help="the context each row's block table is sized for, as an engine's --max-seq-len sizes it "
                         "(default --ctx); the rows still hold ctx/2 to ctx tokens")
    ap.add_argument("--layers", type=int, default=8, help="attention calls a captured graph (default 8)")
    ap.add_argument("--iters", type=int, default=200, help="graph replays timed (default 200)")
    ap.add_argument("--batches", default="1,16,64", help="rows a call, comma-separated (default 1,16,64)")
    ap.add_argument("--backends", default="torch,fa2,xqa,triton",
                    help="attentions compared, comma-separated: torch, fa2, xqa, triton")
    return ap


def main(argv: list[str] | None = None) -> None:
    a = parser().parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("python -m models.bench.attention: error: it times CUDA graphs of GPU attention: it needs a "
                         "GPU (run it on the H200)")
    dev, dt = "cuda", torch.bfloat16
    d, hq, hk, ps = a.head_dim, a.q_heads, a.kv_heads, a.page_size
    table_ctx = a.table_ctx or a.ctx
    if table_ctx < a.ctx:
        parser().error(f"argument --table-ctx: {table_ctx} is less than --ctx {a.ctx}")
    W = -(-table_ctx // ps)  # the table's width; rows use their first ceil(len / ps) pages
    scale = d**-0.5
    rng = np.random.default_rng(0)
    ws = Workspaces(dev)  # every XQA and fa2 object below takes its workspace from these, as an engine's do
    print(
        f"# decode attention, {torch.cuda.get_device_name()}: d={d} hq={hq} hk={hk} ps={ps} ctx<={a.ctx} "
        f"table for {table_ctx} tokens, layers/graph={a.layers}\n"
    )
    print("| b | backend | us / call (graph replay) | max abs diff vs torch | fa2 plan host us | step us (metadata + "
          "replay) |")
    print("|---|---|---|---|---|---|")
    for b in (int(x) for x in a.batches.split(",")):
        num_pages = 1 + b * -(-a.ctx // ps)
        kv = torch.randn(num_pages, 2, ps, hk, d, dtype=dt, device=dev)
        q = torch.randn(b, hq, d, dtype=dt, device=dev)
        bt_dev = torch.zeros(b, W, dtype=torch.int32, device=dev)
        sl_dev = torch.ones(b, dtype=torch.int32, device=dev)
        sets = [_rows(rng, b, ps, W, a.ctx, num_pages) for _ in range(8)]
        pinned = [(torch.from_numpy(bt).pin_memory(), torch.from_numpy(sl).pin_memory()) for bt, sl in sets]

        def write(i, pinned=pinned, bt_dev=bt_dev, sl_dev=sl_dev):
            bt_dev.copy_(pinned[i % len(pinned)][0], non_blocking=True)
            sl_dev.copy_(pinned[i % len(pinned)][1], non_blocking=True)

        write(0)
        used = -(-a.ctx // ps)  # the reference reads the columns rows use: a table for 262k tokens, gathered
        want = TorchDecode()(q, kv, bt_dev[:, :used], sl_dev, scale).float()  # whole, would not fit in memory
        for name in a.backends.split(","):
            if name == "torch":
                attn = TorchDecode()
            elif name == "xqa":
                attn = XQADecode(hq, hk, d, ps, max_batch=b, device=dev, workspaces=ws)
            elif name == "triton":
                attn = TritonDecode(hq, hk, d, ps, max_batch=b, max_pages_per_row=W, device=dev, sm_scale=scale)
            elif name == "fa2":
                attn = FA2Decode(b, W, hq, hk, d, ps, device=dev, sm_scale=scale, workspaces=ws)
                attn.schedule(*sets[0])
            else:
                raise SystemExit(f"unknown backend {name}")
            write(0)  # the rows ``want`` and fa2's plan describe (the previous backend's replays left others)
            err = (attn(q, kv, bt_dev, sl_dev, scale).float() - want).abs().max().item()  # eager: JIT build, caches
            torch.cuda.synchronize()
            call = lambda attn=attn, q=q, kv=kv, bt=bt_dev, sl=sl_dev: attn(q, kv, bt, sl, scale)
            g = _capture(lambda call=call: [call() for _ in range(a.layers)])
            us = replay_us(g, a.iters) / a.layers
            plan_us = "-"
            step_times = []
            for i in range(a.iters):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                write(i)
                if name == "fa2":
                    attn.schedule(*sets[i % len(sets)])
                g.replay()
                torch.cuda.synchronize()
                step_times.append((time.perf_counter() - t0) * 1e6)
            if name == "fa2":
                plan_times = []
                for i in range(a.iters):
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    attn.schedule(*sets[i % len(sets)])
                    plan_times.append((time.perf_counter() - t0) * 1e6)
                plan_us = f"{statistics.median(plan_times):.1f}"
            step_us = statistics.median(step_times)
            print(f"| {b} | {name} | {us:.1f} | {err:.1e} | {plan_us} | {step_us:.1f} |", flush=True)
            del g, attn
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
