"""The varlen prefill delta rule on CUDA: fla-core's chunked gated delta rule (``fla.ops.gated_delta_rule``), its
forward stages called with a precomputed chunk index so a pass of fixed shape is capturable in a CUDA graph.

fla's conventions, checked against ``naive.gdn_prefill_ref`` (tests/test_gdn_prefill.py): q, k l2-normalised at the
key heads and q unscaled (``scale`` applies in the output stage); value head h reads key head h // (hv // hk); g the
natural-log decay (the cumsum stage rescales it to log2); beta after its sigmoid; states [hv, dk, dv] float32 (not
v-first). ``chunk_gated_delta_rule_fwd`` itself is not called: it would derive chunk_offsets through a tensor cache,
which a graph replay would not recompute. The state pass is ours (``state_pass.state_pass_``: fla's
``chunk_gated_delta_rule_fwd_h`` reading and writing each sequence's state in its pool slot).
"""

from __future__ import annotations

import warnings

import torch

with warnings.catch_warnings():  # fla.ops' package init warns that flash-attn (its NSA ops' need, not ours) is missing
    warnings.simplefilter("ignore", ImportWarning)
    from fla.ops.common.chunk_o import chunk_fwd_o
    from fla.ops.gated_delta_rule.chunk_fwd import chunk_gated_delta_rule_fwd_intra
    from fla.ops.utils import chunk_local_cumsum
    from fla.ops.utils.constant import RCP_LN2

from kernels.gdn_prefill.indices import CHUNK  # noqa: E402  (after fla)
from kernels.gdn_prefill.state_pass import state_pass_  # noqa: E402


def gdn_prefill(
    q: torch.Tensor,  # [N, hk, dk] l2-normalised, not scaled
    k: torch.Tensor,  # [N, hk, dk] l2-normalised
    v: torch.Tensor,  # [N, hv, dv]
    g: torch.Tensor,  # [N, hv] float32 log decay
    beta: torch.Tensor,  # [N, hv] float32
    pool: torch.Tensor,  # [slots, hv, dk, dv] float32 recurrent states, updated in place
    slots: torch.Tensor,  # [S] each sequence's slot (distinct but for the sink, 0)
    fresh: torch.Tensor,  # [S] bool: starts from zeros
    cu_seqlens: torch.Tensor,  # [S + 1] int32
    chunk_indices: torch.Tensor,  # [rows, 2] int32 (indices.chunk_index)
    chunk_offsets: torch.Tensor,  # [S + 1] int32
    scale: float,
    save_slot: torch.Tensor | None = None,  # [rows] slot receiving the state entering each chunk row (0: none)
    final_slot: torch.Tensor | None = None,  # [S] slot receiving each sequence's final state too (0: none)
) -> torch.Tensor:
    """``naive.gdn_prefill_ref`` from h0 = pool[slots] (zeros where fresh), its final states written back to
    pool[slots] (and the saves, ``state_pass.state_pass_``'s, where given): o [N, hv, dv] in v's dtype. No host
    sync."""
    q, k, v, g, beta = q[None], k[None], v[None], g[None], beta[None]  # fla's [B = 1, T, H, ...]
    g = chunk_local_cumsum(g, chunk_size=CHUNK, scale=RCP_LN2, cu_seqlens=cu_seqlens, chunk_indices=chunk_indices)
    w, u, _ = chunk_gated_delta_rule_fwd_intra(k=k, v=v, g=g, beta=beta, cu_seqlens=cu_seqlens, chunk_size=CHUNK,
                                               chunk_indices=chunk_indices)  # fmt: skip
    h, v_new = state_pass_(k[0], w[0], u[0], g[0], pool, slots, fresh, cu_seqlens, chunk_offsets,
                           chunk_indices.shape[0], CHUNK, save_slot, final_slot)  # fmt: skip
    o = chunk_fwd_o(q=q, k=k, v=v_new[None], h=h[None], g=g, scale=scale, cu_seqlens=cu_seqlens, chunk_size=CHUNK,
                    chunk_indices=chunk_indices)  # fmt: skip
    return o[0]
