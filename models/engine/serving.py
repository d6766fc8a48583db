"""The engine a server (and ``generate``) runs by default: the fastest arm measured on the H200 where there is CUDA
(plan-free Triton attention, overlapped resident steps, captured prefill passes on their own stream beside the decode
steps), the engine that runs on a CPU elsewhere; its context the model's, its KV pool sized to a memory budget.

Every choice a user may make is a keyword; None takes the default, resolved here against the loaded model, and
``ServingPlan.notes`` says in words what each default chose (a server prints them at start-up)."""

from __future__ import annotations

import attrs
import torch

from models.engine.adapters import Adapter
from models.engine.config import CHECKPOINTS_PER_ROW, EngineConfig, PrefillPlacement
from models.engine.prefill import token_buckets
from models.layers.decode_attention import Backend

GIB = 1 << 30
PREFILL_GRAPHS = 6  # token buckets halving down from 8192, as the benchmarks run (those no pass fills: not captured)
CUDA_KV_FRACTION = 0.5  # of the GPU memory free once the weights are loaded
CPU_KV_GIB = 2.0


@attrs.frozen
class ServingPlan:
    config: EngineConfig
    notes: tuple[str, ...]  # what each default chose, in words


def kv_page_bytes(adapter: Adapter, page_size: int, dtype: torch.dtype) -> int:
    """Bytes one page of every APPEND pool takes (the pools share page numbers: a page is taken in each)."""
    return page_size * sum(p.bytes_per_token(dtype) for p in adapter.append_pools)


def serving_config(
    adapter: Adapter,
    device: str,
    *,
    max_running: int | None = None,
    max_seq_len: int | None = None,
    page_size: int = 16,
    num_pages: int | None = None,
    kv_memory_gib: float | None = None,
    attention: Backend | None = None,
    overlap: bool | None = None,
    prefill_graphs: int | None = None,
    prefill: PrefillPlacement | None = None,
    token_budget: int | None = None,
    prefix_cache: bool | None = None,
) -> ServingPlan:
    """The serving engine's config for ``adapter`` on ``device`` (module doc); ValueError for a choice that cannot
    run there, naming it."""
    cuda = torch.device(device).type == "cuda"
    dtype = next(adapter.model.parameters()).dtype
    notes = []
    if attention is None:
        # (the GPU backends serve one appended pool and no read pool: graphs.make_attention's rule)
        gpu_attention = cuda and len(adapter.pools) == len(adapter.append_pools) == 1
        attention = Backend.TRITON if gpu_attention else Backend.TORCH
        notes.append(f"attention {attention.value}" + ("" if gpu_attention else " (plain torch: " + (
            "no CUDA" if not cuda else "a model with a cross-attention pool") + ")"))  # fmt: skip
    overlap = True if overlap is None else overlap
    if max_running is None:
        max_running = 64 if cuda else 8
        notes.append(f"{max_running} requests at once (--max-running)")
    context = adapter.max_context
    if max_seq_len is None:
        max_seq_len = context
        notes.append(f"context {context} tokens, the model's (--max-seq-len)")
    if prefill_graphs is None:
        refusal = adapter.prefill_capture_refusal() if cuda else "no CUDA"
        prefill_graphs = PREFILL_GRAPHS if refusal is None else 0
        if refusal is not None:
            notes.append(f"prefill passes eager ({refusal})")
    width = -(-max_seq_len // page_size)
    full = max_running * width + 1  # every running request at the full context: more could never be used
    if num_pages is None:
        page = kv_page_bytes(adapter, page_size, dtype)
        if kv_memory_gib is None:
            budget = CUDA_KV_FRACTION * torch.cuda.mem_get_info(device)[0] if cuda else CPU_KV_GIB * GIB
        else:
            budget = kv_memory_gib * GIB
        num_pages = min(full, int(budget // max(page, 1)) + 1)
        if num_pages - 1 < width:
            raise ValueError(f"the KV memory budget ({budget / GIB:.2f} GiB) holds {num_pages - 1} pages of "
                             f"{page_size} tokens, less than one request at the context of {max_seq_len} tokens: "
                             "raise --kv-memory-gib or lower --max-seq-len")  # fmt: skip
        notes.append(f"{num_pages - 1} KV pages of {page_size} tokens ({(num_pages - 1) * page / GIB:.2f} GiB, "
                     f"{(num_pages - 1) * page_size} tokens)" + (": every request at the full context" if
                                                                  num_pages == full else ""))  # fmt: skip
    if prefix_cache is None:
        prefix_cache = adapter.recurrent and len(adapter.pools) == 1  # (check_fits' rule: Qwen3.5)
    cache = {}
    if prefix_cache:
        cache = dict(prefix_cache=True, checkpoints=CHECKPOINTS_PER_ROW * max_running)
        slot = sum(s.slot_bytes(dtype) for s in adapter.model.recurrent_specs())
        notes.append(f"prefix cache on: {cache['checkpoints']} recurrent-state checkpoints "
                     f"({cache['checkpoints'] * slot / GIB:.2f} GiB; --no-prefix-cache)")  # fmt: skip
    placement = {} if prefill is None else {"prefill": prefill}
    budget_field = {} if token_budget is None else {"token_budget": token_budget}
    cfg = EngineConfig(max_running=max_running, page_size=page_size, num_pages=num_pages, max_seq_len=max_seq_len,
                       device=device, attention=attention, overlap=overlap, prefill_graphs=prefill_graphs,
                       **placement, **budget_field, **cache)  # fmt: skip
    notes.append(f"prefill {cfg.prefill.value}, token budget {cfg.token_budget}")
    if cfg.prefill_graphs:  # (the buckets a pass of the budget can fill: EngineConfig.largest_pass)
        b = token_buckets(cfg.prefill_graphs, cfg.prefill_graph_tokens, cfg.largest_pass)
        notes.append(f"prefill passes captured in {len(b)} token buckets ({', '.join(map(str, b))} tokens)")
    return ServingPlan(cfg, tuple(notes))
