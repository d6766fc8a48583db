"""Qwen3.5 building blocks (models/layers) against each other and against transformers' reference functions.

float32 on the CPU; tolerance ATOL = RTOL = 1e-5 unless a test says otherwise (observed differences are ~1e-6).
"""

from __future__ import annotations

import pytest
import torch

from models.layers import gdn
from models.layers.norms import GatedRMSNorm, ZeroCenteredRMSNorm
from models.layers.rope import PartialRotary, apply_partial_rope
from models.qwen3_5 import KV_POOL, Qwen35Model, qwen3_5_0_8b, tiny
from resplan.buffers import StepBuffers
from resplan.layout import KVPool, RowLayout

transformers = pytest.importorskip("transformers")
hf_qwen = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")

ATOL = RTOL = 1e-5


def gdn_inputs(T: int, h: int, dk: int, dv: int, seed: int):
    """Random q, k (normalised like the model does), v, log-decays g <= 0, beta in (0, 1), and a start state."""
    gen = torch.Generator().manual_seed(seed)
    q_raw, k_raw = torch.randn(T, h, dk, generator=gen), torch.randn(T, h, dk, generator=gen)
    v = torch.randn(T, h, dv, generator=gen)
    g = -torch.rand(T, h, generator=gen) * 0.5  # slow decays: the state carries across chunks
    beta = torch.rand(T, h, generator=gen)
    state = torch.randn(h, dk, dv, generator=gen) * 0.1
    return q_raw, k_raw, v, g, beta, state


# -- gated delta rule ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk_size", [1, 5, 16, 64], ids=lambda c: f"chunk={c}")
def test_chunked_delta_rule_equals_sequential(chunk_size):
    q_raw, k_raw, v, g, beta, state = gdn_inputs(T=37, h=3, dk=8, dv=6, seed=chunk_size)
    q, k = gdn.normalize_qk(q_raw, k_raw, n_rep=1)
    want_o, want_s = gdn.gated_delta_sequential(q, k, v, g, beta, state)
    got_o, got_s = gdn.gated_delta_chunked(q, k, v, g, beta, state, chunk_size=chunk_size)
    torch.testing.assert_close(got_o, want_o, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(got_s, want_s, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("n_rep", [1, 2], ids=lambda r: f"v_heads_per_k_head={r}")
def test_delta_rule_matches_transformers(n_rep):
    q_raw, k_raw, v, g, beta, state = gdn_inputs(T=70, h=2 * n_rep, dk=8, dv=6, seed=n_rep)
    q_raw, k_raw = q_raw[:, :2], k_raw[:, :2]  # 2 key heads shared by 2 * n_rep value heads
    q, k = gdn.normalize_qk(q_raw, k_raw, n_rep=n_rep)
    got_o, got_s = gdn.gated_delta_chunked(q, k, v, g, beta, state)
    q_rep, k_rep = (x.repeat_interleave(n_rep, dim=1)[None] for x in (q_raw, k_raw))  # transformers repeats outside
    for fn in (hf_qwen.torch_chunk_gated_delta_rule, hf_qwen.torch_recurrent_gated_delta_rule):
        want_o, want_s = fn(
            q_rep, k_rep, v[None], g=g[None], beta=beta[None], initial_state=state[None],
            output_final_state=True, use_qk_l2norm_in_kernel=True,
        )  # fmt: skip
        torch.testing.assert_close(got_o, want_o[0], atol=ATOL, rtol=RTOL)
        torch.testing.assert_close(got_s, want_s[0], atol=ATOL, rtol=RTOL)


def test_delta_step_batches_rows_independently():
    q_raw, k_raw, v, g, beta, _ = gdn_inputs(T=4, h=2, dk=8, dv=6, seed=3)  # 4 rows of one token each
    q, k = gdn.normalize_qk(q_raw, k_raw, n_rep=1)
    states = torch.randn(4, 2, 8, 6)
    o, s = gdn.gated_delta_step(states, q, k, v, g, beta)
    for r in range(4):
        o_r, s_r = gdn.gated_delta_step(states[r], q[r], k[r], v[r], g[r], beta[r])
        torch.testing.assert_close(o[r], o_r, atol=ATOL, rtol=RTOL)
        torch.testing.assert_close(s[r], s_r, atol=ATOL, rtol=RTOL)


# -- causal conv -----------------------------------------------------------------------------------------------------


def test_causal_conv_prefill_split_and_steps_match_transformers():
    gen = torch.Generator().manual_seed(0)
    T, C, K = 11, 6, 4
    x, w = torch.randn(T, C, generator=gen), torch.randn(C, K, generator=gen)
    want = hf_qwen.causal_conv1d_fn(x.t()[None], w, None, activation="silu")[0].t()  # [T, C], zero left padding

    whole, state = gdn.causal_conv1d_prefill(x, torch.zeros(C, K), w)
    torch.testing.assert_close(whole, want, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(state, x[-K:].t())  # the last K inputs

    a, s1 = gdn.causal_conv1d_prefill(x[:2], torch.zeros(C, K), w)  # a chunk shorter than the kernel
    b, s2 = gdn.causal_conv1d_prefill(x[2:], s1, w)
    torch.testing.assert_close(torch.cat([a, b]), want, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(s2, state)

    steps, s = [], torch.zeros(1, C, K)
    for t in range(T):
        hf_state = s.clone()
        o, s = gdn.causal_conv1d_step(x[t : t + 1], s, w)
        hf_o = hf_qwen.causal_conv1d_update(x[t : t + 1, :, None], hf_state, w, None, "silu")  # updates hf_state
        torch.testing.assert_close(o, hf_o[:, :, 0], atol=ATOL, rtol=RTOL)
        torch.testing.assert_close(s, hf_state)
        steps.append(o[0])
    torch.testing.assert_close(torch.stack(steps), want, atol=ATOL, rtol=RTOL)


# -- rope and norms --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cfg", [tiny, qwen3_5_0_8b], ids=lambda c: c.name)
def test_text_mrope_equals_partial_rope(cfg):
    """Interleaved M-RoPE with the same position in every section is plain RoPE on the first rotary_dim channels."""
    hf_cfg = cfg.to_hf()
    hf_rope = hf_qwen.Qwen3_5TextRotaryEmbedding(hf_cfg)
    pos = torch.tensor([0, 1, 2, 7, 100, 4095, 70_000])
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, cfg.num_attention_heads, len(pos), cfg.head_dim, generator=gen)  # transformers' [b, h, t, d]
    k = torch.randn(1, cfg.num_key_value_heads, len(pos), cfg.head_dim, generator=gen)
    cos, sin = hf_rope(q, pos[None, None].expand(3, 1, -1))
    want_q, want_k = hf_qwen.apply_rotary_pos_emb(q, k, cos, sin)

    ours = PartialRotary(cfg.head_dim, cfg.rotary_dim, cfg.rope_theta)
    c, s = ours(pos, torch.float32)  # [t, rot]
    got_q = apply_partial_rope(q[0].transpose(0, 1), c, s).transpose(0, 1)[None]
    got_k = apply_partial_rope(k[0].transpose(0, 1), c, s).transpose(0, 1)[None]
    torch.testing.assert_close(got_q, want_q, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(got_k, want_k, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(got_q[..., cfg.rotary_dim :], q[..., cfg.rotary_dim :], atol=0, rtol=0)


def test_rotary_stays_float32_under_dtype_casts():
    rope = PartialRotary(32, 8, 10_000.0).to(torch.bfloat16)
    assert rope.inv_freq.dtype == torch.float32
    torch.testing.assert_close(rope.inv_freq, PartialRotary(32, 8, 10_000.0).inv_freq, atol=0, rtol=0)


def test_norms_match_transformers():
    gen = torch.Generator().manual_seed(0)
    x, z = torch.randn(5, 16, generator=gen), torch.randn(5, 16, generator=gen)
    w = torch.randn(16, generator=gen)
    ours, ref = ZeroCenteredRMSNorm(16), hf_qwen.Qwen3_5RMSNorm(16)
    gated, gated_ref = GatedRMSNorm(16), hf_qwen.Qwen3_5RMSNormGated(16)
    with torch.no_grad():
        for m in (ours, ref, gated, gated_ref):
            m.weight.copy_(w)
    torch.testing.assert_close(ours(x), ref(x), atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(gated(x, z), gated_ref(x, z), atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(ours(x), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + w))


# -- the decode step is graph-safe -----------------------------------------------------------------------------------


def test_decode_traces_as_one_graph():
    """torch.compile(fullgraph=True) refuses host syncs (.item()), data-dependent shapes and Python branches on tensor
    values, the things that break CUDA-graph capture; the traced step must also equal the eager one bit for bit."""
    torch.manual_seed(0)
    model = Qwen35Model(tiny).eval()
    state = model.allocate_state(16, 4, 4, "cpu", torch.float32)
    model.prefill(state, torch.arange(5), [3, 7], start=0, rec_slot=2)
    pool = KVPool(KV_POOL, page_size=4, num_pages=16, max_seq_len=32)
    bufs = StepBuffers.allocate(RowLayout(pools=(pool,), positions_pool=KV_POOL, recurrent=True, sampler=False), 3)
    bufs.block_tables[KV_POOL][0, :2] = torch.tensor([3, 7], dtype=torch.int32)
    bufs.seq_lens[KV_POOL].copy_(torch.tensor([6, 1, 1], dtype=torch.int32))  # rows 1, 2: padding
    bufs.write_loc[KV_POOL][0] = 7 * 4 + 1
    bufs.positions[0], bufs.recurrent_slots[0] = 5, 2
    ids = torch.tensor([9, 0, 0])

    eager_state = state.clone()
    want = model.decode(eager_state, ids, bufs)
    torch._dynamo.reset()
    got = torch.compile(model.decode, fullgraph=True, backend="eager", dynamic=False)(state, ids, bufs)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    for name, t in eager_state.tensors().items():
        torch.testing.assert_close(state.tensors()[name], t, atol=0, rtol=0, msg=name)


# -- fused projections ------------------------------------------------------------------------------------------------


def test_fused_projections_share_storage_with_the_state_dict():
    """After fuse_projections the separate weights are views of one GEMM weight: state_dict keys and values are
    unchanged, and load_state_dict writes through to the fused weight the fused decode reads."""
    torch.manual_seed(0)
    model = Qwen35Model(tiny).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.fuse_projections()
    after = model.state_dict()
    assert after.keys() == before.keys()
    for k, v in before.items():
        torch.testing.assert_close(after[k], v, atol=0, rtol=0, msg=k)
    mlp = model.model.layers[0].mlp
    w = mlp.gate_up_weight()
    assert mlp.gate_proj.weight.data_ptr() == w.data_ptr()
    new = {k: torch.randn_like(v) for k, v in before.items()}
    model.load_state_dict(new)
    assert mlp.gate_up_weight() is w  # still fused: loading copied into the views
    torch.testing.assert_close(w, torch.cat([new["model.layers.0.mlp.gate_proj.weight"],
                                             new["model.layers.0.mlp.up_proj.weight"]]), atol=0, rtol=0)  # fmt: skip
    model.to(torch.float64)  # moves each view to its own tensor: the next use re-fuses
    assert mlp.gate_up_weight() is not w and mlp.gate_up_weight().dtype == torch.float64


