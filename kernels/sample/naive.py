"""Reference of the sampled draw, in torch: every logit of a row ordered by (value descending, id ascending; a NaN the
largest), then top-k, top-p and a Gumbel-max draw over the head, as ``models.engine.sampler.Sampler`` draws (which
takes its head with ``topk``, whose order among equal values is unspecified: the two agree wherever the head holds no
tie). Also the counter-based hash both draw their noise from."""

from __future__ import annotations

import torch

from resplan.layout import BANNED_STOPS, SamplerCell

M32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2^32 for int64 x in [0, 2^32), exact in int64 (the high half of c enters 16 bits at a time)."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & M32


def hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mix (lowbias32) on int64 tensors holding values in [0, 2^32)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def token_salt(ids: torch.Tensor) -> torch.Tensor:
    """hash32(id * 0x9E3779B9 mod 2^32): each token's salt (int64 ids in, int64 out)."""
    return hash32((ids * 0x9E3779B9) & M32)


def uniforms(seed: torch.Tensor, position: torch.Tensor, salt: torch.Tensor) -> torch.Tensor:
    """[b, n] float32 in (0, 1): one uniform per (row's seed, row's position, token). seed, position [b] int;
    salt [n] or [b, n] int64 (``token_salt`` of the token ids)."""
    key = hash32(hash32(seed.long() & M32) ^ (position.long() & M32))  # [b]
    r = hash32((key[:, None] + (salt if salt.ndim == 2 else salt[None, :])) & M32)  # [b, n]
    return ((r >> 8).float() + 0.5) * (1.0 / 2**24)


def ban_stops_(scores: torch.Tensor, cells: torch.Tensor, positions: torch.Tensor) -> None:
    """In place: a row drawing at a position below its MIN_POSITION cell gets -inf for each of its STOP cells' ids
    (a request's ``min_tokens``). scores [b, V] float, cells [b, len(SamplerCell)] int32, positions [b] int. Static
    shapes, no host sync: a [b, BANNED_STOPS] gather and scatter. Padding ids (-1) repeat the row's first id, so that
    every write to a column carries one value: -inf on a banned row (whose first id is a real one), else the column's
    own."""
    ids = cells[:, SamplerCell.STOP_0 : SamplerCell.STOP_0 + BANNED_STOPS].long()  # [b, S]
    ids = torch.where(ids >= 0, ids, ids[:, :1].clamp(min=0))
    banned = positions.long() < cells[:, SamplerCell.MIN_POSITION].long()  # [b]
    scores.scatter_(1, ids, torch.where(banned[:, None], float("-inf"), scores.gather(1, ids)))


def draw_head(vals: torch.Tensor, idx: torch.Tensor, cells: torch.Tensor,
              positions: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """The sampled token [b] int64 of each row from its head: ``vals`` [b, K] float32 its K largest scaled logits in
    order, ``idx`` [b, K] int64 their ids. Top-k keeps the first k (top_k 0: all K), top-p the shortest prefix of
    those whose softmax mass reaches top_p (the first always), and the draw is the kept id of the largest vals +
    Gumbel noise keyed by (seed, position, token id)."""
    K = vals.shape[1]
    top_p = cells[:, SamplerCell.TOP_P].view(torch.float32)  # [b]
    top_k = cells[:, SamplerCell.TOP_K].long()  # [b]
    k = torch.where(top_k > 0, top_k.clamp(max=K), K)  # [b]
    keep = torch.arange(K, device=vals.device)[None, :] < k[:, None]  # [b, K] in sorted order
    probs = torch.softmax(vals.masked_fill(~keep, float("-inf")), dim=-1)
    before = probs.cumsum(-1) - probs  # mass strictly ahead of each sorted token
    keep &= before < top_p[:, None]
    keep[:, 0] = True
    noise = -torch.log(-torch.log(uniforms(cells[:, SamplerCell.SEED], positions, token_salt(idx))))  # [b, K]
    score = torch.where(keep, vals + noise, float("-inf"))
    return idx.gather(1, score.argmax(-1, keepdim=True))[:, 0]


def sample_rows_ref(logits: torch.Tensor, cells: torch.Tensor, positions: torch.Tensor,
                    candidates: int = 256) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(tokens [b] int64, head [b, min(V, candidates)] int64): each row's scaled logits (logits / temperature, a
    temperature of 0 dividing by 1; its banned stop ids -inf) ordered by (value descending, id ascending, NaN first),
    the head's ids, and the token drawn from the head (``draw_head``), or the head's first where the temperature is
    0 (greedy)."""
    x = logits.float().clone()
    temp = cells[:, SamplerCell.TEMPERATURE].view(torch.float32)  # [b]
    x /= torch.where(temp > 0, temp, 1.0)[:, None]
    ban_stops_(x, cells, positions)
    vals, idx = x.sort(dim=-1, descending=True, stable=True)  # (stable: ids ascending among equal values)
    K = min(x.shape[1], candidates)
    vals, idx = vals[:, :K], idx[:, :K]
    drawn = draw_head(vals, idx, cells, positions)
    return torch.where(temp > 0, drawn, idx[:, 0]), idx
