"""The pools a Qwen3.5 model reads and writes: paged KV per attention layer, conv + SSM slots per GDN layer."""

from __future__ import annotations

import attrs
import torch


@attrs.frozen(eq=False)
class Qwen35State:
    """Fixed-address state tensors. Page 0 of each KV cache and slot 0 of each recurrent pool are sinks."""

    kv: tuple[torch.Tensor, ...]  # per full-attention layer: [num_pages, 2, page_size, n_kv_heads, head_dim]
    conv: tuple[torch.Tensor, ...]  # per GDN layer: [num_slots, conv_dim, conv_kernel] (last K conv inputs)
    ssm: tuple[torch.Tensor, ...]  # per GDN layer: [num_slots, num_v_heads, k_head_dim, v_head_dim] float32
    page_size: int
    num_pages: int
    num_slots: int
    saving: bool = False  # its prefill passes may save states into spare slots (PrefillChunk.saves); False: a
    # pass has no save inputs and runs no save work (an engine without the prefix cache)
    prefill_attention: object = None  # models.layers.prefill_attention.FlashInferPrefill on CUDA: the prefill pass's
    # FlashInfer wrappers and workspace, which live as long as the pools they read

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
            kv=tuple(t.clone() for t in self.kv),
            conv=tuple(t.clone() for t in self.conv),
            ssm=tuple(t.clone() for t in self.ssm),
        )
