"""A simulated engine for planner tests: host streams with a page allocator, the pure planner, and the executor on the
CPU (kernel references by default) as the simulated device. Expected step buffers are computed here independently,
straight from the host streams, never through the planner or the kernels."""

from __future__ import annotations

import numpy as np

from resplan import (
    SAMPLER_CELLS,
    BucketPlan,
    Executor,
    Graph,
    HostStreams,
    KernelImpl,
    KVPool,
    ResidentStream,
    RowLayout,
    Step,
    StreamMode,
    build_planner,
    commit,
    mark_stale,
    plan,
    release,
    row_check,
)


def memmove_runtime(calls: list):
    """A stand-in for libcudart on the CPU (``resplan.held.HeldCuda(memmove_runtime(calls))``): cudaMemcpyAsync is a
    memmove between the host addresses it is given (CPU tensors' here), its (kind, bytes) appended to ``calls``; a
    launch or an event record does nothing."""
    import ctypes
    import types

    def copy(dst, src, nbytes, kind, stream):
        calls.append((kind, nbytes))
        ctypes.memmove(dst, src, nbytes)
        return 0

    return types.SimpleNamespace(cudaGraphLaunch=lambda *a: 0, cudaEventRecord=lambda *a: 0, cudaMemcpyAsync=copy,
                                 cudaGetErrorString=lambda rc: b"")  # fmt: skip


def qwen_like(page_size: int = 4, pages: int = 64, max_seq_len: int = 64) -> RowLayout:
    """One APPEND pool, positions on it, a recurrent slot, sampler cells."""
    return RowLayout((KVPool("kv", page_size, pages, max_seq_len),), "kv", recurrent=True, sampler=True)


def whisper_like(page_size: int = 4, pages: int = 64, max_seq_len: int = 48, ctx_len: int = 24) -> RowLayout:
    """An APPEND self pool with positions, and a READ cross pool."""
    return RowLayout(
        (KVPool("self", page_size, pages, max_seq_len), KVPool("cross", page_size, pages, ctx_len, StreamMode.READ)),
        "self",
        recurrent=False,
        sampler=False,
    )


def bucket_plans(layout: RowLayout, sizes) -> list[BucketPlan]:
    streams = {p.key: ResidentStream("decode", p.mode) for p in layout.pools}
    return [BucketPlan.build(b, streams, host_plan_free=True) for b in sizes]


def expected_buffers(layout: RowLayout, streams: HostStreams, handles: np.ndarray, bucket: int) -> dict:
    """What the gather must produce for these rows, from the host streams alone (padding rows: the trash row)."""
    out = {}
    n = handles.size
    for p in layout.pools:
        s = streams.kv[p.key]
        W = layout.span(p.key).width
        A = int(p.mode is StreamMode.APPEND)
        bt = np.zeros((bucket, W), np.int32)
        seq = np.full(bucket, A, np.int32)
        wl = np.zeros(bucket, np.int32)
        for r, h in enumerate(handles.tolist()):
            L = int(s.lengths[h])
            used = -(-(L + A) // p.page_size)
            bt[r, :used] = s.pages[h, :used]
            seq[r] = L + A
            if A:
                wl[r] = s.pages[h, L // p.page_size] * p.page_size + L % p.page_size
        out[f"block_table.{p.key}"] = bt
        out[f"seq_lens.{p.key}"] = seq
        if A:
            out[f"write_loc.{p.key}"] = wl
    if layout.positions_pool is not None:
        pos = np.zeros(bucket, np.int32)
        pos[:n] = streams.kv[layout.positions_pool].lengths[handles] + streams.pos_offset[handles]
        out["positions"] = pos
    if layout.recurrent:
        rec = np.zeros(bucket, np.int32)
        rec[:n] = streams.recurrent_slot[handles]
        out["recurrent_slots"] = rec
    if layout.sampler:
        sm = np.zeros((bucket, len(SAMPLER_CELLS)), np.int32)
        sm[:n] = streams.sampler[handles]
        out["sampler"] = sm
    return out


class SimEngine:
    """Host truth + planner + CPU executor. Each resident step: plan, flush, gather, compare, commit in graph,
    advance the host by the same rule; the planner's commit lags one step behind, as in a pipelined engine."""

    def __init__(self, layout: RowLayout, buckets, capacity: int = 32, impl=KernelImpl.REFERENCE, seed: int = 0,
                 device: str = "cpu", graphs: bool = False, held=None):
        self.layout = layout
        self.buckets = tuple(sorted(buckets))
        self.state = build_planner(layout, bucket_plans(layout, self.buckets), capacity)
        self.streams = HostStreams.zeros(layout, capacity)
        self.ex = Executor(layout, self.buckets, device, impl=impl, held=held)
        self.graphs = None
        if graphs:  # one captured step per bucket, largest first, one memory pool
            self.graphs, pool = {}, None
            for b in sorted(self.buckets, reverse=True):
                g = Graph(lambda b=b: (self.ex.before_forward(b), self.ex.after_forward(b)), self.ex.device, pool)
                self.graphs[b], pool = g, g.pool
        self.rng = np.random.default_rng(seed)
        self.free_pages = {p.key: list(range(1, p.num_pages)) for p in layout.pools}
        self.n_pages = {p.key: np.zeros(capacity, np.int64) for p in layout.pools}
        self.live: list[int] = []
        self.free_handles = list(range(capacity))
        self.seq = 0
        self.pending: int | None = None  # the planned step not yet committed
        self.steps = 0
        self.mismatches = 0
        self.displaced = 0
        self.whole_rows = 0
        self.crossings = 0
        self.programs: list = []

    # -- host truth --------------------------------------------------------------------------------------------
    def _ensure_pages(self, key: str, h: int, tokens: int) -> None:
        """Give handle h pages for its first ``tokens`` tokens."""
        p = self.layout.pool(key)
        need = min(-(-tokens // p.page_size), p.span_width)  # a full stream decodes no further
        s = self.streams.kv[key]
        while self.n_pages[key][h] < need:
            pool = self.free_pages[key]
            s.pages[h, self.n_pages[key][h]] = pool.pop(int(self.rng.integers(len(pool))))
            self.n_pages[key][h] += 1

    def _free_all_pages(self, h: int) -> None:
        for key in self.n_pages:
            s = self.streams.kv[key]
            self.free_pages[key].extend(s.pages[h, : self.n_pages[key][h]].tolist())
            s.pages[h, :] = 0
            self.n_pages[key][h] = 0
            s.lengths[h] = 0

    def admit(self, length: int, ctx: int = 5) -> int:
        """A prefilled request: ``length`` tokens stored in every APPEND pool, ``ctx`` in every READ pool."""
        h = self.free_handles.pop(0)
        for p in self.layout.pools:
            L = length if p.mode is StreamMode.APPEND else ctx
            self.streams.kv[p.key].lengths[h] = L
            self.streams.kv[p.key].epoch[h] += 1
            self._ensure_pages(p.key, h, L + (p.mode is StreamMode.APPEND))
        if self.streams.pos_offset is not None:
            self.streams.pos_offset[h] = self.rng.integers(0, 3)
        if self.streams.recurrent_slot is not None:
            self.streams.recurrent_slot[h] = h + 1
        if self.streams.sampler is not None:
            self.streams.sampler[h] = self.rng.integers(0, 1000, len(SAMPLER_CELLS))
        self.live.append(h)
        return h

    def room(self, h: int, extra: int = 1) -> bool:
        """Whether h can store ``extra`` more tokens (plus the next step's) within every APPEND span."""
        return all(
            self.streams.kv[p.key].lengths[h] + extra + 1 <= self.layout.span(p.key).width * p.page_size
            for p in self.layout.append_pools
        )

    def finish(self, h: int) -> None:
        self.state = release(self.state, h)
        self._free_all_pages(h)
        self.live.remove(h)
        self.free_handles.append(h)

    def offload(self, h: int) -> None:
        """Pages leave the device and come back elsewhere: the row must be written whole on its next step."""
        self.state = release(self.state, h)
        lengths = {p.key: int(self.streams.kv[p.key].lengths[h]) for p in self.layout.pools}
        self._free_all_pages(h)
        for p in self.layout.pools:
            self.streams.kv[p.key].lengths[h] = lengths[p.key]
            self.streams.kv[p.key].epoch[h] += 1
            self._ensure_pages(p.key, h, lengths[p.key] + (p.mode is StreamMode.APPEND))

    def host_step(self, handles: list[int], tokens: int, new_context: bool = False) -> None:
        """A host-planned (prefill chunk / mixed) step: APPEND streams grow by ``tokens``; maybe a new context."""
        self.seq += 1
        for h in handles:
            for p in self.layout.pools:
                s = self.streams.kv[p.key]
                if p.mode is StreamMode.APPEND:
                    s.lengths[h] += tokens
                    self._ensure_pages(p.key, h, int(s.lengths[h]) + 1)
                elif new_context:
                    self.free_pages[p.key].extend(s.pages[h, : self.n_pages[p.key][h]].tolist())
                    self.n_pages[p.key][h] = 0
                    s.lengths[h] = int(self.rng.integers(1, self.layout.span(p.key).width * p.page_size + 1))
                    s.epoch[h] += 1
                    self._ensure_pages(p.key, h, int(s.lengths[h]))
        self.state = mark_stale(self.state, np.asarray(handles, np.int64))
        self.commit_pending()
        self.state = commit(self.state, self.seq)

    def commit_pending(self) -> None:
        if self.pending is not None:
            self.state = commit(self.state, self.pending)
            self.pending = None

    # -- resident steps ----------------------------------------------------------------------------------------
    def bucket_for(self, n: int) -> int:
        return next(b for b in self.buckets if b >= n)

    def plan_only(self, handles: list[int]):
        """Plan and drop the result: an abandoned plan."""
        self.seq += 1
        h = np.asarray(handles, np.int64)
        return plan(self.state, Step(h, self.bucket_for(h.size), self.seq), self.streams)

    def resident_step(self, handles: list[int], check: bool = True, tokens: int = 1):
        """Plan, flush, replay (eagerly), compare buffers with the host, advance the host; commit the step before.
        ``tokens`` > 1: the rows' pages for that many tokens first, then that many sub-steps (gather, compare,
        commit: eager only), the host advancing by one after each."""
        self.seq += 1
        h = np.asarray(handles, np.int64)
        b = self.bucket_for(h.size)
        before = self.state
        for hh in handles:  # (a page for each token the step runs: the engine takes them with the step's crossings)
            for p in self.layout.append_pools:
                self._ensure_pages(p.key, hh, int(self.streams.kv[p.key].lengths[hh]) + tokens)
        self.state, program = plan(self.state, Step(h, b, self.seq, tokens), self.streams)
        self.commit_pending()  # the previous step commits while this one is planned
        self.ex.flush(program)
        for j in range(tokens):
            want = expected_buffers(self.layout, self.streams, h, b) if check else {}
            if self.graphs is not None:
                assert tokens == 1, "the sim's captured graphs run one token"
                self.graphs[b].replay()  # gather and commit in one replay; the buffers still hold the gathered rows
            else:
                self.ex.before_forward(b)  # (the staged cells' count is 0 after the first: nothing scattered again)
            got = {k: v.cpu().numpy() for k, v in self.ex.buffers[b].tensors().items()}
            for k, v in want.items():
                if not np.array_equal(got[k], v):
                    raise AssertionError(f"step {self.seq}.{j}: {k} differs\n got  {got[k]}\n want {v}")
            if self.graphs is None:
                self.ex.after_forward(b)
            for hh in handles:  # the host advances by the same rule as the graph
                for p in self.layout.append_pools:
                    s = self.streams.kv[p.key]
                    s.lengths[hh] += 1
                    self._ensure_pages(p.key, hh, int(s.lengths[hh]) + (1 if j == tokens - 1 else 0))
        if check:
            bad = row_check(self.ex.store_numpy(), self.state, h, self.streams, self.ex.buffers[b])
            self.mismatches += len(bad)
            assert not bad, f"step {self.seq}: row check {bad[:3]}"
        self.pending = self.seq
        self.steps += 1
        self.displaced += program.displaced.size
        self.whole_rows += program.rows_whole
        self.crossings += program.crossings
        return before, program
