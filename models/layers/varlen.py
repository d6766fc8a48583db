"""Several requests' prefill chunks in one forward: their tokens concatenated ([N, ...], N = sum T_r) for the
row-wise work (projections, norms, MLP), padded to [R, T_max, ...] where a request's tokens must meet each other
(causal conv, delta rule, attention). Padding sits after each request's tokens, so causal work never reads it.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch

from models.layers.paged import _attend


@attrs.frozen
class Segments:
    """R chunks of T_r tokens at stream positions start_r .. start_r + T_r - 1 of their requests."""

    lens: torch.Tensor  # [R] long, T_r >= 1
    starts: torch.Tensor  # [R] long
    flat: torch.Tensor  # [R, T_max] long: index of (r, i) in the concatenation, 0 where padding
    valid: torch.Tensor  # [R, T_max] bool: i < T_r
    seg: torch.Tensor  # [N] long: the chunk of each concatenated token
    pos: torch.Tensor  # [N] long: each token's stream position start_r + i
    last: torch.Tensor  # [R] long: index of each chunk's last token in the concatenation
    unflat: torch.Tensor  # [N] long: index of each concatenated token in the padded [R * T_max] rows
    all_fresh: bool = False  # every chunk starts its request's stream (start 0): it attends to its own tokens only

    @classmethod
    def build(cls, lens: Sequence[int], starts: Sequence[int], device) -> Segments:
        lens_t = torch.as_tensor(list(lens), dtype=torch.long, device=device)
        starts_t = torch.as_tensor(list(starts), dtype=torch.long, device=device)
        if lens_t.numel() == 0 or int(lens_t.min()) < 1:
            raise ValueError(f"every chunk needs >= 1 token, got lengths {list(lens)}")
        offsets = torch.cumsum(lens_t, 0) - lens_t  # [R]
        i = torch.arange(int(lens_t.max()), device=device)  # [T_max]
        valid = i[None, :] < lens_t[:, None]
        flat = torch.where(valid, offsets[:, None] + i[None, :], 0)
        seg = torch.repeat_interleave(torch.arange(len(lens_t), device=device), lens_t)  # [N]
        within = torch.arange(int(lens_t.sum()), device=device) - offsets[seg]  # [N] i of each token in its chunk
        pos = starts_t[seg] + within
        unflat = seg * valid.shape[1] + within
        fresh = all(int(s) == 0 for s in starts)
        return cls(lens_t, starts_t, flat, valid, seg, pos, offsets + lens_t - 1, unflat, fresh)

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """[N, ...] -> [R, T_max, ...], zeros at padding."""
        out = x[self.flat]
        return out.masked_fill(~self.valid.view(*self.valid.shape, *([1] * (x.dim() - 1))), 0)

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """[R, T_max, ...] -> [N, ...]: a gather by index (a boolean mask would sync with the host: not capturable)."""
        return x.flatten(0, 1)[self.unflat]


def fresh_prefill_attention_batch(
    q: torch.Tensor,  # [R, T_max, hq, d], chunk r's token i at stream position i (every chunk starts at 0)
    k: torch.Tensor,  # [R, T_max, hk, d], the chunks' own keys, padded
    v: torch.Tensor,  # [R, T_max, hk, d]
    scale: float,
) -> torch.Tensor:
    """Causal attention of chunks that start their streams, over their own K/V: out [R, T_max, hq, d]. Padding sits
    after each chunk's tokens, so a real query never sees it (causal); padding rows' outputs are not used. One fused
    SDPA call (flash attention on the GPU) where the paged path gathers pages and materialises float32 scores."""
    o = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, scale=scale,
        enable_gqa=q.shape[2] != k.shape[2])  # fmt: skip
    return o.transpose(1, 2)


def paged_prefill_attention_batch(
    q: torch.Tensor,  # [R, T_max, hq, d], chunk r's token i at stream position start_r + i
    kv: torch.Tensor,  # [num_pages, 2, ps, hk, d], holding each request's tokens 0 .. start_r + T_r - 1
    page_table: torch.Tensor,  # [R, W] long: request r's pages in order (any page past its used ones)
    segs: Segments,
    scale: float,
) -> torch.Tensor:
    """Causal attention of every chunk over its own paged stream, batched: out [R, T_max, hq, d] (0 at padding).
    Query i of chunk r sees tokens t <= start_r + i; ``paged_prefill_attention`` one request at a time."""
    R, W = page_table.shape
    ps, hk, d = kv.shape[2], kv.shape[3], kv.shape[4]
    sel = kv[page_table]  # [R, W, 2, ps, hk, d]
    k = sel[:, :, 0].reshape(R, W * ps, hk, d).transpose(1, 2)  # [R, hk, L, d]
    v = sel[:, :, 1].reshape(R, W * ps, hk, d).transpose(1, 2)
    t = torch.arange(W * ps, device=q.device)
    qpos = segs.starts[:, None] + torch.arange(q.shape[1], device=q.device)[None, :]  # [R, T_max]
    mask = (t[None, None, :] <= qpos[:, :, None]) & segs.valid[:, :, None]  # [R, T_max, L]
    out = _attend(q.transpose(1, 2), k, v, mask[:, None], scale)  # [R, hq, T_max, d]
    return out.transpose(1, 2).to(q.dtype)
