"""The weight stream with whole-slice configs (kernels.gemv.slice_config: each program's block_n columns x all of K in
one tile, read before the PDL wait): gemv, gemv_silu_mul and gemv_add_rms_norm at such configs against their float64
references, one row and several (tl.dot), K off a power of two (the tile masked past K) and N off block_n; the rule
itself; ``KernelChoices.gemv_slice`` reaching the config; on a GPU the 0.8B one-row decode with and without it.
Fresh random inputs per seed. Without CUDA the kernels run in Triton's interpreter (``pytest -m gpu`` on a GPU).
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kernels.choices import KernelChoices  # noqa: E402  (after TRITON_INTERPRET is settled)
from kernels.gemv import (  # noqa: E402
    gemv,
    gemv_add_rms_norm,
    gemv_add_rms_norm_ref,
    gemv_ref,
    gemv_silu_mul,
    gemv_silu_mul_ref,
    slice_config,
)
from kernels.norms import add_rms_norm_  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
DEVICE = "cpu" if INTERPRET or not torch.cuda.is_available() else "cuda"
pytestmark = [pytest.mark.gpu] if DEVICE == "cuda" else []
TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def _tol(dtype: torch.dtype, rows: int) -> dict:
    """bf16: one rounding of the output; float32: tl.dot takes float32 as TF32 on a GPU."""
    return dict(atol=2e-2, rtol=2e-2) if DEVICE == "cuda" and rows > 1 else TOL[dtype]


def test_slice_config_covers_k_in_one_tile():
    """block_k is the power of two at or above K, block_n what the element budget leaves (>= 1; >= 16 for tl.dot)."""
    assert slice_config(1, 1024, 8192) == (8, 1024, 4, 1)
    assert slice_config(1, 3584, 8192) == (2, 4096, 4, 1)
    assert slice_config(1, 3584, 2048) == (1, 4096, 4, 1)  # never fewer than one column
    assert slice_config(16, 1024, 8192) == (16, 1024, 4, 1)  # tl.dot's tiles are 16 wide at least
    assert slice_config(4, 300, 16384) == (32, 512, 4, 1)
    assert KernelChoices().gemv_config(1, 1024) is None  # 0: the measured tables
    assert KernelChoices(gemv_slice=8192).gemv_config(1, 3584) == slice_config(1, 3584, 8192)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("M,N,K,elements", [(1, 37, 70, 256), (1, 70, 300, 2048), (3, 40, 300, 8192),
                                            (1, 24, 1024, 4096)])  # fmt: skip
@pytest.mark.parametrize("seed", [0, 1])
def test_gemv_and_silu_mul_at_slice_configs(seed, M, N, K, elements, dtype):
    """gemv and gemv_silu_mul with every program's whole slice in one tile equal their references."""
    if INTERPRET and dtype == torch.bfloat16 and M > 1:
        pytest.skip("the interpreter's tl.dot multiplies bf16 bit patterns (triton-lang/triton#11584)")
    gen = torch.Generator().manual_seed(seed)
    config = slice_config(M, K, elements)
    x = torch.randn(M, K, generator=gen).to(dtype=dtype, device=DEVICE)
    gu = torch.randn(M, 2 * K, generator=gen).to(dtype=dtype, device=DEVICE)
    w = (torch.randn(N, K + 5, generator=gen) / K**0.5).to(dtype=dtype, device=DEVICE)[:, 2 : 2 + K]  # row stride K+5
    torch.testing.assert_close(gemv(x, w, config=config), gemv_ref(x, w), **_tol(dtype, M))
    torch.testing.assert_close(gemv_silu_mul(gu, w, config=config), gemv_silu_mul_ref(gu, w), **_tol(dtype, M))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("N,K,elements", [(37, 70, 512), (40, 1100, 4096)])
def test_gemv_add_rms_norm_at_slice_configs(N, K, elements, dtype):
    """The pre-norm fold with the whole slice in one tile: its output and the updated residual."""
    gen = torch.Generator().manual_seed(N + K)
    h = (torch.randn(1, K, generator=gen) * 3).to(dtype=dtype, device=DEVICE)
    delta = torch.randn(1, K, generator=gen).to(dtype=dtype, device=DEVICE)
    nw = (torch.randn(K, generator=gen) * 0.3).to(dtype=dtype, device=DEVICE)
    w = (torch.randn(N, K, generator=gen) / K**0.5).to(dtype=dtype, device=DEVICE)
    h_out = torch.empty_like(h)
    y = gemv_add_rms_norm(h, delta, nw, 1e-6, w, h_out, config=slice_config(1, K, elements))
    want = gemv_add_rms_norm_ref(h, delta, nw, 1e-6, w)
    torch.testing.assert_close(y, want, **({"atol": 5e-2, "rtol": 5e-2} if dtype == torch.bfloat16 else TOL[dtype]))
    h_want = h.clone()
    add_rms_norm_(h_want, delta, nw, 1e-6)  # the residual as the norm kernel updates it
    assert torch.equal(h_out, h_want)


@pytest.mark.skipif(DEVICE != "cuda", reason="the 0.8B shape compiled on a GPU")
@pytest.mark.parametrize("elements", [8192, 16384])
def test_0_8b_decode_with_whole_slices_gpu(elements):
    """Qwen3.5-0.8B's shape, bf16: one row decoded with every weight stream at whole-slice configs and at the measured
    ones. The K reduction runs in other tile orders, so logits agree within bf16 roundings, and the argmax wherever the
    measured step's top two are apart."""
    from tests.test_gemv_norm import _model  # (the norm tests' model: its norm weights drawn around 0)

    model = _model("qwen3_5-0.8b", "cuda", torch.bfloat16)
    base = _logits(model, KernelChoices(fused_decode=True))
    whole = _logits(model, KernelChoices(fused_decode=True, gemv_slice=elements))
    for a, b in zip(whole, base, strict=True):
        a, b = a.float(), b.float()
        torch.testing.assert_close(a, b, atol=0.1, rtol=0.05)
        top2 = b[0].topk(2).values
        if float(top2[0] - top2[1]) > 0.2:
            assert torch.equal(a.argmax(-1), b.argmax(-1))


def _logits(model, kc: KernelChoices, steps: int = 3) -> list[torch.Tensor]:
    """A 7-token prompt prefilled into slot 1, then ``steps`` one-row fused decode steps under ``kc``: their logits."""
    from models.qwen3_5 import KV_POOL
    from resplan.buffers import StepBuffers
    from resplan.layout import KVPool, RowLayout

    page = 16
    gen = torch.Generator().manual_seed(11)
    ids = torch.randint(0, model.cfg.vocab_size, (7 + steps,), generator=gen)
    pages = [3, 1, 4, 2, 5]
    state = model.allocate_state(8, page, 3, "cuda", torch.bfloat16)
    model.prefill(state, ids[:7], pages, start=0, rec_slot=1)
    layout = RowLayout((KVPool(KV_POOL, page, 8, len(pages) * page),), positions_pool=KV_POOL, recurrent=True,
                       sampler=False)  # fmt: skip
    bufs = StepBuffers.allocate(layout, 1, "cuda")
    bufs.block_tables[KV_POOL][0, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
    bufs.recurrent_slots.fill_(1)
    out = []
    for t in range(7, 7 + steps):
        bufs.seq_lens[KV_POOL].fill_(t + 1)
        bufs.write_loc[KV_POOL].fill_(pages[t // page] * page + t % page)
        bufs.positions.fill_(t)
        out.append(model.decode(state, ids[t : t + 1].cuda(), bufs, kc=kc))
    return out
