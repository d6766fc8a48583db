"""resplan.Graph on a GPU: a workspace a captured step makes lazily per stream (the GEMV's split-K partials and
counts) is made by the warm-up on the capture stream, outside the capture. Made during the capture, it lived in the
graph's private pool, over memory that the graphs captured before it in that pool use for their intermediates: each of
their replays overwrote its counts, and the next split-K launch summed garbage (the resident engine's first decode
step after a larger bucket's replay, all its tokens wrong)."""

from __future__ import annotations

import itertools

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


def _interpreter_runs_during(calls, n: int = 200, rounds: int = 1) -> int:
    """How many times a thread that asks for the interpreter every 0.1 ms ran Python while ``calls()`` ran ``n``
    times in this one, with the switch interval at 1 s (so only a call that lets the interpreter go hands it over);
    with ``rounds`` > 1, up to that many runs of ``n`` calls, stopping after the first in which the thread ran (a
    control: on a machine busy with other test workers the waiting thread can miss a short hand-over)."""
    import sys
    import threading
    import time

    runs, stop, ready = [0], threading.Event(), threading.Event()

    def other() -> None:
        ready.set()
        while not stop.is_set():
            runs[0] += 1
            time.sleep(1e-4)

    interval = sys.getswitchinterval()
    t = threading.Thread(target=other, daemon=True)
    t.start()
    ready.wait()
    sys.setswitchinterval(1.0)
    try:
        before = runs[0]
        for _ in range(rounds):
            for _ in range(n):
                calls()
            if runs[0] > before:
                break
        during = runs[0] - before
    finally:
        sys.setswitchinterval(interval)
        stop.set()
        t.join()
    return during


def test_a_held_launch_and_record_do_what_torchs_do_and_keep_the_interpreter():
    """Graph.launch through resplan.held runs the captured work on the stream given, as replay() does; a pinned
    ring's completions recorded through it are waited on as torch's are (the readback is there when its entry comes
    round); neither lets the interpreter go, where torch's replay does (a thread waiting for it runs meanwhile)."""
    from resplan.held import HeldCuda
    from resplan.pinned import PinnedRing

    dev = torch.device("cuda")
    held = HeldCuda.load()
    assert held is not None, "torch's CUDA runtime should be a shared library here"
    x = torch.arange(4096, dtype=torch.float32, device=dev)
    y = torch.zeros_like(x)
    graph = Graph(lambda: y.copy_(y * 0.5 + x), dev)
    y.zero_()  # (the warm-up ran the step once)
    torch.cuda.synchronize()
    stream = _fresh_stream()
    ring = PinnedRing(2, lambda pinned: torch.zeros(4096, pin_memory=pinned), cuda=True, held=held)
    expect, seen = torch.zeros_like(x), {}  # seen: entry -> the y its readback holds once its launch is done
    with torch.cuda.stream(stream):
        for i in range(6):  # held launches and torch's replays alternated
            k, host = ring.take()  # waits for the readback made into this entry two launches ago
            if i >= 2:
                assert torch.equal(host, seen[k].cpu()), i
            graph.launch(held, stream.cuda_stream) if i % 2 else graph.replay()
            expect = expect * 0.5 + x
            host.copy_(y, non_blocking=True)
            ring.done(stream)
            seen[k] = expect.clone()
    stream.synchronize()
    assert torch.equal(y, expect)

    with torch.cuda.stream(stream):
        s = stream.cuda_stream
        held_runs = _interpreter_runs_during(lambda: (graph.launch(held, s), ring.done(stream)))
        torch_runs = _interpreter_runs_during(graph.replay, rounds=20)
    stream.synchronize()
    assert held_runs == 0, held_runs
    assert torch_runs > 0, "the probe should see torch's replay hand the interpreter over"


def test_the_raw_current_stream_is_torchs_and_a_ring_marks_its_copies_on_it():
    """current_raw_stream is the handle of torch's current stream, inside a stream context and out of it; a held
    ring's ``done_on`` marks the work queued on that handle (its entry is not handed out again before it is done)."""
    from resplan.held import HeldCuda, current_raw_stream
    from resplan.pinned import PinnedRing

    held = HeldCuda.load()
    assert held is not None, "torch's CUDA runtime should be a shared library here"
    dev = torch.cuda.current_device()
    stream = _fresh_stream()
    assert current_raw_stream(dev) == torch.cuda.current_stream(dev).cuda_stream
    ring = PinnedRing(1, lambda pinned: torch.zeros(1, pin_memory=pinned), cuda=True, held=held)
    x = torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        raw = current_raw_stream(dev)
        assert raw == stream.cuda_stream != torch.cuda.default_stream(dev).cuda_stream
        _, host = ring.take()
        torch.cuda._sleep(100_000_000)  # ~50 ms of spinning before the readback
        x.fill_(7.0)
        host.copy_(x, non_blocking=True)
        ring.done_on(raw)
        _, again = ring.take()  # waits for the copy marked on the stream
    assert again.item() == 7.0


def test_a_held_flush_writes_what_torchs_copies_write_and_keeps_the_interpreter():
    """The executor's flush through resplan.held on CUDA: after each flush (programs of new rows, whole-row runs,
    crossings and displacement) the store, slot rows and staging equal those of an executor flushing through torch;
    its flushes do not let the interpreter go, where torch's copies do."""
    import numpy as np
    from sim import SimEngine, qwen_like

    from resplan import Executor
    from resplan.held import HeldCuda

    held = HeldCuda.load()
    assert held is not None, "torch's CUDA runtime should be a shared library here"
    e = SimEngine(qwen_like(page_size=4, pages=256, max_seq_len=48), (1, 2, 4), capacity=16)  # (the CPU plans)
    rng = np.random.default_rng(1)
    hs = [e.admit(int(rng.integers(1, 12))) for _ in range(12)]  # more than the store's slots: displacement
    programs = []
    for i in range(48):
        rows = rng.permutation([h for h in hs if e.room(h)])[: 1 + i % 4].tolist()
        programs.append(e.resident_step(rows)[1])
    programs = [p for p in programs if not p.empty]
    assert sum(p.run_len.size for p in programs) and sum(p.staged_idx.size for p in programs) and e.displaced
    dev, reps = torch.device("cuda"), 4
    ring = reps * len(programs) + 1  # (no entry comes round in the probes: no wait that could let go)
    ours, torchs = (Executor(e.layout, e.buckets, dev, held=h, ring=ring) for h in (held, None))
    for p in programs:
        ours.flush(p)
        torchs.flush(p)
        torch.cuda.synchronize()
        assert torch.equal(ours.store, torchs.store) and torch.equal(ours.staging, torchs.staging)
        assert all(torch.equal(ours.slot_rows[b], torchs.slot_rows[b]) for b in e.buckets)
    assert ours.copies == torchs.copies > 0
    flushes = iter(programs * reps)
    assert _interpreter_runs_during(lambda: ours.flush(next(flushes)), len(programs) * reps) == 0
    flushes = itertools.cycle(programs * reps)
    assert _interpreter_runs_during(lambda: torchs.flush(next(flushes)), len(programs) * reps, rounds=20) > 0
