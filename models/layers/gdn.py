"""Gated DeltaNet math in plain torch: gates, causal depthwise conv, and the gated delta rule. The one-token forms
(gates, q/k normalisation, the conv step, the delta rule step) live beside the decode kernels they are the reference
of (``kernels.gdn_decode.naive``) and are re-exported here; the per-chunk prefill forms (the references of the varlen
pass) are here.

State per head is S [dk, dv] (float32). One token does
    S <- exp(g) * S
    S <- S + k (beta * (v - S^T k))^T
    o  = S^T q
with q, k l2-normalised and q scaled by dk^-0.5 before the rule (``normalize_qk``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.gdn_decode.naive import L2_EPS as L2_EPS
from kernels.gdn_decode.naive import causal_conv1d_step as causal_conv1d_step
from kernels.gdn_decode.naive import gated_delta_step as gated_delta_step
from kernels.gdn_decode.naive import gdn_gates as gdn_gates
from kernels.gdn_decode.naive import l2norm as l2norm
from kernels.gdn_decode.naive import normalize_qk as normalize_qk
from kernels.gdn_prefill.naive import gated_delta_chunked as gated_delta_chunked

# -- causal depthwise conv (the state keeps the last K inputs, as transformers does) ---------------------------------


def causal_conv1d_prefill(
    x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk: x [T, C] after the last K inputs conv_state [C, K]: out[t] = silu(sum_j w[:, j] * xs[t + 1 + j]).

    xs = cat(conv_state, x^T) [C, K + T] (F.conv1d, depthwise); returns out [T, C] in x's dtype and the new state
    xs[:, -K:]. The per-chunk reference of the varlen pass's conv (``kernels.conv1d_varlen``).
    """
    T, K = x.shape[0], conv_state.shape[-1]
    xs = torch.cat([conv_state.to(weight.dtype), x.t().to(weight.dtype)], dim=1)  # [C, K + T]
    out = F.conv1d(xs[None], weight[:, None, :], groups=weight.shape[0])[0, :, 1 : T + 1]  # [C, T]
    return F.silu(out).t().to(x.dtype), xs[:, T : T + K].to(conv_state.dtype)


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
