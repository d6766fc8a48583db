"""The reference of the varlen prefill conv: the same gathers in plain torch (every token's K taps, then a sum)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def conv1d_varlen_ref_(
    x: torch.Tensor,  # [N, C]: S sequences back to back
    conv_pool: torch.Tensor,  # [slots, C, K]: each slot's last K conv inputs (column K - 1 the newest)
    weight: torch.Tensor,  # [C, K]
    seq_of: torch.Tensor,  # [N] int: each token's sequence
    cu_seqlens: torch.Tensor,  # [S + 1] int: sequence s is tokens cu[s] .. cu[s + 1] - 1
    slots: torch.Tensor,  # [S] int: each sequence's slot
    fresh: torch.Tensor,  # [S] bool: the sequence starts its stream (its slot reads as zeros)
    saves: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,  # (save_slot, save_at, final_slot)
) -> torch.Tensor:
    """out[n] = silu(sum_j weight[:, j] xs_s[p + 1 + j]) for token n at position p of sequence s, xs_s =
    cat(state_s, x_s) along time; then each slot holds its sequence's last K inputs (an empty sequence leaves its
    state as it was read). In place on conv_pool; out [N, C] in x's dtype.

    ``saves`` (a prefix cache's checkpoints, ``models.layers.flat``): (save_slot [R], save_at [R], final_slot [S]);
    where save_slot[r] is nonzero, that slot takes the K inputs before flat row save_at[r] (rows save_at[r] - K ..
    save_at[r] - 1, inside its sequence); where final_slot[s] is nonzero, that slot takes sequence s's new state too.
    Here every entry is written, the unused ones (0) into the sink slot 0, whose contents nothing reads."""
    N, C = x.shape
    K = weight.shape[1]
    seq_of, slots = seq_of.long(), slots.long()
    cu = cu_seqlens.long()
    state0 = conv_pool[slots].masked_fill(fresh[:, None, None], 0).transpose(1, 2).float()  # [S, K, C]
    k = torch.arange(K, device=x.device)
    bos = cu[:-1][seq_of]  # [N]
    taps = (torch.arange(N, device=x.device) - bos)[:, None] - (K - 1) + k[None, :]  # [N, K] position each tap reads
    from_x = x[(bos[:, None] + taps).clamp(0, N - 1)].float()  # [N, K, C]
    from_state = state0[seq_of[:, None], (K + taps).clamp(max=K - 1)]  # [N, K, C]
    xs = torch.where((taps >= 0)[:, :, None], from_x, from_state)
    out = F.silu((xs * weight.t().float()[None]).sum(1))  # [N, C]
    lens = cu[1:] - cu[:-1]  # [S]
    last = lens[:, None] - K + k[None, :]  # [S, K] position of each of the last K inputs
    new_x = x[(cu[:-1, None] + last).clamp(0, max(N - 1, 0))].float()  # [S, K, C]
    new_state = state0.gather(1, (K + last).clamp(max=K - 1)[:, :, None].expand(-1, -1, C))
    new = torch.where((last >= 0)[:, :, None], new_x, new_state)  # [S, K, C]
    conv_pool[slots] = new.transpose(1, 2).to(conv_pool.dtype)
    if saves is not None:
        save_slot, save_at, final_slot = (t.long() for t in saves)
        at = (save_at[:, None] - K + k[None, :]).clamp(0, max(N - 1, 0))  # [R, K]
        conv_pool[save_slot] = x[at].transpose(1, 2).to(conv_pool.dtype)  # [R, C, K]
        conv_pool[final_slot] = conv_pool[slots]
    return out.to(x.dtype)
