"""The prefix cache (models/engine/prefix_cache.py): tokens with the cache equal tokens without it over random traces
of shared prefixes and multi-turn chats (greedy and seeded sampling, aborts, KV pressure with offloads and evictions,
a checkpoint pool small enough to evict), with every page and checkpoint accounted for after every step; a
checkpoint equals the state recomputed from its tokens; hits at every prompt length from one page up; a machine over
the page references and the checkpoint pool."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from models.engine import Engine, EngineConfig, PrefillPlacement, Request, SamplingParams, build_adapter
from models.engine.compare import check_pools
from models.engine.prefix_cache import ROOT, Checkpoint, Checkpoints, PageRefs, chain_keys

QWEN = build_adapter("qwen3_5-tiny", seed=0)
BASE = EngineConfig(page_size=4, max_seq_len=160, max_running=3, row_check=True)
CACHE = dict(prefix_cache=True, checkpoints=5, checkpoint_interval=64)


def _sessions(seed: int, n: int = 7, turns: int = 3) -> list[dict]:
    """Random chats: some start with one of two shared prefixes (a system prompt), each turn a new message; some
    sample (seeded), some are aborted after a few steps (their chat ends there)."""
    rng = np.random.default_rng(seed)
    V = QWEN.vocab_size
    systems = [rng.integers(0, V, int(rng.integers(60, 90))).tolist() for _ in range(2)]
    out = []
    for i in range(n):
        sys_prompt = systems[int(rng.integers(0, 3)) - 1] if rng.random() < 0.7 else []
        msgs = [rng.integers(0, V, int(rng.integers(1, 12))).tolist() for _ in range(turns)]
        gens = [int(rng.integers(1, 8)) for _ in range(turns)]
        temp = 0.8 if rng.random() < 0.3 else 0.0
        abort_at = int(rng.integers(1, 4)) if rng.random() < 0.2 else None
        out.append(dict(id=i, system=sys_prompt, msgs=msgs, gens=gens, temp=temp, seed=int(rng.integers(1 << 30)),
                        abort_turn=int(rng.integers(0, turns)), abort_at=abort_at))  # fmt: skip
    return out


def _serve(cfg: EngineConfig, sessions: list[dict]) -> tuple[dict, Engine]:
    """Each chat's turns in order (a turn submitted when the one before finished, its prompt the whole history), all
    chats at once; every step's pools checked. Returns {(chat, turn): tokens} for turns that were not aborted."""
    eng = Engine(QWEN, cfg)
    hist = {s["id"]: list(s["system"]) for s in sessions}
    turn = dict.fromkeys(hist, 0)
    aborts: dict[str, int] = {}  # request id -> the step it is aborted at
    out, step = {}, 0

    def submit(s) -> None:
        t = turn[s["id"]]
        prompt = hist[s["id"]] + s["msgs"][t]
        rid = f"{s['id']}-{t}"
        sp = SamplingParams(max_tokens=s["gens"][t], temperature=s["temp"], seed=s["seed"] + t, ignore_eos=True)
        eng.submit(Request(tuple(prompt), sp, request_id=rid))
        hist[s["id"]] = prompt
        if s["abort_at"] is not None and t == s["abort_turn"]:
            aborts[rid] = step + s["abort_at"]

    by_id = {s["id"]: s for s in sessions}
    for s in sessions:
        submit(s)
    while eng.has_work():
        for rid in [r for r, at in aborts.items() if at == step]:
            eng.abort(rid)
        o = eng.step()
        step += 1
        check_pools(eng)
        for r in o.finished:
            c, t = (int(x) for x in r.request_id.split("-"))
            if r.request_id in aborts:
                continue  # (its chat ends: what it produced depends on when the abort came)
            out[(c, t)] = r.tokens
            hist[c] = hist[c] + list(r.tokens)
            turn[c] += 1
            if turn[c] < len(by_id[c]["msgs"]):
                submit(by_id[c])
        assert step < 5000
    return out, eng


CASES = {
    "in-step": dict(),
    "in-step-kv-pressure": dict(num_pages=60),  # offloads, and cached pages evicted for new ones
    "exact-pool": dict(num_pages=3 * 40 + 1),  # every request at the context (serving's size): tails evicted for rows
    "in-pass-chunked": dict(prefill=PrefillPlacement.IN_PASS, token_budget=40),
    "overlap-chunked": dict(overlap=True, token_budget=24),
    "overlap-k4": dict(overlap=True, tokens_per_launch=4),  # (a reply's stream runs past its end: no checkpoint)
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_tokens_with_the_cache_equal_tokens_without(case):
    cfg = attrs.evolve(BASE, **CASES[case])
    sessions = _sessions(seed=len(case))
    plain, _ = _serve(cfg, sessions)
    cached, eng = _serve(attrs.evolve(cfg, **CACHE), sessions)
    assert cached == plain
    s = eng.stats
    assert s.prefix_hits > 0 and s.prefix_cached_tokens > 0 and s.checkpoints_taken > 0
    assert s.checkpoints_evicted > 0  # the pool of 5 is smaller than what the chats checkpoint
    if case == "in-step-kv-pressure":
        assert s.cached_pages_evicted > 0
    if case == "overlap-k4":
        assert s.multi_token_steps > 0
    adm = eng.admission  # every request ended: the pages held are the checkpoints' tails, no more
    tails = sum(1 for ck in adm.checkpoints.lru.values() if ck.tail_page)
    assert sum(adm.refs.count) == tails and not adm.in_flight


def test_hits_at_every_prompt_length_from_one_page_up():
    """A prompt of L tokens, then the same prompt extended: the second restores the first's end (L tokens cached)."""
    rng = np.random.default_rng(3)
    cfg = attrs.evolve(BASE, **CACHE)
    for L in range(cfg.page_size, 3 * cfg.page_size + 2):
        eng = Engine(QWEN, cfg)
        x = rng.integers(0, QWEN.vocab_size, L).tolist()
        first = eng.run([Request(tuple(x), SamplingParams(max_tokens=1))])[0]
        longer = Request(tuple(x + [5, 6]), SamplingParams(max_tokens=3))
        second = eng.run([longer])[0]
        assert eng.stats.prefix_hits == 1 and eng.stats.prefix_cached_tokens == L, L
        assert second.tokens == Engine(QWEN, BASE).run([longer])[0].tokens
        assert first.tokens


def test_a_restore_under_kv_pressure_never_evicts_the_pages_it_shares():
    """A request restoring a prefix whose cached pages nobody holds, when the ring is short and older cached pages of
    its own prefix would be evicted first: it holds its shared pages before it takes new ones (else one of them is
    evicted and handed back to it for another column), and gives the tokens of an engine without the cache."""
    rng = np.random.default_rng(9)
    V = QWEN.vocab_size
    x, y, z = (rng.integers(0, V, n).tolist() for n in (16, 24, 20))
    cfg = attrs.evolve(BASE, max_running=2, max_seq_len=32, num_pages=17, prefill=PrefillPlacement.IN_STEP)

    def serve(c):
        eng = Engine(QWEN, c)
        for p in (x, y):  # their pages end cached, nobody holding them: x's the least recently let go
            eng.run([Request(tuple(p), SamplingParams(max_tokens=1))])
        eng.submit(Request(tuple(z), SamplingParams(max_tokens=12, ignore_eos=True), request_id="z"))
        eng.step()  # z holds its pages: the ring is short
        eng.submit(Request(tuple(x + list(range(7, 15))), SamplingParams(max_tokens=6, ignore_eos=True),
                           request_id="b"))  # fmt: skip
        out = {}
        while eng.has_work():
            for r in eng.step().finished:
                out[r.request_id] = r.tokens
            check_pools(eng)
        return out, eng

    plain, _ = serve(cfg)
    cached, eng = serve(attrs.evolve(cfg, **CACHE))
    assert eng.stats.prefix_hits == 1 and eng.stats.cached_pages_evicted > 0
    assert cached == plain


def test_an_offloaded_request_keeps_its_shared_pages_and_copies_the_rest():
    """A request that restored a prefix is offloaded mid-decode: its cached pages stay held (not copied), the others go
    to the host; it comes back with both where they were, and gives the tokens of an engine without the cache."""
    rng = np.random.default_rng(10)
    x = rng.integers(0, QWEN.vocab_size, 16).tolist()
    b = Request(tuple(x + [5, 6, 7, 8, 9, 10]), SamplingParams(max_tokens=8, ignore_eos=True), request_id="b")
    want = Engine(QWEN, BASE).run([Request(tuple(x), SamplingParams(max_tokens=1)), b])[1].tokens
    eng = Engine(QWEN, attrs.evolve(BASE, **CACHE))
    eng.run([Request(tuple(x), SamplingParams(max_tokens=1))])
    eng.submit(b)
    eng.step()
    eng.step()
    h = eng.table.handle_of("b")
    shared = eng.streams.kv["kv"].pages[h, :4].copy()
    eng._offload(h)
    kept = eng.admission.saved[h]["kv"][2]
    assert np.array_equal(kept[:4], shared) and (kept == 0).any()  # (its own full prompt pages are cached too)
    check_pools(eng)
    out = {}
    while eng.has_work():
        out.update({r.request_id: r.tokens for r in eng.step().finished})
        check_pools(eng)
    assert eng.stats.prefix_hits == 1 and eng.stats.reloads == 1 and out["b"] == want


def _shared_prefix_requests(seed: int) -> list[Request]:
    """8 requests at once, each one of two random prefixes (8-19 tokens) and 0-2 more tokens, 4 or more tokens to go
    within a context of 32."""
    rng = np.random.default_rng(seed)
    prefixes = [rng.integers(0, QWEN.vocab_size, int(rng.integers(8, 20))).tolist() for _ in range(2)]
    out = []
    for i in range(8):
        p = prefixes[int(rng.integers(2))] + rng.integers(0, QWEN.vocab_size, int(rng.integers(0, 3))).tolist()
        sp = SamplingParams(max_tokens=int(rng.integers(4, 32 - len(p))), ignore_eos=True)
        out.append(Request(tuple(p), sp, request_id=str(i)))
    return out


def test_offloaded_requests_that_pin_cached_pages_never_stall_the_engine():
    """Requests of shared prefixes in a pool of 8 or 10 pages (a request at the context holds 8): an offloaded request
    keeps its cached pages, so once every request is offloaded what they pin can leave too few pages for any to come
    back. The oldest offload then comes back (with the page its next token opens), offloaded requests first spilling
    their kept pages to the host where it takes that (without that, the engine raised "engine stalled" in these
    cases); every request gives an engine's tokens without the cache, every page accounted for after every step, and
    the step that brought an offload back ran what it could then run (in the step, not as a step of nothing)."""

    def serve(c: EngineConfig, seed: int):
        eng = Engine(QWEN, c)
        for r in _shared_prefix_requests(seed):
            eng.submit(r)
        out = {}
        while eng.has_work():
            out.update({r.request_id: r.tokens for r in eng.step().finished})
            check_pools(eng)
        return out, eng

    spills = 0
    for num_pages, seed in ((9, 3), (11, 2)):
        cfg = EngineConfig(page_size=4, max_seq_len=32, max_running=4, num_pages=num_pages, row_check=True)
        plain, _ = serve(cfg, seed)
        cached, eng = serve(attrs.evolve(cfg, **CACHE), seed)
        s = eng.stats
        assert cached == plain and len(cached) == 8 and s.offloads > 0 and s.mismatches == 0, (num_pages, seed)
        assert s.prefill_steps + s.mixed_steps == s.prefill_passes  # (no step ran nothing)
        spills += s.spills
    assert spills > 0


def test_a_checkpoint_equals_the_state_recomputed_from_its_tokens():
    """The checkpoint a finished stream leaves (its slot after its decode steps) and one a pass saves, against the
    state a fresh prefill of the same tokens leaves (float32; tolerance 1e-4 of the state's scale)."""
    cfg = attrs.evolve(BASE, **CACHE)
    eng = Engine(QWEN, cfg)
    x = np.random.default_rng(4).integers(0, QWEN.vocab_size, 70).tolist()
    r = eng.run([Request(tuple(x), SamplingParams(max_tokens=5))])[0]
    fed = x + list(r.tokens[:-1])
    cks = {ck.position: ck for ck in eng.admission.checkpoints.lru.values()}
    assert set(cks) == {64, 70, len(fed)}  # the interval, the prompt's end, the stream's end
    pools = eng.model_state.conv + eng.model_state.ssm  # (one a layer: each checked at its own scale)
    for p, ck in cks.items():
        ref = Engine(QWEN, BASE)
        ref.run([Request(tuple(fed[:p]), SamplingParams(max_tokens=1))])
        # the reference engine's request held slot 1; its state stays there after it ends
        for got, want in zip(pools, ref.model_state.conv + ref.model_state.ssm, strict=True):
            scale = float(want[1].abs().max()) or 1.0
            torch.testing.assert_close(got[ck.slot], want[1], atol=1e-4 * scale, rtol=1e-4)


class PagesAndCheckpoints(RuleBasedStateMachine):
    """PageRefs and Checkpoints against a plain model: counts never negative, a held page never free or evicted, a
    page always in exactly one of free, held and idle, a slot in exactly one of free, reserved and indexed."""

    N, SLOTS = 12, 3

    def __init__(self) -> None:
        super().__init__()
        self.refs = PageRefs(self.N)
        self.free = set(range(1, self.N))
        self.holders: list[int] = []  # one entry a holder
        self.cks = Checkpoints(20, self.SLOTS, 4)
        self.reserved: list[int] = []
        self.n = 0

    @rule(k=st.integers(1, 4))
    def take(self, k):
        if k > len(self.free) + self.refs.evictable:
            return
        short = k - len(self.free)
        if short > 0:
            ev = self.refs.evict(short)
            assert not set(ev.tolist()) & set(self.holders)
            self.free |= set(ev.tolist())
        pages = np.array(sorted(self.free)[:k], np.int32)
        self.free -= set(pages.tolist())
        self.refs.hold(pages)
        self.holders += pages.tolist()

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def share(self, data):
        p = data.draw(st.sampled_from(self.holders))
        self.refs.hold(np.array([p], np.int32))
        self.holders.append(p)

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def cache(self, data):
        p = data.draw(st.sampled_from(self.holders))
        self.n += 1
        self.refs.insert(np.array([p], np.int32), chain_keys(np.full(4, self.n), 4))

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def let_go(self, data):
        p = data.draw(st.sampled_from(self.holders))
        self.holders.remove(p)
        back = self.refs.let_go(np.array([p], np.int32)).tolist()
        assert (p in back) == (p not in self.holders and p not in self.refs.key_of)
        self.free |= set(back)

    @rule()
    def reserve(self):
        if not self.cks.free and not len(self.cks):
            return
        slot, old = self.cks.reserve()
        assert slot not in self.reserved and (old is None or old.slot == slot)
        self.reserved.append(slot)

    @precondition(lambda self: self.reserved)
    @rule(index=st.booleans())
    def land(self, index):
        slot = self.reserved.pop(0)
        if index:
            self.n += 1
            self.cks.add(Checkpoint(slot, 4, ROOT, bytes([self.n % 256, self.n // 256]), 0))
        else:
            self.cks.unreserve(slot)

    @invariant()
    def accounted(self):
        held = set(self.holders)
        idle = set(self.refs.idle)
        assert min(self.refs.count) >= 0
        assert all(self.refs.count[p] == self.holders.count(p) for p in range(1, self.N))
        assert not (self.free & held) and not (self.free & idle) and not (held & idle)
        assert self.free | held | idle == set(range(1, self.N))
        slots = [ck.slot for ck in self.cks.lru.values()]
        assert len(set(slots)) == len(slots) and not set(slots) & set(self.reserved)
        assert sorted(slots + self.reserved + self.cks.free) == list(range(20, 20 + self.SLOTS))


TestPagesAndCheckpoints = PagesAndCheckpoints.TestCase
TestPagesAndCheckpoints.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


def test_offloaded_requests_come_back_before_new_arrivals_are_admitted():
    """Four long requests of one prompt each (their prompt pages cached) in 23 pages, then a short request every other
    step: the long ones are offloaded under the pressure, pinning their cached pages. Admitting each new arrival while
    they wait had kept them out (the arrivals took whatever pages came free; the long ones finished only after the
    arrivals stopped, every step running ~2 rows instead of ~3). An offloaded request came first, so none is admitted
    while one waits: the long ones finish while the arrivals go on."""
    rng = np.random.default_rng(0)
    cfg = EngineConfig(page_size=4, max_seq_len=64, max_running=6, num_pages=24, **CACHE)
    eng = Engine(QWEN, cfg)
    for i in range(4):
        eng.submit(Request(tuple(rng.integers(0, QWEN.vocab_size, 20).tolist()),
                           SamplingParams(max_tokens=40, ignore_eos=True), request_id=f"long{i}"))  # fmt: skip
    finished_at = {}
    for step in range(250):
        if step % 2 == 0:
            eng.submit(Request(tuple(rng.integers(0, QWEN.vocab_size, 8).tolist()),
                               SamplingParams(max_tokens=6, ignore_eos=True), request_id=f"short{step}"))  # fmt: skip
        finished_at.update({r.request_id: step for r in eng.step().finished})
    assert eng.stats.offloads > 0 and all(f"long{i}" in finished_at for i in range(4)), finished_at
