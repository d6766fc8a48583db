"""In-graph sampling from logits and a bucket's sampler cells: no host sync, no ``.item()``, static shapes.

Cells per row (``resplan.SamplerCell``): temperature and top_p as float32 bit patterns, top_k (0 = off), seed.
``temperature == 0`` is greedy (argmax, first index on ties). Otherwise the logits are divided by the temperature, cut
to the top-k, then to the smallest head of the sorted distribution whose mass reaches top_p, and one token is drawn by
Gumbel-max with noise from a counter-based hash of (seed, position, token id) (``kernels.sample.naive``). Sampling
looks at the ``CANDIDATES`` most likely tokens only (submission refuses a top-k above it; top-p's mass is taken within
them): a full sort of a 248k vocabulary every step cost milliseconds of GPU time at c=64. On CUDA the draw is
``kernels.sample`` (the head found without sorting the vocabulary, three launches; ``KernelChoices.sampler``), else
torch's ``topk`` of 256 and ~20 small ops (238 us on an H100 at one row and 605 at 64, against the kernel's 25 and 127
on bf16 logits, 37 and 177 on float32; faster at every row count measured, 1 to 256); the two
draw alike but where equal logits straddle a top-k or top-p cut in the head (the kernel orders them by id). The same
``Sampler`` samples a prefill's first token and every decode token, so both planning arms (and any batch a row lands
in) draw the same token from the same logits. A row under its ``min_tokens`` draws with its stop tokens at -inf
(``ban_stops_``); its logprobs stay those of the raw logits.

A step's ``SamplingMode`` picks its graph: all rows greedy, argmax; any row sampled, the sampler; any row asking for
logprobs, the sampler (whose temperature-0 rows take the argmax) and ``logprobs``: log_softmax of the raw logits, the
drawn token's and the ``MAX_LOGPROBS`` largest, for every row (the host keeps what each request asked for). The
largest are the head of the sampler's candidates (a temperature divides a row's logits alike, so keeps their order).
Drawn by torch's ops, a full log_softmax (on the H200 at 64 rows of a 248k vocabulary it added 183 us to the torch
sampler's 558); drawn by ``kernels.sample``, each row's log-sum-exp summed as its first launch reads the logits and a
logprob a logit less it (``logprobs_from_lse``).
"""

from __future__ import annotations

import enum

import torch

from kernels.argmax import argmax_rows
from kernels.choices import DEFAULT, KernelChoices
from kernels.sample import CellColumns, sample_rows
from kernels.sample.naive import draw_head, scaled_logits, token_salt
from models.engine.requests import CANDIDATES, MAX_LOGPROBS  # the tokens a row draws from; top logprobs kept
from resplan.layout import BANNED_STOPS, SamplerCell

COLUMNS = CellColumns(SamplerCell.TEMPERATURE, SamplerCell.TOP_P, SamplerCell.TOP_K, SamplerCell.SEED,
                      SamplerCell.MIN_POSITION, SamplerCell.STOP_0, BANNED_STOPS, len(SamplerCell))  # fmt: skip


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


class Sampler:
    """``sampler(logits [b, V], cells [b, len(SamplerCell)] int32, positions [b] int[, out]) -> tokens [b] int64``
    (into ``out`` where given); ``draw`` also returns the candidates. On CUDA where the choices ask for it
    (``KernelChoices.draws_sample_kernel``) the draw is ``kernels.sample`` (the head found without sorting the
    vocabulary; its order among equal logits is by id), else in torch ops (``topk``)."""

    def __init__(self, vocab_size: int, device: torch.device | str, kc: KernelChoices = DEFAULT) -> None:
        device = torch.device(device)
        self.vocab_size = vocab_size
        self.kernel = kc.draws_sample_kernel(device.type == "cuda")
        self.pdl = kc.pdl  # the kernel's launches (kernels.pdl)
        self.salt = token_salt(torch.arange(vocab_size, dtype=torch.int64, device=device))  # [V] (the torch ops')

    def __call__(self, logits: torch.Tensor, cells: torch.Tensor, positions: torch.Tensor,
                 out: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        """The tokens [b] int64, written into ``out`` where given (the kernel writes them there, and no head)."""
        if self.kernel:
            out = torch.empty(logits.shape[0], dtype=torch.int64, device=logits.device) if out is None else out
            return sample_rows(logits, cells, positions, COLUMNS, out, candidates=CANDIDATES, pdl=self.pdl)
        tokens = self.draw(logits, cells, positions)[0]
        return tokens if out is None else out.copy_(tokens)

    def draw(self, logits: torch.Tensor, cells: torch.Tensor,
             positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """The tokens [b] int64, and the candidates they were drawn from: [b, min(V, CANDIDATES)] int64 ids, most
        likely first."""
        if self.kernel:
            return self._kernel_draw(logits, cells, positions)
        temp = cells[:, SamplerCell.TEMPERATURE].view(torch.float32)  # [b]
        scaled = scaled_logits(logits, cells, positions, COLUMNS)  # [b, V] (a greedy row's: its logits)
        greedy = scaled.argmax(-1)  # [b]
        vals, idx = scaled.topk(min(self.vocab_size, CANDIDATES), dim=-1)  # [b, K] descending
        drawn = draw_head(vals, idx, cells, positions, COLUMNS, self.salt[idx])
        return torch.where(temp > 0, drawn, greedy), idx

    def draw_logprobs(self, logits: torch.Tensor, cells: torch.Tensor, positions: torch.Tensor,
                      ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:  # fmt: skip
        """The tokens [b] int64 and their ``logprobs`` (a LOGPROBS step's). The kernel's draw sums each row's
        log-sum-exp as it reads the logits (``logprobs_from_lse``: a few gathers), where torch's ops take a full
        log_softmax (183 us at 64 rows on the H200)."""
        if not self.kernel:
            tokens, head = self.draw(logits, cells, positions)
            return tokens, logprobs(logits, tokens, head)
        lse = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
        tokens, head = self._kernel_draw(logits, cells, positions, lse)
        return tokens, logprobs_from_lse(logits, tokens, head, lse)

    def _kernel_draw(self, logits: torch.Tensor, cells: torch.Tensor, positions: torch.Tensor,
                     lse: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """``draw`` by ``kernels.sample`` (and each row's log-sum-exp into ``lse`` where given)."""
        b = logits.shape[0]
        tokens = torch.empty(b, dtype=torch.int64, device=logits.device)
        head = torch.empty(b, min(self.vocab_size, CANDIDATES), dtype=torch.int64, device=logits.device)
        sample_rows(logits, cells, positions, COLUMNS, tokens, head, candidates=CANDIDATES, pdl=self.pdl, lse=lse)
        return tokens, head


def logprobs(logits: torch.Tensor, tokens: torch.Tensor,
             candidates: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """ls = log_softmax(logits [b, V] as float32): (ls[i, tokens[i]] [b] float32, the MAX_LOGPROBS largest's ids
    [b, 5] int64 and values [b, 5] float32, largest first), the largest being the head of ``candidates`` ([b, >= 5],
    most likely first: ``Sampler.draw``'s). Static shapes, no host sync."""
    ls = torch.log_softmax(logits.float(), dim=-1)  # [b, V]
    return _picked(lambda ids: ls.gather(1, ids), tokens, candidates)


def logprobs_from_lse(logits: torch.Tensor, tokens: torch.Tensor, candidates: torch.Tensor,
                      lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """``logprobs`` as float32 logits less their row's log-sum-exp ``lse`` [b] float32 (the kernel's), gathered
    where needed: no [b, V] pass. Equal to log_softmax up to float32 rounding (its sum runs in another order)."""
    return _picked(lambda ids: logits.gather(1, ids).float() - lse[:, None], tokens, candidates)


def _picked(logprob_at, tokens: torch.Tensor,
            candidates: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """(the tokens' logprobs [b], the head of ``candidates``' MAX_LOGPROBS ids [b, 5] and logprobs [b, 5] sorted
    largest first), ``logprob_at(ids [b, n]) -> [b, n] float32`` giving each row's logprobs at its ids."""
    head = candidates[:, :MAX_LOGPROBS]  # [b, 5]
    top_lp, order = logprob_at(head).sort(dim=-1, descending=True)  # (a temperature's rounding may tie two)
    return logprob_at(tokens[:, None])[:, 0], head.gather(1, order), top_lp
