"""A step's prefill pass: every chunk of the step in one adapter call (eager, or replayed from a captured prefill
graph) and the first token of each chunk that ends its prompt. With the decode rows in the pass
(``PrefillPlacement.IN_PASS``), each decode row rides in it as a one-token sequence at its stream's end and is sampled
as a decode step samples it. When a drawn row's request asks for logprobs, every drawn row's logprobs come back with
the tokens (``sampler.logprobs``, as the LOGPROBS decode graph computes them). The pass reads the host streams; the
lengths it adds are admission's to write (``Admission.prefilled``, from the chunks and the contexts the pass
encoded).

``launch`` enqueues a pass and returns it in flight (``PassInFlight``): with a CUDA ``stream`` its work goes there,
after everything queued on the caller's stream so far (pages and slots given back by requests whose last decode step
is still running), and its first tokens come back into pinned memory behind an event; ``land`` waits for that event
(``ready`` says whether it would wait) and makes the caller's stream wait for it too. ``run`` is
``land(launch(...))``: a pass inside its step. Beside the decode steps (``PrefillPlacement.BESIDE``) the part holds
the one pass in flight itself: ``launch_beside`` launches it on the passes' stream, ``land_beside`` lands it once it
has finished (or, asked to wait, in any case)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from functools import partial

import attrs
import numpy as np
import torch

from kernels.choices import DEFAULT, KernelChoices
from models.engine.adapters import Adapter, PrefillInput
from models.engine.prefill_graphs import PrefillGraphs
from models.engine.requests import MAX_LOGPROBS, Request, TokenLogprobs
from models.engine.sampler import Sampler
from models.engine.scheduler import Chunk
from models.engine.stats import Counts
from models.layers.flat import device_array
from resplan import HostStreams, RowLayout
from resplan.layout import SamplerCell
from resplan.pinned import host_zeros


@attrs.frozen(slots=True)
class PassCounts(Counts):
    """What a prefill pass cost."""

    prefill_passes: int = 0
    prefill_chunks: int = 0
    prefill_tokens: int = 0
    prefill_ns: int = 0  # wall time from its launch (inputs, the pass, first-token sampling) until its readback landed
    prefill_host_ns: int = 0  # of which the host spent enqueueing them, until it waits for the first tokens
    prefill_gpu_ms: float = 0.0  # the pass and first-token sampling on the GPU (CUDA events; with timing on), else 0


@attrs.frozen(eq=False)
class Scored:
    """A chunk's prompt tokens scored (``SamplingParams.prompt_logprobs``): those at prompt positions ``at`` ..
    ``at`` + m - 1, each given the tokens before it (log_softmax of the logits one position earlier, float32)."""

    handle: int
    at: int
    logprobs: TokenLogprobs  # [m]


@attrs.frozen(eq=False)
class Prefilled:
    """A landed pass: its chunks, the handles whose prompts it ended and their first tokens ([m] int64 each), the
    tokens of the decode rows that rode in it, and what it cost; with the drawn tokens' logprobs when a drawn row's
    request asked for them (else None)."""

    chunks: tuple[Chunk, ...]
    ended: np.ndarray
    first_tokens: np.ndarray
    decoded: np.ndarray  # [r] int64: the tokens of the decode rows that rode in the pass, in their order
    counts: PassCounts
    first_lp: TokenLogprobs | None = None  # [m]
    decoded_lp: TokenLogprobs | None = None  # [r]
    scored: tuple[Scored, ...] = ()  # the prompt tokens it scored, for the chunks whose requests ask


@attrs.frozen(eq=False)
class PassInFlight:
    """A launched pass whose first tokens the host has not read yet: its chunks and the contexts its first chunks
    encoded (tokens by READ pool, for ``Admission.prefilled``), the ended prompts' handles ([m] int64), how many
    drawn tokens land in the pinned readback (m, then the decode rows'), whether their logprobs do too, the event
    recorded after it on its stream (None on a CPU: the pass ran at launch), and its timings so far."""

    chunks: tuple[Chunk, ...]
    contexts: tuple[dict[str, int], ...]
    ended: np.ndarray
    n_drawn: int
    done: torch.cuda.Event | None
    t0: int  # perf_counter_ns at launch
    host_ns: int  # the host's time enqueueing it
    logprobs: bool = False
    scored: tuple[tuple[int, int, tuple[torch.Tensor, ...]], ...] = ()  # (handle, at, its [m] logprobs on the device)

    def ready(self) -> bool:
        """Whether ``Prefill.land`` would return without waiting for the device."""
        return self.done is None or self.done.query()


Saves = Sequence[tuple[int, int]]  # a chunk's recurrent-state saves: (stream position, slot) each
SCORE_ROWS = 256  # prompt positions scored at once: [256, V] float32 logits (254 MB at Qwen3.5's vocabulary)
_NONE = np.zeros(0, np.int64)  # no handles, no tokens (read-only)
_NONE.flags.writeable = False


def token_buckets(graphs: int, graph_tokens: int, largest: int | None = None) -> tuple[int, ...]:
    """The prefill graphs' token buckets: ``graphs`` sizes halving down from ``graph_tokens`` (ascending; at least
    1 token each, duplicates dropped), none past the smallest that holds ``largest`` tokens (no pass holds more, so
    a larger bucket would never be replayed)."""
    buckets = sorted({max(1, graph_tokens >> i) for i in range(graphs)})
    if largest is not None:
        buckets = [b for b in buckets if b < largest] + [b for b in buckets if b >= largest][:1]
    return tuple(buckets)


class Prefill:
    """Runs a step's prefill chunks as one flat pass (models.layers.flat). With ``graphs`` > 0 a pass of at most
    ``graph_tokens`` tokens is padded to the smallest of ``token_buckets(graphs, graph_tokens, largest_pass)`` that
    holds it and replayed from that bucket's captured graph (PrefillGraphs); a longer pass runs eagerly at its exact
    shape.
    ``pass_stream``: the stream passes beside the decode steps run on (None: passes run in their step).
    ``largest_pass``: the most tokens a pass holds (``EngineConfig.largest_pass``; None: no bound), which bounds the
    buckets and the eager passes' warm-up."""

    def __init__(self, adapter: Adapter, model_state, sampler: Sampler, layout: RowLayout, streams: HostStreams,
                 n_pages: dict[str, np.ndarray], page_size: int, graphs: int, graph_tokens: int, max_chunks: int,
                 device: torch.device, timing: bool, kernels: KernelChoices = DEFAULT,
                 capture_stream: torch.cuda.Stream | None = None,
                 pass_stream: torch.cuda.Stream | None = None, largest_pass: int | None = None) -> None:  # fmt: skip
        self.adapter = adapter
        self.kernels = kernels  # the pass's kernel forms (prefill kernels, row-wise fusion)
        self.model_state = model_state
        self.sampler = sampler
        self.streams = streams
        self.n_pages = n_pages  # pages each handle holds, by pool (admission's)
        self.append_keys = tuple(p.key for p in layout.append_pools)
        self.read_keys = tuple(p.key for p in layout.read_pools)
        self.positions_key = layout.positions_pool or (self.append_keys[0] if self.append_keys else None)  # position
        self.device = device
        self.buckets = token_buckets(graphs, graph_tokens, largest_pass) if graphs else ()
        self.graphs = (PrefillGraphs(partial(adapter.prefill_forward, model_state), device, capture_stream)
                       if graphs else None)  # fmt: skip
        self.max_chunks = max_chunks  # chunks a pass holds at most: one a running request
        if self.graphs is not None:
            self._capture_buckets(page_size)
        # the eager passes' first-use tuning, before any request can pay for it
        self.warmed = (adapter.prefill_warm_sizes(largest_pass, self.buckets, kernels) if largest_pass is not None
                       else ())  # fmt: skip
        for tokens in self.warmed:
            adapter.prefill_last(model_state, [self._dummy(tokens, page_size)], kc=kernels)
        cuda = device.type == "cuda"
        self._timer = ((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                       if cuda and timing else None)  # fmt: skip
        # the drawn tokens' readback: a pass draws at most one token a chunk and one a decode row riding in it
        self._drawn = host_zeros(2 * max_chunks, torch.int64, cuda)  # [2 * max_chunks]
        self._drawn_np = self._drawn.numpy()
        D, K = 2 * max_chunks, MAX_LOGPROBS
        self._drawn_lp = (host_zeros(D, torch.float32, cuda), host_zeros(D * K, torch.int64, cuda).view(D, K),
                          host_zeros(D * K, torch.float32, cuda).view(D, K))  # [D], [D, 5], [D, 5]: their logprobs
        self._drawn_lp_np = TokenLogprobs(*(t.numpy() for t in self._drawn_lp))
        self.pass_stream = pass_stream
        self._in_flight: PassInFlight | None = None  # beside the decode steps: the pass launched and not landed

    @property
    def in_flight(self) -> PassInFlight | None:
        """The pass beside the decode steps launched and not landed, if any."""
        return self._in_flight

    def _capture_buckets(self, page_size: int) -> None:
        """Every token bucket's graph captured at build, as the decode graphs are, over a dummy chunk (``_dummy``)."""
        for tokens in self.buckets:
            shape = self.adapter.prefill_shape(self.model_state, tokens, self.max_chunks)
            self.graphs.capture(self.adapter.prefill_inputs(self.model_state, [self._dummy(tokens, page_size)], shape,
                                                            kc=self.kernels))  # fmt: skip

    def _dummy(self, tokens: int, page_size: int) -> PrefillInput:
        """A chunk of ``tokens`` tokens for the passes run at build: on the sink page and recurrent slot 1, which no
        request holds yet (a fresh chunk reads its slot as zeros, so what the dummy leaves there is never read)."""
        return PrefillInput(ids=np.zeros(tokens, np.int64),
                            pages={k: np.zeros(-(-tokens // page_size), np.int64) for k in self.n_pages},
                            start=0, rec_slot=1, read_lens={}, pos_offset=0)  # fmt: skip

    def run(self, chunks: tuple[Chunk, ...], requests: list[Request], rows: np.ndarray = _NONE,
            row_ids: np.ndarray = _NONE, rows_logprobs: bool = False,
            saves: Sequence[Saves] = ()) -> tuple[PassInFlight, Prefilled]:  # fmt: skip
        """Run ``chunks`` (``requests[i]`` is chunk i's request) in the step, and sample the first token of each that
        ends its prompt (a request's first chunk also encodes its context into its READ pools). ``rows``: decode
        rows riding in the pass, row i one token ``row_ids[i]`` at its stream's end, sampled at that position
        (``Prefilled.decoded``; ``rows_logprobs``: a row's request asks for logprobs). Returns the pass as launched
        (its chunks and contexts, for admission) and landed. ``saves[i]``: chunk i's recurrent-state saves
        (``PrefillInput.saves``; default none)."""
        p = self.launch(chunks, requests, rows, row_ids, rows_logprobs=rows_logprobs, saves=saves)
        return p, self.land(p)

    def mark(self) -> torch.cuda.Event | None:
        """An event recorded on the caller's stream now (None on a CPU): a pass launched later with it as ``after``
        waits for the work queued so far, and not for what the caller queues in between."""
        if self.device.type != "cuda":
            return None
        event = torch.cuda.Event()
        event.record()
        return event

    def launch(self, chunks: tuple[Chunk, ...], requests: list[Request], rows: np.ndarray = _NONE,
               row_ids: np.ndarray = _NONE, stream: torch.cuda.Stream | None = None,
               rows_logprobs: bool = False, saves: Sequence[Saves] = (),
               after: torch.cuda.Event | None = None) -> PassInFlight:  # fmt: skip
        """Enqueue ``run``'s pass (on ``stream`` when given, after ``after`` (``mark``), else after the caller's
        stream's work so far) and return it in flight. One pass in flight at a time: its readback buffer and timer
        are this object's."""
        t0 = time.perf_counter_ns()
        if stream is None:
            return self._launch(chunks, requests, rows, row_ids, rows_logprobs, t0, saves)
        if after is not None:
            stream.wait_event(after)
        else:
            stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            return self._launch(chunks, requests, rows, row_ids, rows_logprobs, t0, saves)

    def land(self, p: PassInFlight) -> Prefilled:
        """Wait for ``p``'s first tokens (the caller's stream then also waits for its pass) and return what it did."""
        if p.done is not None:
            p.done.synchronize()
            torch.cuda.current_stream(self.device).wait_event(p.done)
        gpu_ms = 0.0
        if self._timer is not None:
            self._timer[1].synchronize()
            gpu_ms = self._timer[0].elapsed_time(self._timer[1])
        drawn = self._drawn_np[: p.n_drawn].copy()
        m = p.ended.size
        scored = tuple(Scored(h, at, TokenLogprobs(*(t.cpu().numpy() for t in lp))) for h, at, lp in p.scored)
        counts = PassCounts(1, len(p.chunks), sum(c.n for c in p.chunks), time.perf_counter_ns() - p.t0, p.host_ns,
                            gpu_ms)  # fmt: skip
        if not p.logprobs:
            return Prefilled(p.chunks, p.ended, drawn[:m], drawn[m:], counts, scored=scored)
        lp = self._drawn_lp_np[: p.n_drawn].copy()
        return Prefilled(p.chunks, p.ended, drawn[:m], drawn[m:], counts, lp[:m], lp[m:], scored)

    def launch_beside(self, chunks: tuple[Chunk, ...], requests: list[Request], saves: Sequence[Saves] = (),
                      after: torch.cuda.Event | None = None) -> PassInFlight:  # fmt: skip
        """Launch the chunks' pass on the passes' stream (after ``after``, ``launch``) and hold it in flight (its
        requests stay PREFILLING until it lands); returns it, for admission."""
        assert self._in_flight is None, "one pass in flight at a time: land it first"
        self._in_flight = self.launch(chunks, requests, stream=self.pass_stream, saves=saves, after=after)
        return self._in_flight

    def land_beside(self, wait: bool) -> Prefilled | None:
        """The pass in flight, landed, if it has finished (``wait``: in any case); None when there is none, or it
        still runs."""
        p = self._in_flight
        if p is None or not (wait or p.ready()):
            return None
        self._in_flight = None
        return self.land(p)

    def _launch(self, chunks, requests, rows, row_ids, rows_logprobs: bool, t0: int, saves) -> PassInFlight:
        timer = self._timer
        if timer is not None:
            timer[0].record()
        ended, contexts, drawn, lp, host_ns, scored = self._pass(chunks, requests, rows, row_ids, rows_logprobs, saves)
        if timer is not None:
            timer[1].record()
        n = 0 if drawn is None else drawn.numel()
        if n:
            self._drawn[:n].copy_(drawn, non_blocking=True)
        if lp is not None:
            for dst, src in zip(self._drawn_lp, lp, strict=True):
                dst[:n].copy_(src, non_blocking=True)
        done = None
        if self.device.type == "cuda":
            done = torch.cuda.Event()
            done.record()
        return PassInFlight(tuple(chunks), contexts, ended, n, done, t0, host_ns, lp is not None, scored)

    def _input(self, h: int, ids: np.ndarray, start: int, read_lens: dict[str, int] | None = None,
               saves: tuple[tuple[int, int], ...] = ()) -> PrefillInput:  # fmt: skip
        """Handle h's tokens ``ids`` at stream positions start .. start + len(ids) - 1, on the pages it holds.
        ``read_lens``: its READ pools' lengths (default: the streams'; a first chunk's context is not on them yet).
        ``saves``: the recurrent-state saves the pass takes for it (``PrefillInput.saves``)."""
        st = self.streams
        return PrefillInput(
            ids=ids,
            pages={k: st.kv[k].pages[h, : held[h]] for k, held in self.n_pages.items()},  # host rows, not copied
            start=start,
            rec_slot=int(st.recurrent_slot[h]) if st.recurrent_slot is not None else 0,
            read_lens=read_lens if read_lens is not None else {k: int(st.kv[k].lengths[h]) for k in self.read_keys},
            pos_offset=int(st.pos_offset[h]),
            saves=saves,
        )  # fmt: skip

    def _pass(self, chunks: tuple[Chunk, ...], requests: list[Request], rows: np.ndarray, row_ids: np.ndarray,
              rows_logprobs: bool, saves: Sequence[Saves] = (),
              ) -> tuple[np.ndarray, tuple[dict, ...], torch.Tensor | None, tuple | None, int, tuple]:  # fmt: skip
        """The pass, enqueued; returns the ended prompts' handles, each chunk's context (tokens by READ pool, encoded
        by a first chunk; empty otherwise), the tokens drawn on the device ([m + r] int64: the ended prompts' first
        tokens, then the decode rows'; None when nothing was drawn), their logprobs when a drawn row's request asks
        for them (``sampler.logprobs``: [m + r], [m + r, 5], [m + r, 5]; else None), the host time it took, and the
        prompt tokens it scored for the chunks whose requests ask (``_score``; a pass with such a chunk runs eagerly,
        at its exact shape, to keep every token's hidden state)."""
        t0 = time.perf_counter_ns()
        st = self.streams
        if not chunks and not rows.size:
            return _NONE, (), None, None, 0, ()
        inputs, contexts = [], []
        for i, (chunk, req) in enumerate(zip(chunks, requests, strict=True)):
            h, start, n = chunk.handle, chunk.start, chunk.n
            context = {}
            if start == 0 and self.read_keys:
                pages = {k: st.kv[k].pages[h, : held[h]] for k, held in self.n_pages.items()}
                self.adapter.encode(self.model_state, req, {
                    k: torch.from_numpy(v.astype(np.int64)).to(self.device) for k, v in pages.items()})  # fmt: skip
                context = self.adapter.read_tokens(req)
            contexts.append(context)
            ids = np.asarray(req.prompt[start : start + n], np.int64)
            inputs.append(self._input(h, ids, start, context if start == 0 and self.read_keys else None,
                                      tuple(saves[i]) if saves else ()))  # fmt: skip
        lengths = st.kv[self.positions_key].lengths
        for h, tok in zip(rows.tolist(), row_ids.tolist(), strict=True):  # one token each: at most max_running
            inputs.append(self._input(h, np.array([tok], np.int64), int(lengths[h])))
        tokens = sum(len(x.ids) for x in inputs)
        scoring = [i for i, req in enumerate(requests) if req.sampling.prompt_logprobs is not None]
        scored = ()
        if scoring:
            batch = self.adapter.prefill_inputs(self.model_state, inputs, kc=self.kernels)
            with torch.inference_mode():
                hidden = self.adapter.prefill_hidden(self.model_state, batch)  # [N, hidden]
                logits = self.adapter.logits(self.model_state, hidden[batch.last])  # [S - 2, V]
                scored = self._score(hidden, [len(x.ids) for x in inputs], chunks, requests, scoring)
        elif self.graphs is None:
            logits = self.adapter.prefill_last(self.model_state, inputs, kc=self.kernels)  # [R, V]
        else:
            bucket = next((b for b in self.buckets if b >= tokens), None)
            shape = None if bucket is None else self.adapter.prefill_shape(self.model_state, bucket, self.max_chunks)
            logits = self.graphs.run(self.adapter.prefill_inputs(self.model_state, inputs, shape, kc=self.kernels))
        ends = [i for i, c in enumerate(chunks) if c.last]
        hs = np.array([chunks[i].handle for i in ends], np.int64)
        drawn_at = ends + list(range(len(chunks), len(inputs)))  # the ended chunks, then the decode rows
        if not drawn_at:
            return hs, tuple(contexts), None, None, time.perf_counter_ns() - t0, scored
        cells_h = st.sampler[np.concatenate([hs, rows])]  # [m + r, len(SamplerCell)]
        picked = logits[device_array(np.array(drawn_at, np.int64), self.device)]  # [m + r, V]
        asks = rows_logprobs or any(requests[i].sampling.logprobs is not None for i in ends)
        plain = not cells_h[:, SamplerCell.TEMPERATURE].any() and not cells_h[:, SamplerCell.MIN_POSITION].any()
        if not asks and plain:  # every drawn row greedy, none asking for logprobs, none under a min_tokens: the
            drawn = picked.argmax(-1)  # argmax, as a greedy decode graph takes it (H200, 32 rows: 25 us, the
            return hs, tuple(contexts), drawn, None, time.perf_counter_ns() - t0, scored  # sampler 380; bench.sampler)
        pos = [inputs[i].pos_offset + inputs[i].start + len(inputs[i].ids) - 1 for i in drawn_at]
        cells_d, pos_d = device_array(cells_h, self.device), device_array(np.array(pos, np.int64), self.device)
        drawn, lp = (self.sampler.draw_logprobs(picked, cells_d, pos_d) if asks
                     else (self.sampler(picked, cells_d, pos_d), None))  # fmt: skip
        return hs, tuple(contexts), drawn, lp, time.perf_counter_ns() - t0, scored

    def _score(self, hidden: torch.Tensor, lens: list[int], chunks: tuple[Chunk, ...], requests: list[Request],
               scoring: list[int]) -> tuple[tuple[int, int, tuple[torch.Tensor, ...]], ...]:  # fmt: skip
        """The prompt tokens that chunks ``scoring`` (indices) predict, scored on the device: chunk i's token j (prompt
        position start + j) gives prompt token start + j + 1 its logprob and the MAX_LOGPROBS most likely there
        (``hidden``: the pass's [N, hidden], the chunks' tokens back to back, ``lens`` long; the prompt's last token
        predicts the first generated one, which the sampler draws). Returns (handle, first position scored, ([m]
        float32, [m, 5] int64, [m, 5] float32)) a chunk that predicts any."""
        out, starts = [], np.cumsum([0, *lens])
        for i in scoring:
            c, prompt = chunks[i], requests[i].prompt
            m = min(c.n, len(prompt) - c.start - 1)
            if m <= 0:
                continue
            targets = device_array(np.asarray(prompt[c.start + 1 : c.start + 1 + m], np.int64), self.device)
            parts = []
            for a in range(0, m, SCORE_ROWS):  # ([SCORE_ROWS, V] logits at a time)
                h = hidden[int(starts[i]) + a : int(starts[i]) + min(a + SCORE_ROWS, m)]
                ls = torch.log_softmax(self.adapter.logits(self.model_state, h).float(), dim=-1)  # [rows, V]
                top = ls.topk(MAX_LOGPROBS, dim=-1)
                parts.append((ls.gather(1, targets[a : a + h.shape[0], None])[:, 0], top.indices, top.values))
            out.append((c.handle, c.start + 1, tuple(torch.cat(t) for t in zip(*parts, strict=True))))
        return tuple(out)
