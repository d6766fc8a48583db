"""A step's prefill pass: every chunk of the step in one adapter call (eager, or replayed from a captured prefill
graph), the first token of each chunk that ends its prompt, and the host streams' lengths after it."""

from __future__ import annotations

import time
from functools import partial

import attrs
import numpy as np
import torch

from models.engine.adapters import Adapter, PrefillInput
from models.engine.prefill_graphs import PrefillGraphs
from models.engine.requests import Request
from models.engine.sampler import Sampler
from models.engine.scheduler import Chunk
from resplan import HostStreams, RowLayout


@attrs.frozen(slots=True)
class Prefilled:
    """What a prefill pass did: the handles whose prompts it ended and their first tokens ([m] int64 each), and its
    counters."""

    ended: np.ndarray
    first_tokens: np.ndarray
    prefill_passes: int
    prefill_chunks: int
    prefill_tokens: int
    prefill_ns: int  # wall time: inputs, the pass, first-token sampling and readback
    prefill_host_ns: int  # of which the host spent enqueueing them, until it waits for the first tokens
    prefill_gpu_ms: float  # the pass and first-token sampling on the GPU (CUDA events; with timing on), else 0


class Prefill:
    """Runs a step's prefill chunks (``run``); ``graphs`` > 0 keeps that many pass shapes captured (PrefillGraphs)."""

    def __init__(self, adapter: Adapter, model_state, sampler: Sampler, layout: RowLayout, streams: HostStreams,
                 n_pages: dict[str, np.ndarray], graphs: int, graph_tokens: int, device: torch.device,
                 timing: bool) -> None:  # fmt: skip
        self.adapter = adapter
        self.model_state = model_state
        self.sampler = sampler
        self.streams = streams
        self.n_pages = n_pages  # pages each handle holds, by pool (admission's)
        self.append_keys = tuple(p.key for p in layout.append_pools)
        self.read_keys = tuple(p.key for p in layout.read_pools)
        self.device = device
        self.graphs = (PrefillGraphs(partial(adapter.prefill_forward, model_state), device, graphs, graph_tokens)
                       if graphs else None)  # fmt: skip
        cuda = device.type == "cuda"
        self._timer = ((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                       if cuda and timing else None)  # fmt: skip

    def run(self, chunks: tuple[Chunk, ...], requests: list[Request]) -> Prefilled:
        """Run ``chunks`` (``requests[i]`` is chunk i's request) and sample the first token of each that ends its
        prompt; the chunks' APPEND lengths then cover what they ran (a request's first chunk also encodes its context
        into its READ pools, and sets their lengths)."""
        t0 = time.perf_counter_ns()
        timer = self._timer
        if timer is not None:
            timer[0].record()
        rows, tokens, host_ns = self._pass(chunks, requests)
        gpu_ms = 0.0
        if timer is not None:
            timer[1].record()
            timer[1].synchronize()
            gpu_ms = timer[0].elapsed_time(timer[1])
        return Prefilled(rows, tokens, 1, len(chunks), sum(c.n for c in chunks), time.perf_counter_ns() - t0, host_ns,
                         gpu_ms)  # fmt: skip

    def _pass(self, chunks: tuple[Chunk, ...], requests: list[Request]) -> tuple[np.ndarray, np.ndarray, int]:
        """The pass; returns the ended prompts' handles and first tokens, and the host time until the readback."""
        t0 = time.perf_counter_ns()
        st = self.streams
        if not chunks:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), 0
        inputs = []
        for chunk, req in zip(chunks, requests, strict=True):
            h, start, n = chunk.handle, chunk.start, chunk.n
            pages = {
                k: torch.from_numpy(st.kv[k].pages[h, : held[h]].astype(np.int64)).to(self.device)
                for k, held in self.n_pages.items()
            }
            if start == 0 and self.read_keys:
                self.adapter.encode(self.model_state, req, pages)
                for k, n_ctx in self.adapter.read_tokens(req).items():
                    st.kv[k].lengths[h] = n_ctx
                    st.kv[k].epoch[h] += 1
            inputs.append(PrefillInput(
                ids=torch.tensor(req.prompt[start : start + n], dtype=torch.int64, device=self.device),
                pages=pages,
                start=start,
                rec_slot=int(st.recurrent_slot[h]) if st.recurrent_slot is not None else 0,
                read_lens={k: int(st.kv[k].lengths[h]) for k in self.read_keys},
                pos_offset=int(st.pos_offset[h]),
            ))  # fmt: skip
        if self.graphs is None:
            logits = self.adapter.prefill_last(self.model_state, inputs)  # [R, V]
        else:
            logits = self.graphs.run(self.adapter.prefill_inputs(self.model_state, inputs))
        for chunk in chunks:
            for k in self.append_keys:
                st.kv[k].lengths[chunk.handle] = chunk.start + chunk.n
                st.kv[k].epoch[chunk.handle] += 1
        ends = [i for i, c in enumerate(chunks) if c.last]
        hs = np.array([chunks[i].handle for i in ends], np.int64)
        if not ends:
            return hs, np.zeros(0, np.int64), time.perf_counter_ns() - t0
        cells = torch.from_numpy(st.sampler[hs]).to(self.device)  # [m, 4]
        pos = [inputs[i].pos_offset + chunks[i].start + chunks[i].n - 1 for i in ends]
        drawn = self.sampler(logits[ends], cells, torch.tensor(pos, dtype=torch.int64, device=self.device))
        host_ns = time.perf_counter_ns() - t0
        return hs, drawn.cpu().numpy(), host_ns
