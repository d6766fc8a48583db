"""A model's one-row decode over fixed tokens, for tests that compare two kernel choices of the fused step: the model
with its norm weights made visible, and the logits of a few steps after a prefilled prompt."""

from __future__ import annotations

import torch

from kernels.choices import KernelChoices
from models.engine import build_adapter
from models.qwen3_5 import KV_POOL
from resplan.buffers import StepBuffers
from resplan.layout import KVPool, RowLayout

PAGE = 4


def model_with_norms(name: str, device: str, dtype: torch.dtype):
    """The named model (seeded random weights), its pre-norm weights redrawn around 0 (the models start them at
    exactly 0, where (1 + w) = 1 would hide the norm weight)."""
    model = build_adapter(name, seed=0, device=device, dtype=dtype).model
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("layernorm.weight") or pname == "model.norm.weight":
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
    return model


def decode_one_row(model, kc: KernelChoices, steps: int, device: str, dtype: torch.dtype) -> list[torch.Tensor]:
    """A 7-token prompt prefilled into slot 1, then ``steps`` decode steps of one row over fixed tokens with the
    kernel choices ``kc``; the logits [1, V] of each step (each step reads the states the one before wrote)."""
    gen = torch.Generator().manual_seed(11)
    ids = torch.randint(0, model.cfg.vocab_size, (7 + steps,), generator=gen)
    pages = [3, 1, 4, 2, 5]
    state = model.allocate_state(8, PAGE, 3, device, dtype)
    model.prefill(state, ids[:7], pages, start=0, rec_slot=1)
    layout = RowLayout((KVPool(KV_POOL, PAGE, 8, len(pages) * PAGE),), positions_pool=KV_POOL, recurrent=True,
                       sampler=False)  # fmt: skip
    bufs = StepBuffers.allocate(layout, 1, device)
    bufs.block_tables[KV_POOL][0, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
    bufs.recurrent_slots.fill_(1)
    out = []
    for t in range(7, 7 + steps):  # token t at position t
        bufs.seq_lens[KV_POOL].fill_(t + 1)
        bufs.write_loc[KV_POOL].fill_(pages[t // PAGE] * PAGE + t % PAGE)
        bufs.positions.fill_(t)
        out.append(model.decode(state, ids[t : t + 1].to(device), bufs, kc=kc))
    return out
