"""The sampler's GPU time by row count, and its parts (``models.engine.sampler``).

    python -m models.bench.sampler [--rows 1,8,32,64] [--vocab 248320]

Each form runs in a CUDA graph on fresh bf16 logits [rows, vocab] (the lm_head's output) and reports the median replay:
``argmax`` (what a greedy decode graph runs), ``Sampler`` (temperature, top-k, top-p, Gumbel draw), and the candidate
selection inside it: ``topk`` of the 256 most likely tokens in float32 (as the sampler takes it) and in bf16.
"""

from __future__ import annotations

import argparse

import torch

from models.bench.timing import replay_us
from models.cli import OneLineParser
from models.engine.requests import CANDIDATES
from models.engine.sampler import Sampler
from resplan import Graph
from resplan.layout import SamplerCell


def parser() -> argparse.ArgumentParser:
    ap = OneLineParser(prog="python -m models.bench.sampler", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--rows", default="1,8,32,64", help="rows sampled at once, comma-separated")
    ap.add_argument("--vocab", type=int, default=248320, help="vocabulary (default 248320, Qwen3.5's)")
    ap.add_argument("--iters", type=int, default=50, help="replays timed (default 50)")
    return ap


def _times(sampler: Sampler, b: int, vocab: int, iters: int, dev: torch.device) -> list[float]:
    """us of each form at b rows: argmax, the sampler, topk in float32 and in bf16."""
    logits = torch.randn(b, vocab, device=dev).to(torch.bfloat16) * 4
    cells = torch.zeros(b, 4, dtype=torch.int32, device=dev)
    cells[:, SamplerCell.TEMPERATURE] = torch.tensor(0.8).view(torch.int32)
    cells[:, SamplerCell.TOP_P] = torch.tensor(0.95).view(torch.int32)
    cells[:, SamplerCell.TOP_K] = 50
    cells[:, SamplerCell.SEED] = torch.arange(b, dtype=torch.int32, device=dev)
    pos = torch.arange(b, device=dev)
    forms = [
        lambda: logits.argmax(-1),
        lambda: sampler(logits, cells, pos),
        lambda: logits.float().topk(CANDIDATES, dim=-1),
        lambda: logits.topk(CANDIDATES, dim=-1),
    ]
    return [replay_us(Graph(f, dev), iters) for f in forms]


def main(argv: list[str] | None = None) -> None:
    a = parser().parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("the sampler bench times GPU graphs: it needs CUDA")
    dev = torch.device("cuda")
    sampler = Sampler(a.vocab, dev)
    print(f"# sampler, vocab {a.vocab}, bf16 logits, median of {a.iters} graph replays (us)\n")
    print("| rows | argmax | Sampler | topk 256 float32 | topk 256 bf16 |\n|---|---|---|---|---|")
    for b in (int(r) for r in a.rows.split(",")):
        us = _times(sampler, b, a.vocab, a.iters, dev)
        print(f"| {b} | " + " | ".join(f"{u:.0f}" for u in us) + " |")


if __name__ == "__main__":
    main()
