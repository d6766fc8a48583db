"""What a model asks of the state pools: KV pools (paged) and recurrent pools (one slot per request). A model declares
its pools with these records once; the engine derives its row layout and page counts from them
(``models.engine.pools.pool_layout``) and allocates the caches they describe."""

from __future__ import annotations

import attrs
import torch

from resplan.layout import KVPool, StreamMode


@attrs.frozen
class KVPoolSpec:
    """A paged KV pool of ``num_layers`` layers, one cache each [num_pages, 2, page_size, n_kv_heads, head_dim], whose
    streams hold at most ``max_seq_len`` tokens; decode appends to it (APPEND) or only reads it (READ: a
    cross-attention context)."""

    key: str
    mode: StreamMode
    num_layers: int
    n_kv_heads: int
    head_dim: int
    max_seq_len: int

    def layout_pool(self, page_size: int, num_pages: int, max_seq_len: int | None = None) -> KVPool:
        """The row layout's view of this pool at a page size and page count (page 0 the sink), its streams up to
        ``max_seq_len`` tokens (default: the model's limit)."""
        return KVPool(self.key, page_size, num_pages, self.max_seq_len if max_seq_len is None else max_seq_len,
                      self.mode)  # fmt: skip

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        """K and V of one token over all the pool's layers."""
        return 2 * self.num_layers * self.n_kv_heads * self.head_dim * dtype.itemsize

    def allocate(self, num_pages: int, page_size: int, *, device, dtype) -> tuple[torch.Tensor, ...]:
        """Zeroed caches, one a layer (views of ``allocate_stacked``'s tensor)."""
        return tuple(self.allocate_stacked(num_pages, page_size, device=device, dtype=dtype).unbind(0))

    def allocate_stacked(self, num_pages: int, page_size: int, *, device, dtype) -> torch.Tensor:
        """Zeroed caches of every layer in one tensor, [num_layers, num_pages, 2, page_size, n_kv_heads, head_dim]:
        each layer's cache is contiguous, and one page over every layer is one index of its transpose."""
        return torch.zeros(self.num_layers, num_pages, 2, page_size, self.n_kv_heads, self.head_dim, dtype=dtype,
                           device=device)  # fmt: skip


@attrs.frozen
class RecurrentSpec:
    """One recurrent (GDN) layer: conv state [slots, *conv_shape] in the model dtype, SSM state [slots, *ssm_shape]."""

    layer: int
    conv_shape: tuple[int, ...]  # (conv_dim, conv_kernel_size)
    ssm_shape: tuple[int, ...]  # (num_v_heads, k_head_dim, v_head_dim)
    ssm_dtype: torch.dtype = torch.float32

    def slot_bytes(self, dtype: torch.dtype) -> int:
        """Bytes one slot holds in this layer (conv in ``dtype``, SSM in ``ssm_dtype``)."""
        conv = dtype.itemsize
        for n in self.conv_shape:
            conv *= n
        ssm = self.ssm_dtype.itemsize
        for n in self.ssm_shape:
            ssm *= n
        return conv + ssm
