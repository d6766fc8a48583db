"""What a model asks of the state pools: KV pools (paged) and recurrent pools (one slot per request)."""

from __future__ import annotations

import attrs
import torch


@attrs.frozen
class KVPoolSpec:
    """A paged KV pool shared by ``num_layers`` layers; per layer [num_pages, 2, page_size, n_kv_heads, head_dim]."""

    key: str
    num_layers: int
    n_kv_heads: int
    head_dim: int

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        """K and V of one token over all the pool's layers."""
        return 2 * self.num_layers * self.n_kv_heads * self.head_dim * dtype.itemsize


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
