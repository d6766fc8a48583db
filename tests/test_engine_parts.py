"""The engine's parts on their own: the in-graph sampler, the page pool, the host arm's fill (checked against the
planner tests' independent expectation), the bucket list, and the demo's command line."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
import torch
from sim import expected_buffers

from kernels.sample.naive import ban_stops_, hash32
from models.engine import AdmitRefusal, AdmitRefused, PagePool, Sampler, decode_buckets, recurrent_pool
from models.engine.host_arm import HostFill
from models.engine.planning import HostArm
from models.engine.sampler import COLUMNS
from resplan import HostStreams, KVPool, RowLayout, SamplerCell, StepBuffers, StreamMode, float_bits
from resplan.layout import BANNED_STOPS


# -- sampler -----------------------------------------------------------------------------------------------------------
def _cells(b: int, temperature=0.0, top_p=1.0, top_k=0, seed=0) -> torch.Tensor:
    c = np.zeros((b, len(SamplerCell)), np.int32)
    c[:, SamplerCell.TEMPERATURE], c[:, SamplerCell.TOP_P] = float_bits(temperature), float_bits(top_p)
    c[:, SamplerCell.TOP_K], c[:, SamplerCell.SEED] = top_k, seed
    return torch.from_numpy(c)


def _hash32_numpy(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.uint32)
    with np.errstate(over="ignore"):
        x ^= x >> np.uint32(16)
        x *= np.uint32(0x7FEB352D)
        x ^= x >> np.uint32(15)
        x *= np.uint32(0x846CA68B)
        x ^= x >> np.uint32(16)
    return x


def test_hash32_is_uint32_arithmetic_in_int64():
    x = np.random.default_rng(0).integers(0, 2**32, 4096, dtype=np.uint64)
    x[:3] = [0, 2**32 - 1, 2**31]
    got = hash32(torch.from_numpy(x.astype(np.int64))).numpy()
    assert np.array_equal(got.astype(np.uint32), _hash32_numpy(x))


def test_greedy_and_top_k_1_are_argmax():
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0))
    s = Sampler(50, "cpu")
    pos = torch.arange(6)
    assert torch.equal(s(logits, _cells(6), pos), logits.argmax(-1))
    assert torch.equal(s(logits, _cells(6, temperature=2.0, top_k=1, seed=3), pos), logits.argmax(-1))


def test_ban_stops_masks_a_rows_stop_ids_below_its_minimum_position_only():
    """``ban_stops_`` against a loop over the rows, on fresh random scores: ids repeated, padded, id 0 among them, rows
    below, at and above their minimum, rows without stop ids; then greedy and sampled draws never pick a banned id."""
    g = torch.Generator().manual_seed(3)
    rng = np.random.default_rng(3)
    b, V = 24, 30
    scores = torch.randn(b, V, generator=g)
    cells = _cells(b, temperature=1.0, seed=11).numpy()
    cells[:, SamplerCell.STOP_0 :] = -1
    for r in range(b):
        n = int(rng.integers(0, BANNED_STOPS + 1))
        cells[r, SamplerCell.STOP_0 : SamplerCell.STOP_0 + n] = rng.choice([0, 1, 2, *rng.integers(0, V, 4)], n)
        cells[r, SamplerCell.MIN_POSITION] = int(rng.integers(0, 8)) if n else 0
    pos = torch.from_numpy(rng.integers(0, 8, b))
    got = scores.clone()
    ban_stops_(got, torch.from_numpy(cells), pos, COLUMNS)
    want = scores.clone()
    for r in range(b):
        if pos[r] < cells[r, SamplerCell.MIN_POSITION]:
            for t in cells[r, SamplerCell.STOP_0 :]:
                if t >= 0:
                    want[r, t] = float("-inf")
    assert torch.equal(got, want) and (got != scores).any()
    banned = torch.isinf(want)
    for temperature in (0.0, 1.0):
        c = cells.copy()
        c[:, SamplerCell.TEMPERATURE] = float_bits(temperature)
        drawn = Sampler(V, "cpu")(scores, torch.from_numpy(c), pos)
        assert not banned[torch.arange(b), drawn].any()


def test_a_draw_depends_on_seed_and_position_only():
    V = 40
    logits = torch.zeros(1, V)  # uniform: the noise alone decides
    s = Sampler(V, "cpu")
    one = s(logits, _cells(1, temperature=1.0, seed=7), torch.tensor([5]))
    batch = s(logits.expand(4, V), _cells(4, temperature=1.0, seed=7), torch.tensor([9, 5, 5, 2]))
    assert batch[1] == one and batch[2] == one
    draws = s(logits.expand(64, V), _cells(64, temperature=1.0, seed=7), torch.arange(64))
    assert draws.unique().numel() > 20
    other = s(logits.expand(64, V), _cells(64, temperature=1.0, seed=8), torch.arange(64))
    assert (draws != other).any()


def test_draws_follow_the_tempered_distribution():
    V, n = 6, 6000
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]])
    s = Sampler(V, "cpu")
    draws = s(logits.expand(n, V), _cells(n, temperature=0.8, seed=11), torch.arange(n))
    freq = torch.bincount(draws, minlength=V).double() / n
    want = torch.softmax(logits[0].double() / 0.8, -1)
    assert torch.allclose(freq, want, atol=0.02), (freq, want)


def test_top_p_keeps_the_smallest_head_reaching_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    s = Sampler(4, "cpu")
    n = 500
    for top_p, allowed in ((0.5, {0}), (0.6, {0, 1}), (0.85, {0, 1, 2})):
        d = s(logits.expand(n, 4), _cells(n, temperature=1.0, top_p=top_p, seed=1), torch.arange(n))
        assert set(d.tolist()) == allowed


# -- pools -------------------------------------------------------------------------------------------------------------
def test_page_pool_is_fifo_and_refuses_when_short():
    p = PagePool("kv", 6, 4)
    assert p.take(2).tolist() == [1, 2]
    p.give(np.array([2, 1], np.int32))
    assert p.free_pages().tolist() == [3, 4, 5, 2, 1]
    assert p.take(4).tolist() == [3, 4, 5, 2]
    with pytest.raises(AdmitRefused) as info:
        p.take(2)
    assert info.value.reason is AdmitRefusal.NO_PAGES
    p.give(np.array([4], np.int32))
    assert p.free == 2 and p.take(2).tolist() == [1, 4]


def test_recurrent_pool_keeps_the_sink():
    r = recurrent_pool(3)
    assert [r.take(), r.take()] == [1, 2]
    with pytest.raises(AdmitRefused, match="NO_RECURRENT_SLOT"):
        r.take()


# -- the host arm's fill -----------------------------------------------------------------------------------------------
def _layout() -> RowLayout:
    return RowLayout(
        (KVPool("self", 4, 64, 40), KVPool("cross", 5, 64, 24, StreamMode.READ)), "self", recurrent=True, sampler=True
    )


@pytest.mark.parametrize("exact", [True, False], ids=["exact-pages", "masked"])
@pytest.mark.parametrize("n,bucket", [(1, 1), (3, 4), (8, 8)], ids=lambda x: str(x))
def test_host_fill_matches_the_streams(exact, n, bucket):
    lay = _layout()
    rng = np.random.default_rng(n * 10 + bucket)
    H = 12
    st = HostStreams.zeros(lay, H)
    for p in lay.pools:
        s, W = st.kv[p.key], lay.span(p.key).width
        append = p.mode is StreamMode.APPEND
        s.lengths[:] = rng.integers(0, W * p.page_size - append, H)
        used = -(-(s.lengths + append) // p.page_size)
        s.pages[:] = rng.integers(1, 64, (H, W))
        if exact:
            s.pages[np.arange(W)[None, :] >= used[:, None]] = 0
    st.pos_offset[:] = rng.integers(0, 5, H)
    st.recurrent_slot[:] = rng.integers(1, 9, H)
    st.sampler[:] = rng.integers(-(2**31), 2**31 - 1, (H, len(SamplerCell)))
    bufs = StepBuffers.allocate(lay, bucket)
    fill = HostFill(lay, bufs, exact_pages=exact)
    h = rng.permutation(H)[:n].astype(np.int64)
    for _ in range(3):  # every ring buffer, same answer
        bufs.flat.fill_(-7)
        fill.fill(st, h)
        got = {k: v.numpy() for k, v in bufs.tensors().items()}
        for k, want in expected_buffers(lay, st, h, bucket).items():
            assert np.array_equal(got[k], want), k


# -- buckets and the demo ----------------------------------------------------------------------------------------------
def test_decode_buckets():
    assert decode_buckets(1) == (1,)
    assert decode_buckets(8) == (1, 2, 4, 8)
    assert decode_buckets(6) == (1, 2, 4, 6)
    assert decode_buckets(40) == (1, 2, 4, 8, 16, 24, 32, 40)
    assert decode_buckets(128)[-3:] == (112, 120, 128)


def test_demo_help_names_every_option(capsys):
    from models.demo import main

    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    for opt in ("--model", "--arms", "--concurrency", "--requests", "--prompt-len", "--gen-len", "--page-size",
                "--num-pages", "--max-seq-len", "--order", "--max-bucket", "--token-budget", "--row-check", "--seed",
                "--temperature", "--top-p", "--top-k", "--progress", "--attention", "--overlap"):
        assert opt in text


def test_demo_runs_both_arms(capsys):
    from models.demo import main

    argv = ["-n", "5", "-c", "3", "--prompt-len", "3:9", "--gen-len", "4:9", "--order", "turns", "--max-bucket", "2",
            "--no-progress"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "same tokens in resident and host: 5/5 requests" in out
    assert "row check (steps, mismatches)" in out
    overlapped = next(line for line in out.splitlines() if line.startswith("overlapped steps"))
    assert int(overlapped.split()[-3]) > 0 and overlapped.split()[-1] == "off"  # resident overlaps, host never


# -- pool layout -------------------------------------------------------------------------------------------------------
def test_pool_layout_derives_widths_and_page_counts_from_the_models_pools():
    """Whisper's pools: "self" APPEND (streams up to the engine's context, num_pages when given), "cross" READ (its
    own limit, room for every running request); one pool too small for a request is refused naming it."""
    from models.engine.pools import pool_layout
    from models.whisper import WhisperModel
    from models.whisper.config import tiny

    specs = WhisperModel(tiny).kv_pool_specs()
    layout, counts = pool_layout(specs, page_size=4, max_running=3, max_seq_len=32, num_pages=None,
                                 positions_pool="self", recurrent=False)  # fmt: skip
    assert counts == {"self": 3 * 8 + 1, "cross": 3 * 6 + 1}  # 32 / 4 pages; 24 encoder tokens / 4
    assert [(p.key, p.max_seq_len, p.mode.value) for p in layout.pools] == [("self", 32, "append"),
                                                                            ("cross", 24, "read")]  # fmt: skip
    assert layout.span("self").width == 8 and layout.span("cross").width == 6
    _, counts = pool_layout(specs, 4, 3, 32, num_pages=12, positions_pool="self", recurrent=False)
    assert counts == {"self": 12, "cross": 19}  # num_pages is the APPEND pools'
    with pytest.raises(ValueError, match="pool 'self': 7 usable pages cannot hold one request of 32 tokens"):
        pool_layout(specs, 4, 3, 32, num_pages=8, positions_pool="self", recurrent=False)


# -- capture plans -----------------------------------------------------------------------------------------------------
def test_the_engines_bucket_plans_come_from_the_adapters_decode_walk():
    """Whisper's walk appends to "self" and only reads "cross" (the records capture_streams gives); the captured
    graphs are keyed by those plans."""
    from models.engine import Engine, EngineConfig, build_adapter
    from models.engine.sampler import SamplingMode

    e = Engine(build_adapter("whisper-test"), EngineConfig(page_size=4, max_seq_len=32, max_running=2))
    g = e.graphs
    assert g.refusal is None and e.resident
    plan = g.plans[2]
    assert [(k, s.label, s.mode.value) for k, s in plan.streams] == [("cross", "decode", "read"),
                                                                     ("self", "decode", "append")]  # fmt: skip
    assert plan.host_plan_free and set(g.decode_graphs) == {(g.plans[b], m) for b in e.buckets for m in SamplingMode}


def test_a_resource_that_refuses_resident_planning_keeps_the_engine_host_planned(caplog):
    """A KV pool with a sliding window cannot keep rows on the device: asked for the resident arm, the engine builds
    host-planned, says why once, and serves what the host arm serves."""
    import logging

    from models.engine import Engine, EngineConfig, Planning, QwenAdapter
    from models.engine.compare import random_requests
    from resplan import CaptureProblem, ResourceInfo, ResourceKind

    class Windowed(QwenAdapter):
        def resources(self):
            return {**super().resources(), "kv": ResourceInfo("kv", ResourceKind.KV, sliding_window=64)}

    from test_engine import QWEN

    windowed = Windowed("qwen3_5-tiny", QWEN.model)
    cfg = EngineConfig(page_size=4, max_seq_len=32, max_running=4)
    with caplog.at_level(logging.WARNING, logger="models.engine.graphs"):
        e = Engine(windowed, attrs.evolve(cfg, planning=Planning.RESIDENT))
    refusal = e.graphs.refusal
    assert not e.resident and isinstance(e.arm, HostArm) and refusal.problem is CaptureProblem.REFUSED
    assert [r.getMessage() for r in caplog.records].count(
        f"qwen3_5-tiny: resident planning refused, the engine is host-planned: {refusal}") == 1
    assert "SLIDING_WINDOW" in str(refusal)
    reqs = random_requests(QWEN, 6, (3, 10), (2, 6), seed=9)
    host = Engine(QWEN, attrs.evolve(cfg, planning=Planning.HOST)).run(reqs)
    assert [r.tokens for r in e.run(reqs)] == [r.tokens for r in host]


def test_stats_sum_a_parts_record_by_field_name():
    """EngineStats.add sums every field of a part's record into the counter of the same name, and nothing else."""
    from models.engine.launcher import Landed
    from models.engine.planning import Prepared
    from models.engine.stats import EngineStats

    st = EngineStats()
    st.add(Prepared(plan_ns=100, attn_schedule_ns=5, early_hits=1, h2d_copies=2, h2d_bytes=64))
    st.add(Prepared(plan_ns=50, h2d_copies=1))
    st.add(Landed(discarded=2, wait_ns=9, gpu_ms=0.5))
    assert (st.plan_ns, st.attn_schedule_ns, st.early_hits, st.h2d_copies, st.h2d_bytes) == (150, 5, 1, 3, 64)
    assert (st.discarded, st.wait_ns, st.gpu_ms, st.tokens, st.steps) == (2, 9, 0.5, 0, 0)


def test_every_field_of_every_counted_record_names_a_counter():
    """A record field that named no counter would raise when added; this finds one before any engine adds it."""
    import models.engine.driver  # noqa: F401  (every part that defines a record)
    from models.engine.stats import Counts, EngineStats, counters

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    records = list(subclasses(Counts))
    names = {r.__name__ for r in records}
    assert {"Prepared", "Checked", "Launched", "Landed", "PassCounts", "StepCounts", "Tokens", "EarlySteps",
            "Events"} <= names  # fmt: skip
    named = counters()
    bad = [f"{r.__name__}.{f.name}" for r in records for f in attrs.fields(r) if f.name not in named]
    assert not bad, bad

    @attrs.frozen
    class Stray(Counts):  # (defined after the scan above)
        strays: int = 1

    with pytest.raises(AttributeError):  # and adding a field that names no counter is an error, never a silent skip
        EngineStats().add(Stray())


def test_kernel_choices_say_where_the_weight_stream_and_the_folds_run():
    """KernelChoices at Qwen3.5-0.8B's shapes: the weight stream where measured (or at every skinny GEMM, or never),
    the folds where configured unless turned off."""
    from kernels.choices import GemvPick, KernelChoices
    from kernels.gemv import MAX_ROWS

    kc = KernelChoices()
    assert kc.streams(1, 7168, 1024) and not kc.streams(1, 18432, 2560)  # measured; a 4B shape, never benchmarked
    every, never = KernelChoices(gemv=GemvPick.EVERY), KernelChoices(gemv=GemvPick.NEVER)
    assert every.streams(1, 18432, 2560) and every.streams(MAX_ROWS, 18432, 2560)
    assert not every.streams(MAX_ROWS + 1, 7168, 1024) and not never.streams(1, 7168, 1024)
    assert kc.folds_silu_mul(1, 1024, 3584) and not KernelChoices(fold_silu_mul=False).folds_silu_mul(1, 1024, 3584)
    assert kc.folds_norm(1, 8224, 1024) and not kc.folds_norm(2, 8224, 1024)
