"""Tensor parallelism on the CPU: two processes over gloo, each serving its shard of the tiny model in float32
(models.qwen3_5.tp, models.engine.tensor_parallel), give the single-process engine's tokens in both arms, with the
row check at 0 mismatches on every rank and the ranks' tokens compared after every step; the sharding itself; and
planners fed the same history, with releases landing on either side of a commit, displace the same requests."""

from __future__ import annotations

import os
import queue
import tempfile
import time

import attrs
import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from sim import SimEngine, qwen_like

from models.engine import EngineConfig, Planning, build_adapter
from models.engine.compare import random_requests
from models.engine.tensor_parallel import RankEngine, build_rank_adapter, fold_tokens, load_rank_adapter
from models.qwen3_5.tp import TensorParallel, shard_config, shard_state_dict

MODEL = "qwen3_5-tiny"
CFG = EngineConfig(page_size=4, max_seq_len=96, max_running=4, token_budget=24, row_check=True)


def _requests():
    return random_requests(build_adapter(MODEL, seed=0), 10, prompt_len=(3, 40), gen_len=(2, 12), seed=3)


def _rank(rank: int, world: int, init: str, planning: Planning, checkpoint: str | None, out) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    tp = TensorParallel(rank, world)
    try:
        torch.set_num_threads(1)
        adapter = build_rank_adapter(MODEL, tp, seed=0) if checkpoint is None else load_rank_adapter(checkpoint, tp)
        eng = RankEngine(adapter, attrs.evolve(CFG, planning=planning), tp, check=True)
        results = eng.run(_requests() if rank == 0 else None)
        out.put((rank, [r.tokens for r in results], eng.engine.stats.mismatches, eng.engine.stats.decode_steps))
    finally:
        tp.leave()
    out.close()
    out.join_thread()  # the report is in the pipe
    # a rank that read a checkpoint aborts in 1 of ~5 runs while the interpreter tears down ("terminate called without
    # an active exception": a native thread left joinable), after its work is done and reported: leave at once
    os._exit(0)


def _collect(out, procs, timeout_s: float = 300.0) -> dict:
    """Each rank's report from ``out``; fails at once, with the exit codes, when a rank died without reporting."""
    got: dict = {}
    deadline = time.monotonic() + timeout_s
    while len(got) < len(procs):
        try:
            rank, *rest = out.get(timeout=1.0)
            got[rank] = rest
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead or time.monotonic() > deadline:
                for p in procs:
                    p.kill()
                pytest.fail(f"a rank died or hung: exit codes {[p.exitcode for p in procs]}")
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return got


@pytest.mark.parametrize("planning,source", [(Planning.RESIDENT, "random"), (Planning.HOST, "random"),
                                             (Planning.RESIDENT, "checkpoint")])  # fmt: skip
def test_two_ranks_give_the_single_process_engines_tokens(planning, source, tmp_path):
    """Random weights drawn on every rank from one seed, or a transformers checkpoint each rank reads and shards."""
    from models.engine import Engine
    from models.engine.checkpoint import load_adapter

    checkpoint = None
    if source == "checkpoint":
        from checkpoints import save_qwen

        checkpoint = str(save_qwen(tmp_path / "qwen", seed=5))
    whole = build_adapter(MODEL, seed=0) if checkpoint is None else load_adapter(checkpoint)
    want = [r.tokens for r in Engine(whole, attrs.evolve(CFG, planning=planning)).run(_requests())]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as d:
        init = "file://" + os.path.join(d, "rendezvous")
        procs = [ctx.Process(target=_rank, args=(r, 2, init, planning, checkpoint, out)) for r in range(2)]
        for p in procs:
            p.start()
        got = _collect(out, procs)
    for rank in (0, 1):
        tokens, mismatches, steps = got[rank]
        assert tokens == want, f"rank {rank}"
        assert mismatches == 0 and steps > 0


def test_the_shards_cut_every_weight_into_blocks_that_cover_it():
    """Each sharded weight of rank 0 and rank 1 put back together (rows or columns, GDN's q | k | v parts) is the
    full weight; replicated ones are equal on both ranks."""
    full = build_adapter(MODEL, seed=0).model
    sd, cfg = full.state_dict(), full.cfg
    parts = [shard_state_dict(sd, cfg, r, 2) for r in range(2)]
    local = shard_config(cfg, 2)
    assert (local.num_attention_heads, local.linear_num_value_heads) == (cfg.num_attention_heads // 2,
                                                                        cfg.linear_num_value_heads // 2)  # fmt: skip
    for name, t in sd.items():
        a, b = parts[0][name], parts[1][name]
        if a.shape == t.shape:
            assert torch.equal(a, t) and torch.equal(b, t), name
        elif name.endswith(("in_proj_qkv.weight", "conv1d.weight")):
            qk = cfg.linear_num_key_heads * cfg.linear_key_head_dim
            cut = [qk // 2, qk // 2, t.shape[0] // 2 - qk]
            back = torch.cat([torch.cat([x, y]) for x, y in zip(a.split(cut), b.split(cut), strict=True)])
            assert torch.equal(back, t), name
        else:
            dim = 0 if a.shape[0] != t.shape[0] else 1
            assert torch.equal(torch.cat([a, b], dim=dim), t), name
    with pytest.raises(ValueError, match="not divisible"):
        shard_config(cfg, 3)


@pytest.mark.parametrize("seed", range(6))
def test_planners_with_releases_on_either_side_of_a_commit_displace_the_same_requests(seed):
    """Two ranks' planners run the same resident steps over 12 live requests (a store of 9 rows: steps displace);
    each finished request is released before the last step's commit on rank 0 and after it on rank 1. Every plan
    displaces the same requests on both (the slot numbers are each rank's own)."""
    rng = np.random.default_rng(seed)
    ranks = [SimEngine(qwen_like(page_size=4, pages=256), (1, 2, 4), seed=r) for r in range(2)]
    live = [[e.admit(3) for _ in range(12)] for e in ranks]
    history: list[list] = [[], []]
    displaced = 0
    for _ in range(80):
        pick = sorted(rng.choice(12, size=int(rng.integers(1, 5)), replace=False).tolist())
        done = [i for i in pick if rng.random() < 0.2]
        for r, e in enumerate(ranks):
            _, program = e.resident_step([live[r][i] for i in pick])
            history[r].append(sorted(live[r].index(h) for h in program.displaced.tolist()))
            gone = [live[r][i] for i in done]
            if r == 0:
                for h in gone:
                    e.finish(h)
                e.commit_pending()
            else:
                e.commit_pending()
                for h in gone:
                    e.finish(h)
            for i in sorted(done, reverse=True):
                live[r][i] = e.admit(3)
        displaced += len(history[0][-1])
    assert history[0] == history[1] and displaced > 0


def test_the_traffic_benchmark_runs_under_torchrun_over_two_ranks(tmp_path):
    """``python -m torch.distributed.run --nproc-per-node 2 -m models.bench.traffic`` on the CPU: rank 0 drives the
    arrivals and writes the report, which says the engines ran over 2 ranks; both arms serve every request with the
    same tokens."""
    import subprocess
    import sys

    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "models.bench.traffic",
           "--model", MODEL, "--device", "cpu", "--page-size", "4", "--max-running", "4", "--no-progress",
           "--num-requests", "8", "--rate", "400", "--prompt-len", "uniform:3,30",
           "--gen-len", "lognormal:median=6,sigma=0.8,min=2,max=20", "--token-budget", "12", "--rounds", "1",
           "--out", str(out)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = (out / "results.md").read_text()
    assert "tensor parallel over 2 ranks" in report
    row = next(line for line in report.splitlines() if line.startswith("| resident-torch |"))
    assert row.rstrip(" |").endswith("8/8 | 8/8")


def test_the_ranks_digest_tells_tokens_and_their_order_apart():
    """The (count, digest) the ranks compare after each step: a step's tokens folded in order, so another token, the
    same tokens in another order, or the same tokens split over other steps with one dropped, each give another."""
    a = np.array([5, 9, 9, 248000], np.int64)
    want = (4, sum(int(t) * (i + 1) for i, t in enumerate(a.tolist())) % (1 << 61))
    assert fold_tokens(0, 0, a) == want
    assert fold_tokens(*fold_tokens(0, 0, a[:1]), a[1:]) == want  # split over two steps
    assert fold_tokens(0, 0, a[[1, 0, 2, 3]])[1] != want[1]
    assert fold_tokens(0, 0, np.array([5, 9, 8, 248000]))[1] != want[1]
    assert fold_tokens(0, 0, a[:3]) != want
