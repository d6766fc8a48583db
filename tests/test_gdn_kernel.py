"""The fused Gated DeltaNet decode kernels (kernels/gdn_decode) against gather -> its naive step -> scatter.

Without CUDA the kernels run in Triton's interpreter (TRITON_INTERPRET=1, set before triton is imported unless the
environment already says otherwise). The ``gpu`` tests run compiled on the H200 at the 0.8B shape and in a CUDA graph.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kernels import (  # noqa: E402  (after TRITON_INTERPRET is settled)
    conv1d_decode_step_,
    conv1d_decode_step_ref,
    gdn_decode_step_,
    gdn_decode_step_ref,
)
from kernels.choices import KernelChoices  # noqa: E402
from models.layers.gdn import causal_conv1d_step, gated_delta_step, normalize_qk  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
DEVICE = "cpu" if INTERPRET or not torch.cuda.is_available() else "cuda"
POISON = float("nan")
ATOL = RTOL = 1e-5


def make_case(b, hv, hk, dk, dv, n_slots, n_pad, seed, device=DEVICE, dtype=torch.float32):
    """Random pool, b real rows on distinct nonzero slots then n_pad padding rows on slot 0, and step inputs."""
    gen = torch.Generator().manual_seed(seed)
    pool = (torch.randn(n_slots, hv, dk, dv, generator=gen) * 0.3).to(dtype)
    real = torch.randperm(n_slots - 1, generator=gen)[:b] + 1
    slots = torch.cat([real, torch.zeros(n_pad, dtype=torch.long)]).to(torch.int32)
    n = b + n_pad
    q, k = normalize_qk(torch.randn(n, hk, dk, generator=gen), torch.randn(n, hk, dk, generator=gen), 1)
    v = torch.randn(n, hv, dv, generator=gen)
    g = -torch.rand(n, hv, generator=gen)
    beta = torch.rand(n, hv, generator=gen)
    return tuple(t.to(device) for t in (pool, slots, q, k, v, g, beta))


def expected(pool, slots, q, k, v, g, beta, b):
    """Plain gather / gated_delta_step / scatter of the b real rows (value head h reads key head h // n_rep)."""
    n_rep = pool.shape[1] // q.shape[1]
    idx = slots[:b].long()
    qr, kr = q[:b].repeat_interleave(n_rep, dim=1), k[:b].repeat_interleave(n_rep, dim=1)
    o, s1 = gated_delta_step(pool[idx].float(), qr, kr, v[:b], g[:b], beta[:b])
    want = pool.clone()
    want[idx] = s1.to(pool.dtype)
    return o, want


def check(pool, slots, q, k, v, g, beta, b, block_v=None, atol=ATOL, rtol=RTOL):
    o_want, pool_want = expected(pool, slots, q, k, v, g, beta, b)
    out = torch.full(v.shape, POISON, dtype=torch.float32, device=v.device)
    gdn_decode_step_(pool, slots, q, k, v, g, beta, out, block_v=block_v)
    torch.testing.assert_close(out[:b], o_want, atol=atol, rtol=rtol)
    assert not out.isnan().any(), "padding rows must be written too"
    # every slot but the sink: real slots updated, the others untouched
    torch.testing.assert_close(pool[1:], pool_want[1:], atol=atol, rtol=rtol)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    "shape",
    [(3, 4, 2, 16, 32, None), (3, 4, 4, 16, 32, None), (2, 4, 1, 16, 64, 16), (3, 2, 2, 12, 40, None)],
    ids=["rep2", "rep1", "rep4-chunked", "unaligned"],
)
def test_gdn_decode_matches_step(shape, seed):
    b, hv, hk, dk, dv, block_v = shape
    case = make_case(b, hv, hk, dk, dv, n_slots=8, n_pad=2, seed=seed)
    check(*case, b=b, block_v=block_v)


@pytest.mark.parametrize("hv,dk,dv", [(16, 128, 128), (4, 16, 32), (3, 12, 40), (32, 256, 256)])
def test_block_v_for_is_the_narrowest_tile_within_the_program_budget(hv, dk, dv):
    """The default columns a program: a power of two from 16 up to its cap (a [dk, block_v] tile of 8192 elements, or
    dv's width); the grid within STEP_PROGRAMS unless at the cap, and the next narrower tile over it. At the 0.8B shape:
    16 columns at one row, 32 at 16 rows, 64 at 64 (what the H200 measured fastest)."""
    import triton

    from kernels.gdn_decode.kernel import STEP_PROGRAMS, block_v_for

    cap = max(16, min(triton.next_power_of_2(dv), 8192 // triton.next_power_of_2(dk)))
    for rows in range(1, 130):
        bv = block_v_for(rows, hv, dk, dv)
        assert bv >= 16 and bv & (bv - 1) == 0 and bv <= cap, (rows, bv)
        assert bv == cap or rows * hv * triton.cdiv(dv, bv) <= STEP_PROGRAMS, (rows, bv)
        assert bv == 16 or rows * hv * triton.cdiv(dv, bv // 2) > STEP_PROGRAMS, (rows, bv)
    if (hv, dk, dv) == (16, 128, 128):
        assert [block_v_for(r, hv, dk, dv) for r in (1, 16, 64)] == [16, 32, 64]


def test_gdn_decode_on_a_bfloat16_state_pool():
    """``EngineConfig.state_dtype=bfloat16``: the kernel reads the bf16 state, steps it in float32 and stores it
    rounded, as the torch step does (the pool within a bf16 rounding, the output as from the same bf16 state)."""
    case = make_case(3, 4, 2, 16, 32, n_slots=8, n_pad=2, seed=7, dtype=torch.bfloat16)
    check(*case, b=3, atol=1e-2, rtol=1e-2)


def test_gdn_decode_matches_ref_and_two_steps():
    """The exported reference agrees, and two consecutive steps chain through the pool."""
    pool, slots, q, k, v, g, beta = make_case(3, 4, 2, 16, 32, n_slots=6, n_pad=1, seed=5)
    pool_ref, out_ref, out = pool.clone(), torch.empty_like(v), torch.full_like(v, POISON)
    for _ in range(2):
        gdn_decode_step_(pool, slots, q, k, v, g, beta, out)
        gdn_decode_step_ref(pool_ref, slots, q, k, v, g, beta, out_ref)
        torch.testing.assert_close(out[:3], out_ref[:3], atol=ATOL, rtol=RTOL)
        torch.testing.assert_close(pool[1:], pool_ref[1:], atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("seed", [0, 1])
def test_conv1d_decode_matches_step(seed):
    gen = torch.Generator().manual_seed(seed)
    b, n_pad, n_slots, C, K = 3, 2, 7, 300, 4  # C over one channel block
    pool = torch.randn(n_slots, C, K, generator=gen)
    slots = torch.cat([torch.randperm(n_slots - 1, generator=gen)[:b] + 1, torch.zeros(n_pad, dtype=torch.long)])
    slots = slots.to(torch.int32)
    x, w = torch.randn(b + n_pad, C, generator=gen), torch.randn(C, 2 * K, generator=gen)[:, ::2]  # strided weight
    pool, slots, x, w = (t.to(DEVICE) for t in (pool, slots, x, w))
    idx = slots[:b].long()
    y_want, s1 = causal_conv1d_step(x[:b], pool[idx], w)
    pool_want = pool.clone()
    pool_want[idx] = s1
    y = conv1d_decode_step_(pool, slots, x, w, out=torch.full_like(x, POISON))
    torch.testing.assert_close(y[:b], y_want, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(pool[1:], pool_want[1:], atol=ATOL, rtol=RTOL)
    pool_ref = pool_want.clone()
    conv1d_decode_step_ref(pool_ref, slots[:b], x[:b], w)
    y2 = conv1d_decode_step_(pool, slots, x, w)
    torch.testing.assert_close(pool[1:], pool_ref[1:], atol=ATOL, rtol=RTOL)
    assert y2.shape == x.shape


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_layer_decode_fused_equals_torch(dtype):
    """GatedDeltaNet.decode through the kernels (KernelChoices.fused_decode) equals its torch path: output and both
    pools."""
    from models.qwen3_5 import tiny
    from models.qwen3_5.linear_attention import GatedDeltaNet

    torch.manual_seed(0)
    layer = GatedDeltaNet(tiny).to(DEVICE, dtype).eval()
    n_slots, b = 6, 4
    conv = (torch.randn(n_slots, tiny.conv_dim, tiny.linear_conv_kernel_dim) * 0.5).to(DEVICE, dtype)
    ssm = torch.randn(n_slots, layer.hv, layer.dk, layer.dv, device=DEVICE) * 0.1  # float32, as allocate_state
    slots = torch.tensor([3, 1, 0, 5], dtype=torch.int32, device=DEVICE)  # row 2: padding
    x = torch.randn(b, tiny.hidden_size, device=DEVICE).to(dtype)
    conv_t, ssm_t = conv.clone(), ssm.clone()
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    with torch.no_grad():
        for _ in range(2):
            want = layer.decode(x, conv_t, ssm_t, slots, KernelChoices(fused_decode=False))
            got = layer.decode(x, conv, ssm, slots, KernelChoices(fused_decode=True))
            real = slots != 0
            torch.testing.assert_close(got[real], want[real], **tol)
            torch.testing.assert_close(conv[1:], conv_t[1:], **tol)
            torch.testing.assert_close(ssm[1:], ssm_t[1:], **tol)


# -- GPU ----------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs CUDA and compiled Triton")
@pytest.mark.parametrize("hk", [16, 8])
def test_gdn_decode_0_8b_shape(hk):
    b = 64
    case = make_case(b - 8, 16, hk, 128, 128, n_slots=80, n_pad=8, seed=3)
    check(*case, b=b - 8, atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs CUDA and compiled Triton")
def test_gdn_decode_in_cuda_graph():
    """Capture once; replays follow new inputs and new slots like the reference."""
    b, hv, hk, dk, dv = 16, 16, 16, 128, 128
    pool, slots, q, k, v, g, beta = make_case(b, hv, hk, dk, dv, n_slots=40, n_pad=4, seed=7)
    out = torch.empty_like(v)
    gdn_decode_step_(pool, slots, q, k, v, g, beta, out)  # compile outside the capture
    torch.cuda.synchronize()
    pool_before = pool.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gdn_decode_step_(pool, slots, q, k, v, g, beta, out)
    torch.cuda.synchronize()
    assert torch.equal(pool[1:], pool_before[1:]), "capture must not run the kernel"
    for step in range(3):
        _, s2, q2, k2, v2, g2, b2 = make_case(b, hv, hk, dk, dv, n_slots=40, n_pad=4, seed=50 + step)
        for dst, src in ((slots, s2), (q, q2), (k, k2), (v, v2), (g, g2), (beta, b2)):
            dst.copy_(src)
        o_want, pool_want = expected(pool, slots, q, k, v, g, beta, b)
        out.fill_(POISON)
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out[:b], o_want, atol=1e-4, rtol=1e-4, msg=f"replay {step}")
        torch.testing.assert_close(pool[1:], pool_want[1:], atol=1e-4, rtol=1e-4, msg=f"replay {step}")
