"""One engine process per rank of a tensor-parallel group (``torchrun``; gloo on CPUs, NCCL on GPUs).

Rank 0 takes the submissions and aborts. Each step it sends what arrived since the last one to every rank (one
broadcast of Python objects), and every rank then submits the same requests in the same order and steps its own
engine. The scheduler, admission and the planner therefore see the same history on every rank and decide the same
rows, victims and chunks. Each rank's planner, store, pools, pages and slots stay its own. Tokens agree without a
broadcast: every rank samples from the same all-reduced hidden state through the same replicated lm_head
(models.qwen3_5.tp), with the same per-request seeds. ``check`` compares the ranks' emitted tokens after every step
(a debug collective).
"""

from __future__ import annotations

import attrs
import torch
import torch.distributed as dist

from models.engine.adapters import Adapter, QwenAdapter, build_adapter
from models.engine.driver import Engine, EngineConfig
from models.engine.requests import Request
from models.qwen3_5.tp import TensorParallel, shard_model


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


class RankEngine:
    """A rank's engine in lockstep with the group's (module doc): ``submit`` and ``abort`` on rank 0, ``step`` and
    ``run`` on every rank."""

    def __init__(self, adapter: Adapter, config: EngineConfig, tp: TensorParallel, check: bool = False) -> None:
        self.engine = Engine(adapter, config)
        self.tp = tp
        self.check = check
        self._outbox: list[tuple[str, object]] = []  # rank 0: ("submit", request) / ("abort", id) since the last step
        self._device = torch.device("cuda") if dist.get_backend(tp.group) == "nccl" else torch.device("cpu")

    def submit(self, request: Request) -> str:
        """Rank 0: queue a request for every rank (validated here first); returns its id."""
        self._rank0("submit")
        rid = self.engine.submit(request)
        self._outbox.append(("submit", attrs.evolve(request, request_id=rid)))
        return rid

    def abort(self, request_id: str) -> bool:
        """Rank 0: end a request on every rank (``Engine.abort``)."""
        self._rank0("abort")
        ended = self.engine.abort(request_id)
        self._outbox.append(("abort", request_id))
        return ended

    def step(self) -> bool:
        """Every rank: take rank 0's submissions and aborts, then one engine step. Returns whether the group has work
        (rank 0's answer, the same on every rank)."""
        msg = [(self._outbox, self.engine.has_work())] if self.tp.rank == 0 else [None]
        dist.broadcast_object_list(msg, src=0, group=self.tp.group)
        events, _ = msg[0]
        if self.tp.rank != 0:
            for kind, what in events:
                if kind == "submit":
                    self.engine.submit(what)
                else:
                    self.engine.abort(what)
        self._outbox = []
        if self.engine.has_work():
            self.engine.step()
        if self.check:
            self._check()
        flag = [self.engine.has_work() if self.tp.rank == 0 else None]
        dist.broadcast_object_list(flag, src=0, group=self.tp.group)
        return bool(flag[0])

    def run(self, requests: list[Request] | None) -> list:
        """Every rank: serve ``requests`` (given on rank 0; None elsewhere) to the end; each rank's results."""
        ids = [self.submit(r) for r in requests] if self.tp.rank == 0 else []
        while self.step():
            pass
        ids_msg = [ids]
        dist.broadcast_object_list(ids_msg, src=0, group=self.tp.group)
        return [self.engine.pop_result(i) for i in ids_msg[0]]

    def _check(self) -> None:
        """Every rank has emitted the same tokens so far (count and a sum of ids weighted by position)."""
        tbl = self.engine.table
        digest = torch.tensor([int(tbl.emitted), int(tbl.digest)], dtype=torch.int64, device=self._device)
        lo, hi = digest.clone(), digest.clone()
        dist.all_reduce(lo, op=dist.ReduceOp.MIN, group=self.tp.group)
        dist.all_reduce(hi, op=dist.ReduceOp.MAX, group=self.tp.group)
        if not torch.equal(lo, hi):
            raise RuntimeError(f"rank {self.tp.rank}: the ranks' tokens diverged (emitted, digest) {digest.tolist()} "
                               f"vs min {lo.tolist()} max {hi.tolist()}")  # fmt: skip

    def _rank0(self, what: str) -> None:
        if self.tp.rank != 0:
            raise RuntimeError(f"{what} on rank {self.tp.rank}: only rank 0 takes requests; the others follow it")
