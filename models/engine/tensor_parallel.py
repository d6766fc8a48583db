"""One engine process per rank of a tensor-parallel group (``torchrun``; gloo on CPUs, NCCL on GPUs).

Rank 0 takes the submissions and aborts and leads the steps. Each step it sends what arrived since the last one to
every rank (one broadcast of Python objects), and every rank then submits the same requests in the same order and
steps its own engine. The scheduler, admission and the planner therefore see the same history on every rank and
decide the same rows, victims and chunks. Each rank's planner, store, pools, pages and slots stay its own. Tokens
agree without a broadcast: every rank samples from the same all-reduced hidden state through the same replicated
lm_head (models.qwen3_5.tp), with the same per-request seeds. ``check`` compares the ranks' emitted tokens after every
step (a debug collective).
"""

from __future__ import annotations

import os

import attrs
import numpy as np
import torch
import torch.distributed as dist

from models.engine.adapters import Adapter, QwenAdapter, build_adapter
from models.engine.config import EngineConfig
from models.engine.driver import Engine
from models.engine.requests import Request, Result, StepOutput
from models.qwen3_5.tp import TensorParallel, shard_model


def join_group(cuda: bool) -> TensorParallel | None:
    """This process's rank of the group torchrun started (NCCL on GPUs, one a rank; gloo on CPUs), or None when it
    runs alone (no ``WORLD_SIZE`` above 1 in the environment)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo")
    return TensorParallel(dist.get_rank(), dist.get_world_size())


def shard_adapter(full: Adapter, tp: TensorParallel, device=None) -> Adapter:
    """Rank ``tp.rank``'s shard of a whole Qwen3.5 adapter (random or a checkpoint's), on ``device`` (default: the
    whole model's); the EOS tokens and checkpoint record carried over."""
    if not isinstance(full, QwenAdapter):
        raise ValueError(f"{full.name}: tensor parallelism is built for Qwen3.5 only")
    shard = shard_model(full.model, tp)
    if device is not None:
        shard.to(device)
    shard.fuse_projections()
    adapter = QwenAdapter(full.name, shard)
    adapter.vocab_size, adapter.eos_token_ids, adapter.checkpoint = full.vocab_size, full.eos_token_ids, full.checkpoint
    return adapter


def build_rank_adapter(name: str, tp: TensorParallel, seed: int = 0, device="cpu", dtype=torch.float32) -> Adapter:
    """Rank ``tp.rank``'s shard of the named Qwen3.5 model with random weights from ``seed`` (every rank draws the
    full model from the same seed on the CPU, then keeps its shard)."""
    return shard_adapter(build_adapter(name, seed=seed, dtype=dtype), tp, device)


def load_rank_adapter(path, tp: TensorParallel, device="cpu", dtype: torch.dtype | None = None) -> Adapter:
    """Rank ``tp.rank``'s shard of a Hugging Face Qwen3.5 directory (every rank reads the whole checkpoint on the
    CPU, then keeps its shard)."""
    from models.engine.checkpoint import load_adapter

    return shard_adapter(load_adapter(path, "cpu", dtype), tp, device)


def fold_tokens(emitted: int, digest: int, tokens: np.ndarray) -> tuple[int, int]:
    """(emitted + n, digest + sum_i tokens[i] * (emitted + i + 1) mod 2^61): the count and digest a rank compares,
    after ``tokens`` ([n], in the order a step gave them)."""
    place = np.arange(emitted + 1, emitted + tokens.size + 1, dtype=np.int64)
    return emitted + tokens.size, (digest + int(np.dot(tokens.astype(np.int64), place))) % (1 << 61)


class RankEngine:
    """A rank's engine in lockstep with the group's (module doc). Rank 0 leads: ``submit``, ``abort`` and ``step``
    as on an ``Engine``, then ``close`` when it stops stepping; every other rank calls ``follow`` meanwhile, which
    steps as often as rank 0 does and returns at its ``close``. ``run`` does both sides for a list of requests."""

    def __init__(self, adapter: Adapter, config: EngineConfig, tp: TensorParallel, check: bool = False) -> None:
        if config.prefill.beside:
            raise ValueError(f"prefill {config.prefill.name} lands a pass when this rank's GPU has run it, so the "
                             "ranks would compose different steps; a tensor-parallel engine runs its passes in the "
                             "step: EngineConfig(prefill=PrefillPlacement.IN_STEP)")  # fmt: skip
        self.engine = Engine(adapter, config)
        self.tp = tp
        self.check = check
        self._outbox: list[tuple[str, object]] = []  # rank 0: ("submit", request) / ("abort", id) since the last step
        self._emitted = 0  # (check) tokens this rank's steps gave
        self._digest = 0  # (check) sum of each token id times its place in the order they came + 1, mod 2^61
        self._device = torch.device("cuda") if dist.get_backend(tp.group) == "nccl" else torch.device("cpu")

    # -- what an Engine's driver reads -----------------------------------------------------------------------------
    @property
    def stats(self):
        return self.engine.stats

    def has_work(self) -> bool:
        return self.engine.has_work()

    # -- rank 0 ----------------------------------------------------------------------------------------------------
    def submit(self, request: Request, arrived: float | None = None) -> str:
        """Queue a request on every rank (validated here first); returns its id."""
        self._rank0("submit")
        rid = self.engine.submit(request, arrived)
        self._outbox.append(("submit", attrs.evolve(request, request_id=rid)))
        return rid

    def abort(self, request_id: str) -> bool:
        """End a request on every rank (``Engine.abort``)."""
        self._rank0("abort")
        ended = self.engine.abort(request_id)
        self._outbox.append(("abort", request_id))
        return ended

    def step(self) -> StepOutput:
        """One step on every rank (the events since the last one go out first); rank 0's output."""
        self._rank0("step")
        self._send("step")
        out = self.engine.step()
        if self.check:
            self._check(out)
        return out

    def close(self) -> None:
        """Release the followers (with any events still queued: aborts after the last step)."""
        self._rank0("close")
        self._send("stop")

    # -- the other ranks -------------------------------------------------------------------------------------------
    def follow(self) -> list[Result]:
        """Step as rank 0 steps, taking its submissions and aborts, until it closes; this rank's finished results."""
        if self.tp.rank == 0:
            raise RuntimeError("follow on rank 0: rank 0 leads (step, then close)")
        finished: list[Result] = []
        while True:
            msg = [None]
            dist.broadcast_object_list(msg, src=0, group=self.tp.group)
            events, command = msg[0]
            for kind, what in events:
                if kind == "submit":
                    self.engine.submit(what)
                else:
                    self.engine.abort(what)
            if command == "stop":
                return finished
            out = self.engine.step()
            finished += out.finished
            if self.check:
                self._check(out)

    def run(self, requests: list[Request] | None) -> list[Result]:
        """Every rank: serve ``requests`` (given on rank 0; None elsewhere) to the end; each rank's results, in the
        order rank 0 was given the requests."""
        if self.tp.rank == 0:
            ids = [self.submit(r) for r in requests]
            finished = []
            while self.has_work():
                finished += self.step().finished
            self.close()
        else:
            ids = []
            finished = self.follow()
        msg = [ids]
        dist.broadcast_object_list(msg, src=0, group=self.tp.group)
        by_id = {r.request_id: r for r in finished}
        return [by_id[i] for i in msg[0]]

    def _send(self, command: str) -> None:
        msg = [(self._outbox, command)]
        dist.broadcast_object_list(msg, src=0, group=self.tp.group)
        self._outbox = []

    def _check(self, out: StepOutput) -> None:
        """Every rank has emitted the same tokens so far, this step's ``out`` included (their count and a sum of ids
        weighted by their place in the order they came)."""
        self._emitted, self._digest = fold_tokens(self._emitted, self._digest, out.tokens)
        digest = torch.tensor([self._emitted, self._digest], dtype=torch.int64, device=self._device)
        lo, hi = digest.clone(), digest.clone()
        dist.all_reduce(lo, op=dist.ReduceOp.MIN, group=self.tp.group)
        dist.all_reduce(hi, op=dist.ReduceOp.MAX, group=self.tp.group)
        if not torch.equal(lo, hi):
            raise RuntimeError(f"rank {self.tp.rank}: the ranks' tokens diverged (emitted, digest) {digest.tolist()} "
                               f"vs min {lo.tolist()} max {hi.tolist()}")  # fmt: skip

    def _rank0(self, what: str) -> None:
        if self.tp.rank != 0:
            raise RuntimeError(f"{what} on rank {self.tp.rank}: rank 0 takes the requests and leads the steps; the "
                               "others follow")  # fmt: skip
