"""GPU time of a captured graph: the median over replays of the CUDA-event time around one ``replay()``."""

from __future__ import annotations

import statistics

import torch


def replay_us(graph, iters: int) -> float:
    """Median GPU microseconds of ``graph.replay()`` (a ``torch.cuda.CUDAGraph`` or ``resplan.Graph``)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(iters):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)
