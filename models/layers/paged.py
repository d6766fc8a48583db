"""Paged KV attention in plain torch: runs on the CPU and inside a CUDA graph (no host sync, no data-dependent shapes).

Cache layout, one tensor per attention layer: ``kv[num_pages, 2, page_size, n_kv_heads, head_dim]`` (K at index 0 of
dim 1, V at 1), page 0 the sink page. A token at stream position t of a request lives at page ``pages[t // ps]``,
offset ``t % ps``; its flat slot is ``page * ps + t % ps``.
"""

from __future__ import annotations

import torch

from kernels.attention_prep.naive import write_kv as write_kv


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(q k^T * scale + mask) v in float32 with GQA.

    q [b, hq, tq, d]; k, v [b, hk, tk, d]; mask [b, 1, tq, tk].
    """
    hq, hk = q.shape[1], k.shape[1]
    if hq != hk:
        k = k.repeat_interleave(hq // hk, dim=1)
        v = v.repeat_interleave(hq // hk, dim=1)
    s = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # a row that sees no token (a padding row's empty context) -> 0
    # a key no query sees is cleared, not weighted by 0: its cell may hold anything (the sink page, a page's tail),
    # and 0 * nan is nan
    seen = mask.any(-2)[..., None]  # [b, 1, tk, 1]
    return torch.matmul(p, v.float().masked_fill(~seen, 0.0))


def paged_decode_attention(
    q: torch.Tensor,  # [b, hq, d]
    kv: torch.Tensor,  # [num_pages, 2, ps, hk, d]
    block_table: torch.Tensor,  # [b, W] int32, 0 past the used columns
    seq_lens: torch.Tensor,  # [b] int32, tokens each row attends to (>= 1)
    scale: float,
) -> torch.Tensor:
    """One query token a row over its first seq_lens tokens: out [b, hq, d] in q's dtype."""
    b, W = block_table.shape
    ps = kv.shape[2]
    pages = kv[block_table.long()]  # [b, W, 2, ps, hk, d]
    k = pages[:, :, 0].reshape(b, W * ps, kv.shape[3], kv.shape[4]).transpose(1, 2)  # [b, hk, W*ps, d]
    v = pages[:, :, 1].reshape(b, W * ps, kv.shape[3], kv.shape[4]).transpose(1, 2)
    t = torch.arange(W * ps, device=q.device)
    mask = (t[None, :] < seq_lens.long()[:, None])[:, None, None, :]  # [b, 1, 1, W*ps]
    out = _attend(q[:, :, None, :], k, v, mask, scale)  # [b, hq, 1, d]
    return out[:, :, 0].to(q.dtype)


def paged_prefill_attention(
    q: torch.Tensor,  # [T, hq, d], the request's tokens at positions start .. start+T-1
    kv: torch.Tensor,  # [num_pages, 2, ps, hk, d], already holding tokens 0 .. kv_len-1
    pages: torch.Tensor,  # [n] page ids of the request, in order
    start: int,
    kv_len: int,
    scale: float,
    causal: bool = True,
) -> torch.Tensor:
    """Attention of one request's chunk over its paged stream: out [T, hq, d]. causal: query i sees t <= start + i."""
    T = q.shape[0]
    ps = kv.shape[2]
    n = -(-kv_len // ps)
    sel = kv[pages[:n].long()]  # [n, 2, ps, hk, d]
    k = sel[:, 0].reshape(n * ps, kv.shape[3], kv.shape[4])[:kv_len].transpose(0, 1)[None]  # [1, hk, kv_len, d]
    v = sel[:, 1].reshape(n * ps, kv.shape[3], kv.shape[4])[:kv_len].transpose(0, 1)[None]
    t = torch.arange(kv_len, device=q.device)
    if causal:
        mask = t[None, :] <= (start + torch.arange(T, device=q.device))[:, None]
    else:
        mask = torch.ones(T, kv_len, dtype=torch.bool, device=q.device)
    out = _attend(q.transpose(0, 1)[None], k, v, mask[None, None], scale)  # [1, hq, T, d]
    return out[0].transpose(0, 1).to(q.dtype)
