"""A decode step's device side, built once: each bucket's decode attention, its capture plan (``resplan.BucketPlan``,
from the streams the adapter's decode walk declares), and its captured graphs keyed by ``(capture plan, sampling
mode)`` (``DecodeGraphs``), two a key (``Pair``: graph k reads its sampled tokens back into the launcher's pinned
entry k, so that a replay's readback is in the graph, and a launch lets the interpreter go once, at the replay); and
the CUDA streams an engine's graphs and passes run on (``engine_streams``)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import attrs
import numpy as np
import torch

from kernels.choices import KernelChoices
from models.engine.adapters import DECODE, Adapter
from models.engine.launcher import Launcher
from models.engine.sampler import Sampler, SamplingMode, greedy
from models.layers.decode_attention import Backend
from models.layers.flashinfer_attention import Workspaces, make_decode_attention
from resplan import (
    BucketPlan,
    CaptureError,
    Executor,
    Graph,
    ResidentStream,
    RowLayout,
    capture_streams,
    distinct_streams,
)

log = logging.getLogger(__name__)

GraphKey = tuple[BucketPlan, SamplingMode]  # (the bucket's capture plan, how its rows draw)
Pair = tuple[Graph, Graph]  # one step's graphs by readback parity: [k] reads back into the launcher's pinned entry k


def make_attention(backend: Backend, adapter: Adapter, layout: RowLayout, buckets: tuple[int, ...], page_size: int,
                   device: torch.device, dtype: torch.dtype, kc: KernelChoices,
                   workspaces: Workspaces | None = None) -> dict[int, object | None]:  # fmt: skip
    """Each bucket's decode attention: None (plain torch), one XQA or Triton attention shared by every bucket, or
    fa2 per bucket. Triton runs on a CPU too, in Triton's interpreter, and launches as ``kc.pdl`` says. XQA and fa2
    take their FlashInfer workspace from ``workspaces`` (the engine's; None: one private to these attentions), every
    fa2 bucket the same one."""
    if backend is Backend.TORCH:
        return {b: None for b in buckets}
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
            kc: KernelChoices, b: int, mode: SamplingMode, resident: bool, device_ids: bool, parity: int,
            tokens: int = 1) -> Callable[[], None]:  # fmt: skip
    """One decode step of bucket b: (resident: scatter + gather rows,) forward (its kernels as ``kc`` says), draw as
    ``mode`` says (LOGPROBS: and every row's logprobs into the launcher's buffers), (resident: commit), then read the
    sampled tokens (and logprobs) back into the launcher's pinned entry ``parity``. A graph with ``device_ids``
    (resident, and a host-planned one under overlap) takes its input ids from the device. ``tokens`` = k > 1
    (resident, no logprobs): k such sub-steps, each after the first taking the tokens the one before drew, each read
    back into its own row of the entry (the staged cells are scattered by the first: the scatter empties them)."""
    ex, bufs, host_ids, out = executor, executor.buffers[b], launcher.ids[b], launcher.tokens[b]
    src, last = launcher.idsrc[b][1], launcher.tokens_all
    lp_out = launcher.logprobs[b]  # [b], [b, 5], [b, 5]
    host_tokens, host_lp = launcher.readback(parity, b)  # pinned [K, b]; [b], [b, 5], [b, 5]
    assert tokens == 1 or (resident and mode is not SamplingMode.LOGPROBS), "k tokens a launch: resident, no logprobs"

    def fn() -> None:
        for j in range(tokens):
            ids = host_ids
            if resident:
                ex.before_forward(b)
            if j:
                ids = out  # [b] the sub-step before's tokens (read by the forward before the draw rewrites out)
            elif device_ids:
                ids = torch.where(src >= 0, last[src.clamp(min=0)], host_ids)  # [b] last step's token, or the host's
            logits = adapter.decode(model_state, ids, bufs, attn, kc)  # [b, V]
            if mode is SamplingMode.GREEDY:
                greedy(logits, out, kc)
            elif mode is SamplingMode.SAMPLE:
                sampler(logits, bufs.sampler, bufs.positions, out)
            else:  # (temperature 0 rows: the argmax)
                drawn, lp = sampler.draw_logprobs(logits, bufs.sampler, bufs.positions)  # [b], ([b], [b, 5], [b, 5])
                out.copy_(drawn)
                for dst, v in zip(lp_out, lp, strict=True):
                    dst.copy_(v)
            if resident:
                ex.after_forward(b)
            host_tokens[j].copy_(out, non_blocking=True)
        if mode is SamplingMode.LOGPROBS:
            for dst, src_lp in zip(host_lp, lp_out, strict=True):
                dst.copy_(src_lp, non_blocking=True)

    return fn


def capture_graphs(plans: dict[int, BucketPlan], attn: dict[int, object | None], width: int, device: torch.device,
                   make_fn: Callable[[int, SamplingMode, bool, int, int], Callable[[], None]], resident: bool,
                   stream: torch.cuda.Stream | None = None, mixed_steps: bool = True, tokens: int = 1,
                   ) -> tuple[dict[GraphKey, Pair], dict[GraphKey, Pair], dict[GraphKey, Pair]]:  # fmt: skip
    """Capture every bucket once per sampling mode and readback parity (``Pair``), largest first, in one memory pool:
    the host-planned graphs (mixed steps, and the host arm's decode) and, in the resident arm, the resident decode
    graphs (else the host-planned ones again), and with ``tokens`` = k > 1 the resident graphs of k tokens a launch
    (GREEDY and SAMPLE). ``make_fn(b, mode, resident, parity, k)`` is the step to capture. A step
    whose rows are all greedy replays the argmax graph and skips the sampler's top-k over the vocabulary (hundreds of
    microseconds of GPU time at 64 rows); only a step with a row asking for logprobs replays the LOGPROBS graph (a
    log_softmax over the vocabulary more). ``width``: the block table's columns (a host-scheduled attention is
    scheduled for the trash rows first). ``stream``: the capture stream (None: torch's default one). ``mixed_steps``
    False: the resident arm runs no step on host-filled buffers (its passes run beside the decode steps, or carry the
    decode rows), so only the resident graphs are captured (half the captures, and half their memory)."""
    for b, p in plans.items():  # a captured run of a host-scheduled attention needs a schedule: the trash rows'
        if not p.host_plan_free:
            attn[b].schedule(np.zeros((b, width), np.int32), np.ones(b, np.int32))
    pool, host, res, multi = None, {}, {}, {}

    def pair(b: int, mode: SamplingMode, resident_rows: bool, k: int = 1) -> Pair:
        nonlocal pool
        graphs = []
        for parity in (0, 1):  # (parity 0's eager warm-up made the stream's workspaces: parity 1 needs none)
            graphs.append(Graph(make_fn(b, mode, resident_rows, parity, k), device, pool, warmup=1 - parity,
                                stream=stream))  # fmt: skip
            pool = graphs[-1].pool
        return graphs[0], graphs[1]

    for b in sorted(plans, reverse=True):
        key = plans[b]
        for mode in (SamplingMode.LOGPROBS, SamplingMode.SAMPLE, SamplingMode.GREEDY):
            if mixed_steps or not resident:
                host[key, mode] = pair(b, mode, False)
            if resident:
                res[key, mode] = pair(b, mode, True)
            if resident and tokens > 1 and mode is not SamplingMode.LOGPROBS:
                multi[key, mode] = pair(b, mode, True, tokens)
    return host, (res if resident else host), multi


@attrs.frozen(eq=False)
class DecodeGraphs:
    """Every bucket's attention, capture plan and captured graphs. ``resident``: the decode graphs gather and commit
    the store's rows (resident planning asked for, and no resource refused it; else ``refusal`` says why not)."""

    attn: dict[int, object | None]
    plans: dict[int, BucketPlan]
    refusal: CaptureError | None
    resident: bool
    host_graphs: dict[GraphKey, Pair]  # read host-filled buffers: mixed steps, and the host arm's decode steps
    decode_graphs: dict[GraphKey, Pair]  # a decode step's (resident: the resident graphs; else host_graphs)
    multi_graphs: dict[GraphKey, Pair]  # resident steps of ``EngineConfig.tokens_per_launch`` tokens (GREEDY, SAMPLE)

    def decode(self, b: int, mode: SamplingMode, tokens: int = 1) -> Pair:
        """Bucket b's decode step graphs drawing as ``mode`` says (``RequestTable.mode`` of its rows), of ``tokens``
        tokens a row (1, or the engine's tokens_per_launch)."""
        return (self.decode_graphs if tokens == 1 else self.multi_graphs)[self.plans[b], mode]

    def host(self, b: int, mode: SamplingMode) -> Pair:
        """Bucket b's graphs over buffers the host filled (a mixed step's decode rows; captured where the engine runs
        mixed steps)."""
        return self.host_graphs[self.plans[b], mode]


def build_graphs(adapter: Adapter, model_state, layout: RowLayout, buckets: tuple[int, ...], backend: Backend,
                 resident: bool, executor: Executor, launcher: Launcher, sampler: Sampler, kc: KernelChoices,
                 device_ids: bool, dtype: torch.dtype, page_size: int, workspaces: Workspaces,
                 stream: torch.cuda.Stream | None, mixed_steps: bool = True,
                 tokens: int = 1) -> DecodeGraphs:  # fmt: skip
    """The attention, capture plans and graphs of every bucket (``resident``: resident planning asked for;
    ``device_ids``: the host-planned graphs take their input ids from the device, as under overlap; ``mixed_steps``:
    the engine runs decode rows from a host fill beside a pass in the step; ``tokens``: a resident launch's tokens a
    row, k > 1 capturing those graphs too)."""
    device = executor.device
    attn = make_attention(backend, adapter, layout, buckets, page_size, device, dtype, kc, workspaces)
    refusal, plans = capture_plans(adapter, layout, buckets, attn, resident)
    resident = resident and refusal is None

    def make_fn(b: int, mode: SamplingMode, res: bool, parity: int, k: int) -> Callable[[], None]:
        return step_fn(adapter, model_state, executor, launcher, sampler, attn[b], kc, b, mode, res,
                       device_ids=res or device_ids, parity=parity, tokens=k)  # fmt: skip

    W = layout.span(layout.append_pools[0].key).width
    host, decode, multi = capture_graphs(plans, attn, W, device, make_fn, resident, stream, mixed_steps, tokens)
    return DecodeGraphs(attn, plans, refusal, resident, host, decode, multi)


def engine_streams(device: torch.device) -> tuple[torch.cuda.Stream | None, ...]:
    """An engine's CUDA streams, pairwise distinct (torch's pool hands out 32 in turn; graphs or GEMMs that may run
    at once must not share a cuBLAS workspace, resplan.Graph): the decode graphs' and the passes' capture streams,
    and the stream passes beside the decode steps run on. All None on a CPU."""
    return distinct_streams(device, 3) if device.type == "cuda" else (None, None, None)


def priority_stream(device: torch.device, priority: int) -> torch.cuda.Stream:
    """A stream of ``priority`` that an engine's steps run on, after everything queued so far on the caller's (its
    build)."""
    stream = torch.cuda.Stream(device, priority=priority)
    stream.wait_stream(torch.cuda.current_stream(device))
    return stream
