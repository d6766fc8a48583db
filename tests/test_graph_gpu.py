"""resplan.Graph on a GPU: a workspace a captured step makes lazily per stream (the GEMV's split-K partials and
counts) is made by the warm-up on the capture stream, outside the capture. Made during the capture, it lived in the
graph's private pool, over memory that the graphs captured before it in that pool use for their intermediates: each of
their replays overwrote its counts, and the next split-K launch summed garbage (the resident engine's first decode
step after a larger bucket's replay, all its tokens wrong)."""

from __future__ import annotations

import pytest
import torch

from kernels.gemv import gemv
from resplan import Graph

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _fresh_stream() -> torch.cuda.Stream:
    """A CUDA stream of its own (not one of torch's pooled streams, which earlier work may have made workspaces for)."""
    handle = torch.zeros(1, dtype=torch.int64)
    torch.cuda.cudart().cudaStreamCreate(handle.data_ptr())
    return torch.cuda.ExternalStream(int(handle.item()))


def test_split_k_graphs_survive_replays_of_a_graph_captured_before_them_in_their_pool():
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    M, N, K = 16, 1024, 2048  # a shape whose configured GEMV splits K (GEMV_CONFIGS[16, 1024, 2048])
    x = torch.randn(M, K, device=dev, generator=g).to(torch.bfloat16)
    w = (torch.randn(N, K, device=dev, generator=g) / K**0.5).to(torch.bfloat16)
    outs = [torch.empty(M, N, dtype=torch.bfloat16, device=dev) for _ in range(2)]
    small, large = torch.randn(1 << 16, device=dev, generator=g), torch.randn(1 << 21, device=dev, generator=g)
    sink_small, sink_large = torch.empty_like(small), torch.empty_like(large)

    def first() -> None:  # float32 intermediates of both of the allocator's block sizes, freed within the capture
        sink_small.copy_(small * 2.0 + 1.0)
        sink_large.copy_(large * 2.0 + 1.0)

    stream = _fresh_stream()
    a = Graph(first, dev, stream=stream)
    # two split-K graphs after it in its pool: where the workspace was made during the first one's capture, only that
    # graph's replays zeroed its counts, and the second read what ``a`` left there
    b, c = (Graph(lambda out=out: gemv(x, w, out=out, pdl=False), dev, pool=a.pool, stream=stream) for out in outs)
    want = (x.float() @ w.float().T).to(torch.bfloat16)
    for order in ((b, a, c), (a, c, b), (a, b, c)):
        for o in outs:
            o.zero_()
        for graph in order:
            graph.replay()
        torch.cuda.synchronize()
        for o in outs:
            torch.testing.assert_close(o, want, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(sink_small, small * 2.0 + 1.0)
