"""The fused decode step's row kernels (kernels/norms, gates, attention_prep, gdn_decode raw entry) against
their torch references, which are the model's torch path op for op.

Fresh random inputs per seed; odd widths (masked tails); padding rows (write_loc at the sink page, slot 0). Without CUDA
the kernels run in Triton's interpreter; the ``gpu`` variants run compiled in bf16 on the H200.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kernels import (  # noqa: E402  (after TRITON_INTERPRET is settled)
    add_rms_norm_,
    add_rms_norm_ref,
    attention_prep_,
    attention_prep_ref,
    gated_rms_norm,
    gated_rms_norm_ref,
    gdn_decode_raw_step_,
    gdn_decode_raw_step_ref,
    sigmoid_gate_mul,
    sigmoid_gate_mul_ref,
    silu_mul,
    silu_mul_ref,
)

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
DEVICE = "cpu" if INTERPRET or not torch.cuda.is_available() else "cuda"
SEEDS = [0, 1]
# float32: the kernels and references differ by reduction order only. bf16 (compiled, GPU): one rounding apart.
TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}
CASES = [(torch.float32, DEVICE)] + ([(torch.bfloat16, "cuda")] if DEVICE == "cuda" else [])  # bf16: compiled only
CASE_IDS = [str(c[0]).removeprefix("torch.") for c in CASES]
pytestmark = [pytest.mark.gpu] if DEVICE == "cuda" else []  # on a GPU every case here runs compiled


def rand(gen, *shape, dtype, device, scale=1.0):
    return (torch.randn(*shape, generator=gen) * scale).to(dtype=dtype, device=device)


@pytest.mark.parametrize("dtype,device", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("n,N", [(1, 64), (5, 96), (3, 1000)])
@pytest.mark.parametrize("with_delta", [True, False])
@pytest.mark.parametrize("zero_centered", [True, False])
def test_add_rms_norm(n, N, with_delta, zero_centered, seed, dtype, device):
    gen = torch.Generator().manual_seed(seed)
    h = rand(gen, n, N, dtype=dtype, device=device, scale=3.0)
    delta = rand(gen, n, N, dtype=dtype, device=device) if with_delta else None
    w = rand(gen, N, dtype=dtype, device=device, scale=0.2)
    h_want = h.clone()
    want = add_rms_norm_ref(h_want, delta, w, 1e-6, zero_centered=zero_centered)
    got = add_rms_norm_(h, delta, w, 1e-6, zero_centered=zero_centered)
    torch.testing.assert_close(h, h_want, **TOL[dtype])
    torch.testing.assert_close(got, want, **TOL[dtype])


@pytest.mark.parametrize("dtype,device", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("n,H,D,rows", [(1, 2, 16, None), (4, 3, 40, None), (2, 16, 128, None), (5, 3, 40, 8),
                                        (300, 16, 128, None)])  # (5, 3): 15 pairs, 2 programs of 8, a masked tail
def test_gated_rms_norm(n, H, D, rows, seed, dtype, device):
    """Each (row, head) pair normalised on its own, one a program or a tile of several (the prefill pass's 300 x
    16 pairs take the tiled form by size); o float32 (the decode kernel's) or the model dtype (fla's)."""
    gen = torch.Generator().manual_seed(seed)
    o = rand(gen, n, H, D, dtype=torch.float32 if seed % 2 == 0 else dtype, device=device)
    wide = rand(gen, n, H * D + 7, dtype=dtype, device=device)  # z is a strided column block of a wider row
    z = wide[:, 3 : 3 + H * D]
    w = rand(gen, D, dtype=dtype, device=device, scale=0.5) + 1
    got = gated_rms_norm(o, z, w, 1e-6, rows=rows)
    torch.testing.assert_close(got, gated_rms_norm_ref(o, z, w, 1e-6), **TOL[dtype])


@pytest.mark.parametrize("dtype,device", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("n,inter", [(1, 8), (3, 1500), (2, 3584)])
def test_silu_mul(n, inter, seed, dtype, device):
    gen = torch.Generator().manual_seed(seed)
    gu = rand(gen, n, 2 * inter, dtype=dtype, device=device, scale=2.0)
    torch.testing.assert_close(silu_mul(gu), silu_mul_ref(gu), **TOL[dtype])


@pytest.mark.parametrize("dtype,device", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("n,H,D,extra", [(1, 2, 16, 0), (3, 4, 24, 50), (2, 8, 256, 1024)])
def test_sigmoid_gate_mul(n, H, D, extra, seed, dtype, device):
    gen = torch.Generator().manual_seed(seed)
    o = rand(gen, n, H, D, dtype=dtype, device=device)
    qkv = rand(gen, n, H * 2 * D + extra, dtype=dtype, device=device, scale=2.0)
    torch.testing.assert_close(sigmoid_gate_mul(o, qkv), sigmoid_gate_mul_ref(o, qkv), **TOL[dtype])


@pytest.mark.parametrize("dtype,device", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(
    "hq,hk,d,r,ps", [(4, 2, 32, 8, 4), (2, 1, 24, 12, 16), (8, 2, 256, 64, 16)], ids=["gqa2", "odd-d", "qwen08b"]
)
def test_attention_prep(hq, hk, d, r, ps, seed, dtype, device):
    gen = torch.Generator().manual_seed(seed)
    b, n_pad, P = 3, 2, 6
    n = b + n_pad
    qkv = rand(gen, n, hq * 2 * d + 2 * hk * d, dtype=dtype, device=device, scale=2.0)
    wq, wk = (rand(gen, d, dtype=dtype, device=device, scale=0.3) for _ in range(2))
    pos = torch.randint(0, 5000, (n,), generator=gen).float()
    freqs = pos[:, None] * (1e4 ** (-torch.arange(0, r, 2) / r))[None]
    emb = torch.cat([freqs, freqs], -1)
    cos, sin = emb.cos().to(dtype=dtype, device=device), emb.sin().to(dtype=dtype, device=device)
    slots = torch.randperm((P - 1) * ps, generator=gen)[:b] + ps  # distinct token slots off the sink page
    write_loc = torch.cat([slots, torch.randint(0, ps, (n_pad,), generator=gen)]).to(torch.int32).to(device)
    kv = rand(gen, P, 2, ps, hk, d, dtype=dtype, device=device)
    kv_want = kv.clone()
    q_want = attention_prep_ref(qkv, wq, wk, cos, sin, kv_want, write_loc, hq, 1e-6)
    q = attention_prep_(qkv, wq, wk, cos, sin, kv, write_loc, hq, 1e-6)
    torch.testing.assert_close(q, q_want, **TOL[dtype])
    torch.testing.assert_close(kv[1:], kv_want[1:], **TOL[dtype])  # page 0 is the sink the padding rows hit


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("hv,hk,dk,dv", [(4, 2, 16, 32), (4, 4, 12, 40), (16, 16, 128, 128)],
                         ids=["rep2", "unaligned", "qwen08b"])  # fmt: skip
def test_gdn_decode_raw_step(hv, hk, dk, dv, seed):
    """The raw entry (norms and gates in the kernel) equals normalize_qk + gdn_gates + the reference step."""
    gen = torch.Generator().manual_seed(seed)
    b, n_pad, n_slots = 3, 2, 8
    n = b + n_pad
    pool = torch.randn(n_slots, hv, dk, dv, generator=gen) * 0.3
    slots = torch.cat([torch.randperm(n_slots - 1, generator=gen)[:b] + 1, torch.zeros(n_pad, dtype=torch.long)])
    mixed = torch.randn(n, 2 * hk * dk + hv * dv, generator=gen)  # the conv output: q | k | v channels
    q = mixed[:, : hk * dk].view(n, hk, dk)
    k = mixed[:, hk * dk : 2 * hk * dk].view(n, hk, dk)
    v = mixed[:, 2 * hk * dk :].view(n, hv, dv)
    ab = torch.randn(n, 2 * hv, generator=gen) * 3  # wide values: both softplus branches
    a, bb = ab[:, :hv], ab[:, hv:]
    A_log, dt_bias = torch.rand(hv, generator=gen) * 2, torch.randn(hv, generator=gen)
    case = [t.to(DEVICE) for t in (pool, slots.to(torch.int32), q, k, v, a, bb, A_log, dt_bias)]
    pool_want = case[0].clone()
    o_want = torch.empty(n, hv, dv, device=DEVICE)
    gdn_decode_raw_step_ref(pool_want, *case[1:], o_want)
    o = torch.full((n, hv, dv), float("nan"), device=DEVICE)
    gdn_decode_raw_step_(*case, o)
    torch.testing.assert_close(o[:b], o_want[:b], **TOL[torch.float32])
    torch.testing.assert_close(case[0][1:], pool_want[1:], **TOL[torch.float32])
    assert not o.isnan().any()


@pytest.mark.parametrize("dtype,device", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("M,N,K", [(1, 37, 70), (1, 256, 1024), (3, 70, 300), (16, 64, 129), (20, 40, 130),
                                   (64, 33, 100)])  # fmt: skip
@pytest.mark.parametrize("config", [None, (4, 64, 2, 1), (4, 64, 2, 1, 1, 1)], ids=["default", "small-tiles",
                                                                                     "swapped"])  # fmt: skip
def test_gemv(M, N, K, config, seed, dtype, device):
    """``swapped``: the weight tile as tl.dot's first operand (a config's sixth entry; one row: no dot, ignored)."""
    from kernels.gemv import gemv

    gen = torch.Generator().manual_seed(seed)
    x = rand(gen, M, K, dtype=dtype, device=device)
    w = rand(gen, N, K + 5, dtype=dtype, device=device)[:, 2 : 2 + K]  # a strided weight (row stride K + 5)
    if config is not None and M > 1:  # tl.dot needs 16-wide tiles (20 rows: padded to a 32-row tile; 64: a whole one)
        config = (16, 64, 2, 1, *config[4:])
    want = (x.float() @ w.float().t()).to(dtype)
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else TOL[dtype]
    if device == "cuda" and dtype == torch.float32 and M > 1:
        tol = dict(atol=2e-2, rtol=2e-2)  # tl.dot takes float32 inputs as TF32 on the GPU
    torch.testing.assert_close(gemv(x, w, config=config), want, **tol)


@pytest.mark.parametrize("dtype,device", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("M,N,K,split,swap", [(1, 37, 700, 3, 0), (1, 20, 1024, 8, 0), (3, 40, 300, 4, 0),
                                              (16, 33, 1000, 7, 0), (1, 9, 100, 4, 0), (40, 20, 300, 3, 0),
                                              (16, 33, 1000, 7, 1), (40, 20, 300, 3, 1)])  # fmt: skip
def test_gemv_split_k(M, N, K, split, swap, seed, dtype, device):
    """K split over programs (a config's fifth entry): the float64 value within the dtype's tolerance, the same bits
    on every launch (the partials are summed in split order, whichever split ends last), and every count of the
    stream's workspace back at zero. (1, 9, 100, 4): two 64-wide K tiles, so two splits, none empty."""
    from kernels.gemv import gemv
    from kernels.gemv.kernel import split_workspace

    gen = torch.Generator().manual_seed(seed)
    x = rand(gen, M, K, dtype=dtype, device=device)
    w = rand(gen, N, K + 5, dtype=dtype, device=device)[:, 2 : 2 + K]  # a strided weight (row stride K + 5)
    config = (16 if M > 1 else 4, 64, 2, 1, split, swap)
    want = (x.double() @ w.double().t()).to(dtype)
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else TOL[dtype]
    if device == "cuda" and dtype == torch.float32 and M > 1:
        tol = dict(atol=2e-2, rtol=2e-2)  # tl.dot takes float32 inputs as TF32 on the GPU
    got = gemv(x, w, config=config)
    torch.testing.assert_close(got, want, **tol)
    assert torch.equal(gemv(x, w, config=config), got)
    assert not split_workspace(x.device, 0, 0)[1].any()


@pytest.mark.skipif(DEVICE != "cuda", reason="the configurations are the GPU's (the interpreter runs the same paths at "
                    "random shapes above)")
def test_gemv_at_every_configured_shape_and_config():
    """Every GEMV_CONFIGS entry at its own configuration, at the row tile's full count and at a padded count: the
    float64 value within bf16's tolerance (what the decode step runs; split-K entries included)."""
    from kernels.gemv import GEMV_CONFIGS, gemv

    gen = torch.Generator().manual_seed(0)
    for tile, n, k in GEMV_CONFIGS:
        w = rand(gen, n, k, dtype=torch.bfloat16, device="cuda")
        for m in sorted({tile, tile // 2 + 1}):
            x = rand(gen, m, k, dtype=torch.bfloat16, device="cuda")
            want = (x.double() @ w.double().t()).to(torch.bfloat16)
            got = gemv(x, w)  # (at the table's configuration for its row tile)
            assert torch.allclose(got.float(), want.float(), **TOL[torch.bfloat16]), (tile, n, k, m)


def test_gemv_only_where_measured_faster():
    """decode_linear's dispatch: a GEMM takes the weight stream where its shape is listed for its row tile (1, 2-16,
    17-32, 33-64 rows); an unlisted shape, a use at another row tile than the one listed, and more than 64 rows stay
    on cuBLAS."""
    from kernels.gemv import GEMV_CONFIGS, MAX_ROWS, ROW_TILES, gemv_wins, tile_rows

    assert [tile_rows(r) for r in (1, 2, 16, 17, 32, 33, 64)] == [1, 16, 16, 32, 32, 64, 64]
    listed = {t: {(n, k) for tt, n, k in GEMV_CONFIGS if tt == t} for t in ROW_TILES}
    assert listed[1] and listed[16]
    for lo, t in zip((1, 2, 17, 33), ROW_TILES, strict=True):
        assert all(gemv_wins(r, n, k) for n, k in listed[t] for r in (lo, t))
        others = set().union(*listed.values()) - listed[t]
        assert not any(gemv_wins(t, n, k) for n, k in others)
    assert not any(gemv_wins(MAX_ROWS + 1, n, k) for n, k in listed[16])
    assert not gemv_wins(1, 18432, 2560)  # a 4B shape (gate|up), never benchmarked
