"""In-graph sampling from logits and a bucket's sampler cells: no host sync, no ``.item()``, static shapes.

Cells per row (``resplan.SamplerCell``): temperature and top_p as float32 bit patterns, top_k (0 = off), seed.
``temperature == 0`` is greedy (argmax, first index on ties). Otherwise the logits are divided by the temperature, cut
to the top-k, then to the smallest head of the sorted distribution whose mass reaches top_p, and one token is drawn by
Gumbel-max with noise from a counter-based hash of (seed, position, token id) in torch integer ops. Sampling looks at
the ``CANDIDATES`` most likely tokens only (submission refuses a top-k above it; top-p's mass is taken within them): a
full sort of a 248k vocabulary every step cost milliseconds of GPU time at c=64; ``topk`` of 256 costs a fraction.
The same function samples a prefill's first token and every decode token, so both planning arms (and any batch a row
lands in) draw the same token from the same logits.
"""

from __future__ import annotations

import torch

from models.engine.requests import CANDIDATES  # tokens a sampled row can draw from: the most likely ones
from resplan.layout import SamplerCell

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


def uniforms(seed: torch.Tensor, position: torch.Tensor, salt: torch.Tensor) -> torch.Tensor:
    """[b, n] float32 in (0, 1): one uniform per (row's seed, row's position, token). seed, position [b] int;
    salt [n] or [b, n] int64 (hash32 of the token ids)."""
    key = hash32(hash32(seed.long() & M32) ^ (position.long() & M32))  # [b]
    r = hash32((key[:, None] + (salt if salt.ndim == 2 else salt[None, :])) & M32)  # [b, n]
    return ((r >> 8).float() + 0.5) * (1.0 / 2**24)


class Sampler:
    """``sampler(logits [b, V], cells [b, 4] int32, positions [b] int) -> tokens [b] int64``."""

    def __init__(self, vocab_size: int, device: torch.device | str) -> None:
        self.vocab_size = vocab_size
        ids = torch.arange(vocab_size, dtype=torch.int64, device=device)
        self.salt = hash32((ids * 0x9E3779B9) & M32)  # [V]
        self.rank = torch.arange(vocab_size, device=device)  # [V]

    def __call__(self, logits: torch.Tensor, cells: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        logits = logits.float()
        temp = cells[:, SamplerCell.TEMPERATURE].view(torch.float32)  # [b]
        top_p = cells[:, SamplerCell.TOP_P].view(torch.float32)  # [b]
        top_k = cells[:, SamplerCell.TOP_K].long()  # [b]
        greedy = logits.argmax(-1)  # [b]
        scaled = logits / torch.where(temp > 0, temp, 1.0)[:, None]  # [b, V]
        K = min(self.vocab_size, CANDIDATES)
        vals, idx = scaled.topk(K, dim=-1)  # [b, K] descending
        k = torch.where(top_k > 0, top_k.clamp(max=K), K)  # [b]
        keep = self.rank[None, :K] < k[:, None]  # [b, K] in sorted order
        probs = torch.softmax(vals.masked_fill(~keep, float("-inf")), dim=-1)
        before = probs.cumsum(-1) - probs  # mass strictly ahead of each sorted token
        keep &= before < top_p[:, None]
        keep[:, 0] = True
        seeds = cells[:, SamplerCell.SEED]  # [b]
        noise = -torch.log(-torch.log(uniforms(seeds, positions, self.salt[idx])))  # [b, K] by token id
        score = torch.where(keep, vals + noise, float("-inf"))
        drawn = idx.gather(1, score.argmax(-1, keepdim=True))[:, 0]  # [b]
        return torch.where(temp > 0, drawn, greedy)
