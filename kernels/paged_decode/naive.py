"""The reference of paged decode attention: each row's first seq_lens tokens gathered through its block table, one
softmax in float32 (grouped-query heads), no split."""

from __future__ import annotations

import torch


def paged_decode_ref(
    q: torch.Tensor,  # [b, hq, d]
    kv: torch.Tensor,  # [num_pages, 2, ps, hk, d]
    block_table: torch.Tensor,  # [b, W] int32; columns past a row's length are never read
    seq_lens: torch.Tensor,  # [b] int32, tokens each row attends to (0: an all-zero output)
    scale: float,
) -> torch.Tensor:
    """out[r, h] = softmax(q[r, h] . K[r]^T * scale) V[r] over row r's tokens, K/V of head h // (hq // hk): [b, hq, d]
    in q's dtype."""
    b, W = block_table.shape
    _, _, ps, hk, d = kv.shape
    hq = q.shape[1]
    pages = kv[block_table.long()].float()  # [b, W, 2, ps, hk, d]
    k = pages[:, :, 0].reshape(b, W * ps, hk, d).repeat_interleave(hq // hk, dim=2)  # [b, T, hq, d]
    v = pages[:, :, 1].reshape(b, W * ps, hk, d).repeat_interleave(hq // hk, dim=2)
    s = torch.einsum("bhd,bthd->bht", q.float(), k) * scale  # [b, hq, T]
    seen = torch.arange(W * ps, device=q.device)[None, :] < seq_lens.long()[:, None]  # [b, T]
    p = torch.softmax(s.masked_fill(~seen[:, None, :], float("-inf")), dim=-1).nan_to_num(0.0)  # empty rows: 0
    v = v.masked_fill(~seen[:, :, None, None], 0.0)  # a page past the length may hold anything, NaN included
    return torch.einsum("bht,bthd->bhd", p, v).to(q.dtype)
