"""The executor: H2D counts per step, the stager sized at build, the Triton path, and captured graphs on the GPU."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from sim import SimEngine, memmove_runtime, qwen_like, whisper_like

from resplan import KernelImpl

TRITON_RUNS = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"


def test_a_steady_step_issues_no_h2d_and_a_crossing_step_exactly_one():
    e = SimEngine(qwen_like(page_size=4), (2,))
    a, b = e.admit(1), e.admit(2)
    e.resident_step([a, b])  # lengths 2, 3 after
    copies = e.ex.copies
    e.resident_step([a, b])  # 2 -> 3, 3 -> 4: no page opens
    assert e.ex.copies == copies
    e.resident_step([a, b])  # b stores 4: its next token opens page 1; a stores 3
    assert e.ex.copies == copies + 1


def test_the_stager_holds_the_largest_flush_without_growing():
    lay = qwen_like(page_size=4, pages=512, max_seq_len=64)
    e = SimEngine(lay, (1, 4))
    entries = e.ex._ring.entries

    def ring() -> list[int]:
        return [t.data_ptr() for st in entries for t in (st.slot, st.rows, st.stage)]

    before = ring()
    assert e.ex.stager_bytes == len(entries) * 4 * (4 + 4 * lay.width + 2 + 2 * e.ex.staging_cap)
    hs = [e.admit(lay.span("kv").width * 4 - 1) for _ in range(4)]  # full rows: every column used
    _, program = e.resident_step(hs)
    assert program.run_cells.size == 4 * lay.width
    assert ring() == before


@pytest.mark.parametrize("factory", [qwen_like, whisper_like], ids=["qwen-like", "whisper-like"])
def test_buffers_start_out_reading_the_trash_row(factory):
    """A bucket's buffers before any step (what a capture's warm-up runs over) hold what gathering an all-trash slot
    row writes: APPEND lengths 1, not 0 (an attention kernel may not guard an empty row)."""
    from resplan import Executor, StepBuffers

    lay = factory()
    fresh = StepBuffers.allocate(lay, 3)
    ex = Executor(lay, (3,), impl=KernelImpl.REFERENCE)
    ex.buffers[3].flat.fill_(-7)
    ex.before_forward(3)  # slot row all 0: every row the trash row
    for name, t in fresh.tensors().items():
        torch.testing.assert_close(t, ex.buffers[3].tensors()[name], rtol=0, atol=0, msg=name)
    assert all((fresh.seq_lens[p.key] == 1).all() for p in lay.append_pools)


def test_whole_rows_of_a_one_pool_node_are_one_h2d_each():
    e = SimEngine(qwen_like(), (4,))
    hs = [e.admit(5 + i) for i in range(3)]
    copies = e.ex.copies
    _, program = e.resident_step(hs)
    assert e.ex.copies - copies == 3 + 1  # three rows, one slot row
    assert program.h2d_copies == 4


@pytest.mark.parametrize("factory", [qwen_like, whisper_like], ids=["qwen-like", "whisper-like"])
def test_a_flush_by_raw_addresses_writes_what_torchs_copies_write(factory, monkeypatch):
    """``Executor(held=...)`` issues the flush's copies by raw address (cudaMemcpyAsync; here a memmove on the CPU
    tensors' addresses): a decode loop of new rows, whole-row runs, crossings and displacement, multi-token steps
    among them, gathers every step's buffers equal to the host's and leaves every row it read equal to the host,
    with every copy the executor counts made through the runtime, host to device."""
    import resplan.executor as executor_module
    from resplan.held import HeldCuda

    calls: list = []
    monkeypatch.setattr(executor_module, "current_raw_stream", lambda device: 0)  # (torch's asks CUDA)
    e = SimEngine(factory(page_size=4, pages=256, max_seq_len=48), (1, 2, 4), capacity=16,
                  held=HeldCuda(memmove_runtime(calls)))  # fmt: skip
    rng = np.random.default_rng(7)
    hs = [e.admit(int(rng.integers(1, 12))) for _ in range(12)]  # more than the store's 9 slots: displacement
    for i in range(60):
        k = 1 + i % 3
        rows = rng.permutation([h for h in hs if e.room(h, extra=k)])[: 1 + i % 4].tolist()
        if not rows:
            break
        e.resident_step(rows, tokens=k)
    assert e.mismatches == 0 and e.displaced > 0 and e.crossings > 0 and e.whole_rows > 0
    assert len(calls) == e.ex.copies > 0 and {kind for kind, _ in calls} == {1}  # cudaMemcpyHostToDevice


@pytest.mark.skipif(not TRITON_RUNS, reason="Triton needs CUDA or TRITON_INTERPRET=1")
@pytest.mark.parametrize("factory", [qwen_like, whisper_like], ids=["qwen-like", "whisper-like"])
def test_the_triton_kernels_drive_a_decode_loop_with_displacement(factory):
    e = SimEngine(factory(page_size=4, pages=128, max_seq_len=32), (1, 2), capacity=8, impl=KernelImpl.TRITON)
    rng = np.random.default_rng(3)
    hs = [e.admit(int(rng.integers(1, 12))) for _ in range(6)]
    for i in range(40):
        rows = rng.permutation([h for h in hs if e.room(h)])[: 1 + i % 2].tolist()
        e.resident_step(rows)
        if i % 9 == 4:
            e.host_step(rows[:1], tokens=1)
    assert e.displaced > 0 and e.crossings > 0 and e.mismatches == 0


@pytest.mark.parametrize("impl", [KernelImpl.REFERENCE, KernelImpl.TRITON], ids=["reference", "triton"])
@pytest.mark.parametrize("factory", [qwen_like, whisper_like], ids=["qwen-like", "whisper-like"])
def test_steps_of_several_tokens_stage_each_page_once_and_mirror_the_host(factory, impl):
    """Steps of 1-4 tokens a row (``Step.tokens``; page size 4), mixed with one-token steps, host-planned steps and
    displacement: after each sub-step's gather the buffers equal the host's, and after the step every row it read
    equals the host; each page a row opens is staged once, by the step whose tokens reach it."""
    if impl is KernelImpl.TRITON and not TRITON_RUNS:
        pytest.skip("Triton needs CUDA or TRITON_INTERPRET=1")
    e = SimEngine(factory(page_size=4, pages=256, max_seq_len=48), (1, 2, 4), capacity=16, impl=impl)
    rng = np.random.default_rng(5)
    hs = [e.admit(int(rng.integers(1, 12))) for _ in range(12)]  # more than the store's 9 slots: displacement
    key, opened = e.layout.append_pools[0].key, 0
    for i in range(60):
        k = int(rng.integers(1, 5))
        rows = rng.permutation([h for h in hs if e.room(h, extra=k)])[: 1 + i % 4].tolist()
        if not rows:
            break
        L = e.streams.kv[key].lengths[np.asarray(rows)]
        opened += int((-(-(L + k) // 4) - -(-L // 4)).sum())  # pages the step's tokens open
        e.resident_step(rows, tokens=k)
        if i % 11 == 6:
            e.host_step(rows[:1], tokens=1)
    assert e.mismatches == 0 and e.displaced > 0
    assert 0 < e.crossings <= opened  # (a row written whole carries its new page in its run, not as a crossing)


@pytest.mark.gpu
@pytest.mark.parametrize("held", [False, True], ids=["torch-copies", "held-copies"])
@pytest.mark.parametrize("factory", [qwen_like, whisper_like], ids=["qwen-like", "whisper-like"])
def test_captured_buckets_replay_hundreds_of_steps_of_changing_host_state(factory, held):
    """Capture each bucket once; then new rows, crossings, displacement, stale rows, offloads and padding, with
    every gathered buffer and every row the step read compared with the host each step. ``held``: the flushes'
    copies through resplan.held."""
    from resplan.held import HeldCuda

    assert torch.cuda.is_available()
    lay = factory(page_size=4, pages=512, max_seq_len=64)
    e = SimEngine(lay, (1, 2, 4, 8), capacity=40, impl=KernelImpl.TRITON, device="cuda", graphs=True,
                  held=HeldCuda.load() if held else None)  # fmt: skip
    rng = np.random.default_rng(0)
    for _ in range(24):
        e.admit(int(rng.integers(1, 20)))
    for i in range(600):
        live = [h for h in e.live if e.room(h)]
        for h in [h for h in e.live if not e.room(h)]:
            e.finish(h)
        while len(e.live) < 24:
            e.admit(int(rng.integers(1, 20)))
        rows = rng.permutation(live)[: int(rng.integers(1, 9))].tolist()
        if rows:
            e.resident_step(rows)
        if i % 17 == 3 and rows:
            e.host_step(rows[:2], tokens=int(rng.integers(0, 3)), new_context=bool(i % 2))
        if i % 23 == 5 and e.live:
            e.offload(e.live[int(rng.integers(len(e.live)))])
    print(f"\n{factory.__name__}: {e.steps} captured steps, {e.displaced} displaced, {e.whole_rows} rows whole, "
          f"{e.crossings} crossings, {e.mismatches} row-check mismatches")
    assert e.steps >= 500 and e.displaced > 0 and e.crossings > 0 and e.mismatches == 0


class _FlakyCapture:
    """A stand-in for ``torch.cuda.graph``: the first ``failures`` captures end invalidated, as CUDA reports it."""

    def __init__(self, failures: int) -> None:
        self.failures, self.calls, self.gc_during = failures, 0, []

    def __call__(self, graph, pool=None, stream=None, capture_error_mode=None):
        import contextlib
        import gc

        outer = self

        @contextlib.contextmanager
        def ctx():
            outer.calls += 1
            outer.gc_during.append(gc.isenabled())
            yield
            if outer.calls <= outer.failures:
                raise RuntimeError("CUDA error: operation failed due to a previous error during capture")

        return ctx()


def test_an_invalidated_capture_is_retried_once_with_a_warning_and_gc_paused():
    import gc

    from resplan import Graph

    runs = []
    flaky = _FlakyCapture(failures=1)
    with pytest.warns(RuntimeWarning, match="capturing again"):
        g = Graph._capture(lambda: runs.append(1), None, new_graph=object, capturing=flaky)
    assert g is not None and flaky.calls == 2 and len(runs) == 2
    assert flaky.gc_during == [False, False] and gc.isenabled()  # paused during capture, restored after


def test_a_capture_that_fails_twice_raises_and_other_errors_are_not_retried():
    import gc

    from resplan import Graph

    with pytest.warns(RuntimeWarning), pytest.raises(RuntimeError, match="during capture"):
        Graph._capture(lambda: None, None, new_graph=object, capturing=_FlakyCapture(failures=2))
    assert gc.isenabled()

    def broken():
        raise RuntimeError("shape mismatch")

    flaky = _FlakyCapture(failures=0)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        Graph._capture(broken, None, new_graph=object, capturing=flaky)
    assert flaky.calls == 1


class _Pool:
    """torch's stream pool as c10 has it: ``size`` streams handed out in turn."""

    def __init__(self, size: int) -> None:
        self.size, self.drawn = size, 0

    def __call__(self, device=None) -> str:
        self.drawn += 1
        return f"pool{(self.drawn - 1) % self.size}"


@pytest.mark.parametrize("drawn_before", [0, 1, 30, 31, 63])
def test_distinct_streams_never_hand_out_one_stream_twice_though_the_pool_wraps(drawn_before, monkeypatch):
    """Whatever was drawn before, the streams are pairwise distinct and none is the current stream or the default
    capture stream (here pool0, the first ever drawn)."""
    import resplan.graph as ex

    pool = _Pool(ex.POOL_STREAMS)
    monkeypatch.setattr(torch.cuda, "Stream", pool)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: "default")
    monkeypatch.setattr(torch.cuda.graph, "default_capture_stream", pool())
    for _ in range(drawn_before):
        pool()
    got = ex.distinct_streams(torch.device("cuda"), 3)
    assert len(set(got)) == 3 and not {"pool0", "default"} & set(got)


def test_distinct_streams_say_when_the_pool_cannot_give_them(monkeypatch):
    import resplan.graph as ex

    monkeypatch.setattr(torch.cuda, "Stream", _Pool(2))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: "pool0")
    monkeypatch.setattr(torch.cuda.graph, "default_capture_stream", None)
    with pytest.raises(RuntimeError, match="gave 1 of 2 distinct streams"):
        ex.distinct_streams(torch.device("cuda"), 2)


@pytest.mark.gpu
def test_torchs_pool_streams_wrap_and_distinct_streams_step_around_the_default_capture_stream():
    """The premise (a stream drawn POOL_STREAMS draws later is the same stream), then the helper on the real pool with
    the default capture stream one draw ahead."""
    import resplan.graph as ex

    dev = torch.device("cuda")
    first = torch.cuda.Stream(dev)
    assert [torch.cuda.Stream(dev) for _ in range(ex.POOL_STREAMS)][-1] == first
    if torch.cuda.graph.default_capture_stream is None:
        torch.cuda.graph.default_capture_stream = torch.cuda.Stream(dev)
    default = torch.cuda.graph.default_capture_stream
    assert default in [torch.cuda.Stream(dev) for _ in range(ex.POOL_STREAMS)]
    while torch.cuda.Stream(dev) != default:
        pass
    for _ in range(ex.POOL_STREAMS - 1):
        torch.cuda.Stream(dev)  # the next draw would be the default capture stream
    got = ex.distinct_streams(dev, 3)
    assert len(set(got)) == 3
    assert torch.cuda.graph.default_capture_stream not in got and torch.cuda.current_stream(dev) not in got


def test_the_pinned_ring_hands_its_entries_out_in_turn():
    """Entries built once by make(pinned), taken round-robin with their index; ``last`` names the one taken last (the
    one ``done`` marks). Off CUDA there are no events: waiting returns at once."""
    from resplan.pinned import PinnedRing

    built = []
    ring = PinnedRing(3, lambda pinned: built.append(pinned) or torch.zeros(2), cuda=False)
    assert built == [False] * 3 and len(ring) == 3
    taken = []
    for _ in range(7):
        i, entry = ring.take()
        assert entry is ring.entries[i] and ring.last == i
        ring.done()
        ring.wait(i)
        taken.append(i)
    assert taken == [0, 1, 2, 0, 1, 2, 0]
    with pytest.raises(ValueError):
        PinnedRing(0, lambda pinned: None, cuda=False)


def test_the_pinned_ring_synchronizes_only_on_an_event_still_pending():
    """A wait queries its entry's event first and synchronizes (which lets the interpreter go) only when the event has
    not completed: a step already done costs a busy host no hand-off of the interpreter."""
    from resplan.pinned import PinnedRing

    class Event:
        def __init__(self, done: bool) -> None:
            self.done, self.synced = done, 0

        def query(self) -> bool:
            return self.done

        def synchronize(self) -> None:
            self.synced += 1

    ring = PinnedRing(2, lambda pinned: None, cuda=False)
    ring._events = [Event(done=True), Event(done=False)]
    ring.wait(0)
    ring.wait(1)
    assert [e.synced for e in ring._events] == [0, 1]
