"""The request table: every request the engine knows, by handle while it is admitted and by id until its result is
handed over. Per-handle state is numpy arrays a step reads with vectorised ops (tokens so far and their times, limits,
stop tokens, the serial of each admission, the tokens launched, the logprobs asked for and emitted); what a step emits
and which requests finish go to the table's outbox, which ``take_output`` hands over as a ``StepOutput`` (and a
finished request's id is forgotten then, so nothing per finished request stays behind)."""

from __future__ import annotations

import itertools
import time

import attrs
import numpy as np

from models.engine.requests import (
    MAX_LOGPROBS,
    FinishReason,
    InvalidRequest,
    Request,
    Result,
    StepOutput,
    TokenLogprobs,
)
from models.engine.sampler import SamplingMode
from models.engine.scheduler import Pending

_NO_TOKENS = np.zeros(0, np.int64)
_NO_TOKENS.flags.writeable = False
_NO_IDS = np.zeros(0, object)
_NO_IDS.flags.writeable = False


@attrs.frozen(eq=False, slots=False)
class Emitted:
    """What one step's tokens did: their count, the gaps since each row's last token (with timing), and which rows
    are done, by stop token or by running out of tokens or context."""

    n: int
    itl: np.ndarray | None  # [k] seconds, the rows that had a token before
    done: np.ndarray  # [n] bool
    stopped: np.ndarray  # [n] bool: done by a stop token
    n_done: int


class RequestTable:
    def __init__(self, capacity: int, max_seq_len: int) -> None:
        H = capacity
        self.max_seq_len = max_seq_len
        self.gen = np.zeros(H, np.int64)  # tokens generated
        self.t_first = np.zeros(H)  # wall clock of each handle's first token
        self.t_last = np.zeros(H)  # and of its latest
        self._zero, self._one = np.zeros(1, np.int64), np.ones(1, np.int64)  # (a compare with an array is cheaper)
        self._block_at = np.arange(max_seq_len)[:, None]  # [T, 1] a token's index in a launch (emit_block)
        self.room = np.zeros(H, np.int64)  # tokens a request may generate: min(max_tokens, context - prompt)
        self.min_tokens = np.zeros(H, np.int64)  # no stop token before this many (0 when it has no stop tokens)
        self.sampling = np.zeros(H, bool)  # temperature > 0: the step replays the sampling graph
        self.samplers = 0  # admitted requests that sample (0: no step looks at them)
        self.prompt_len = np.zeros(H, np.int64)
        self.last_token = np.zeros(H, np.int64)
        self.out = np.zeros((H, max_seq_len), np.int32)  # generated tokens by handle
        self.logprobs = np.full(H, -1, np.int64)  # the top logprobs each handle's request asked for; -1: none
        self.asking = 0  # admitted requests asking for logprobs (0: no step looks at them)
        self.minimums = 0  # admitted requests with a min_tokens (0: no step looks at them)
        self.out_lp = np.zeros((H, max_seq_len), np.float32)  # each generated token's logprob (if asked for)
        self.out_top_ids = np.zeros((H, max_seq_len, MAX_LOGPROBS), np.int32)  # and the most likely tokens'
        self.out_top_lp = np.zeros((H, max_seq_len, MAX_LOGPROBS), np.float32)
        self.stop = np.full((H, 1), -1, np.int64)  # stop tokens by handle, -1 padded
        self._stop0 = self.stop[:, 0]  # [H] a view of its first column (the one there is, most often)
        self.serial = np.zeros(H, np.int64)  # bumped by every admit and finish of a handle
        self.issued = np.zeros(H, np.int64)  # tokens launched (generated or in flight)
        self.rid_of = np.full(H, None, object)  # [H] the id of the request each handle serves
        self.live: dict[int, Pending] = {}  # admitted requests by handle
        self.rids: set[str] = set()  # ids submitted whose results have not been handed over
        self.t_submit: dict[str, float] = {}
        self._auto_ids = itertools.count()
        self._out_ids: list[np.ndarray] = []  # the outbox: each emit's request ids and tokens, and finished results
        self._out_tokens: list[np.ndarray] = []
        self._out_lp: list[tuple[int, TokenLogprobs]] = []  # (index in _out_ids, its emit's logprobs), if any had them
        self._finished: list[Result] = []
        self.prompt_lp: dict[int, TokenLogprobs] = {}  # [P] by handle, for the requests asking (position 0: none)
        self._out_prompt_lp: list[tuple[str, TokenLogprobs]] = []  # the outbox's prompts scored whole

    # -- submission ----------------------------------------------------------------------------------------------
    def register(self, request: Request, arrived: float | None) -> str:
        """The request's id (its own, or the next free ``req-N``), now in use; InvalidRequest if it already is."""
        rid = request.request_id
        if rid is None:
            rid = f"req-{next(self._auto_ids)}"
            while rid in self.rids:
                rid = f"req-{next(self._auto_ids)}"
        elif rid in self.rids:
            raise InvalidRequest("request_id", f"{rid!r} is in use (submitted, and its result not handed over)")
        self.rids.add(rid)
        self.t_submit[rid] = time.perf_counter() if arrived is None else arrived
        return rid

    def abort_waiting(self, pend: Pending) -> Result:
        """A request aborted before it was admitted: its result (no tokens), its id forgotten."""
        self.t_submit.pop(pend.rid, None)
        self.rids.discard(pend.rid)
        return Result(pend.rid, len(pend.request.prompt), (), FinishReason.ABORT)

    # -- admitted requests ---------------------------------------------------------------------------------------
    def admit(self, h: int, pend: Pending) -> None:
        """Handle h now serves ``pend``: its limits, sampling mode and stop tokens (``pend.stops``)."""
        sp = pend.request.sampling
        self.serial[h] += 1
        self.issued[h] = 0
        self.live[h] = pend
        self.rid_of[h] = pend.rid
        self.sampling[h] = sp.temperature > 0
        self.samplers += sp.temperature > 0
        self.logprobs[h] = -1 if sp.logprobs is None else sp.logprobs
        self.asking += sp.logprobs is not None
        self.gen[h] = 0
        self.prompt_len[h] = len(pend.request.prompt)
        self.room[h] = min(sp.max_tokens, self.max_seq_len - len(pend.request.prompt))
        self.last_token[h] = pend.request.prompt[-1]
        stops = pend.stops
        self.min_tokens[h] = sp.min_tokens if stops else 0
        self.minimums += bool(self.min_tokens[h])
        if len(stops) > self.stop.shape[1]:
            self.stop = np.pad(self.stop, ((0, 0), (0, len(stops) - self.stop.shape[1])), constant_values=-1)
            self._stop0 = self.stop[:, 0]
        self.stop[h] = -1
        self.stop[h, : len(stops)] = stops
        if sp.prompt_logprobs is not None:
            P = len(pend.request.prompt)
            self.prompt_lp[h] = TokenLogprobs(np.full(P, np.nan, np.float32), np.full((P, MAX_LOGPROBS), -1, np.int64),
                                              np.full((P, MAX_LOGPROBS), np.nan, np.float32))  # fmt: skip

    def launched(self, rows: np.ndarray, tokens: int = 1) -> np.ndarray:
        """A step was launched with ``rows``: each has ``tokens`` more tokens issued. Returns [n] bool: the row's last
        token is among those issued (no later step may run it)."""
        issued = self.issued[rows] + (self._one if tokens == 1 else tokens)
        self.issued[rows] = issued
        return issued >= self.room[rows]

    def prefilled(self, ended: np.ndarray, scored=()) -> None:
        """A pass landed: the prompt tokens it scored (``prefill.Scored`` each) are recorded in their requests, and
        the handles whose prompts it ended have each issued their first token; those whose requests asked for their
        prompt's logprobs put them in the outbox (tokens 1 .. P-1; -1 / NaN past the alternatives asked for)."""
        for s in scored:
            lp, m = self.prompt_lp[s.handle], s.logprobs.logprob.size
            lp.logprob[s.at : s.at + m] = s.logprobs.logprob
            lp.top_ids[s.at : s.at + m] = s.logprobs.top_ids
            lp.top_logprobs[s.at : s.at + m] = s.logprobs.top_logprobs
        self.issued[ended] = 1
        if self.prompt_lp:
            for h in ended.tolist():
                if h in self.prompt_lp:
                    k = self.live[h].request.sampling.prompt_logprobs
                    self._out_prompt_lp.append((self.rid_of[h], _shown(self.prompt_lp[h][1:], k)))

    def mode(self, rows: np.ndarray) -> SamplingMode:
        """How a step of ``rows`` draws, so which graph it replays: LOGPROBS when a row asks for logprobs, SAMPLE
        when one samples or may still be under its ``min_tokens`` (the sampler masks its stop tokens), else GREEDY
        (the argmax graph)."""
        if self.asks_logprobs(rows):
            return SamplingMode.LOGPROBS
        if self.samplers and self.sampling[rows].any():
            return SamplingMode.SAMPLE
        if self.minimums and (self.min_tokens[rows] > self.gen[rows]).any():
            return SamplingMode.SAMPLE
        return SamplingMode.GREEDY

    def asks_logprobs(self, rows: np.ndarray) -> bool:
        """Some row's request asks for logprobs."""
        return self.asking > 0 and bool((self.logprobs[rows] >= 0).any())

    def emit(self, rows: np.ndarray, tokens: np.ndarray, timing: bool, lp: TokenLogprobs | None = None) -> Emitted:
        """Record each row's token ([n] handles, [n] tokens; ``lp``: their logprobs, drawn by a step where a row asked
        for them) in its request and in the outbox, and say which rows are done."""
        g = self.gen[rows]
        now = time.perf_counter()
        n_first = rows.size - np.count_nonzero(g)
        if n_first:  # (a prefill's first tokens; a decode step's rows all had one)
            first = g == self._zero
            self.t_first[rows[first]] = now
            itl = now - self.t_last[rows[~first]] if timing and n_first < rows.size else None
        else:
            itl = now - self.t_last[rows] if timing else None
        self.t_last[rows] = now
        self.out[rows, g] = tokens
        if lp is not None:
            self._emit_logprobs(rows, g, lp)
        g += self._one
        tokens = tokens.astype(np.int64, copy=False)
        self.gen[rows] = g
        self.last_token[rows] = tokens
        self._out_ids.append(self.rid_of[rows])
        self._out_tokens.append(tokens)
        if self.stop.shape[1] == 1:
            stopped = self._stop0[rows] == tokens
        else:
            stopped = (self.stop[rows] == tokens[:, None]).any(1)  # [n, stops]
        done = stopped | (g >= self.room[rows])
        return Emitted(rows.size, itl, done, stopped, np.count_nonzero(done))

    def emit_block(self, rows: np.ndarray, tokens: np.ndarray, timing: bool) -> Emitted:
        """Record the tokens a launch of k tokens a row drew ([n] handles, [k, n] tokens, row j the j-th), each row's
        up to the first that ends it (a stop token, or its last by max_tokens or the context; the rest dropped), in
        order in the outbox, and say which rows are done. Its gaps: each row's since its last token, then 0 for the
        tokens that came with it."""
        k, n = tokens.shape
        g = self.gen[rows]  # [n]
        tokens = tokens.astype(np.int64, copy=False)
        stop = (self.stop[rows][None, :, :] == tokens[:, :, None]).any(2)  # [k, n]
        at = self._block_at[:k]  # [k, 1]
        ends = stop | (at >= (self.room[rows] - g - 1)[None, :])  # [k, n]: the row ends on its j-th token
        done = ends.any(0)
        n_done = int(np.count_nonzero(done))
        count = np.where(done, ends.argmax(0) + 1, k) if n_done else np.full(n, k)  # [n] tokens recorded a row
        total = int(count.sum())
        now = time.perf_counter()
        first = g == self._zero
        if first.any():
            self.t_first[rows[first]] = now
        itl = None
        if timing and not first.all():
            itl = np.concatenate([now - self.t_last[rows[~first]], np.zeros(total - n)])
        self.t_last[rows] = now
        cols = g[None, :] + at  # [k, n] each token's index in its request's output
        if n_done:
            valid = at < count[None, :]  # [k, n]
            self.out[np.broadcast_to(rows, (k, n))[valid], cols[valid]] = tokens[valid]
        else:  # (no row ends in the launch: every token recorded)
            self.out[rows[None, :], cols] = tokens
        self.gen[rows] = g + count
        self.last_token[rows] = tokens[count - 1, np.arange(n)]
        ids = self.rid_of[rows]
        for j in range(k):  # (the outbox in token order: a row's j-th token after every row's (j-1)-th)
            v = count > j
            if n_done == 0 or v.all():
                self._out_ids.append(ids)
                self._out_tokens.append(tokens[j])
            elif v.any():
                self._out_ids.append(ids[v])
                self._out_tokens.append(tokens[j][v])
        stopped = stop[count - 1, np.arange(n)] & done
        return Emitted(total, itl, done, stopped, n_done)

    def _emit_logprobs(self, rows: np.ndarray, g: np.ndarray, lp: TokenLogprobs) -> None:
        """Record the rows' logprobs at token index g ([n] each) and put them in the outbox, NaN / -1 past what each
        row's request asked for (a row that asked for none: all)."""
        self.out_lp[rows, g] = lp.logprob
        self.out_top_ids[rows, g] = lp.top_ids
        self.out_top_lp[rows, g] = lp.top_logprobs
        self._out_lp.append((len(self._out_ids), _shown(lp, self.logprobs[rows])))

    def finish(self, h: int, reason: FinishReason) -> Result:
        """Handle h's request ends: its result, and its id forgotten. A step in flight that ran it drops its token
        (the serial changed)."""
        pend = self.live.pop(h)
        rid = pend.rid
        n = int(self.gen[h])
        ttft = self.t_first[h] - self.t_submit.pop(rid, float("nan"))
        itl = (self.t_last[h] - self.t_first[h]) / (n - 1) if n > 1 else float("nan")
        self.serial[h] += 1
        self.rid_of[h] = None
        self.rids.discard(rid)
        if self.min_tokens[h]:
            self.min_tokens[h] = 0
            self.minimums -= 1
        if self.sampling[h]:
            self.sampling[h] = False
            self.samplers -= 1
        lps, tops = self._logprobs_of(h, n)
        plps, ptops = (), ()
        prompt_lp = self.prompt_lp.pop(h, None)
        if prompt_lp is not None:
            plps, ptops = _listed(prompt_lp[1:], pend.request.sampling.prompt_logprobs)
        return Result(rid, int(self.prompt_len[h]), tuple(self.out[h, :n].tolist()), reason, ttft, itl, lps, tops,
                      plps, ptops)  # fmt: skip

    def _logprobs_of(self, h: int, n: int) -> tuple[tuple, tuple]:
        """Handle h's first n tokens' logprobs and top (id, logprob) pairs, if its request asked for them (else
        empty); it asks no more."""
        k = int(self.logprobs[h])
        if k < 0:
            return (), ()
        self.logprobs[h] = -1
        self.asking -= 1
        return _listed(TokenLogprobs(self.out_lp[h, :n], self.out_top_ids[h, :n], self.out_top_lp[h, :n]), k)

    def hand_over(self, result: Result) -> None:
        """A finished request's result goes to the outbox."""
        self._finished.append(result)

    def knows(self, request_id: str) -> bool:
        """The id was submitted and its result not handed over yet."""
        return request_id in self.rids

    def serials(self, rows: np.ndarray) -> np.ndarray:
        """[n] the rows' admission serials (a launch records them; its landing drops rows whose serial changed)."""
        return self.serial[rows]

    def last_tokens(self, rows: np.ndarray) -> np.ndarray:
        """[n] int64: each row's last token (its next input id)."""
        return self.last_token[rows]

    def handle_of(self, request_id: str) -> int | None:
        return next((h for h, pend in self.live.items() if pend.rid == request_id), None)

    def requests(self, handles) -> list[Request]:
        """The requests the handles serve, in order."""
        return [self.live[h].request for h in handles]

    # -- the outbox ------------------------------------------------------------------------------------------------
    def has_output(self) -> bool:
        """Tokens or results wait in the outbox (an abort's, between steps)."""
        return bool(self._out_ids or self._finished or self._out_prompt_lp)

    def take_output(self, ran: bool) -> StepOutput:
        """What was emitted and finished since the last call, handed over."""
        if not self._out_ids:
            ids, tokens = _NO_IDS, _NO_TOKENS
        elif len(self._out_ids) == 1:
            ids, tokens = self._out_ids[0], self._out_tokens[0]
        else:
            ids, tokens = np.concatenate(self._out_ids), np.concatenate(self._out_tokens)
        if self._out_lp:
            lp = self._out_logprobs()
            out = StepOutput(ids, tokens, tuple(self._finished), ran, lp.logprob, lp.top_ids, lp.top_logprobs)
        else:
            out = StepOutput(ids, tokens, tuple(self._finished), ran)
        if self._out_prompt_lp:
            out = attrs.evolve(out, prompt_logprobs=tuple(self._out_prompt_lp))
            self._out_prompt_lp = []
        self._out_ids, self._out_tokens, self._out_lp, self._finished = [], [], [], []
        return out

    def _out_logprobs(self) -> TokenLogprobs:
        """The outbox's logprobs aligned with its tokens: each emit's that had them, NaN / -1 for the others'."""
        if len(self._out_ids) == 1:
            return self._out_lp[0][1]
        ends = np.cumsum([a.size for a in self._out_ids])
        n, K = int(ends[-1]), MAX_LOGPROBS
        out = TokenLogprobs(np.full(n, np.nan, np.float32), np.full((n, K), -1, np.int64),
                            np.full((n, K), np.nan, np.float32))  # fmt: skip
        for i, lp in self._out_lp:  # (a loop over the emits that had logprobs, not over tokens)
            at = slice(int(ends[i]) - lp.logprob.size, int(ends[i]))
            out.logprob[at], out.top_ids[at], out.top_logprobs[at] = lp.logprob, lp.top_ids, lp.top_logprobs
        return out


def _shown(lp: TokenLogprobs, k: int | np.ndarray) -> TokenLogprobs:
    """``lp`` (new arrays) with -1 / NaN past the k alternatives its request asked for (``k`` one for all, or [n]
    one a row; k < 0, asked for none: its logprob NaN too)."""
    k = np.asarray(k)
    hide = np.arange(MAX_LOGPROBS) >= k[..., None]  # [5], or [n, 5]
    return TokenLogprobs(np.where(k >= 0, lp.logprob, np.float32(np.nan)),
                         np.where(hide, -1, lp.top_ids), np.where(hide, np.float32(np.nan), lp.top_logprobs))


def _listed(lp: TokenLogprobs, k: int) -> tuple[tuple[float, ...], tuple[tuple[tuple[int, float], ...], ...]]:
    """A Result's logprobs: each token's, and its k most likely (id, logprob) pairs."""
    ids, vals = lp.top_ids[:, :k].tolist(), lp.top_logprobs[:, :k].tolist()
    return tuple(lp.logprob.tolist()), tuple(tuple(zip(i, v, strict=True)) for i, v in zip(ids, vals, strict=True))
