"""Run the same requests through both planning arms and compare: what the demo and the engine tests share.

``random_requests`` draws prompts, lengths and sampling seeds from one seed (and log-mel frames for an
encoder-decoder). ``run_arms`` serves them in a fresh engine per arm over the same adapter (same weights, separate
pools). ``check_pools`` asserts the page bookkeeping an engine keeps: every page held by at most one request, free +
held = usable, and no stream holding a page past the pages it counts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import attrs
import numpy as np
import torch

from models.engine.adapters import Adapter
from models.engine.config import EngineConfig, Planning
from models.engine.driver import Engine
from models.engine.requests import InvalidRequest, Request, Result, SamplingParams, StepOutput
from resplan import StreamMode


def random_requests(
    adapter: Adapter,
    n: int,
    prompt_len: tuple[int, int],  # inclusive range
    gen_len: tuple[int, int],
    seed: int = 0,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
) -> list[Request]:
    """``n`` requests with random prompt tokens; a per-request sampling seed; log-mel frames where the model reads a
    context pool (its decoder prompt then starts with the decoder start token)."""
    rng = np.random.default_rng(seed)
    reads = any(p.mode is StreamMode.READ for p in adapter.pools)
    out = []
    for i in range(n):
        length = int(rng.integers(prompt_len[0], prompt_len[1] + 1))
        sp = SamplingParams(
            max_tokens=int(rng.integers(gen_len[0], gen_len[1] + 1)),
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            seed=int(rng.integers(0, 2**31 - 1)),
        )
        prompt = rng.integers(0, adapter.vocab_size, length).tolist()
        features = None
        if reads:
            cfg = adapter.model.cfg
            frames = int(rng.integers(2, 2 * cfg.max_source_positions + 1))
            features = torch.from_numpy(rng.standard_normal((cfg.num_mel_bins, frames)).astype(np.float32))
            prompt[0] = cfg.decoder_start_token_id
        out.append(Request(prompt, sp, features=features, request_id=f"r{i}"))
    return out


@attrs.frozen(eq=False)
class ArmRun:
    engine: Engine
    results: list[Result | InvalidRequest]
    wall_s: float

    @property
    def tokens(self) -> list[tuple[int, ...] | None]:
        return [r.tokens if isinstance(r, Result) else None for r in self.results]


def run_arms(
    adapter: Adapter,
    config: EngineConfig,
    requests: Sequence[Request],
    arms: Sequence[Planning] = (Planning.RESIDENT, Planning.HOST),
    on_step: Callable[[StepOutput], None] | None = None,
    make_on_step: Callable[[Planning, Engine], Callable[[StepOutput], None] | None] | None = None,
    per_arm: dict[Planning, dict] | None = None,
) -> dict[Planning, ArmRun]:
    """Serve ``requests`` in one fresh engine per arm (``config`` with its planning set to the arm, and the arm's
    ``per_arm`` fields, e.g. ``{Planning.RESIDENT: dict(overlap=True)}``); ``on_step`` (or what ``make_on_step(arm,
    engine)`` returns) is called with every step's output."""
    out = {}
    for arm in arms:
        engine = Engine(adapter, attrs.evolve(config, planning=arm, **(per_arm or {}).get(arm, {})))
        cb = make_on_step(arm, engine) if make_on_step is not None else on_step
        t0 = time.perf_counter()
        results = engine.run(requests, on_step=cb)
        out[arm] = ArmRun(engine, results, time.perf_counter() - t0)
    return out


def check_pools(engine: Engine) -> None:
    """Assert the engine's page and recurrent-slot bookkeeping and the scheduler's kept decode rows (tests; it walks
    every handle). With the prefix cache, a page may be held by several rows and by checkpoints (its count says how
    many), a cached page nobody holds is neither held nor free, no free page is counted or cached, and a recurrent
    slot is a request's, free, or a checkpoint's (free, indexed, or a save in flight)."""
    adm = engine.admission
    for key, pool in adm.page_pools.items():
        s, held = engine.streams.kv[key], adm.n_pages[key]
        cols = np.arange(s.pages.shape[1])
        kept = [saved[key][2] for saved in adm.saved.values()]  # offloaded requests' kept (cached) pages
        live = np.concatenate([s.pages[cols[None, :] < held[:, None]], *(x[x > 0] for x in kept)]).astype(np.int64)
        assert (live > 0).all(), f"pool {key!r}: a held page is the sink"
        assert not s.pages[cols[None, :] >= held[:, None]].any(), f"pool {key!r}: a stream holds an uncounted page"
        free = pool.free_pages()
        assert not np.isin(free, live).any(), f"pool {key!r}: a held page is also free"
        for h in np.flatnonzero(held).tolist():
            row = s.pages[h, : held[h]]
            assert np.unique(row).size == row.size, f"pool {key!r}: handle {h} holds a page twice"
        refs = adm.refs if adm.prefix is not None and key == adm.prefix.pool else None
        if refs is None:
            assert np.unique(live).size == live.size, f"pool {key!r}: a page is held twice"
            assert free.size + live.size == pool.capacity, f"pool {key!r}: {free.size} free + {live.size} held"
            continue
        cks = [*adm.checkpoints.lru.values(), *(ck for ck, _ in adm.in_flight)]
        tails = [ck.tail_page for ck in cks if ck.tail_page]
        assert len(tails) == adm.tails, "the checkpoints' tail pages are miscounted"
        live_set = set(live.tolist())
        assert not any(p in live_set for p in tails), "a checkpoint's tail page is a request's"
        want = np.bincount(np.concatenate([live, np.asarray(tails, np.int64)]).astype(np.int64),
                           minlength=pool.num_pages)  # fmt: skip
        count = np.asarray(refs.count)  # [num_pages]
        assert np.array_equal(count, want), f"pool {key!r}: reference counts are not the rows' and tails'"
        idle = np.fromiter(refs.idle, np.int64, len(refs.idle))
        assert (count[idle] == 0).all() and all(p in refs.key_of for p in idle.tolist()), "an idle page is held"
        assert not np.isin(free, idle).any() and not np.isin(free, list(refs.key_of)).any(), "a free page is cached"
        assert free.size + np.count_nonzero(count) + idle.size == pool.capacity, f"pool {key!r}: pages lost"
    if adm.rec is not None:  # every recurrent slot in one place: a request's, the requests' free ones, a checkpoint's
        slots = [*engine.streams.recurrent_slot[engine.streams.recurrent_slot > 0].tolist(), *adm.rec.free_slots()]
        total = adm.rec.size
        if adm.checkpoints is not None:
            cks = adm.checkpoints
            slots += [*cks.free, *(ck.slot for ck in cks.lru.values()), *(ck.slot for ck, _ in adm.in_flight)]
            total += cks.size
        assert sorted(slots) == list(range(1, total + 1)), f"recurrent slots lost or held twice: {sorted(slots)}"
    sch = engine.scheduler  # the kept decode rows are the ones a fresh computation picks
    assert np.array_equal(sch.decode_rows(), sch._compute_decode_rows()), "the scheduler kept stale decode rows"
