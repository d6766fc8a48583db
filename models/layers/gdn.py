"""Gated DeltaNet math in plain torch: gates, causal depthwise conv, and the gated delta rule.

State per head is S [dk, dv] (float32). One token does
    S <- exp(g) * S
    S <- S + k (beta * (v - S^T k))^T
    o  = S^T q
with q, k l2-normalised and q scaled by dk^-0.5 before the rule (``normalize_qk``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

L2_EPS = 1e-6  # matches transformers / FLA: x * rsqrt(sum(x^2) + eps)


def gdn_gates(
    a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """a, b [..., h] -> g = -exp(A_log) * softplus(a + dt_bias) (log decay, <= 0), beta = sigmoid(b); float32."""
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias.float())
    return g, b.float().sigmoid()


def l2norm(x: torch.Tensor) -> torch.Tensor:
    """x * rsqrt(sum(x^2) + eps) over the last dim."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2_EPS)


def normalize_qk(q: torch.Tensor, k: torch.Tensor, n_rep: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k [..., hk, dk] -> float32 [..., hk * n_rep, dk]: heads repeated, l2-normed, q scaled by dk^-0.5."""
    if n_rep > 1:
        q = q.repeat_interleave(n_rep, dim=-2)
        k = k.repeat_interleave(n_rep, dim=-2)
    q, k = l2norm(q.float()), l2norm(k.float())
    return q * q.shape[-1] ** -0.5, k


# -- causal depthwise conv (the state keeps the last K inputs, as transformers does) ---------------------------------


def causal_conv1d_prefill(
    x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, C] after the last K inputs conv_state [C, K]: out[t] = silu(sum_j w[:, j] * xs[t + 1 + j]).

    xs = cat(conv_state, x^T) [C, K + T]; returns out [T, C] in x's dtype and the new state xs[:, -K:].
    """
    xs = torch.cat([conv_state.to(weight.dtype), x.t().to(weight.dtype)], dim=-1)  # [C, K+T]
    out = F.conv1d(xs[None], weight[:, None, :], groups=weight.shape[0])[0, :, 1:]  # [C, T]
    new_state = xs[:, -conv_state.shape[-1] :]  # [C, K]
    return F.silu(out).t().to(x.dtype), new_state.to(conv_state.dtype)


def causal_conv1d_step(
    x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token a row. x [b, C]; conv_state [b, C, K]; weight [C, K] -> out [b, C], new state [b, C, K]."""
    xs = torch.cat([conv_state.to(weight.dtype), x[:, :, None].to(weight.dtype)], dim=-1)  # [b, C, K+1]
    new_state = xs[:, :, 1:]  # [b, C, K]
    out = (new_state * weight[None]).sum(-1)  # [b, C]
    return F.silu(out).to(x.dtype), new_state.to(conv_state.dtype)


# -- gated delta rule ----------------------------------------------------------------------------------------------


def gated_delta_step(
    state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token. state [..., h, dk, dv]; q, k [..., h, dk]; v [..., h, dv]; g, beta [..., h]. Float32 in and out.

    S = exp(g) S; S += k (beta (v - S^T k))^T; o = S^T q. Returns o [..., h, dv] and the new S.
    """
    state = state * g.exp()[..., None, None]
    kv_mem = torch.einsum("...kv,...k->...v", state, k)  # [..., h, dv]
    delta = (v - kv_mem) * beta[..., None]  # [..., h, dv]
    state = state + k[..., :, None] * delta[..., None, :]
    return torch.einsum("...kv,...k->...v", state, q), state


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
    """
    q, k, v = (x.float().transpose(0, 1) for x in (q, k, v))  # [h, T, d]
    g, beta = g.float().t(), beta.float().t()  # [h, T]
    state = state.float()
    T = q.shape[1]
    outs = []
    for s in range(0, T, chunk_size):
        qc, kc, vc = q[:, s : s + chunk_size], k[:, s : s + chunk_size], v[:, s : s + chunk_size]  # [h, c, d]
        gc, bc = g[:, s : s + chunk_size], beta[:, s : s + chunk_size]  # [h, c]
        c = qc.shape[1]
        lower = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
        G = gc.cumsum(-1)  # [h, c]
        decay = (G[:, :, None] - G[:, None, :]).masked_fill(~lower, float("-inf")).exp()  # [h, c, c], e^{G_i-G_j}
        A = (bc[:, :, None] * (kc @ kc.transpose(-1, -2)) * decay).tril(-1)  # [h, c, c], strictly lower
        M = A + torch.eye(c, dtype=A.dtype, device=A.device)
        rhs = torch.cat([bc[..., None] * vc, (bc * G.exp())[..., None] * kc], dim=-1)  # [h, c, dv + dk]
        sol = torch.linalg.solve_triangular(M, rhs, upper=False, unitriangular=True)
        dv = vc.shape[-1]
        u = sol[..., :dv] - sol[..., dv:] @ state  # [h, c, dv]
        attn = (qc @ kc.transpose(-1, -2)) * decay  # [h, c, c], lower incl. diagonal
        outs.append((qc * G.exp()[..., None]) @ state + attn @ u)  # [h, c, dv]
        tail = (G[:, -1:] - G).exp()  # [h, c], e^{G_c - G_j}
        state = G[:, -1].exp()[:, None, None] * state + (kc * tail[..., None]).transpose(-1, -2) @ u
    return torch.cat(outs, dim=1).transpose(0, 1), state  # [T, h, dv], [h, dk, dv]
