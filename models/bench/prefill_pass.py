"""Prompt throughput of one prefill pass of varied-length chunks: the prefill kernels eager and replayed from a
token bucket's CUDA graph, and the torch references, arms alternated.

    python -m models.bench.prefill_pass --tokens 2048,8192 --repeats 10

Each pass is a fresh draw of chunks (lognormal lengths, median 256, 32-1536, cut to the pass's tokens; a third of
them continuing a stream that already holds up to 256 tokens) on their own pages and slots. Per arm and token count:
wall time of a pass (CUDA-synchronised; inputs, FlashInfer's plan, the pass and its logits) as median [min-max] over
``--repeats`` passes, and prompt tokens a second. ``graph`` replays the bucket of ``--tokens`` (captured at its second
pass, as the engine does); ``kernels``: the same kernels eager at the pass's exact shape; ``torch``: the references
(``--torch`` to include them: seconds a pass at 8k tokens).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from kernels.choices import KernelChoices
from models.cli import OneLineParser
from models.engine import build_adapter
from models.engine.prefill_graphs import PrefillGraphs
from models.layers.flat import bucket_shape
from models.qwen3_5 import PrefillChunk


def draw_chunks(rng: np.random.Generator, tokens: int, ps: int, vocab: int, max_chunks: int) -> list[PrefillChunk]:
    """Chunks of lognormal lengths (median 256, 32-1536) filling ``tokens``; a third continue a stream; pages from
    1 up, slots 1..R."""
    lens: list[int] = []
    while sum(lens) < tokens and len(lens) < max_chunks:
        lens.append(int(np.clip(rng.lognormal(np.log(256), 0.9), 32, 1536)))
    lens[-1] -= sum(lens) - tokens
    if lens[-1] < 1:
        lens.pop()
    out, page = [], 1
    for r, n in enumerate(lens):
        start = int(rng.integers(1, 257)) if rng.random() < 1 / 3 else 0
        k = -(-(start + n) // ps)
        out.append(PrefillChunk(rng.integers(0, vocab, n), np.arange(page, page + k), start, r + 1))
        page += k
    return out


def parser() -> argparse.ArgumentParser:
    ap = OneLineParser(prog="python -m models.bench.prefill_pass", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--model", default="qwen3_5-0.8b", help="model shape (random weights, bf16; default 0.8b)")
    ap.add_argument("--tokens", default="2048,8192", help="prompt tokens a pass, comma-separated (default 2048,8192)")
    ap.add_argument("--max-chunks", type=int, default=32, help="chunks a pass holds at most (default 32)")
    ap.add_argument("--repeats", type=int, default=10, help="timed passes per arm and size (default 10)")
    ap.add_argument("--page-size", type=int, default=16, help="tokens a KV page holds (default 16)")
    ap.add_argument("--torch", action="store_true", help="also time the torch references")
    ap.add_argument("--profile", type=int, default=0, help="after timing, the top N CUDA kernels of one replay")
    return ap


def main(argv: list[str] | None = None) -> None:
    ap = parser()
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU (the kernels and graphs are CUDA's)")
    adapter = build_adapter(args.model, seed=0, device="cuda", dtype=torch.bfloat16)
    model, ps = adapter.model, args.page_size
    sizes = [int(t) for t in args.tokens.split(",")]
    n_pages = max(sizes) // ps + 2 * args.max_chunks + 17 * args.max_chunks
    state = model.allocate_state(n_pages, ps, args.max_chunks + 1, "cuda", torch.bfloat16)
    arms = ["graph", "kernels"] + (["torch"] if args.torch else [])
    print(f"{args.model} bf16 on {torch.cuda.get_device_name()}; {args.repeats} passes an arm and size, arms "
          f"alternated; chunks lognormal (median 256, 32-1536), a third continuing")  # fmt: skip
    print("| tokens | arm | chunks (median) | pass ms | prompt tok/s |\n|---|---|---|---|---|")
    for T in sizes:
        shape = bucket_shape(T, args.max_chunks, n_pages, ps)
        graphs = PrefillGraphs(lambda b: model.prefill_forward(state, b), "cuda")
        rng = np.random.default_rng(T)
        times: dict[str, list[float]] = {a: [] for a in arms}
        counts = []
        for rep in range(args.repeats + 2):  # the first two untimed (the first captures the bucket)
            chunks = draw_chunks(rng, T, ps, model.cfg.vocab_size, args.max_chunks)
            counts.append(len(chunks))
            for arm in arms if rep % 2 == 0 else arms[::-1]:
                kc = KernelChoices(prefill_kernels=arm != "torch")
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                if arm == "graph":
                    batch = model.prefill_inputs(state, chunks, shape, graphed=True, kc=kc)
                    graphs.run(batch) if rep else graphs.capture(batch)
                else:
                    model.prefill_batch(state, chunks, kc)
                torch.cuda.synchronize()
                if rep >= 2:
                    times[arm].append(time.perf_counter() - t0)
        if args.profile:
            batch = model.prefill_inputs(state, draw_chunks(rng, T, ps, model.cfg.vocab_size, args.max_chunks), shape,
                                         graphed=True)  # fmt: skip
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                graphs.run(batch)
                torch.cuda.synchronize()
            print(f"\n{T} tokens, one replay:\n" + prof.key_averages().table(sort_by="cuda_time_total",
                                                                             row_limit=args.profile))  # fmt: skip
        for arm in arms:
            t = np.array(times[arm]) * 1e3
            tps = T / np.array(times[arm])
            print(f"| {T} | {arm} | {int(np.median(counts))} | {np.median(t):.2f} [{t.min():.2f}-{t.max():.2f}] | "
                  f"{np.median(tps):,.0f} [{tps.min():,.0f}-{tps.max():,.0f}] |")  # fmt: skip


if __name__ == "__main__":
    main()
