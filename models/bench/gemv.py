"""Skinny decode GEMMs on the GPU: cuBLAS (``F.linear``) against the Triton weight stream (``kernels.gemv``).

    python -m models.bench.gemv --model qwen3_5-0.8b [--rows 1,4,16,32,64] [--parts gemv,silu-mul,norm] [--quick]

For every distinct GEMM shape (N, K) of the model's fused decode (input projections, MLP, output projections,
lm_head), and every row count M, a CUDA graph of ``--layers`` calls on distinct weight copies (more bytes than the
L2 holds, as in a real step) is replayed; reported: us per call (median replay / layers), the weight bytes streamed
per second, and the best stream's time against a device copy that moves the same bytes (half of them read, half
written: a graph of as many copies of N * K / 2 elements on distinct buffers, timed alike), which pays the same
launch and ramp (copy / Triton: the stream's speed as a share of that copy's). Prints the best Triton configuration
per shape and a ``GEMV_CONFIGS`` literal of the shapes where Triton beats cuBLAS by more than 5%, per row tile
(``kernels.gemv.tile_rows``: M == 1 on the CUDA cores, 2-16, 17-32 and 33-64 rows with tl.dot, each chosen by the
sum over the M measured in it).

Then SwiGLU's down projection with silu_mul folded into the weight stream (``kernels.gemv.gemv_silu_mul``, what
``forward_fused`` runs where gemv wins) against the two launches it replaces (``silu_mul`` then ``gemv``, or then
cuBLAS), each from the gate|up output gu [M, 2K]: the best configuration of each, and the fused kernel at the two-step
path's best configuration (decode_linear shares one ``GEMV_CONFIGS`` entry between them).

Then, at one row, each sublayer's first GEMM (the GDN in_proj, the attention qkv, the MLP gate|up) with its pre-norm
folded into the weight stream (``kernels.gemv.gemv_add_rms_norm``) against the two launches it replaces
(``add_rms_norm_`` then the faster of cuBLAS and the best ``gemv``), each from the residual row and the last sublayer's
output: the best configuration of each, and a ``NORM_CONFIGS`` literal of the shapes where the fold is faster. The
fold's every program re-reads and reduces the whole residual row, so its search reaches wider column blocks than
gemv's (fewer programs, fewer re-reads). ``--parts`` picks which of the three searches run.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import multiprocessing
import os
import time

import torch
import torch.nn.functional as F
import triton

from kernels.gates import silu_mul
from kernels.gemv import gemv, gemv_add_rms_norm, gemv_silu_mul, tile_rows
from kernels.norms import add_rms_norm_
from models.bench.timing import replay_us
from models.cli import OneLineParser
from models.engine import build_adapter
from resplan import Graph

DOT_SPACE = dict(block_n=(16, 32, 64), block_k=(64, 128, 256), warps=(4,), stages=(2, 4))
WIDE_SPACE = dict(block_n=(32, 64, 128), block_k=(64, 128, 256), warps=(4, 8), stages=(3, 4))  # 32- and 64-row tiles
ROW_SPACE = dict(block_n=(1, 2, 4, 8, 16), block_k=(256, 512, 1024, 2048, 4096), warps=(4, 8), stages=(1, 3))
ROW_TILE = 8192  # one row: block_n * block_k at most (a program's weight tile, elements)
SPLITS = (2, 4, 8, 16)  # K split this many programs a column block, searched where N < K (a long walk, few columns)
ROW_SPLIT_TILES = ((2, 512), (4, 512))  # one row: the (block_n, block_k) tried with a split (whole-K tiles win there)
SILU_ROWS = 16  # the silu_mul fold is timed up to this many rows (at 4-16 it already lost to two launches)
NORM_SPACE = dict(block_n=(2, 4, 8, 16, 32, 64), block_k=(128, 256, 512, 1024, 2048), warps=(4, 8), stages=(1, 3))
NORM_EPS = 1e-6  # the pre-norm's epsilon in the fold's sweep (Qwen3.5's)
PARTS = ("gemv", "silu-mul", "norm")  # the searches --parts may name


def _normed_shapes(model) -> list[tuple[int, int]]:
    """Distinct (N, K) of the GEMMs a pre-norm feeds: each layer's mixer input (GDN in_proj or attention qkv) and its
    MLP gate|up (the lm_head's norm is never folded: kernels.gemv.NORM_CONFIGS)."""
    seen: dict[tuple[int, int], None] = {}
    for layer in model.model.layers:
        mixer = layer.linear_attn.in_weight() if layer.is_linear else layer.self_attn.qkv_weight()
        for w in (mixer, layer.mlp.gate_up_weight()):
            seen[tuple(w.shape)] = None
    return list(seen)


def _shapes(model) -> list[tuple[int, int]]:
    """Distinct (N, K) of the fused decode's GEMMs, lm_head last."""
    seen: dict[tuple[int, int], None] = {}
    for layer in model.model.layers:
        ws = [layer.mlp.gate_up_weight(), layer.mlp.down_proj.weight]
        if layer.is_linear:
            ws += [layer.linear_attn.in_weight(), layer.linear_attn.out_proj.weight]
        else:
            ws += [layer.self_attn.qkv_weight(), layer.self_attn.o_proj.weight]
        for w in ws:
            seen[tuple(w.shape)] = None
    seen[tuple(model.lm_head.weight.shape)] = None
    return list(seen)


def _asked_shapes(text: str, shapes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The (N, K) of ``--shapes`` ("NxK,NxK"), in its order, each one of ``shapes``; else ValueError naming them."""
    asked = [tuple(int(v) if v.isdigit() else -1 for v in s.split("x")) for s in text.split(",")]
    if not set(asked) <= set(shapes):
        raise ValueError(f"the model's decode GEMMs are {', '.join(f'{n}x{k}' for n, k in shapes)}")
    return asked


def _time_us(fn, layers: int, iters: int) -> float:
    """us per call of a graph of ``layers`` calls."""
    return replay_us(Graph(fn, torch.device("cuda")), iters) / layers


def _copy_us(n: int, k: int, copies: int, iters: int, dev, dt) -> float:
    """us per device copy moving a weight's bytes (n * k elements: half read, half written), in a graph of ``copies``
    copies on distinct buffers, as the GEMMs are timed."""
    pairs = [(torch.empty(n * k // 2, device=dev, dtype=dt), torch.empty(n * k // 2, device=dev, dtype=dt))
             for _ in range(copies)]  # fmt: skip
    return _time_us(lambda: [dst.copy_(src) for src, dst in pairs], copies, iters)


def _configs(tile: int, quick: bool, n: int, k: int) -> list[tuple[int, ...]]:
    """The (block_n, block_k, warps, stages[, split]) searched for a row tile and shape: tl.dot needs block_n >= 16; one
    row takes tiles of at most ROW_TILE elements and K tiles up to K's next power of 2, one stage where one tile spans
    K. Where N < K also each tile with K split ``SPLITS`` ways (one stage: a split walks a few tiles; at one row the
    ``ROW_SPLIT_TILES`` only). ``quick``: a few."""
    dot = tile > 1
    space = ROW_SPACE if not dot else DOT_SPACE if tile <= 16 else WIDE_SPACE
    if quick:
        space = {key: v[:2] for key, v in space.items()}
    whole = triton.next_power_of_2(k)
    plain = [(bn, bk, warps, stages) for bn, bk, warps, stages in itertools.product(*space.values())
             if (bn >= 16 if dot else bn * bk <= ROW_TILE) and bk <= whole and (stages == 1 or bk < k)]  # fmt: skip
    splits = (SPLITS[:1] if quick else SPLITS) if n < k else ()
    tiles = sorted({(bn, bk, warps) for bn, bk, warps, _ in plain if dot or (bn, bk) in ROW_SPLIT_TILES})
    return plain + [(bn, bk, warps, 1, s) for bn, bk, warps in tiles for s in splits if bk * s < 2 * k]


def _norm_configs(quick: bool, k: int) -> list[tuple[int, int, int, int]]:
    """The fold's one-row (block_n, block_k, warps, stages): tiles of at most ROW_TILE elements and K tiles up to K's
    next power of 2, one stage where one tile spans K; no split (the fold does not split K). ``quick``: a few."""
    space = {key: v[:2] for key, v in NORM_SPACE.items()} if quick else NORM_SPACE
    whole = triton.next_power_of_2(k)
    return [(bn, bk, warps, stages) for bn, bk, warps, stages in itertools.product(*space.values())
            if bn * bk <= ROW_TILE and bk <= whole and (stages == 1 or bk < k)]  # fmt: skip


def _sweep(fn, configs, copies: int, iters: int, what: str) -> dict[tuple, float]:
    """us per call of ``fn(cfg)`` (a graph of ``copies`` calls) for every configuration the compiler accepts."""
    results = {}
    for cfg in configs:
        try:
            results[cfg] = _time_us(lambda cfg=cfg: fn(cfg), copies, iters)
        except Exception as e:  # a configuration the compiler refuses (shared memory, registers)
            print(f"<!-- {what} {cfg}: {type(e).__name__} -->")
    return results


def _compile_one(job: tuple) -> None:
    """Compile (into Triton's disk cache) the kernel one sweep entry launches: ``job`` = (kind, M, N, K, config), kind
    "gemv", "silu" (gemv_silu_mul; silu_mul + gemv compiles gemv's) or "norm" (gemv_add_rms_norm, one row). A
    configuration the compiler refuses is left to the sweep, which reports it."""
    kind, M, N, K, cfg = job
    dev, dt = torch.device("cuda"), torch.bfloat16
    w = torch.empty(N, K, device=dev, dtype=dt)
    try:
        if kind == "norm":
            h, d = torch.zeros(1, K, device=dev, dtype=dt), torch.zeros(1, K, device=dev, dtype=dt)
            gemv_add_rms_norm(h, d, torch.zeros(K, device=dev, dtype=dt), NORM_EPS, w, torch.empty_like(h),
                              config=cfg)  # fmt: skip
        elif kind == "silu":
            gemv_silu_mul(torch.zeros(M, 2 * K, device=dev, dtype=dt), w, config=cfg)
        else:
            gemv(torch.zeros(M, K, device=dev, dtype=dt), w, config=cfg)
    except Exception:  # noqa: BLE001, S110 (the sweep reports it)
        pass


def _compile_all(shapes, down: tuple[int, int], normed, rows: list[int], parts: set[str], quick: bool,
                 jobs: int) -> None:
    """Every kernel the chosen ``parts`` sweep (gemv at ``shapes``, gemv_silu_mul at the down projection's (N, K), at
    one row gemv and gemv_add_rms_norm at the ``normed`` shapes), compiled first in ``jobs`` processes (the sweeps then
    find them in Triton's cache): the search compiles hundreds of variants, one after another a few minutes of a
    device call."""
    todo = []
    if "gemv" in parts:
        todo += [("gemv", M, N, K, c) for N, K in shapes for M in rows for c in _configs(tile_rows(M), quick, N, K)]
    if "silu-mul" in parts:
        todo += [("silu", M, *down, c) for M in rows if M <= SILU_ROWS for c in _configs(tile_rows(M), quick, *down)]
    if "norm" in parts:
        todo += [("gemv", 1, N, K, c) for N, K in normed for c in _configs(1, quick, N, K)]
        todo += [("norm", 1, N, K, c) for N, K in normed for c in _norm_configs(quick, K)]
    todo = list(dict.fromkeys(todo))  # (gemv and norm both sweep one-row gemv at the pre-normed shapes: compile once)
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        list(pool.map(_compile_one, todo, chunksize=4))


def _every_gemm(model, shapes, rows: list[int], a, dev, dt) -> None:
    """Every GEMM shape at every row count: cuBLAS, the best weight stream, a device copy of the bytes; a GEMV_CONFIGS
    literal of the shapes where the stream wins."""
    print("\n| M | N | K | cuBLAS us | TB/s | best Triton us | TB/s | device copy of the bytes us | copy / Triton | "
          "config (bn, bk, warps, stages[, split]) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    best: dict[tuple[int, int, int], dict[tuple, float]] = {}
    cublas: dict[tuple[int, int, int], float] = {}
    for N, K in shapes:
        copies = 1 if N * K * 2 > 200 << 20 else a.layers  # lm_head alone is larger than L2 many times over
        ws = [torch.randn(N, K, device=dev, dtype=dt) * 0.02 for _ in range(copies)]
        gb = N * K * 2 / 1e9
        t_copy = _copy_us(N, K, copies, a.iters, dev, dt)
        for M in rows:
            x = torch.randn(M, K, device=dev, dtype=dt)
            tile = tile_rows(M)
            t_cu = _time_us(lambda x=x, ws=ws: [F.linear(x, w) for w in ws], copies, a.iters)
            results = _sweep(lambda cfg, x=x, ws=ws: [gemv(x, w, config=cfg) for w in ws],
                             _configs(tile, a.quick, N, K), copies, a.iters, f"{M} {N} {K}")  # fmt: skip
            cfg, t = min(results.items(), key=lambda kv: kv[1])
            print(f"| {M} | {N} | {K} | {t_cu:.1f} | {gb / t_cu * 1e3:.2f} | {t:.1f} | {gb / t * 1e3:.2f} | "
                  f"{t_copy:.1f} | {t_copy / t:.0%} | {cfg} |", flush=True)  # fmt: skip
            key = (tile, N, K)
            cublas[key] = cublas.get(key, 0.0) + t_cu
            acc = best.setdefault(key, {})
            for c, v in results.items():
                total, n = acc.get(c, (0.0, 0))
                acc[c] = (total + v, n + 1)
        del ws
        torch.cuda.empty_cache()
    print("\nGEMV_CONFIGS = {  # (row tile, N, K): (block_n, block_k, num_warps, num_stages[, split]), where Triton "
          "beats cuBLAS")
    for key, acc in best.items():
        n_rows = max(n for _, n in acc.values())
        common = {c: total for c, (total, n) in acc.items() if n == n_rows}  # measured at every M of this path
        cfg, t = min(common.items(), key=lambda kv: kv[1])
        verdict = "" if t < 0.95 * cublas[key] else "  # cuBLAS as fast: not used"
        line = f"    {key}: {cfg},  # {t:.1f} vs cuBLAS {cublas[key]:.1f} us (summed over M)"
        print(("#" + line[1:] if verdict else line) + verdict)
    print("}")


def _fused_down(model, rows: list[int], a, dev, dt) -> None:
    """SwiGLU's down GEMM from gu: silu_mul + cuBLAS, silu_mul + gemv, and gemv_silu_mul (one launch)."""
    N, K = model.model.layers[0].mlp.down_proj.weight.shape
    copies = a.layers
    ws = [torch.randn(N, K, device=dev, dtype=dt) * 0.02 for _ in range(copies)]
    print("\n# SwiGLU down projection from gu [M, 2K]: silu_mul folded into the weight stream (gemv_silu_mul)\n")
    print("| M | N | K | silu_mul + cuBLAS us | silu_mul + gemv us | config | fused us | config | fused at gemv's "
          "config us |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for M in rows:
        gu = torch.randn(M, 2 * K, device=dev, dtype=dt)
        configs = _configs(tile_rows(M), a.quick, N, K)
        t_cu = _time_us(lambda gu=gu: [F.linear(silu_mul(gu), w) for w in ws], copies, a.iters)
        two = _sweep(lambda cfg, gu=gu: [gemv(silu_mul(gu), w, config=cfg) for w in ws], configs, copies, a.iters,
                     f"silu_mul+gemv {M} {N} {K}")  # fmt: skip
        one = _sweep(lambda cfg, gu=gu: [gemv_silu_mul(gu, w, config=cfg) for w in ws], configs, copies, a.iters,
                     f"gemv_silu_mul {M} {N} {K}")  # fmt: skip
        c2, t2 = min(two.items(), key=lambda kv: kv[1])
        c1, t1 = min(one.items(), key=lambda kv: kv[1])
        at = f"{one[c2]:.1f}" if c2 in one else "-"
        print(f"| {M} | {N} | {K} | {t_cu:.1f} | {t2:.1f} | {c2} | {t1:.1f} | {c1} | {at} |", flush=True)


def _fused_norm_shape(N: int, K: int, a, dev, dt) -> tuple[tuple[int, ...], float, float]:
    """One pre-normed GEMM at one row, from the residual row h and the last sublayer's output d: prints add_rms_norm_ +
    cuBLAS, add_rms_norm_ + gemv and gemv_add_rms_norm, each at its best configuration; returns (the fold's best
    configuration, its us, the faster two-launch us)."""
    copies = a.layers
    ws = [torch.randn(N, K, device=dev, dtype=dt) * 0.02 for _ in range(copies)]
    h = torch.randn(1, K, device=dev, dtype=dt)
    d = torch.randn(1, K, device=dev, dtype=dt) * 0.02
    nw = torch.randn(K, device=dev, dtype=dt) * 0.1
    x, h_out, y = torch.empty_like(h), torch.empty_like(h), torch.empty(1, N, device=dev, dtype=dt)

    def two(linear):  # (h grows by d every call, as the step's residual does; the timing does not depend on it)
        return [linear(add_rms_norm_(h, d, nw, NORM_EPS, out=x), w) for w in ws]

    t_cu = _time_us(lambda: two(F.linear), copies, a.iters)
    split = _sweep(lambda cfg: two(lambda x, w: gemv(x, w, out=y, config=cfg)), _configs(1, a.quick, N, K), copies,
                   a.iters, f"add_rms_norm_+gemv {N} {K}")  # fmt: skip
    fold = _sweep(lambda cfg: [gemv_add_rms_norm(h, d, nw, NORM_EPS, w, h_out, out=y, config=cfg) for w in ws],
                  _norm_configs(a.quick, K), copies, a.iters, f"gemv_add_rms_norm {N} {K}")  # fmt: skip
    c2, t2 = min(split.items(), key=lambda kv: kv[1])
    c1, t1 = min(fold.items(), key=lambda kv: kv[1])
    t_two = min(t2, t_cu)
    at = f"{fold[c2]:.1f}" if c2 in fold else "-"
    print(f"| {N} | {K} | {t_cu:.1f} | {t2:.1f} | {c2} | {t1:.1f} | {c1} | {at} | {t1 / t_two:.2f} |", flush=True)
    return c1, t1, t_two


def _fused_norm(model, a, dev, dt) -> None:
    """Every pre-normed GEMM shape at one row (``_fused_norm_shape``), then a NORM_CONFIGS literal of the shapes
    where the fold is faster than the two launches by more than 2%."""
    print("\n# A pre-norm folded into the GEMM after it, one row (gemv_add_rms_norm)\n")
    print("| N | K | norm + cuBLAS us | norm + gemv us | config | fold us | config | fold at gemv's config us | "
          "fold / two launches |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    picks = []
    for N, K in _normed_shapes(model):
        picks.append(((1, N, K), *_fused_norm_shape(N, K, a, dev, dt)))
        torch.cuda.empty_cache()
    print("\nNORM_CONFIGS = {  # (row tile, N, K): (block_n, block_k, num_warps, num_stages), where the fold is faster")
    for key, cfg, t1, t_two in picks:
        line = f"    {key}: {cfg},  # {t1:.1f} vs {t_two:.1f} us (add_rms_norm_ + the faster GEMM)"
        print(line if t1 < 0.98 * t_two else "#" + line[1:] + "  # two launches as fast: not used")
    print("}")


def parser() -> argparse.ArgumentParser:
    ap = OneLineParser(prog="python -m models.bench.gemv", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--model", default="qwen3_5-0.8b", help="model whose decode GEMM shapes are timed")
    ap.add_argument("--rows", default="1,4,16", help="rows a GEMM, comma-separated, each <= 64 (default 1,4,16)")
    ap.add_argument("--layers", type=int, default=24, help="weight copies per graph (distinct, so L2 cannot hold them)")
    ap.add_argument("--iters", type=int, default=20, help="graph replays timed (default 20)")
    ap.add_argument("--quick", action="store_true", help="a few configurations per path only")
    ap.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1),
                    help="processes compiling the searched kernels before the sweeps (default: the CPUs, at most 16; "
                         "1: each compiled where first timed)")
    ap.add_argument("--shapes", default=None,
                    help="GEMM shapes the gemv search times, as NxK, comma-separated (e.g. 1024x3584,1024x2048); "
                         "each must be one of the model's decode GEMMs (default: all of them, lm_head last)")
    ap.add_argument("--parts", default=",".join(PARTS),
                    help="searches to run, comma-separated: gemv (every GEMM against cuBLAS, at --rows), silu-mul "
                         "(the down GEMM with silu_mul folded, at --rows up to 16), norm (the pre-norm folded, one "
                         "row) (default: all three)")
    return ap


def main(argv: list[str] | None = None) -> None:
    ap = parser()
    a = ap.parse_args(argv)
    parts = set(a.parts.split(","))
    if not parts <= set(PARTS):
        ap.error(f"--parts takes {', '.join(PARTS)}, comma-separated; got {a.parts!r}")
    if not torch.cuda.is_available():
        raise SystemExit("the GEMM benchmark needs a GPU")
    dev, dt = torch.device("cuda"), torch.bfloat16
    model = build_adapter(a.model, seed=0, device=dev, dtype=dt).model
    rows = [int(r) for r in a.rows.split(",")]
    shapes = _shapes(model)
    if a.shapes is not None:
        try:
            shapes = _asked_shapes(a.shapes, shapes)
        except ValueError as e:
            ap.error(f"--shapes {a.shapes!r}: {e}")
    if a.jobs > 1:
        t0 = time.perf_counter()
        _compile_all(shapes, tuple(model.model.layers[0].mlp.down_proj.weight.shape), _normed_shapes(model), rows,
                     parts, a.quick, a.jobs)
        print(f"<!-- compiled the searched kernels in {a.jobs} processes: {time.perf_counter() - t0:.0f} s -->")
    print(f"# decode GEMMs on {torch.cuda.get_device_name()}: {a.model}, bf16, {a.layers} weight copies a graph")
    if "gemv" in parts:
        _every_gemm(model, shapes, rows, a, dev, dt)
    if "silu-mul" in parts:
        _fused_down(model, [M for M in rows if M <= SILU_ROWS], a, dev, dt)
    if "norm" in parts:
        _fused_norm(model, a, dev, dt)


if __name__ == "__main__":
    main()
