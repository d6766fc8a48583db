"""The head-gate folds into the one-row weight stream against the two kernels each replaces and a float64 torch
reference: the GDN output norm in out_proj's loads (kernels.gemv.gemv_gated_rms_norm, against
kernels.norms.gated_rms_norm then kernels.gemv.gemv) and attention's output gate in o_proj's loads
(kernels.gemv.gemv_sigmoid_gate, against kernels.gates.sigmoid_gate_mul then gemv); their dispatch
(models.layers.fused) and the model's decode with them.

Exactness: both equal their two kernels bit for bit in the interpreter (same operations, same roundings; a head's sum
of squares is reduced by numpy over the same D elements in both). Compiled, the sigmoid gate stays bit for bit
(elementwise), the gated norm is compared to a tight tolerance: its per-head sum of squares is reduced in the order of
the GEMV tile's layout, not the norm kernel's, so rstd may move by an ulp and an x element by one rounding.

Fresh random inputs per seed; one row; N not a multiple of block_n (masked columns), K over one and many tiles and
off the tile (masked whole heads). Without CUDA the kernels run in Triton's interpreter; on a GPU the same cases run
compiled (``pytest -m gpu``).
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import models.layers.fused as fused  # noqa: E402  (after TRITON_INTERPRET is settled)
from kernels.choices import DEFAULT, KernelChoices  # noqa: E402
from kernels.gates import sigmoid_gate_mul  # noqa: E402
from kernels.gemv import (  # noqa: E402
    DEFAULT_CONFIG,
    gated_norm_fold_wins,
    gemv,
    gemv_gated_rms_norm,
    gemv_gated_rms_norm_ref,
    gemv_sigmoid_gate,
    gemv_sigmoid_gate_ref,
    sigmoid_gate_fold_wins,
)
from kernels.norms import gated_rms_norm  # noqa: E402
from models.engine import build_adapter  # noqa: E402
from models.layers.fused import (  # noqa: E402
    decode_gated_norm_linear,
    decode_linear,
    decode_sigmoid_gate_linear,
    gated_norm_folds,
    sigmoid_gate_folds,
)
from models.qwen3_5 import KV_POOL  # noqa: E402
from models.qwen3_5.config import LINEAR  # noqa: E402
from resplan.buffers import StepBuffers  # noqa: E402
from resplan.layout import KVPool, RowLayout  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
DEVICE = "cpu" if INTERPRET or not torch.cuda.is_available() else "cuda"
pytestmark = [pytest.mark.gpu] if DEVICE == "cuda" else []  # on a GPU every case here runs compiled
DTYPES = [torch.float32, torch.bfloat16]
SEEDS = [0, 1]
EPS = 1e-6
# (N, H, D): N off block_n; K = H D over one tile, many tiles, and off the tile (9 heads of 128: half a 1024 tile)
SHAPES = [(37, 6, 16), (70, 4, 32), (40, 9, 128)]
# (block_n, block_k, warps, stages): gemv's one-row default, and tiles of one head of 128 (many K steps, N tails)
CONFIGS = {"default": DEFAULT_CONFIG[False], "head-tiles": (4, 128, 2, 1)}


def _dtype_id(d: torch.dtype) -> str:
    return str(d).removeprefix("torch.")


def _weight(gen: torch.Generator, N: int, K: int, dtype: torch.dtype) -> torch.Tensor:
    """A strided weight w [N, K] (row stride K + 5)."""
    return (torch.randn(N, K + 5, generator=gen) / K**0.5).to(dtype=dtype, device=DEVICE)[:, 2 : 2 + K]


def _gdn_case(seed: int, N: int, H: int, D: int, dtype: torch.dtype):
    """o [1, H, D] float32 (the GDN kernel's output), z [1, H D] a column block of a wider row (as in the in_proj
    output), norm weight [D] around 1, w [N, H D]."""
    gen = torch.Generator().manual_seed(seed)
    o = (torch.randn(1, H, D, generator=gen) * 2).to(DEVICE)
    z = (torch.randn(1, H * D + 7, generator=gen) * 2).to(dtype=dtype, device=DEVICE)[:, 3 : 3 + H * D]
    nw = (1 + 0.3 * torch.randn(D, generator=gen)).to(dtype=dtype, device=DEVICE)
    return o, z, nw, _weight(gen, N, H * D, dtype)


def _attn_case(seed: int, N: int, H: int, D: int, dtype: torch.dtype):
    """o [1, H, D] with head stride D + 4 (a view), qkv [1, 2 H D + 2 D] (query | gate per head, then k, v), w."""
    gen = torch.Generator().manual_seed(seed)
    o = (torch.randn(1, H, D + 4, generator=gen) * 2).to(dtype=dtype, device=DEVICE)[:, :, 1 : 1 + D]
    qkv = (torch.randn(1, 2 * H * D + 2 * D, generator=gen) * 2).to(dtype=dtype, device=DEVICE)
    return o, qkv, _weight(gen, N, H * D, dtype)


def _assert_gated_norm_value(got: torch.Tensor, want: torch.Tensor) -> None:
    """Bit for bit in the interpreter; compiled, within a rounding of a head's rstd (see module doc)."""
    if INTERPRET:
        assert torch.equal(got, want), (got.float() - want.float()).abs().max()
    else:
        tol = dict(atol=1e-5, rtol=1e-5) if got.dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(got, want, **tol)


def _ref_tol(dtype: torch.dtype) -> dict:
    """Against the float64 reference: float32 differs by reduction order; bf16 by the roundings of x and y."""
    return dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("dtype", DTYPES, ids=_dtype_id)
@pytest.mark.parametrize("N,H,D,config", [(*SHAPES[0], "default"), (*SHAPES[1], "head-tiles"), (*SHAPES[2], "default"),
                                          (*SHAPES[2], "head-tiles")])  # fmt: skip
@pytest.mark.parametrize("seed", SEEDS)
def test_gemv_gated_rms_norm(seed, N, H, D, config, dtype):
    o, z, nw, w = _gdn_case(seed, N, H, D, dtype)
    o_in, z_in = o.clone(), z.clone()
    cfg = CONFIGS[config]
    got = gemv_gated_rms_norm(o, z, nw, EPS, w, config=cfg)
    assert got.shape == (1, N) and got.dtype == dtype
    _assert_gated_norm_value(got, gemv(gated_rms_norm(o, z, nw, EPS), w, config=cfg))  # the two kernels it replaces
    torch.testing.assert_close(got, gemv_gated_rms_norm_ref(o, z, nw, EPS, w), **_ref_tol(dtype))
    assert torch.equal(o, o_in) and torch.equal(z, z_in)  # only read


def test_gemv_gated_rms_norm_refuses_tiles_off_the_heads_and_rows():
    """BLOCK_K and K must hold whole heads (the tile is reshaped to [BLOCK_K // D, D]); one row only."""
    o, z, nw, w = _gdn_case(0, 16, 4, 32, torch.float32)
    with pytest.raises(AssertionError, match="whole heads"):
        gemv_gated_rms_norm(o, z, nw, EPS, w, config=(4, 16, 2, 1))
    with pytest.raises(AssertionError, match="power of two"):
        gemv_gated_rms_norm(o[..., :24].contiguous(), z[:, :96], nw[:24], EPS, w[:, :96])
    with pytest.raises(AssertionError, match="one row"):
        gemv_gated_rms_norm(o.expand(2, -1, -1).contiguous(), z.expand(2, -1), nw, EPS, w)
    with pytest.raises(AssertionError):
        gemv_gated_rms_norm(o, z, nw, EPS, w[:, :96])  # a weight of another width


@pytest.mark.parametrize("dtype", DTYPES, ids=_dtype_id)
@pytest.mark.parametrize("N,H,D,config", [(37, 6, 16, "default"), (70, 4, 32, "small-tiles"),
                                          (40, 5, 24, "small-tiles")])  # D = 24: heads straddle the tiles  # fmt: skip
@pytest.mark.parametrize("seed", SEEDS)
def test_gemv_sigmoid_gate(seed, N, H, D, config, dtype):
    o, qkv, w = _attn_case(seed, N, H, D, dtype)
    cfg = {"default": DEFAULT_CONFIG[False], "small-tiles": (4, 64, 2, 1)}[config]
    got = gemv_sigmoid_gate(o, qkv, w, config=cfg)
    assert got.shape == (1, N) and got.dtype == dtype
    assert torch.equal(got, gemv(sigmoid_gate_mul(o, qkv), w, config=cfg))  # the two kernels it replaces, bit for bit
    torch.testing.assert_close(got, gemv_sigmoid_gate_ref(o, qkv, w), **_ref_tol(dtype))


def test_gemv_sigmoid_gate_refuses_a_short_qkv_and_rows():
    o, qkv, w = _attn_case(0, 16, 4, 32, torch.float32)
    with pytest.raises(AssertionError):
        gemv_sigmoid_gate(o, qkv[:, : 2 * 4 * 32 - 1], w)  # the last head's gate is missing
    with pytest.raises(AssertionError, match="one row"):
        gemv_sigmoid_gate(o.expand(2, -1, -1), qkv.expand(2, -1), w)


def test_folds_are_configured_at_one_row_of_the_0_8b_out_and_o_proj_only():
    """0.8B's out_proj and o_proj (both 1024 x 2048) at one row; never at more rows or another shape (the 2B's);
    only on CUDA (the meta tensors stand in for CPU ones), only with the fold chosen."""
    for wins in (gated_norm_fold_wins, sigmoid_gate_fold_wins):
        assert wins(1, 1024, 2048) and not wins(2, 1024, 2048) and not wins(1, 2048, 2048)
    w = torch.empty(1024, 2048, device="meta")
    assert not gated_norm_folds(torch.empty(1, 16, 128, device="meta"), w, DEFAULT)  # not CUDA
    assert not sigmoid_gate_folds(torch.empty(1, 8, 256, device="meta"), w, DEFAULT)
    assert DEFAULT.folds_gated_norm(1, 1024, 2048) and DEFAULT.folds_sigmoid_gate(1, 1024, 2048)
    assert not KernelChoices(fold_gated_norm=False).folds_gated_norm(1, 1024, 2048)
    assert not KernelChoices(fold_sigmoid_gate=False).folds_sigmoid_gate(1, 1024, 2048)


@pytest.mark.parametrize("fold", [False, True], ids=["split", "fold"])
def test_dispatch_is_the_two_step_value(fold, monkeypatch):
    """decode_gated_norm_linear and decode_sigmoid_gate_linear, split (off CUDA: the norm or gate kernel, then
    F.linear) and folded (forced here), against the two kernels then decode_linear / gemv."""
    o, z, nw, w = _gdn_case(3, 40, 4, 32, torch.float32)
    oa, qkv, wa = _attn_case(3, 40, 4, 32, torch.float32)
    if fold:
        monkeypatch.setattr(fused, "gated_norm_folds", lambda o, w, kc: True)
        monkeypatch.setattr(fused, "sigmoid_gate_folds", lambda o, w, kc: True)
    got_g = decode_gated_norm_linear(o, z, nw, EPS, w, DEFAULT)
    got_s = decode_sigmoid_gate_linear(oa, qkv, wa, DEFAULT)
    x_g, x_s = gated_rms_norm(o, z, nw, EPS), sigmoid_gate_mul(oa, qkv)
    if fold:
        _assert_gated_norm_value(got_g, gemv(x_g, w))
        assert torch.equal(got_s, gemv(x_s, wa))
    else:
        assert torch.equal(got_g, decode_linear(x_g, w, DEFAULT))
        assert torch.equal(got_s, decode_linear(x_s, wa, DEFAULT))


# -- the model's decode, folds on and off -----------------------------------------------------------------------------

PAGE = 4


def _decode_one_row(name: str, device: str, dtype: torch.dtype, fold: bool, steps: int, monkeypatch):
    """The named model (seeded random weights): a 7-token prompt prefilled into slot 1, then ``steps`` one-row decode
    steps over fixed tokens on the fused decode, both head-gate folds chosen or not (``fold``; the pre-norm and
    silu_mul folds as by default). The logits [1, V] of each step, and how many gated norms and sigmoid gates folded."""
    model = build_adapter(name, seed=0, device=device, dtype=dtype).model
    kc = KernelChoices(fold_gated_norm=fold, fold_sigmoid_gate=fold, fused_decode=True)
    gen = torch.Generator().manual_seed(11)
    ids = torch.randint(0, model.cfg.vocab_size, (7 + steps,), generator=gen)
    pages = [3, 1, 4, 2, 5]
    state = model.allocate_state(8, PAGE, 3, device, dtype)
    model.prefill(state, ids[:7], pages, start=0, rec_slot=1)
    layout = RowLayout((KVPool(KV_POOL, PAGE, 8, len(pages) * PAGE),), positions_pool=KV_POOL, recurrent=True,
                       sampler=False)  # fmt: skip
    bufs = StepBuffers.allocate(layout, 1, device)
    bufs.block_tables[KV_POOL][0, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
    bufs.recurrent_slots.fill_(1)
    calls = {"gated_norm": 0, "sigmoid_gate": 0}
    for kind, real in (("gated_norm", gemv_gated_rms_norm), ("sigmoid_gate", gemv_sigmoid_gate)):
        counted = lambda *a, real=real, kind=kind, **k: calls.__setitem__(kind, calls[kind] + 1) or real(*a, **k)
        monkeypatch.setattr(fused, real.__name__, counted)
    out = []
    for t in range(7, 7 + steps):  # token t at position t
        bufs.seq_lens[KV_POOL].fill_(t + 1)
        bufs.write_loc[KV_POOL].fill_(pages[t // PAGE] * PAGE + t % PAGE)
        bufs.positions.fill_(t)
        out.append(model.decode(state, ids[t : t + 1].to(device), bufs, kc=kc))
    return out, calls, model.cfg


def test_model_decode_with_the_gate_folds_equals_without(monkeypatch):
    """The tiny model's fused decode at one row with every GDN output norm and attention output gate folded (forced:
    off CUDA the folds are never taken) against the split step: the same logits (float32; the split GEMMs are F.linear
    on the CPU, hence a tolerance) and tokens. On a GPU, ``test_0_8b_decode_with_the_gate_folds_equals_without_gpu``."""
    if DEVICE == "cpu":
        monkeypatch.setattr(fused, "gated_norm_folds", lambda o, w, kc: kc.fold_gated_norm and o.shape[0] == 1)
        monkeypatch.setattr(fused, "sigmoid_gate_folds", lambda o, w, kc: kc.fold_sigmoid_gate and o.shape[0] == 1)
    split, n_split, cfg = _decode_one_row("qwen3_5-tiny", DEVICE, torch.float32, False, 2, monkeypatch)
    fold, n_fold, _ = _decode_one_row("qwen3_5-tiny", DEVICE, torch.float32, True, 2, monkeypatch)
    if DEVICE == "cpu":
        gdn = sum(t == LINEAR for t in cfg.layer_types)
        assert n_split == {"gated_norm": 0, "sigmoid_gate": 0}
        assert n_fold == {"gated_norm": 2 * gdn, "sigmoid_gate": 2 * (cfg.num_hidden_layers - gdn)}, n_fold
    for a, b in zip(fold, split, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        assert torch.equal(a.argmax(-1), b.argmax(-1))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_0_8b_decode_with_the_gate_folds_equals_without_gpu(monkeypatch):
    """Qwen3.5-0.8B's shape, bf16, compiled: one row decoded with both head-gate folds on (18 GDN output norms into
    out_proj, 6 attention output gates into o_proj) and off. Logits within bf16 roundings (a head's rstd may move by an
    ulp in the folded norm, see module doc); the same argmax wherever the split step's top two are not that close."""
    split, n_split, cfg = _decode_one_row("qwen3_5-0.8b", "cuda", torch.bfloat16, False, 3, monkeypatch)
    fold, n_fold, _ = _decode_one_row("qwen3_5-0.8b", "cuda", torch.bfloat16, True, 3, monkeypatch)
    gdn = sum(t == LINEAR for t in cfg.layer_types)
    assert n_split == {"gated_norm": 0, "sigmoid_gate": 0}
    assert n_fold == {"gated_norm": 3 * gdn, "sigmoid_gate": 3 * (cfg.num_hidden_layers - gdn)}, n_fold
    for a, b in zip(fold, split, strict=True):
        a, b = a.float(), b.float()
        print(f"\nmax |logit diff| {float((a - b).abs().max()):.4g}, max |logit| {float(b.abs().max()):.4g}")
        torch.testing.assert_close(a, b, atol=0.1, rtol=0.05)
        top2 = b[0].topk(2).values
        if float(top2[0] - top2[1]) > 0.2:
            assert torch.equal(a.argmax(-1), b.argmax(-1))
