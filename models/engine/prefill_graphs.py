"""Captured prefill passes, one per input shape: a short prefill is launch-bound, not GPU-bound.

An eager pass of one 512-token prompt through Qwen3.5-0.8B launches ~3,900 kernels for ~13 ms of GPU work and takes
50-90 ms of host time; replayed from a CUDA graph it costs about its GPU time. A pass is capturable when the adapter
splits it into host-side inputs (``prefill_inputs``: an attrs record with ``key`` and ``tokens`` whose tensor fields,
nested records included, are the pass's inputs) and a forward with no host sync whose every shape follows from
``key`` (``prefill_forward``). Then:

* a key's first pass runs eagerly and is only remembered: under traffic of varied lengths most keys never come back,
  and a capture costs several eager passes (with prefill graphs captured at first sight, a benchmark of varied
  lengths ran 1.7-1.9x slower than with them off);
* its second pass runs eagerly too (its result is the answer; it also initialises what a capture must not: the Triton
  JIT, cuBLAS handles, lazily built tables) and is then captured over a private copy of its inputs;
* a later pass of that key copies its input tensors into the copy and replays: same kernels, same result;
* at most ``capacity`` keys are kept (least recently used evicted, its graph and pool freed), and the last
  ``remember`` keys seen once; passes of more than ``max_tokens`` tokens stay eager (GPU-bound already, and their
  captures would hold large pools).

The engine's passes are padded to token buckets (models.engine.prefill: a handful of shapes that always recur), and
it captures every bucket at build (``capture``); the first-and-second-sight rule above serves callers that run
passes of exact shapes.

On the CPU the "graph" is an eager replay of the same callable (``resplan.Graph``), so the copy-then-run path is tested
everywhere; only on CUDA does it save launches.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import attrs
import torch

from resplan import Graph, distinct_streams


@attrs.define
class PrefillGraphStats:
    """What the cache did: eager passes (no graph: too long, or a key's first or second), captures, replays,
    evictions."""

    eager: int = 0
    captures: int = 0
    replays: int = 0
    evictions: int = 0


@attrs.define
class _Captured:
    graph: Graph
    inputs: Any  # the batch record the graph reads: a private copy of the first batch of its key
    out: list  # [logits]: the graph's output tensor, rewritten by each replay


class PrefillGraphs:
    """``run(batch)`` = ``forward(batch)``, from a captured graph of ``batch.key`` where one is kept (module doc)."""

    def __init__(
        self,
        forward: Callable[[Any], torch.Tensor],
        device: torch.device | str,
        capacity: int,
        max_tokens: int,
        remember: int = 256,
        capture_stream: torch.cuda.Stream | None = None,
    ) -> None:
        if capacity < 1 or max_tokens < 1 or remember < 1:
            raise ValueError(f"prefill graphs need capacity, max_tokens and remember >= 1, got {capacity}, "
                             f"{max_tokens}, {remember}")  # fmt: skip
        self.forward = forward
        self.device = torch.device(device)
        self.capacity = capacity
        self.max_tokens = max_tokens
        self.remember = remember
        # the passes' own capture stream (None: one drawn apart from torch's default): a decode graph may replay
        # beside a pass (async_prefill), and graphs captured on one stream share its cuBLAS workspace (resplan.Graph)
        if capture_stream is None and self.device.type == "cuda":
            (capture_stream,) = distinct_streams(self.device, 1)
        self.capture_stream = capture_stream
        self.graphs: OrderedDict[Hashable, _Captured] = OrderedDict()
        self.seen: OrderedDict[Hashable, None] = OrderedDict()  # keys that ran once, not captured (LRU)
        self.stats = PrefillGraphStats()

    def run(self, batch) -> torch.Tensor:
        """The pass's logits [R, V]. A replay's output is the graph's own tensor: read it before the next ``run``."""
        if batch.tokens > self.max_tokens:
            self.stats.eager += 1
            return self.forward(batch)
        hit = self.graphs.get(batch.key)
        if hit is None:
            logits = self.forward(batch)  # the answer, and (seen before) the warm-up the capture needs
            self.stats.eager += 1
            if batch.key in self.seen:
                del self.seen[batch.key]
                self._capture(batch)
            else:
                self.seen[batch.key] = None
                if len(self.seen) > self.remember:
                    self.seen.popitem(last=False)
            return logits
        self.graphs.move_to_end(batch.key)
        for dst, src in zip(_tensors(hit.inputs), _tensors(batch), strict=True):
            dst.copy_(src, non_blocking=True)
        hit.graph.replay()
        self.stats.replays += 1
        return hit.out[0]

    def capture(self, batch) -> None:
        """Capture ``batch.key`` now (a shape known to recur, a token bucket's, at engine build): one eager pass over
        ``batch`` initialises what a capture must not (Triton's JIT and autotuning, cuBLAS handles), then the capture.
        The pass writes into the pools as any pass does: run it where they hold nothing yet."""
        if batch.key in self.graphs:
            return
        self.forward(batch)
        self.stats.eager += 1
        self.seen.pop(batch.key, None)
        self._capture(batch)

    def _capture(self, batch) -> None:
        if len(self.graphs) >= self.capacity:
            self.graphs.popitem(last=False)
            self.stats.evictions += 1
        inputs = _clone(batch)
        out: list = [None]

        def step() -> None:
            out[0] = self.forward(inputs)

        # warmup=0: the eager pass above was the warm-up; a second run would apply the pass to the state twice
        self.graphs[batch.key] = _Captured(Graph(step, self.device, warmup=0, stream=self.capture_stream), inputs, out)
        self.stats.captures += 1


def _tensors(record) -> list[torch.Tensor]:
    """An attrs record's tensor fields, nested records included, in declaration order (every input of its pass)."""
    out = []
    for f in attrs.fields(type(record)):
        v = getattr(record, f.name)
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif attrs.has(type(v)):
            out += _tensors(v)
    return out


def _clone(record):
    """A deep copy of an attrs record's tensors (nested records included); other fields shared."""
    changes = {}
    for f in attrs.fields(type(record)):
        v = getattr(record, f.name)
        if isinstance(v, torch.Tensor):
            changes[f.name] = v.clone()
        elif attrs.has(type(v)):
            changes[f.name] = _clone(v)
    return attrs.evolve(record, **changes)
