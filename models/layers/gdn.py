"""Gated DeltaNet math in plain torch: gates, causal depthwise conv, and the gated delta rule. The one-token forms
(gates, q/k normalisation, the conv step, the delta rule step) live beside the decode kernels they are the reference
of (``kernels.gdn_decode.naive``) and are re-exported here; the prefill forms (a chunk, a batch of chunks) are here.

State per head is S [dk, dv] (float32). One token does
    S <- exp(g) * S
    S <- S + k (beta * (v - S^T k))^T
    o  = S^T q
with q, k l2-normalised and q scaled by dk^-0.5 before the rule (``normalize_qk``).
"""

from __future__ import annotations

import torch

from kernels.conv1d_prefill import conv1d_prefill, conv1d_prefill_ref
from kernels.gdn_decode.naive import L2_EPS as L2_EPS
from kernels.gdn_decode.naive import causal_conv1d_step as causal_conv1d_step
from kernels.gdn_decode.naive import gated_delta_step as gated_delta_step
from kernels.gdn_decode.naive import gdn_gates as gdn_gates
from kernels.gdn_decode.naive import l2norm as l2norm
from kernels.gdn_decode.naive import normalize_qk as normalize_qk

# -- causal depthwise conv (the state keeps the last K inputs, as transformers does) ---------------------------------


def causal_conv1d_prefill(
    x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, C] after the last K inputs conv_state [C, K]: out[t] = silu(sum_j w[:, j] * xs[t + 1 + j]).

    xs = cat(conv_state, x^T) [C, K + T]; returns out [T, C] in x's dtype and the new state xs[:, -K:].
    (``causal_conv1d_prefill_batch`` of one chunk.)
    """
    lens = torch.tensor([x.shape[0]], device=x.device)
    out, new_state = causal_conv1d_prefill_batch(x[None], conv_state[None], weight, lens)
    return out[0], new_state[0]


def causal_conv1d_prefill_batch(
    x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor, lens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``causal_conv1d_prefill`` for R chunks at once. x [R, T_max, C] (chunk r's first lens[r] rows real, padding
    after); conv_state [R, C, K]; lens [R] long -> out [R, T_max, C] in x's dtype (padding rows junk) and the new
    states [R, C, K]: the last K inputs of each chunk's real rows, xs[r, T_r : T_r + K] of
    xs = cat(conv_state^T, x) [R, K + T_max, C]. On CUDA the conv is one Triton kernel (kernels.conv1d_prefill)."""
    R, K = x.shape[0], conv_state.shape[-1]
    xs = torch.cat([conv_state.transpose(1, 2).to(weight.dtype), x.to(weight.dtype)], dim=1)  # [R, K+T_max, C]
    conv = conv1d_prefill if x.is_cuda else conv1d_prefill_ref
    out = conv(xs, weight, x.shape[1])  # [R, T_max, C], silu applied
    idx = lens[:, None] + torch.arange(K, device=x.device)[None, :]  # [R, K]: xs rows T_r .. T_r + K - 1
    new_state = xs.gather(1, idx[:, :, None].expand(R, K, xs.shape[2])).transpose(1, 2)  # [R, C, K]
    return out.to(x.dtype), new_state.to(conv_state.dtype)


# -- gated delta rule ----------------------------------------------------------------------------------------------


def gated_delta_sequential(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference: gated_delta_step token by token. q, k [T, h, dk]; v [T, h, dv]; g, beta [T, h]; state [h, dk, dv]."""
    outs = []
    for t in range(q.shape[0]):
        o, state = gated_delta_step(state, q[t], k[t], v[t], g[t], beta[t])
        outs.append(o)
    return torch.stack(outs), state  # [T, h, dv], [h, dk, dv]


def gated_delta_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same result as gated_delta_sequential, a chunk of c tokens at a time (UT transform). Float32.

    Within a chunk, with G_i = cumsum(g)_i and S0 the state entering it, the delta-rule updates u_i solve
        u_i + sum_{j<i} beta_i e^{G_i - G_j} (k_i . k_j) u_j = beta_i v_i - beta_i e^{G_i} S0^T k_i
    (unit lower-triangular), then o_i = e^{G_i} S0^T q_i + sum_{j<=i} e^{G_i - G_j} (q_i . k_j) u_j and
    S_c = e^{G_c} S0 + sum_j e^{G_c - G_j} k_j u_j^T. Every exponent is <= 0, so nothing overflows.

    Everything that does not depend on S0 (the decays, the triangular solve, the intra-chunk attention) is computed
    for all chunks at once; only the three state products run chunk by chunk. A tail shorter than c is padded with
    k = v = beta = g = 0 tokens, which leave the state and the real outputs unchanged.
    """
    T, h = q.shape[0], q.shape[1]
    c = min(chunk_size, T)
    n = -(-T // c)
    pad = n * c - T

    def chunks(x: torch.Tensor) -> torch.Tensor:  # [T, h, ...] -> [h, n, c, ...] float32
        x = x.float()
        if pad:
            x = torch.cat([x, x.new_zeros(pad, *x.shape[1:])])
        return x.reshape(n, c, *x.shape[1:]).movedim(2, 0)

    q, k, v, g, beta = chunks(q), chunks(k), chunks(v), chunks(g), chunks(beta)  # [h, n, c(, d)]
    state = state.float()
    lower = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
    G = g.cumsum(-1)  # [h, n, c]
    decay = (G[..., :, None] - G[..., None, :]).masked_fill(~lower, float("-inf")).exp()  # [h, n, c, c]
    A = (beta[..., :, None] * (k @ k.transpose(-1, -2)) * decay).tril(-1)  # strictly lower
    eye = torch.eye(c, dtype=A.dtype, device=A.device)
    # M^-1 once (c right-hand sides), then two products: a batched triangular solve costs in proportion to its
    # right-hand sides, and [v | k] has dv + dk of them (58 ms of a 64-prompt prefill on the H200 solving for those)
    Minv = torch.linalg.solve_triangular(A + eye, eye.expand_as(A), upper=False, unitriangular=True)
    W = Minv @ (beta[..., None] * v)  # [h, n, c, dv]
    Y = Minv @ ((beta * G.exp())[..., None] * k)  # [h, n, c, dk]: u = W - Y S0
    attn = (q @ k.transpose(-1, -2)) * decay  # [h, n, c, c], lower incl. diagonal
    qG = q * G.exp()[..., None]  # [h, n, c, dk]
    kT = (k * (G[..., -1:] - G).exp()[..., None]).transpose(-1, -2)  # [h, n, dk, c], e^{G_c - G_j} k_j
    last = G[..., -1].exp()[..., None, None]  # [h, n, 1, 1]
    outs = []
    for Wi, Yi, ai, qi, ki, li in zip(*(x.unbind(1) for x in (W, Y, attn, qG, kT, last)), strict=True):
        u = torch.baddbmm(Wi, Yi, state, alpha=-1.0)  # [h, c, dv] = W - Y S  (fused: an eager step is ~5 launches)
        outs.append(torch.baddbmm(torch.bmm(qi, state), ai, u))  # qG S + attn u
        state = torch.baddbmm(li * state, ki, u)  # e^{G_c} S + kT u
    o = torch.stack(outs, dim=1).reshape(h, n * c, v.shape[-1])[:, :T]
    return o.transpose(0, 1), state  # [T, h, dv], [h, dk, dv]
