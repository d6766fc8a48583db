"""The sampler's GPU time by row count, and its parts (``models.engine.sampler``).

    python -m models.bench.sampler [--rows 1,8,32,64] [--vocab 248320] [--logits normal,clustered] [--dtype bfloat16]

Each form runs in a CUDA graph on fresh logits [rows, vocab] (the lm_head's output) and reports the median replay:
torch's ``argmax`` and ``kernels.argmax`` (what a greedy decode graph runs), the draw (temperature 0.8, top-k 50,
top-p 0.95, the Gumbel draw) as ``kernels.sample`` (the engine's ``Sampler`` on CUDA) and as the ``Sampler``'s
torch ops, and the candidate selection inside the latter: ``topk`` of the 256 most likely tokens in float32 (as it
takes it) and in the logits' dtype; and a LOGPROBS step's draw (``Sampler.draw_logprobs``: the kernel summing each row's
log-sum-exp as it reads the logits) against the kernel's draw followed by a full log_softmax (``logprobs``), the form
it replaced. Before timing, the two samplers' tokens are compared (they differ only where a row's head holds equal
logits).

The logits (``--logits``, comma-separated, a table each): ``normal``, N(0, 4^2) (a random-weight model's rows draw
alike: ~300 logits reach the kernel's bound, at most ~11 a tile); ``clustered``, the same with each row's 400 largest on
consecutive ids (one tile holds more than the head's 256 of them: the kernel's slow paths, its worst case found);
``tied``, integers in [-8, 8) (ties everywhere, thousands at the head's last value).
"""

from __future__ import annotations

import argparse

import torch

from kernels.argmax import argmax_rows
from kernels.choices import KernelChoices
from kernels.sample import sample_rows
from models.bench.timing import replay_us
from models.cli import OneLineParser
from models.engine.requests import CANDIDATES
from models.engine.sampler import COLUMNS, Sampler, logprobs
from resplan import Graph
from resplan.layout import SamplerCell


def parser() -> argparse.ArgumentParser:
    ap = OneLineParser(prog="python -m models.bench.sampler", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--rows", default="1,8,32,64", help="rows sampled at once, comma-separated")
    ap.add_argument("--vocab", type=int, default=248320, help="vocabulary (default 248320, Qwen3.5's)")
    ap.add_argument("--iters", type=int, default=50, help="replays timed (default 50)")
    ap.add_argument("--logits", default="normal", help="normal, clustered, tied; comma-separated (default normal)")
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16", help="the logits' (default bf16)")
    return ap


LOGITS = ("normal", "clustered", "tied")


def make_logits(kind: str, b: int, vocab: int, dtype: torch.dtype, dev: torch.device) -> torch.Tensor:
    """[b, vocab] logits of a kind (the module doc)."""
    if kind == "tied":
        return torch.randint(-8, 8, (b, vocab), device=dev).to(dtype)
    x = torch.randn(b, vocab, device=dev) * 4
    if kind == "clustered":
        x[:, 5000:5400] += 30  # (ids 5000-5399: one tile of 4096 holds most)
    return x.to(dtype)


def _times(b: int, vocab: int, iters: int, dev: torch.device, kind: str = "normal",
           dtype: torch.dtype = torch.bfloat16) -> tuple[list[float], int]:  # fmt: skip
    """(us of each form at b rows, the rows where the two samplers drew differently)."""
    logits = make_logits(kind, b, vocab, dtype, dev)
    cells = torch.full((b, len(SamplerCell)), -1, dtype=torch.int32, device=dev)
    cells[:, SamplerCell.TEMPERATURE] = torch.tensor(0.8).view(torch.int32)
    cells[:, SamplerCell.TOP_P] = torch.tensor(0.95).view(torch.int32)
    cells[:, SamplerCell.TOP_K] = 50
    cells[:, SamplerCell.SEED] = torch.arange(b, dtype=torch.int32, device=dev)
    cells[:, SamplerCell.MIN_POSITION] = 0
    pos = torch.arange(b, device=dev)
    torch_ops = Sampler(vocab, dev, KernelChoices(sampler=False))
    kernel = Sampler(vocab, dev, KernelChoices(sampler=True))
    out = torch.empty(b, dtype=torch.int64, device=dev)
    head = torch.empty(b, min(vocab, CANDIDATES), dtype=torch.int64, device=dev)
    differ = int((sample_rows(logits, cells, pos, COLUMNS, out, head) != torch_ops(logits, cells, pos)).sum())
    forms = [
        lambda: logits.argmax(-1),
        lambda: argmax_rows(logits, out),
        lambda: sample_rows(logits, cells, pos, COLUMNS, out, head),
        lambda: torch_ops(logits, cells, pos),
        lambda: logits.float().topk(CANDIDATES, dim=-1),
        lambda: logits.topk(CANDIDATES, dim=-1),
        lambda: kernel.draw_logprobs(logits, cells, pos),
        lambda: logprobs(logits, *kernel.draw(logits, cells, pos)),
    ]
    return [replay_us(Graph(f, dev), iters) for f in forms], differ


def main(argv: list[str] | None = None) -> None:
    ap = parser()
    a = ap.parse_args(argv)
    kinds = a.logits.split(",")
    if not set(kinds) <= set(LOGITS):
        ap.error(f"--logits takes {', '.join(LOGITS)}, comma-separated; got {a.logits!r}")
    if not torch.cuda.is_available():
        raise SystemExit("the sampler bench times GPU graphs: it needs CUDA")
    dev = torch.device("cuda")
    dtype = getattr(torch, a.dtype)
    print(f"# sampler on {torch.cuda.get_device_name()}, vocab {a.vocab}, {a.dtype} logits, median of {a.iters} "
          "graph replays (us)")
    for kind in kinds:
        print(f"\n{kind} logits\n\n| rows | torch argmax | kernels.argmax | kernels.sample | Sampler: torch ops | "
              "topk 256 float32 | topk 256 of the logits | logprobs draw: kernel with log-sum-exp | logprobs draw: "
              "kernel, then log_softmax | rows drawn differently |\n|---|---|---|---|---|---|---|---|---|---|")
        for b in (int(r) for r in a.rows.split(",")):
            us, differ = _times(b, a.vocab, a.iters, dev, kind, dtype)
            print(f"| {b} | " + " | ".join(f"{u:.1f}" for u in us) + f" | {differ} |", flush=True)


if __name__ == "__main__":
    main()
