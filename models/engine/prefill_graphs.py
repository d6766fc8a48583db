"""Captured prefill passes, one per input shape: a short prefill is launch-bound, not GPU-bound.

An eager pass of one 512-token prompt through Qwen3.5-0.8B launches ~3,900 kernels for ~13 ms of GPU work and takes
50-90 ms of host time; replayed from a CUDA graph it costs about its GPU time. A pass is capturable when the adapter
splits it into host-side inputs (``prefill_inputs``: an attrs record with ``key`` and ``tokens`` whose tensor fields,
nested records included, are the pass's inputs) and a forward with no host sync whose every shape follows from
``key`` (``prefill_forward``). Then ``capture(batch)`` runs the batch eagerly once (the warm-up a capture needs: the
Triton JIT, cuBLAS handles, lazily built tables) and captures its key over a private copy of its inputs, and
``run(batch)`` of that key copies the batch's input tensors into the copy and replays: same kernels, same result. A
pass of any other key runs eagerly.

The engine pads its passes to token buckets (models.engine.prefill: a handful of shapes that always recur) and
captures every bucket when it is built; a pass longer than the largest bucket runs eagerly at its exact shape.

On the CPU the "graph" is an eager replay of the same callable (``resplan.Graph``), so the copy-then-run path is tested
everywhere; only on CUDA does it save launches.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from functools import partial
from typing import Any

import attrs
import torch

from resplan import Graph, distinct_streams, run_on


@attrs.define
class PrefillGraphStats:
    """What the graphs did: eager passes (a capture's warm-up, or a key not captured), captures, replays."""

    eager: int = 0
    captures: int = 0
    replays: int = 0


@attrs.define
class _Captured:
    graph: Graph
    inputs: Any  # the batch record the graph reads: a private copy of the batch it was captured from
    out: list  # [logits]: the graph's output tensor, rewritten by each replay


class PrefillGraphs:
    """``run(batch)`` = ``forward(batch)``, replayed from the graph captured for ``batch.key`` where there is one."""

    def __init__(self, forward: Callable[[Any], torch.Tensor], device: torch.device | str,
                 capture_stream: torch.cuda.Stream | None = None) -> None:  # fmt: skip
        self.forward = forward
        self.device = torch.device(device)
        # the passes' own capture stream (None: one drawn apart from torch's default): a decode graph may replay
        # beside a pass, and graphs captured on one stream share its cuBLAS workspace (resplan.Graph)
        if capture_stream is None and self.device.type == "cuda":
            (capture_stream,) = distinct_streams(self.device, 1)
        self.capture_stream = capture_stream
        self.graphs: dict[Hashable, _Captured] = {}
        self.stats = PrefillGraphStats()

    def run(self, batch) -> torch.Tensor:
        """The pass's logits [R, V]. A replay's output is the graph's own tensor: read it before the next ``run``."""
        hit = self.graphs.get(batch.key)
        if hit is None:
            self.stats.eager += 1
            return self.forward(batch)
        for dst, src in zip(_tensors(hit.inputs), _tensors(batch), strict=True):
            dst.copy_(src, non_blocking=True)
        hit.graph.replay()
        self.stats.replays += 1
        return hit.out[0]

    def capture(self, batch) -> torch.Tensor:
        """Run ``batch`` eagerly (its logits are returned) and capture its key, unless it has a graph already. The
        pass writes into the pools as any pass does: capture where they hold nothing yet."""
        # on the capture stream, so that its per-stream workspaces are made here and not during the capture (Graph)
        logits = run_on(self.capture_stream, partial(self.forward, batch))
        self.stats.eager += 1
        if batch.key in self.graphs:
            return logits
        inputs = _clone(batch)
        out: list = [None]

        def step() -> None:
            out[0] = self.forward(inputs)

        # warmup=0: the eager pass above was the warm-up; a second run would apply the pass to the state twice
        self.graphs[batch.key] = _Captured(Graph(step, self.device, warmup=0, stream=self.capture_stream), inputs, out)
        self.stats.captures += 1
        return logits


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
