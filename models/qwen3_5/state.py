"""The pools a Qwen3.5 model reads and writes: paged KV per attention layer, conv + SSM slots per GDN layer, each
kind one tensor over its layers."""

from __future__ import annotations

import attrs
import torch


@attrs.frozen(eq=False)
class Qwen35State:
    """Fixed-address state tensors. Page 0 of each KV cache and slot 0 of each recurrent pool are sinks."""

    kv_pool: torch.Tensor  # [attention layers, num_pages, 2, page_size, n_kv_heads, head_dim]
    conv_pool: torch.Tensor  # [gdn layers, num_slots, conv_dim, conv_kernel] (last K conv inputs)
    ssm_pool: torch.Tensor  # [gdn layers, num_slots, num_v_heads, k_head_dim, v_head_dim] (float32 by default)
    page_size: int
    num_pages: int
    num_slots: int
    saving: bool = False  # its prefill passes may save states into spare slots (PrefillChunk.saves); False: a
    # pass has no save inputs and runs no save work (an engine without the prefix cache)
    prefill_attention: object = None  # models.layers.prefill_attention.FlashInferPrefill on CUDA: the prefill pass's
    # FlashInfer wrappers and workspace, which live as long as the pools they read
    staging: object = None  # models.layers.flat.HostStaging on CUDA: a pass's index arrays up in one copy
    kv: tuple[torch.Tensor, ...] = attrs.field(init=False)  # per attention layer i: kv_pool[i], [num_pages, ...]
    conv: tuple[torch.Tensor, ...] = attrs.field(init=False)  # per GDN layer j: conv_pool[j], [num_slots, ...]
    ssm: tuple[torch.Tensor, ...] = attrs.field(init=False)  # per GDN layer j: ssm_pool[j], [num_slots, ...]

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "kv", tuple(self.kv_pool.unbind(0)))
        object.__setattr__(self, "conv", tuple(self.conv_pool.unbind(0)))
        object.__setattr__(self, "ssm", tuple(self.ssm_pool.unbind(0)))

    def slot_major(self) -> tuple[torch.Tensor, ...]:
        """The recurrent pools slot first, [num_slots, gdn layers, ...] (conv, SSM): a slot's state over every layer
        in one index, so a slot is copied by one copy a kind, not one a layer and kind."""
        return self.conv_pool.transpose(0, 1), self.ssm_pool.transpose(0, 1)

    def page_major(self) -> tuple[torch.Tensor, ...]:
        """The KV caches page first, [num_pages, attention layers, 2, page_size, ...]: a page over every layer in one
        index, so a page is copied by one copy, not one a layer."""
        return (self.kv_pool.transpose(0, 1),)

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every pool tensor by a flat name (for comparisons and debugging)."""
        out = {f"kv.{i}": t for i, t in enumerate(self.kv)}
        out.update({f"conv.{i}": t for i, t in enumerate(self.conv)})
        out.update({f"ssm.{i}": t for i, t in enumerate(self.ssm)})
        return out

    def clone(self) -> Qwen35State:
        """A deep copy at new addresses."""
        return attrs.evolve(
            self,
            kv_pool=self.kv_pool.clone(),
            conv_pool=self.conv_pool.clone(),
            ssm_pool=self.ssm_pool.clone(),
        )
