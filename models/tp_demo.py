"""Tensor parallelism: one engine process per rank, each serving its shard of a Qwen3.5 model; rank 0 takes the
requests and reports. Launch with torchrun (gloo on CPUs, NCCL on GPUs):

    python -m torch.distributed.run --nproc-per-node 2 -m models.tp_demo --model qwen3_5-tiny -n 16

Rank 0 draws ``-n`` random requests (greedy unless ``--temperature``), every rank serves them in lockstep
(models.engine.tensor_parallel), and rank 0 prints the tokens a second, each rank's row-check mismatches, and whether
the tokens equal a single-process engine's on the whole model (``--compare``, on by default). ``--check`` compares
the ranks' tokens after every step.
"""

from __future__ import annotations

import argparse
import os
import time

import attrs
import torch
import torch.distributed as dist

from models.cli import OneLineParser, positive_int
from models.engine import Engine, EngineConfig, Planning, PrefillPlacement, build_adapter
from models.engine.compare import random_requests
from models.engine.tensor_parallel import RankEngine, build_rank_adapter, join_group


def parser() -> argparse.ArgumentParser:
    ap = OneLineParser(prog="python -m models.tp_demo", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--model", default="qwen3_5-tiny", help="a Qwen3.5 shape, random weights (default qwen3_5-tiny)")
    ap.add_argument("-n", "--requests", type=positive_int, default=16, help="requests served (default 16)")
    ap.add_argument("--prompt-len", type=positive_int, default=40, help="longest prompt, tokens (default 40)")
    ap.add_argument("--gen-len", type=positive_int, default=24, help="most new tokens a request (default 24)")
    ap.add_argument("--planning", choices=[p.value for p in Planning], default="resident",
                    help="decode planning of every rank's engine (default resident)")  # fmt: skip
    ap.add_argument("-c", "--max-running", type=positive_int, default=8, help="requests running at once (default 8)")
    ap.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the weights and the requests")
    ap.add_argument("--no-compare", dest="compare", action="store_false",
                    help="skip the single-process engine on the whole model")  # fmt: skip
    ap.add_argument("--check", action="store_true", help="compare the ranks' tokens after every step")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if int(os.environ.get("WORLD_SIZE", "1")) < 2:
        parser().error("run under torchrun: python -m torch.distributed.run --nproc-per-node 2 -m models.tp_demo")
    cuda = torch.cuda.is_available()
    tp = join_group(cuda)
    try:
        device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
        cfg = EngineConfig(device=device, dtype=dtype, planning=Planning(args.planning), max_running=args.max_running,
                           max_seq_len=args.prompt_len + args.gen_len + 1, row_check=True,
                           prefill=PrefillPlacement.IN_STEP)  # fmt: skip
        try:
            eng = RankEngine(build_rank_adapter(args.model, tp, args.seed, device, dtype), cfg, tp, check=args.check)
        except ValueError as e:
            parser().error(str(e))
        reqs = None
        if tp.rank == 0:
            full = build_adapter(args.model, seed=args.seed, device=device, dtype=dtype)
            reqs = random_requests(full, args.requests, (1, args.prompt_len), (1, args.gen_len), args.seed,
                                   args.temperature)  # fmt: skip
        t0 = time.perf_counter()
        results = eng.run(reqs)
        wall = time.perf_counter() - t0
        mism = [None] * tp.world
        dist.all_gather_object(mism, eng.engine.stats.mismatches)
        if tp.rank == 0:
            n = sum(len(r.tokens) for r in results)
            print(f"{args.model} over {tp.world} ranks ({'NCCL' if cuda else 'gloo'}), {args.planning} planning: "
                  f"{len(results)} requests, {n} tokens in {wall:.2f} s ({n / wall:.0f} tok/s); row-check "
                  f"mismatches by rank {mism}")  # fmt: skip
            if args.compare:
                want = Engine(full, attrs.evolve(cfg, row_check=False)).run(reqs)
                same = sum(a.tokens == b.tokens for a, b in zip(results, want, strict=True))
                print(f"tokens equal to one process on the whole model: {same}/{len(results)} requests")
    finally:
        tp.leave()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
