"""The GDN conv step in the epilogue of its input GEMM's one-row weight stream (kernels.gemv.ConvStep) against the two
kernels it replaces (kernels.gemv.gemv then kernels.gdn_decode.conv1d_decode_step_): the GEMM's output, silu(conv)
and the conv pool, bit for bit in the interpreter (the same roundings: y stored, then shifted into the state); with the
pre-norm folded too; the dispatch (``KernelChoices.folds_conv``, ``models.layers.fused.conv_folds``); the model's
one-row decode with and without it. Fresh random inputs per seed; N past C (columns with no conv), C off block_n.
Without CUDA the kernels run in Triton's interpreter; on a GPU the same cases run compiled (``pytest -m gpu``).
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import models.layers.fused as fused  # noqa: E402  (after TRITON_INTERPRET is settled)
from kernels.choices import KernelChoices  # noqa: E402
from kernels.gdn_decode import conv1d_decode_step_  # noqa: E402
from kernels.gemv import ConvStep, gemv, gemv_add_rms_norm  # noqa: E402
from kernels.norms import add_rms_norm_  # noqa: E402
from models.qwen3_5 import KV_POOL  # noqa: E402
from resplan.buffers import StepBuffers  # noqa: E402
from resplan.layout import KVPool, RowLayout  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
DEVICE = "cpu" if INTERPRET or not torch.cuda.is_available() else "cuda"
pytestmark = [pytest.mark.gpu] if DEVICE == "cuda" else []
DTYPES = [torch.float32, torch.bfloat16]
CONFIGS = {"default": None, "small-tiles": (4, 64, 2, 1), "8-col": (8, 128, 4, 1)}


def _case(seed: int, N: int, K: int, C: int, dtype: torch.dtype):
    """x [1, K], a strided weight w [N, K], a conv pool of 5 slots [5, C, 4], conv weight [C, 4], the row's slot."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(1, K, generator=gen).to(dtype=dtype, device=DEVICE)
    w = (torch.randn(N, K + 5, generator=gen) / K**0.5).to(dtype=dtype, device=DEVICE)[:, 2 : 2 + K]
    pool = torch.randn(5, C, 4, generator=gen).to(dtype=dtype, device=DEVICE)
    cw = torch.randn(C, 4, generator=gen).to(dtype=dtype, device=DEVICE)
    slot = torch.tensor([int(torch.randint(1, 5, (1,), generator=gen))], dtype=torch.int32, device=DEVICE)
    return x, w, pool, cw, slot


def _assert_same(got: torch.Tensor, want: torch.Tensor) -> None:
    """Bit for bit in the interpreter; compiled, the four taps may be summed in another order (one rounding)."""
    if INTERPRET:
        assert torch.equal(got, want), (got.float() - want.float()).abs().max()
    else:
        tol = dict(atol=1e-5, rtol=1e-5) if got.dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(got, want, **tol)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("N,K,C,config", [(100, 70, 60, "small-tiles"), (37, 129, 37, "default"),
                                          (300, 64, 257, "8-col")])  # fmt: skip
@pytest.mark.parametrize("seed", [0, 1])
def test_gemv_with_the_conv_step(seed, N, K, C, config, dtype):
    """The GEMM's output is gemv's bit for bit; silu(conv) and every slot of the pool equal the conv kernel's from
    that output (the row's slot shifted, the others untouched)."""
    x, w, pool, cw, slot = _case(seed, N, K, C, dtype)
    want_pool = pool.clone()
    want_y = gemv(x, w, config=CONFIGS[config])
    want_conv = conv1d_decode_step_(want_pool, slot, want_y[:, :C], cw)
    out = torch.full((1, C), float("nan"), dtype=dtype, device=DEVICE)
    y = gemv(x, w, config=CONFIGS[config], conv=ConvStep(pool, slot, cw, out))
    assert torch.equal(y, want_y)
    _assert_same(out, want_conv)
    _assert_same(pool, want_pool)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_normed_gemv_with_the_conv_step(dtype):
    """The pre-norm fold and the conv epilogue in one launch: add_rms_norm_ + gemv + the conv kernel's values."""
    N, K, C = 90, 64, 70
    x, w, pool, cw, slot = _case(3, N, K, C, dtype)
    gen = torch.Generator().manual_seed(4)
    delta = torch.randn(1, K, generator=gen).to(dtype=dtype, device=DEVICE)
    nw = (torch.randn(K, generator=gen) * 0.3).to(dtype=dtype, device=DEVICE)
    h, want_pool = x.clone(), pool.clone()
    want_y = gemv(add_rms_norm_(h, delta, nw, 1e-6), w)
    want_conv = conv1d_decode_step_(want_pool, slot, want_y[:, :C], cw)
    out, h_out = torch.empty(1, C, dtype=dtype, device=DEVICE), torch.empty_like(x)
    y = gemv_add_rms_norm(x, delta, nw, 1e-6, w, h_out, conv=ConvStep(pool, slot, cw, out))
    _assert_same(y, want_y)  # (compiled: the norm's rstd may move by an ulp, tests/test_gemv_norm.py)
    _assert_same(out, want_conv)
    _assert_same(pool, want_pool)
    assert torch.equal(h_out, h)


def test_the_conv_epilogue_refuses_what_it_cannot_serve():
    x, w, pool, cw, slot = _case(0, 40, 32, 30, torch.float32)
    out = torch.empty(1, 30, device=DEVICE)
    with pytest.raises(AssertionError, match="one row"):
        gemv(x.expand(2, -1).contiguous(), w, conv=ConvStep(pool, slot, cw, out))
    with pytest.raises(AssertionError):
        gemv(x, w[:20], conv=ConvStep(pool, slot, cw, out))  # C = 30 channels past N = 20 columns


def test_the_conv_folds_at_one_row_where_the_gemm_streams():
    """KernelChoices.folds_conv: one row, a GEMM the weight stream serves (GEMV_CONFIGS or NORM_CONFIGS), asked."""
    kc = KernelChoices()
    assert kc.folds_conv(1, 8224, 1024)  # Qwen3.5-0.8B's GDN in_proj
    assert not kc.folds_conv(2, 8224, 1024)
    assert not kc.folds_conv(1, 12288, 2048)  # a shape never measured: cuBLAS, no epilogue
    assert not KernelChoices(fold_conv=False).folds_conv(1, 8224, 1024)


def _decode(model, kc: KernelChoices, steps: int = 3) -> list[torch.Tensor]:
    """A 7-token prompt prefilled into slot 1, then ``steps`` one-row fused decode steps under ``kc``: their logits."""
    page, dtype = 16, next(model.parameters()).dtype
    gen = torch.Generator().manual_seed(11)
    ids = torch.randint(0, model.cfg.vocab_size, (7 + steps,), generator=gen)
    pages = [3, 1, 4, 2, 5]
    state = model.allocate_state(8, page, 3, DEVICE, dtype)
    model.prefill(state, ids[:7], pages, start=0, rec_slot=1)
    layout = RowLayout((KVPool(KV_POOL, page, 8, len(pages) * page),), positions_pool=KV_POOL, recurrent=True,
                       sampler=False)  # fmt: skip
    bufs = StepBuffers.allocate(layout, 1, DEVICE)
    bufs.block_tables[KV_POOL][0, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
    bufs.recurrent_slots.fill_(1)
    out = []
    for t in range(7, 7 + steps):
        bufs.seq_lens[KV_POOL].fill_(t + 1)
        bufs.write_loc[KV_POOL].fill_(pages[t // page] * page + t % page)
        bufs.positions.fill_(t)
        out.append(model.decode(state, ids[t : t + 1].to(DEVICE), bufs, kc=kc))
    return out


def test_model_decode_with_the_conv_fold_equals_without(monkeypatch):
    """The tiny model's fused decode at one row with every GDN conv in its input GEMM's epilogue (forced on the CPU,
    where the GEMMs are F.linear: with the fold the input GEMMs stream in the interpreter, hence a tolerance)
    against the conv kernel, over two steps: the same tokens, and the conv folded in every GDN layer."""
    from tests.test_gemv_norm import _model

    model = _model("qwen3_5-tiny", DEVICE, torch.float32)
    calls = []
    if DEVICE == "cpu":
        monkeypatch.setattr(fused, "conv_folds", lambda x, w, kc: kc.fold_conv and calls.append(1) is None)
        import models.qwen3_5.linear_attention as la

        monkeypatch.setattr(la, "conv_folds", fused.conv_folds)
    split = _decode(model, KernelChoices(fused_decode=True, fold_conv=False), steps=2)
    fold = _decode(model, KernelChoices(fused_decode=True), steps=2)
    gdn_layers = sum(layer.is_linear for layer in model.model.layers)
    assert DEVICE != "cpu" or len(calls) == 2 * gdn_layers
    for a, b in zip(fold, split, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        assert torch.equal(a.argmax(-1), b.argmax(-1))


@pytest.mark.skipif(DEVICE != "cuda", reason="the 0.8B shape compiled on a GPU")
def test_0_8b_decode_with_the_conv_fold_equals_without_gpu():
    """Qwen3.5-0.8B's shape, bf16: one row decoded with the conv in the input GEMM's epilogue and as a kernel of its
    own. The GEMM output is the same; the four taps may be summed in another order (one float32 rounding before
    bf16), so logits within bf16 roundings and the same argmax wherever the split step's top two are apart."""
    from tests.test_gemv_norm import _model

    model = _model("qwen3_5-0.8b", "cuda", torch.bfloat16)
    split = _decode(model, KernelChoices(fused_decode=True, fold_conv=False))
    fold = _decode(model, KernelChoices(fused_decode=True))
    for a, b in zip(fold, split, strict=True):
        a, b = a.float(), b.float()
        print(f"\nmax |logit diff| {float((a - b).abs().max()):.4g}, max |logit| {float(b.abs().max()):.4g}")
        torch.testing.assert_close(a, b, atol=0.1, rtol=0.05)
        top2 = b[0].topk(2).values
        if float(top2[0] - top2[1]) > 0.2:
            assert torch.equal(a.argmax(-1), b.argmax(-1))
