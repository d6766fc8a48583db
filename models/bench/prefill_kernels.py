"""The prefill pass's row-wise GDN kernels on the GPU, by configuration, against the bandwidth their bytes need.

    python -m models.bench.prefill_kernels [--config qwen3_5_0_8b] [--tokens 2048,8192] [--copies 4]

For each pass size N (sequences of lognormal lengths, median 256, a third continuing a stream), a CUDA graph of
``--copies`` calls on distinct inputs (more bytes than the L2 holds at N >= 2048, as in a pass of 18 layers) is
replayed; reported: us per call (the median replay / copies) and the bytes it must move per second. Kernels:

* the varlen conv (``kernels.conv1d_varlen``, q and k l2-normed, q | k | v split), every (BLOCK_T, warps) of its
  autotuner's space and a few beyond it, then what the tuner picks;
* the gated norm (``kernels.norms.gated_rms_norm``), by (row, head) pairs a program;
* ``copy``: ``torch.Tensor.copy_`` of the same read and written bytes, the floor each can hope for.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import triton

from kernels.conv1d_varlen import conv1d_varlen_
from kernels.conv1d_varlen.kernel import _conv_kernel
from kernels.norms import gated_rms_norm
from models.bench.timing import replay_us
from models.cli import OneLineParser
from models.qwen3_5.config import CONFIGS
from resplan import Graph

CONV_SPACE = [(bt, w) for bt in (16, 32, 64, 128) for w in (2, 4, 8, 16)]
NORM_ROWS = (1, 2, 4, 8, 16, 32)


def _lengths(N: int, rng: np.random.Generator) -> list[int]:
    """Sequence lengths summing to N: lognormal (median 256, 32 .. 1536), the last cut to fit."""
    out: list[int] = []
    while sum(out) < N:
        out.append(int(np.clip(rng.lognormal(np.log(256), 0.8), 32, 1536)))
    out[-1] -= sum(out) - N
    return [n for n in out if n > 0]


def _time(fn, copies: int, iters: int) -> float:
    """us per call of a graph of ``copies`` calls (``fn(i)``: call i)."""
    return replay_us(Graph(lambda: [fn(i) for i in range(copies)], torch.device("cuda")), iters) / copies


def _row(what: str, us: float, nbytes: int, floor: float | None) -> str:
    ratio = f"{us / floor:.2f}x" if floor else ""
    return f"| {what} | {us:.1f} | {nbytes / us / 1e3:.0f} | {ratio} |"


def _conv(cfg, N: int, copies: int, iters: int, rng, dev, dt) -> None:
    C, K, kd, dk = cfg.conv_dim, cfg.linear_conv_kernel_dim, cfg.linear_key_dim, cfg.linear_key_head_dim
    lens = _lengths(N, rng)
    S = len(lens)
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32, device=dev)
    seq_of = torch.repeat_interleave(torch.arange(S, dtype=torch.int32, device=dev),
                                     torch.tensor(lens, device=dev)).to(torch.int32)  # fmt: skip
    slots = torch.arange(1, S + 1, dtype=torch.int32, device=dev)
    fresh = torch.tensor(rng.random(S) > 1 / 3, device=dev)
    width = C + cfg.linear_value_dim + 2 * cfg.linear_num_value_heads  # the fused input projection's row
    xs = [torch.randn(N, width, device=dev, dtype=dt)[:, :C] for _ in range(copies)]
    pools = [torch.randn(S + 1, C, K, device=dev, dtype=dt) for _ in range(copies)]
    w = torch.randn(C, K, device=dev, dtype=dt) * 0.3
    nbytes = 2 * N * C * xs[0].element_size()
    outs = [torch.empty(N, C, device=dev, dtype=dt) for _ in range(copies)]
    floor = _time(lambda i: outs[i].copy_(xs[i]), copies, iters)
    print(f"\n## conv, N={N} ({S} sequences), C={C}, K={K}\n")
    print("| kernel | us | GB/s | vs copy |\n|---|---|---|---|")
    print(_row("copy", floor, nbytes, None))
    split = dict(split=(kd, 2 * kd), normed=True, eps=1e-6, block_c=dk)
    flat = [torch.empty(N * C, device=dev, dtype=dt) for _ in range(copies)]
    fresh_i = fresh.to(torch.int32)
    for bt, warps in CONV_SPACE:

        def one(i, bt=bt, warps=warps):
            _conv_kernel[(triton.cdiv(N, bt), triton.cdiv(C, dk))](
                xs[i], pools[i], w, flat[i], seq_of, cu, slots, fresh_i, N, C, xs[i].stride(0), pools[i].stride(0),
                pools[i].stride(1), 1e-6, 0, K=K, BLOCK_T=bt, BLOCK_C=dk, SPLIT1=kd, SPLIT2=2 * kd, NORMED=True,
                num_warps=warps,
            )  # fmt: skip

        try:
            print(_row(f"BLOCK_T {bt}, {warps} warps", _time(one, copies, iters), nbytes, floor))
        except Exception as e:  # a configuration the compiler refuses
            print(f"| BLOCK_T {bt}, {warps} warps | {type(e).__name__} | | |")
    for i in range(copies):  # the tuner's pick, tuned here on eager calls
        conv1d_varlen_(xs[i], pools[i], w, seq_of, cu, slots, fresh, **split)
    us = _time(lambda i: conv1d_varlen_(xs[i], pools[i], w, seq_of, cu, slots, fresh, **split), copies, iters)
    print(_row("conv1d_varlen_ (tuned, + the state kernel)", us, nbytes, floor))


def _norm(cfg, N: int, copies: int, iters: int, dev, dt) -> None:
    H, D = cfg.linear_num_value_heads, cfg.linear_value_head_dim
    os_ = [torch.randn(N, H, D, device=dev, dtype=dt) for _ in range(copies)]
    width = cfg.conv_dim + H * D + 2 * H
    zs = [torch.randn(N, width, device=dev, dtype=dt)[:, cfg.conv_dim : cfg.conv_dim + H * D] for _ in range(copies)]
    w = torch.rand(D, device=dev, dtype=dt) + 0.5
    outs = [torch.empty(N, H * D, device=dev, dtype=dt) for _ in range(copies)]
    nbytes = 3 * N * H * D * os_[0].element_size()
    floor = _time(lambda i: outs[i].copy_(zs[i]), copies, iters) * 1.5  # (reads o and z, writes out: 3 of 2)
    print(f"\n## gated norm, N={N}, {H} heads of {D}\n")
    print("| kernel | us | GB/s | vs copy |\n|---|---|---|---|")
    print(_row("copy (scaled to 3 tensors)", floor, nbytes, None))
    for rows in NORM_ROWS:
        us = _time(lambda i, r=rows: gated_rms_norm(os_[i], zs[i], w, 1e-6, out=outs[i], pdl=False, rows=r), copies,
                   iters)  # fmt: skip
        print(_row(f"{rows} pairs a program", us, nbytes, floor))
    us = _time(lambda i: gated_rms_norm(os_[i], zs[i], w, 1e-6, out=outs[i], pdl=False), copies, iters)
    print(_row("gated_rms_norm (default)", us, nbytes, floor))


def parser() -> argparse.ArgumentParser:
    ap = OneLineParser(prog="python -m models.bench.prefill_kernels", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--config", default="qwen3_5_0_8b", choices=sorted(CONFIGS), help="model shape")
    ap.add_argument("--tokens", default="2048,8192", help="pass sizes, comma-separated (default 2048,8192)")
    ap.add_argument("--copies", type=int, default=4, help="calls a graph, each on its own inputs (default 4)")
    ap.add_argument("--iters", type=int, default=20, help="replays timed (default 20)")
    ap.add_argument("--seed", type=int, default=0, help="the sequence lengths' seed")
    return ap


def main(argv: list[str] | None = None) -> None:
    a = parser().parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("prefill_kernels times GPU kernels: it needs CUDA")
    cfg = CONFIGS[a.config]
    rng = np.random.default_rng(a.seed)
    print(f"# {a.config}, bf16, {a.copies} calls a graph, median of {a.iters} replays")
    for N in (int(t) for t in a.tokens.split(",")):
        _conv(cfg, N, a.copies, a.iters, rng, torch.device("cuda"), torch.bfloat16)
        _norm(cfg, N, a.copies, a.iters, torch.device("cuda"), torch.bfloat16)


if __name__ == "__main__":
    main()
