"""A decode step's device side, built once: each bucket's decode attention, its capture plan (``resplan.BucketPlan``,
from the streams the adapter's decode walk declares), and its captured graphs keyed by ``(capture plan, greedy)``."""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import torch

from kernels.choices import KernelChoices
from models.engine.adapters import DECODE, Adapter
from models.engine.launcher import Launcher
from models.engine.sampler import Sampler
from models.layers.decode_attention import Backend
from models.layers.flashinfer_attention import Workspaces, make_decode_attention
from resplan import BucketPlan, CaptureError, Executor, Graph, ResidentStream, RowLayout, capture_streams

log = logging.getLogger(__name__)

GraphKey = tuple[BucketPlan, bool]  # (the bucket's capture plan, greedy)


def make_attention(backend: Backend, adapter: Adapter, layout: RowLayout, buckets: tuple[int, ...], page_size: int,
                   device: torch.device, dtype: torch.dtype, kc: KernelChoices,
                   workspaces: Workspaces | None = None) -> dict[int, object | None]:  # fmt: skip
    """Each bucket's decode attention: None (plain torch), one XQA or Triton attention shared by every bucket, or
    fa2 per bucket. Triton runs on a CPU too, in Triton's interpreter, and launches as ``kc.pdl`` says. XQA and fa2
    take their FlashInfer workspace from ``workspaces`` (the engine's; None: one private to these attentions), every
    fa2 bucket the same one."""
    if backend is Backend.TORCH:
        return {b: None for b in buckets}
    if device.type != "cuda" and backend is not Backend.TRITON:
        raise ValueError(f"attention {backend.value} runs on CUDA only; use Backend.TORCH on {device}")
    if layout.read_pools or len(layout.append_pools) != 1:
        raise ValueError(f"{adapter.name}: GPU attention backends serve one appended pool, no read pools")
    hq, hk, d, scale = adapter.attention_dims()
    W = layout.span(layout.append_pools[0].key).width
    common = dict(max_pages_per_row=W, num_qo_heads=hq, num_kv_heads=hk, head_dim=d, page_size=page_size,
                  device=device, dtype=dtype, sm_scale=scale,
                  workspaces=Workspaces(device) if workspaces is None else workspaces)  # fmt: skip
    if backend in (Backend.XQA, Backend.TRITON):
        extra = dict(pdl=kc.pdl) if backend is Backend.TRITON else {}
        shared = make_decode_attention(backend, batch_size=buckets[-1], **common, **extra)
        return {b: shared for b in buckets}
    return {b: make_decode_attention(Backend.FA2, batch_size=b, **common) for b in buckets}


def capture_plans(adapter: Adapter, layout: RowLayout, buckets: tuple[int, ...], attn: dict[int, object | None],
                  resident: bool) -> tuple[CaptureError | None, dict[int, BucketPlan]]:  # fmt: skip
    """Each bucket's capture plan: the stream record of each KV pool in the decode walk the adapter declares, checked
    by the planner's capture rules (``resplan.capture_streams``), and whether its attention needs a host schedule. A
    resource that cannot keep rows on the device refuses resident planning: returns that refusal (logged once, when
    the engine asked for the resident arm) with plain records, and the engine is host-planned."""
    streams = {p.key: ResidentStream(DECODE, p.mode) for p in layout.pools}
    refusal = None
    try:
        declared = capture_streams(adapter.decode_walk(), adapter.resources(), adapter.positions_pool)
        streams = {k: declared[k] for k in streams}
    except CaptureError as e:
        refusal = e
        if resident:
            log.warning("%s: resident planning refused, the engine is host-planned: %s", adapter.name, e)
    plans = {b: BucketPlan.build(b, streams, attn[b] is None or attn[b].backend.host_plan_free) for b in buckets}
    return refusal, plans


def step_fn(adapter: Adapter, model_state, executor: Executor, launcher: Launcher, sampler: Sampler, attn,
            kc: KernelChoices, b: int, greedy: bool, resident: bool,
            device_ids: bool) -> Callable[[], None]:  # fmt: skip
    """One decode step of bucket b: (resident: scatter + gather rows,) forward (its kernels as ``kc`` says), sample,
    (resident: commit). A graph with ``device_ids`` (resident, and a host-planned one under overlap) takes its input
    ids from the device."""
    ex, bufs, host_ids, out = executor, executor.buffers[b], launcher.ids[b], launcher.tokens[b]
    src, last = launcher.idsrc[b][1], launcher.tokens_all

    def fn() -> None:
        ids = host_ids
        if resident:
            ex.before_forward(b)
        if device_ids:
            ids = torch.where(src >= 0, last[src.clamp(min=0)], host_ids)  # [b] last step's token, or the host's
        logits = adapter.decode(model_state, ids, bufs, attn, kc)  # [b, V]
        out.copy_(logits.argmax(-1) if greedy else sampler(logits, bufs.sampler, bufs.positions))
        if resident:
            ex.after_forward(b)

    return fn


def capture_graphs(plans: dict[int, BucketPlan], attn: dict[int, object | None], width: int, device: torch.device,
                   make_fn: Callable[[int, bool, bool], Callable[[], None]], resident: bool,
                   stream: torch.cuda.Stream | None = None,
                   ) -> tuple[dict[GraphKey, Graph], dict[GraphKey, Graph]]:  # fmt: skip
    """Capture every bucket once per sampling mode, largest first, in one memory pool: the host-planned graphs (mixed
    steps, and the host arm's decode) and, in the resident arm, the resident decode graphs (else the host-planned
    ones again). ``make_fn(b, greedy, resident)`` is the step to capture. A step whose rows are all greedy replays the
    argmax graph and skips the sampler's top-k over the vocabulary (hundreds of microseconds of GPU time at 64
    rows). ``width``: the block table's columns (a host-scheduled attention is scheduled for the trash rows first).
    ``stream``: the capture stream (None: torch's default one)."""
    for b, p in plans.items():  # a captured run of a host-scheduled attention needs a schedule: the trash rows'
        if not p.host_plan_free:
            attn[b].schedule(np.zeros((b, width), np.int32), np.ones(b, np.int32))
    pool, host, res = None, {}, {}
    for b in sorted(plans, reverse=True):
        key = plans[b]
        for greedy in (False, True):
            host[key, greedy] = Graph(make_fn(b, greedy, False), device, pool, stream=stream)
            pool = host[key, greedy].pool
            if resident:
                res[key, greedy] = Graph(make_fn(b, greedy, True), device, pool, stream=stream)
    return host, (res if resident else host)
