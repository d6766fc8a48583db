"""A sublayer's pre-norm folded into the GEMM after it (kernels.gemv.gemv_add_rms_norm) against the two kernels it
replaces (kernels.norms.add_rms_norm_ then kernels.gemv.gemv) and a float64 torch reference; the dispatch
(models.layers.fused.decode_normed_linear) and the residual stream's two buffers; the model's decode with the fold.

Exactness: in the interpreter the fold equals add_rms_norm_ + gemv bit for bit (same operations in the same order;
the row's sum of squares is reduced by numpy over the same padded block in both), in float32 and bf16. Compiled, the
sum of squares is reduced in the order of the kernel's layout, which follows its warp count: at another warp count
than the norm kernel's rstd may move by an ulp and an x element by one rounding, so on a GPU the comparison is to a
tight tolerance. The updated residual (h + delta, no reduction) is equal bit for bit everywhere.

Fresh random inputs per case; one row; widths off the tiles (K not a power of two, N not a multiple of block_n).
Without CUDA the kernels run in Triton's interpreter; on a GPU the same cases run compiled (``pytest -m gpu``).
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import kernels.gemv  # noqa: E402  (after TRITON_INTERPRET is settled)
import models.layers.fused as fused  # noqa: E402
from kernels.choices import DEFAULT, KernelChoices  # noqa: E402
from kernels.gemv import DEFAULT_CONFIG, gemv, gemv_add_rms_norm, gemv_add_rms_norm_ref, norm_fold_wins  # noqa: E402
from kernels.norms import add_rms_norm_  # noqa: E402
from models.bench.gemv import _normed_shapes  # noqa: E402  (the GEMMs a pre-norm feeds, as the search finds them)
from models.engine import build_adapter  # noqa: E402
from models.layers.fused import PendingNorm, Residual, decode_linear, decode_normed_linear, norm_folds  # noqa: E402
from models.qwen3_5 import KV_POOL  # noqa: E402
from resplan.buffers import StepBuffers  # noqa: E402
from resplan.layout import KVPool, RowLayout  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
DEVICE = "cpu" if INTERPRET or not torch.cuda.is_available() else "cuda"
pytestmark = [pytest.mark.gpu] if DEVICE == "cuda" else []  # on a GPU every case here runs compiled
DTYPES = [torch.float32, torch.bfloat16]
EPS = 1e-6
SHAPES = [(37, 70), (64, 129), (70, 300), (40, 1100), (24, 1024)]  # (N, K): K over one and many tiles
# (block_n, block_k, warps, stages): gemv's one-row default, and small tiles (many K steps, N tails)
CONFIGS = {"default": DEFAULT_CONFIG[1], "small-tiles": (4, 64, 2, 1)}


def _case(seed: int, N: int, K: int, dtype: torch.dtype, with_delta: bool):
    """h [1, K] (the residual, scale 3), delta [1, K] or None, norm weight [K] around 0, a strided weight w [N, K]."""
    gen = torch.Generator().manual_seed(seed)
    h = (torch.randn(1, K, generator=gen) * 3).to(dtype=dtype, device=DEVICE)
    delta = torch.randn(1, K, generator=gen).to(dtype=dtype, device=DEVICE) if with_delta else None
    nw = (torch.randn(K, generator=gen) * 0.3).to(dtype=dtype, device=DEVICE)
    w = (torch.randn(N, K + 5, generator=gen) / K**0.5).to(dtype=dtype, device=DEVICE)[:, 2 : 2 + K]
    return h, delta, nw, w


def _two_step(h, delta, nw, w, config=None, zero_centered=True):
    """What the fold replaces: add_rms_norm_ on a copy of h (updated in place), then gemv. (y, updated h)."""
    h2 = h.clone()
    x = add_rms_norm_(h2, delta, nw, EPS, zero_centered=zero_centered)
    return gemv(x, w, config=config), h2


def _assert_two_step_value(got: torch.Tensor, want: torch.Tensor) -> None:
    """Bit for bit in the interpreter; compiled, within a rounding of rstd (see module doc)."""
    if INTERPRET:
        assert torch.equal(got, want), (got - want).abs().max()
    else:
        tol = dict(atol=1e-5, rtol=1e-5) if got.dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(got, want, **tol)


def _fold_cases() -> list:
    """Every shape x config x dtype; along the shapes of each (config, dtype), with and without delta and the two norm
    weight forms alternate so that each pair meets all four of their combinations; a seed of its own a case."""
    cases = []
    for config in CONFIGS:
        for dtype in DTYPES:
            for i, (N, K) in enumerate(SHAPES):
                delta, zero_centered = i % 2 == 0, (i // 2) % 2 == 0
                words = ("delta" if delta else "no-delta", "1+w" if zero_centered else "w",
                         str(dtype).removeprefix("torch."))  # fmt: skip
                cases.append(pytest.param(len(cases), N, K, config, delta, zero_centered, dtype,
                                          id="-".join((str(N), str(K), config, *words))))  # fmt: skip
    return cases


@pytest.mark.parametrize("seed,N,K,config,with_delta,zero_centered,dtype", _fold_cases())
def test_gemv_add_rms_norm(seed, N, K, config, with_delta, zero_centered, dtype):
    h, delta, nw, w = _case(seed, N, K, dtype, with_delta)
    h_in, d_in = h.clone(), None if delta is None else delta.clone()
    h_out = torch.full_like(h, float("nan"))
    cfg = CONFIGS[config]
    got = gemv_add_rms_norm(h, delta, nw, EPS, w, h_out, config=cfg, zero_centered=zero_centered)
    assert got.shape == (1, N) and got.dtype == dtype
    want, h_want = _two_step(h, delta, nw, w, cfg, zero_centered)
    # (a) the two kernels it replaces; h_out is the residual add_rms_norm_ leaves in h, bit for bit
    _assert_two_step_value(got, want)
    assert torch.equal(h_out, h_want)
    # (b) the reference (float64, rounded once): float32 differs by reduction order; bf16 by the roundings of s, x, y
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(got, gemv_add_rms_norm_ref(h, delta, nw, EPS, w, zero_centered=zero_centered), **tol)
    # (c) the inputs are only read
    assert torch.equal(h, h_in) and (delta is None or torch.equal(delta, d_in))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_gemv_add_rms_norm_row_views_and_out(dtype):
    """h, delta and h_out as rows of wider tensors (the residual buffers are views in the model), out given."""
    N, K = 70, 300
    h, delta, nw, w = _case(5, N, K, dtype, True)
    bufs = torch.full((3, K), float("nan"), dtype=dtype, device=DEVICE)
    bufs[0] = h[0]
    h_view, h_out = bufs[0:1], bufs[2:3]
    out = torch.full((1, N), float("nan"), dtype=dtype, device=DEVICE)
    got = gemv_add_rms_norm(h_view, delta, nw, EPS, w, h_out, out=out)
    assert got is out
    want, h_want = _two_step(h, delta, nw, w, DEFAULT_CONFIG[1])
    _assert_two_step_value(got, want)
    assert torch.equal(h_out, h_want) and torch.equal(bufs[0:1], h) and bufs[1].isnan().all()


def test_gemv_add_rms_norm_refuses_aliasing_and_rows():
    """(d) h_out must not be h_in's (or delta's) memory: other programs still read them while program 0 writes."""
    h, delta, nw, w = _case(0, 16, 64, torch.float32, True)
    with pytest.raises(AssertionError, match="h_out"):
        gemv_add_rms_norm(h, delta, nw, EPS, w, h)
    with pytest.raises(AssertionError, match="h_out"):
        gemv_add_rms_norm(h, delta, nw, EPS, w, delta)
    with pytest.raises(AssertionError, match="one row"):
        gemv_add_rms_norm(h.expand(2, -1).contiguous(), None, nw, EPS, w, torch.empty(2, 64, device=DEVICE))
    with pytest.raises(AssertionError):
        gemv_add_rms_norm(h, delta, nw[:32], EPS, w, torch.empty_like(h))  # norm weight of another width


def test_fold_is_configured_at_one_row_of_the_measured_shapes_only():
    """0.8B's and 2B's GDN in_proj, gate|up and qkv at one row (the searched shapes); never at more rows, never the
    lm_head; only on CUDA, only with the fold chosen (the meta tensors stand in for CPU ones: no data needed)."""
    for name in ("qwen3_5-0.8b", "qwen3_5-2b"):
        with torch.device("meta"):  # (shapes only: no weights drawn)
            model = build_adapter(name, seed=0, device="meta").model
        assert all(norm_fold_wins(1, n, k) for n, k in _normed_shapes(model)), name
        assert not any(norm_fold_wins(2, n, k) for n, k in _normed_shapes(model)), name
        assert not norm_fold_wins(1, *model.lm_head.weight.shape), name
    p = PendingNorm(Residual(torch.empty(1, 1024, device="meta")), None, torch.empty(1024, device="meta"), EPS)
    assert not norm_folds(p, torch.empty(8224, 1024, device="meta"), DEFAULT)  # not CUDA
    assert DEFAULT.folds_norm(1, 8224, 1024) and not KernelChoices(fold_norm=False).folds_norm(1, 8224, 1024)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("with_delta", [True, False], ids=["delta", "no-delta"])
def test_decode_normed_linear_branches_leave_the_residual_in_res_h(with_delta, dtype, monkeypatch):
    """The dispatch's two branches from the same stream: the split one updates h in place and keeps its buffer; the
    fused one (forced here: off CUDA it is never taken) writes the spare buffer and makes it h, leaving the old buffer
    as it was, and a second fold swaps back. Same residual, same y (the split branch's GEMM is F.linear on the CPU)."""
    N, K = 96, 200
    h, delta, nw, w = _case(7, N, K, dtype, with_delta)

    split = Residual(h.clone())
    buf = split.h
    y_split = decode_normed_linear(PendingNorm(split, delta, nw, EPS), w, DEFAULT)
    assert split.h is buf and split.spare is None

    monkeypatch.setattr(fused, "norm_folds", lambda p, w, kc: True)
    fold = Residual(h.clone())
    buf = fold.h
    y_fold = decode_normed_linear(PendingNorm(fold, delta, nw, EPS), w, DEFAULT)
    assert fold.h is not buf and fold.spare is buf and torch.equal(buf, h)
    assert torch.equal(fold.h, split.h)
    _assert_two_step_value(y_fold, _two_step(h, delta, nw, w, kernels.gemv.NORM_CONFIGS.get((1, N, K)))[0])
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(y_fold, y_split, **tol)

    again = decode_normed_linear(PendingNorm(fold, delta, nw, EPS), w, DEFAULT)  # the stream moves back: first buffer
    assert fold.h is buf
    y2, h2 = _two_step(split.h, delta, nw, w)
    assert torch.equal(fold.h, h2)
    _assert_two_step_value(again, y2)
    # a plain tensor goes straight to decode_linear
    x = torch.randn(1, K, generator=torch.Generator().manual_seed(1)).to(dtype=dtype, device=DEVICE)
    assert torch.equal(decode_normed_linear(x, w, DEFAULT), decode_linear(x, w, DEFAULT))


# -- the model's decode, fold on and off ------------------------------------------------------------------------------

PAGE = 4


def _model(name: str, device: str, dtype: torch.dtype):
    """The named model (seeded random weights), its pre-norm weights redrawn around 0 (the models start them at
    exactly 0, where (1 + w) = 1 would hide the norm weight)."""
    model = build_adapter(name, seed=0, device=device, dtype=dtype).model
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("layernorm.weight") or pname == "model.norm.weight":
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
    return model


def _decode_one_row(model, fold: bool, steps: int, device: str, dtype: torch.dtype, monkeypatch) -> list:
    """A 7-token prompt prefilled into slot 1, then ``steps`` decode steps of one row over fixed tokens on the fused
    decode with the norm fold chosen or not (``fold``); the logits [1, V] of each step, and how many GEMMs folded
    their norm."""
    kc = KernelChoices(fold_norm=fold, fused_decode=True)
    gen = torch.Generator().manual_seed(11)
    V = model.cfg.vocab_size
    ids = torch.randint(0, V, (7 + steps,), generator=gen)
    pages = [3, 1, 4, 2, 5]
    state = model.allocate_state(8, PAGE, 3, device, dtype)
    model.prefill(state, ids[:7], pages, start=0, rec_slot=1)
    layout = RowLayout((KVPool(KV_POOL, PAGE, 8, len(pages) * PAGE),), positions_pool=KV_POOL, recurrent=True,
                       sampler=False)  # fmt: skip
    bufs = StepBuffers.allocate(layout, 1, device)
    bufs.block_tables[KV_POOL][0, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
    bufs.recurrent_slots.fill_(1)
    calls = []
    real = fused.gemv_add_rms_norm
    monkeypatch.setattr(fused, "gemv_add_rms_norm", lambda *a, **k: calls.append(1) or real(*a, **k))
    out = []
    for t in range(7, 7 + steps):  # token t at position t
        bufs.seq_lens[KV_POOL].fill_(t + 1)
        bufs.write_loc[KV_POOL].fill_(pages[t // PAGE] * PAGE + t % PAGE)
        bufs.positions.fill_(t)
        out.append(model.decode(state, ids[t : t + 1].to(device), bufs, kc=kc))
    return out, len(calls)


def test_model_decode_with_the_fold_equals_without(monkeypatch):
    """The tiny model's fused decode at one row with every pre-norm folded (forced: off CUDA the fold is never taken)
    against the split step: the residual stream, alternating between its two buffers, gives the same logits (float32;
    the split GEMMs are F.linear on the CPU, hence a tolerance) and tokens."""
    model = _model("qwen3_5-tiny", DEVICE, torch.float32)
    if DEVICE == "cpu":
        monkeypatch.setattr(fused, "norm_folds", lambda p, w, kc: kc.fold_norm and p.res.h.shape[0] == 1)
    # two steps, each ~10 s in the interpreter
    split, n_split = _decode_one_row(model, False, 2, DEVICE, torch.float32, monkeypatch)
    fold, n_fold = _decode_one_row(model, True, 2, DEVICE, torch.float32, monkeypatch)
    if DEVICE == "cpu":
        assert (n_split, n_fold) == (0, 2 * 2 * model.cfg.num_hidden_layers)  # both pre-norms of every layer folded
    for a, b in zip(fold, split, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        assert torch.equal(a.argmax(-1), b.argmax(-1))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["qwen3_5-0.8b", "qwen3_5-2b"])
def test_decode_with_the_fold_equals_without_gpu(name, monkeypatch):
    """A real model's shape, bf16, compiled: one row decoded with the norm fold on (every pre-norm but the last folded
    into the GDN in_proj, qkv and gate|up GEMMs) and off. A shape NORM_CONFIGS does not list is folded here at gemv's
    one-row default configuration, so each model's widths are tested whether or not the engine folds them. Logits within
    one bf16 rounding of the largest logit (2^-7 of it): the fold may reduce the sum of squares in another order (see
    module doc), and random weights carry that rounding through every layer into every logit; the same argmax wherever
    the split step's top two are further apart than that."""
    model = _model(name, "cuda", torch.bfloat16)
    for n, k in _normed_shapes(model):
        monkeypatch.setitem(kernels.gemv.NORM_CONFIGS, (1, n, k), kernels.gemv.NORM_CONFIGS.get((1, n, k),
                                                                                               DEFAULT_CONFIG[1]))
    split, n_split = _decode_one_row(model, False, 3, "cuda", torch.bfloat16, monkeypatch)
    fold, n_fold = _decode_one_row(model, True, 3, "cuda", torch.bfloat16, monkeypatch)
    assert (n_split, n_fold) == (0, 3 * 2 * model.cfg.num_hidden_layers)
    for a, b in zip(fold, split, strict=True):
        a, b = a.float(), b.float()
        rounding = float(b.abs().max()) * 2**-7
        print(f"\nmax |logit diff| {float((a - b).abs().max()):.4g}, max |logit| {float(b.abs().max()):.4g}")
        torch.testing.assert_close(a, b, atol=rounding, rtol=0)
        top2 = b[0].topk(2).values
        if float(top2[0] - top2[1]) > 2 * rounding:
            assert torch.equal(a.argmax(-1), b.argmax(-1))


def test_the_engines_kernel_choices_reach_the_decode_walk(monkeypatch):
    """EngineConfig.kernels is what the decode step's kernels take: an engine that turns the norm fold off runs no
    folded GEMM, one that keeps it folds. On the CPU (the tiny model, the fold forced as above, no graphs) every
    pre-norm of every one-row step folds and both engines give the same tokens. On a GPU the fold runs only at the
    shapes it is configured for (``kernels.gemv.NORM_CONFIGS``: the 0.8B's), and the walk runs in Python only while
    a graph is captured, so there the 0.8B engine in bf16 folds at its capture or never."""
    from models.engine import Engine, EngineConfig, Request, SamplingParams

    if DEVICE == "cpu":
        adapter = build_adapter("qwen3_5-tiny", seed=0, device=DEVICE)
        fused_decode = True  # the CPU model's decode on the fused Triton step (the interpreter)
        monkeypatch.setattr(fused, "norm_folds", lambda p, w, kc: kc.fold_norm and p.res.h.shape[0] == 1)
        dtype = torch.float32
    else:
        adapter, dtype = build_adapter("qwen3_5-0.8b", seed=0, device=DEVICE, dtype=torch.bfloat16), torch.bfloat16
        fused_decode = None  # on CUDA: the fused step by default
    real, calls = fused.gemv_add_rms_norm, []
    monkeypatch.setattr(fused, "gemv_add_rms_norm", lambda *a, **k: calls.append(1) or real(*a, **k))
    tokens = {}
    for fold in (False, True):
        calls.clear()
        cfg = EngineConfig(max_running=1, page_size=4, max_seq_len=32, device=DEVICE, dtype=dtype,
                           kernels=KernelChoices(fold_norm=fold, fused_decode=fused_decode))  # fmt: skip
        (r,) = Engine(adapter, cfg).run([Request([5, 17, 99], SamplingParams(max_tokens=2))])  # one decode step
        tokens[fold] = r.tokens
        decode_steps = len(r.tokens) - 1  # the first token comes from the prefill
        if DEVICE == "cpu":
            assert len(calls) == (decode_steps * 2 * adapter.model.cfg.num_hidden_layers if fold else 0)
        else:
            assert (len(calls) > 0) == fold, len(calls)
    if DEVICE == "cpu":  # in bf16 the fold may round a near tie the other way
        assert tokens[True] == tokens[False]
