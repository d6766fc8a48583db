"""Whisper's paged KV caches: one tuple of per-layer caches for each pool the decoder declares."""

from __future__ import annotations

from models.layers.specs import KVPoolSpec


class PagedState(dict):
    """Pool key -> one cache a layer, [num_pages, 2, ps, n_kv, dh]. ``prefill_attention``: the prefill pass's
    FlashInfer attention (``models.whisper.model.PrefillAttention``) where it has kernels (CUDA, bf16 or fp16, a head
    width FlashInfer serves), else None; it lives as long as the pools it reads."""

    prefill_attention = None


def allocate_pools(
    specs: tuple[KVPoolSpec, ...], num_pages: dict[str, int], page_size: dict[str, int], *, device, dtype
) -> PagedState:
    """Per-layer caches for every pool in specs, sized by its entry in num_pages and page_size."""
    for spec in specs:
        if num_pages[spec.key] < 2:
            raise ValueError(f"pool {spec.key!r}: num_pages must be >= 2 (page 0 is the sink)")
    return PagedState({s.key: s.allocate(num_pages[s.key], page_size[s.key], device=device, dtype=dtype)
                       for s in specs})  # fmt: skip
