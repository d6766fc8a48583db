"""Reference of the sampled draw, in torch: every logit of a row ordered by (value descending, id ascending; a NaN the
largest), then top-k, top-p and a Gumbel-max draw over the head, as ``models.engine.sampler.Sampler`` draws (which
takes its head with ``topk``, whose order among equal values is unspecified: the two agree wherever the head holds no
tie). Also the counter-based hash both draw their noise from."""

from __future__ import annotations

from typing import NamedTuple

import torch

M32 = 0xFFFFFFFF


class CellColumns(NamedTuple):
    """Where a row's sampler cells sit in ``cells`` [b, width] int32 (resplan's ``SamplerCell``, as plain integers:
    ``kernels`` imports nothing from ``resplan``): temperature and top_p as float32 bit patterns, top_k (0: off), the
    seed, the position below which the row's stop ids are banned (0: none), and the first of ``stops`` stop ids
    (-1 padded, a row's real ones first)."""

    temperature: int
    top_p: int
    top_k: int
    seed: int
    min_position: int
    stop_0: int
    stops: int
    width: int


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


def ban_stops_(scores: torch.Tensor, cells: torch.Tensor, positions: torch.Tensor, cols: CellColumns) -> None:
    """In place: a row drawing at a position below its min_position cell gets -inf for each of its stop cells' ids
    (a request's ``min_tokens``). scores [b, V] float, cells [b, cols.width] int32, positions [b] int. Static
    shapes, no host sync: a [b, cols.stops] gather and scatter. Padding ids (-1) repeat the row's first id, so that
    every write to a column carries one value: -inf on a banned row (whose first id is a real one), else the column's
    own."""
    ids = cells[:, cols.stop_0 : cols.stop_0 + cols.stops].long()  # [b, S]
    ids = torch.where(ids >= 0, ids, ids[:, :1].clamp(min=0))
    banned = positions.long() < cells[:, cols.min_position].long()  # [b]
    scores.scatter_(1, ids, torch.where(banned[:, None], float("-inf"), scores.gather(1, ids)))


def scaled_logits(logits: torch.Tensor, cells: torch.Tensor, positions: torch.Tensor,
                  cols: CellColumns) -> torch.Tensor:  # fmt: skip
    """[b, V] float32: logits / temperature (a temperature of 0 divides by 1), a row's banned stop ids -inf."""
    temp = cells[:, cols.temperature].view(torch.float32)  # [b]
    x = logits.float() / torch.where(temp > 0, temp, 1.0)[:, None]  # (a new tensor: the bans go in place)
    ban_stops_(x, cells, positions, cols)
    return x


def draw_head(vals: torch.Tensor, idx: torch.Tensor, cells: torch.Tensor, positions: torch.Tensor, cols: CellColumns,
              salt: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """The sampled token [b] int64 of each row from its head: ``vals`` [b, K] float32 its K largest scaled logits in
    order, ``idx`` [b, K] int64 their ids. Top-k keeps the first k (top_k 0: all K), top-p the shortest prefix of
    those whose softmax mass reaches top_p (the first always), and the draw is the kept id of the largest vals +
    Gumbel noise keyed by (seed, position, token id). ``salt``: [b, K] ``token_salt(idx)`` if the caller has it
    (a gather from a table is cheaper than the hash)."""
    K = vals.shape[1]
    top_p = cells[:, cols.top_p].view(torch.float32)  # [b]
    top_k = cells[:, cols.top_k].long()  # [b]
    k = torch.where(top_k > 0, top_k.clamp(max=K), K)  # [b]
    keep = torch.arange(K, device=vals.device)[None, :] < k[:, None]  # [b, K] in sorted order
    probs = torch.softmax(vals.masked_fill(~keep, float("-inf")), dim=-1)
    before = probs.cumsum(-1) - probs  # mass strictly ahead of each sorted token
    keep &= before < top_p[:, None]
    keep[:, 0] = True
    salt = token_salt(idx) if salt is None else salt
    noise = -torch.log(-torch.log(uniforms(cells[:, cols.seed], positions, salt)))  # [b, K]
    score = torch.where(keep, vals + noise, float("-inf"))
    return idx.gather(1, score.argmax(-1, keepdim=True))[:, 0]


def sample_rows_ref(logits: torch.Tensor, cells: torch.Tensor, positions: torch.Tensor, cols: CellColumns,
                    candidates: int = 256) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(tokens [b] int64, head [b, min(V, candidates)] int64): each row's scaled logits (logits / temperature, a
    temperature of 0 dividing by 1; its banned stop ids -inf) ordered by (value descending, id ascending, NaN first),
    the head's ids, and the token drawn from the head (``draw_head``), or the head's first where the temperature is
    0 (greedy)."""
    x = scaled_logits(logits, cells, positions, cols)
    temp = cells[:, cols.temperature].view(torch.float32)  # [b]
    vals, idx = x.sort(dim=-1, descending=True, stable=True)  # (stable: ids ascending among equal values)
    K = min(x.shape[1], candidates)
    vals, idx = vals[:, :K], idx[:, :K]
    drawn = draw_head(vals, idx, cells, positions, cols)
    return torch.where(temp > 0, drawn, idx[:, 0]), idx
