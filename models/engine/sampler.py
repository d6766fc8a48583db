"""In-graph sampling from logits and a bucket's sampler cells: no host sync, no ``.item()``, static shapes.

Cells per row (``resplan.SamplerCell``): temperature and top_p as float32 bit patterns, top_k (0 = off), seed.
``temperature == 0`` is greedy (argmax, first index on ties). Otherwise the logits are divided by the temperature, cut
to the top-k, then to the smallest head of the sorted distribution whose mass reaches top_p, and one token is drawn by
Gumbel-max with noise from a counter-based hash of (seed, position, token id) in torch integer ops. Sampling looks at
the ``CANDIDATES`` most likely tokens only (submission refuses a top-k above it; top-p's mass is taken within them): a
full sort of a 248k vocabulary every step cost milliseconds of GPU time at c=64; ``topk`` of 256 costs a fraction.
The same function samples a prefill's first token and every decode token, so both planning arms (and any batch a row
lands in) draw the same token from the same logits. A row under its ``min_tokens`` draws with its stop tokens at -inf
(``ban_stops_``); its logprobs stay those of the raw logits.

A step's ``SamplingMode`` picks its graph: all rows greedy, argmax; any row sampled, the sampler; any row asking for
logprobs, the sampler (whose temperature-0 rows take the argmax) and ``logprobs``: log_softmax of the raw logits, the
drawn token's and the ``MAX_LOGPROBS`` largest, for every row (the host keeps what each request asked for). The
largest are the head of the sampler's candidates (a temperature divides a row's logits alike, so keeps their order):
on the H200 at 64 rows of a 248k vocabulary logprobs add 183 us to the sampler's 558 (425 with a top-k of their own).
"""

from __future__ import annotations

import enum

import torch

from kernels.argmax import argmax_rows
from kernels.choices import KernelChoices
from models.engine.requests import CANDIDATES, MAX_LOGPROBS  # the tokens a row draws from; top logprobs kept
from resplan.layout import BANNED_STOPS, SamplerCell

M32 = 0xFFFFFFFF


class SamplingMode(enum.Enum):
    """How a step draws its rows' tokens, so which graph it replays (a static field of the graph key)."""

    GREEDY = "greedy"  # every row greedy: argmax, no sampler
    SAMPLE = "sample"  # the sampler
    LOGPROBS = "logprobs"  # the sampler, and every row's logprobs (a row asks for them)


def greedy(logits: torch.Tensor, out: torch.Tensor, kc: KernelChoices) -> None:
    """out[r] = argmax(logits[r]) (the first index of the largest): ``kernels.argmax`` written into ``out`` where the
    choices ask for it (``KernelChoices.draws_argmax_kernel``), else torch's argmax copied in. logits [b, V], out [b]
    int64."""
    if kc.draws_argmax_kernel(logits.is_cuda):
        argmax_rows(logits, out, pdl=kc.pdl)
    else:
        out.copy_(logits.argmax(-1))


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
    """``sampler(logits [b, V], cells [b, len(SamplerCell)] int32, positions [b] int) -> tokens [b] int64``;
    ``draw`` also returns the candidates."""

    def __init__(self, vocab_size: int, device: torch.device | str) -> None:
        self.vocab_size = vocab_size
        ids = torch.arange(vocab_size, dtype=torch.int64, device=device)
        self.salt = hash32((ids * 0x9E3779B9) & M32)  # [V]
        self.rank = torch.arange(vocab_size, device=device)  # [V]

    def __call__(self, logits: torch.Tensor, cells: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.draw(logits, cells, positions)[0]

    def draw(self, logits: torch.Tensor, cells: torch.Tensor,
             positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """The tokens [b] int64, and the candidates they were drawn from: [b, min(V, CANDIDATES)] int64 ids, most
        likely first."""
        logits = logits.float()
        temp = cells[:, SamplerCell.TEMPERATURE].view(torch.float32)  # [b]
        top_p = cells[:, SamplerCell.TOP_P].view(torch.float32)  # [b]
        top_k = cells[:, SamplerCell.TOP_K].long()  # [b]
        scaled = logits / torch.where(temp > 0, temp, 1.0)[:, None]  # [b, V] (a greedy row's: its logits)
        ban_stops_(scaled, cells, positions)
        greedy = scaled.argmax(-1)  # [b]
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
        return torch.where(temp > 0, drawn, greedy), idx


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


def logprobs(logits: torch.Tensor, tokens: torch.Tensor,
             candidates: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """ls = log_softmax(logits [b, V] as float32): (ls[i, tokens[i]] [b] float32, the MAX_LOGPROBS largest's ids
    [b, 5] int64 and values [b, 5] float32, largest first), the largest being the head of ``candidates`` ([b, >= 5],
    most likely first: ``Sampler.draw``'s). Static shapes, no host sync."""
    ls = torch.log_softmax(logits.float(), dim=-1)  # [b, V]
    head = candidates[:, :MAX_LOGPROBS]  # [b, 5]
    top_lp, order = ls.gather(1, head).sort(dim=-1, descending=True)  # (a temperature's rounding may tie two)
    return ls.gather(1, tokens[:, None])[:, 0], head.gather(1, order), top_lp
