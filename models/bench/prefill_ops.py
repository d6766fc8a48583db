"""How many torch operations one eager prefill dispatches (each is host time; most launch a kernel on the GPU).

    python -m models.bench.prefill_ops --model qwen3_5-0.8b --prompt-len 512 [--requests 8] [--device cpu]

Prefill runs eagerly, one request's chunk at a time, so on the GPU its time is mostly the host dispatching thousands
of small operations. With ``--requests R`` > 1 the R prompts go through one ``prefill_batch`` pass, as the engine
runs a step's chunks. This counts the aten operations of one prefill (``TorchDispatchMode``), in total and by name, and
times it. The count is exact and machine-independent; the time is only this machine's.
"""

from __future__ import annotations

import argparse
import collections
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from models.cli import OneLineParser
from models.engine import build_adapter
from models.qwen3_5 import PrefillChunk


class CountOps(TorchDispatchMode):
    """Counts aten operations by name while active."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def prefill_inputs(model, R: int, T: int, ps: int, device, dtype: torch.dtype, seed: int = 0):
    """A state with room for R prompts of T random tokens, and their chunks (each on its own pages and slot)."""
    n_pages = -(-T // ps)
    state = model.allocate_state(R * n_pages + 1, ps, R + 1, device, dtype)
    gen = torch.Generator().manual_seed(seed)
    chunks = [PrefillChunk(torch.randint(0, model.cfg.vocab_size, (T,), generator=gen),
                           torch.arange(1 + r * n_pages, 1 + (r + 1) * n_pages), start=0, rec_slot=1 + r)
              for r in range(R)]  # fmt: skip
    return state, chunks


def parser() -> argparse.ArgumentParser:
    ap = OneLineParser(prog="python -m models.bench.prefill_ops", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--model", default="qwen3_5-0.8b", help="model shape (random weights; default qwen3_5-0.8b)")
    ap.add_argument("--prompt-len", type=int, default=512, help="tokens each prompt has (default 512)")
    ap.add_argument("--page-size", type=int, default=16, help="tokens a KV page holds (default 16)")
    ap.add_argument("--requests", type=int, default=1, help="prompts prefilled in one prefill_batch pass")
    ap.add_argument("--device", default="cpu", help="cpu (float32) or cuda (bf16)")
    ap.add_argument("--top", type=int, default=10, help="operators listed (default 10)")
    return ap


def main(argv: list[str] | None = None) -> None:
    a = parser().parse_args(argv)
    dt = torch.float32 if a.device == "cpu" else torch.bfloat16
    model = build_adapter(a.model, seed=0, device=a.device, dtype=dt).model
    T, ps, R = a.prompt_len, a.page_size, a.requests
    state, chunks = prefill_inputs(model, R, T, ps, a.device, dt)

    def run() -> None:
        if R == 1:
            model.prefill(state, chunks[0].token_ids, chunks[0].pages, start=0, rec_slot=1)
        else:
            model.prefill_batch(state, chunks)

    with torch.no_grad():
        run()  # warm-up
        counter = CountOps()
        t0 = time.perf_counter()
        with counter:
            run()
        wall = time.perf_counter() - t0
    total = sum(counter.counts.values())
    how = "one prefill" if R == 1 else f"one prefill_batch of {R} prompts"
    print(f"# {how}: {a.model}, {T} tokens each, {a.device}\n")
    print(f"aten operations: **{total}** ({total / (R * T):.1f} a token); wall {wall:.2f} s on this machine\n")
    print("| operation | count |\n|---|---|")
    for name, c in counter.counts.most_common(a.top):
        print(f"| `{name}` | {c} |")


if __name__ == "__main__":
    main()
