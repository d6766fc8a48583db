"""Gated DeltaNet's decode math in plain torch (gates, q/k normalisation, the conv step, the delta rule step), and the
references of the fused decode kernels built from it: same signatures, in place on the slotted pools.

State per head is S [dk, dv] (float32). One token does
    S <- exp(g) * S
    S <- S + k (beta * (v - S^T k))^T
    o  = S^T q
with q, k l2-normalised and q scaled by dk^-0.5 before the rule (``normalize_qk``). The model's torch path
(``models.layers.gdn``) is this math.
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


def causal_conv1d_step(
    x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token a row. x [b, C]; conv_state [b, C, K] (the last K inputs); weight [C, K] -> out [b, C], new state."""
    xs = torch.cat([conv_state.to(weight.dtype), x[:, :, None].to(weight.dtype)], dim=-1)  # [b, C, K+1]
    new_state = xs[:, :, 1:]  # [b, C, K]
    out = (new_state * weight[None]).sum(-1)  # [b, C]
    return F.silu(out).to(x.dtype), new_state.to(conv_state.dtype)


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


# -- references of the kernels (kernel.py) ---------------------------------------------------------------------------


def gdn_decode_step_ref(
    ssm_pool: torch.Tensor,
    slots: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    out: torch.Tensor,
) -> None:
    """gated_delta_step on ssm_pool[slots] (float32), scattered back in the pool's dtype; o into out (in place).

    q, k [b, hk, dk] are repeated to the hv value heads (value head h reads key head h // (hv // hk)).
    """
    idx = slots.long()
    n_rep = ssm_pool.shape[1] // q.shape[1]
    if n_rep > 1:
        q, k = q.repeat_interleave(n_rep, dim=1), k.repeat_interleave(n_rep, dim=1)
    o, ssm1 = gated_delta_step(ssm_pool[idx].float(), q.float(), k.float(), v.float(), g.float(), beta.float())
    ssm_pool[idx] = ssm1.to(ssm_pool.dtype)
    out.copy_(o)


def conv1d_decode_step_ref(
    conv_pool: torch.Tensor, slots: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """causal_conv1d_step on conv_pool[slots], new state scattered back (in place); returns silu(conv) [b, C]."""
    idx = slots.long()
    y, conv1 = causal_conv1d_step(x, conv_pool[idx], weight)
    conv_pool[idx] = conv1
    if out is None:
        return y
    out.copy_(y)
    return out


def gdn_decode_raw_step_ref(ssm_pool, slots, q, k, v, a, b, A_log, dt_bias, out) -> None:
    """gdn_decode_step_ref after normalize_qk(q, k, 1) and gdn_gates(a, b, A_log, dt_bias)."""
    qn, kn = normalize_qk(q, k, 1)
    g, beta = gdn_gates(a, b, A_log, dt_bias)
    gdn_decode_step_ref(ssm_pool, slots, qn, kn, v, g, beta, out)
