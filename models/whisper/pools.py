"""The paged KV pools a model needs, described once: what a layout pool and a cache allocation are built from."""

from __future__ import annotations

import attrs
import torch

from models.layers.paged import allocate_kv
from resplan.layout import KVPool, StreamMode

PagedState = dict[str, tuple[torch.Tensor, ...]]  # pool key -> one cache a layer, [num_pages, 2, ps, n_kv, dh]


@attrs.frozen
class KVPoolSpec:
    """One pool: n_layers caches of [num_pages, 2, page_size, n_kv_heads, head_dim]; streams up to max_seq_len."""

    key: str
    mode: StreamMode
    n_layers: int
    n_kv_heads: int
    head_dim: int
    max_seq_len: int

    def layout_pool(self, page_size: int, num_pages: int) -> KVPool:
        """The layout's view of this pool at a page size and page count (page 0 the sink)."""
        return KVPool(self.key, page_size, num_pages, self.max_seq_len, self.mode)

    def page_bytes(self, page_size: int, dtype: torch.dtype) -> int:
        """Bytes one page takes across all layers: n_layers * 2 * page_size * n_kv_heads * head_dim * itemsize."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        return self.n_layers * 2 * page_size * self.n_kv_heads * self.head_dim * itemsize

    def allocate(self, num_pages: int, page_size: int, *, device, dtype) -> tuple[torch.Tensor, ...]:
        """Zeroed caches, one a layer."""
        return tuple(
            allocate_kv(num_pages, page_size, self.n_kv_heads, self.head_dim, dtype=dtype, device=device)
            for _ in range(self.n_layers)
        )


def allocate_pools(
    specs: tuple[KVPoolSpec, ...], num_pages: dict[str, int], page_size: dict[str, int], *, device, dtype
) -> PagedState:
    """Per-layer caches for every pool in specs, sized by its entry in num_pages and page_size."""
    for spec in specs:
        if num_pages[spec.key] < 2:
            raise ValueError(f"pool {spec.key!r}: num_pages must be >= 2 (page 0 is the sink)")
    return {s.key: s.allocate(num_pages[s.key], page_size[s.key], device=device, dtype=dtype) for s in specs}
