"""The static buffers a decode forward reads. The resident gather and the host-planned arm fill the same ones."""

from __future__ import annotations

import math

import attrs
import torch

from resplan.layout import SAMPLER_CELLS, RowLayout, StreamMode


@attrs.frozen(eq=False)
class StepBuffers:
    """Per captured bucket (b rows), fixed addresses for the life of the capture.

    For an APPEND pool, a row with stored length L writes its token at position L: ``seq_lens = L + 1``,
    ``write_loc = page(L // page_size) * page_size + L % page_size``. For a READ pool ``seq_lens = L``.
    Block-table columns past ``ceil(seq_lens / page_size)`` are 0 (the sink page). Padding rows read the trash row:
    block table all 0, APPEND seq_len 1, write_loc 0, position 0, recurrent slot 0, sampler cells 0 (greedy).
    """

    size: int
    block_tables: dict[str, torch.Tensor]  # pool -> [b, W] int32
    seq_lens: dict[str, torch.Tensor]  # pool -> [b] int32
    write_loc: dict[str, torch.Tensor]  # APPEND pool -> [b] int32 (flat token slot in the pool)
    positions: torch.Tensor | None  # [b] int32
    recurrent_slots: torch.Tensor | None  # [b] int32
    sampler: torch.Tensor | None  # [b, len(SamplerCell)] int32: temperature, top_p (float32 bits), top_k, seed, ...

    flat: torch.Tensor | None = None  # [cells] int32: every buffer above is a view of it (one H2D fills all)

    @classmethod
    def allocate(cls, layout: RowLayout, size: int, device: torch.device | str = "cpu") -> StepBuffers:
        """Buffers for a bucket of ``size`` rows, all views of one flat int32 tensor (``flat``), every row reading the
        trash row. A forward over buffers nothing has filled yet (a capture's warm-up) then attends one token of the
        sink page, as a padding row does: with APPEND lengths left 0 an attention kernel that does not guard empty
        rows (FlashInfer XQA) divides by a zero softmax sum and leaves NaN in the sink page and slot."""
        shapes: list[tuple[str, str | None, tuple[int, ...]]] = []
        shapes += [("block_tables", s.pool, (size, s.width)) for s in layout.spans]
        shapes += [("seq_lens", p.key, (size,)) for p in layout.pools]
        shapes += [("write_loc", p.key, (size,)) for p in layout.pools if p.mode is StreamMode.APPEND]
        if layout.positions_pool is not None:
            shapes.append(("positions", None, (size,)))
        if layout.recurrent:
            shapes.append(("recurrent_slots", None, (size,)))
        if layout.sampler:
            shapes.append(("sampler", None, (size, len(SAMPLER_CELLS))))
        total = sum(math.prod(shape) for _, _, shape in shapes)
        flat = torch.zeros(total, dtype=torch.int32, device=device)
        parts: dict[str, dict | torch.Tensor | None] = dict(
            block_tables={}, seq_lens={}, write_loc={}, positions=None, recurrent_slots=None, sampler=None
        )
        off = 0
        for name, key, shape in shapes:
            n = math.prod(shape)
            view = flat[off : off + n].view(shape)
            off += n
            if key is None:
                parts[name] = view
            else:
                parts[name][key] = view
        for p in layout.append_pools:
            parts["seq_lens"][p.key].fill_(1)
        return cls(size=size, flat=flat, **parts)

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every buffer by a flat name (for comparisons and debugging)."""
        out: dict[str, torch.Tensor] = {}
        for k, t in self.block_tables.items():
            out[f"block_table.{k}"] = t
        for k, t in self.seq_lens.items():
            out[f"seq_lens.{k}"] = t
        for k, t in self.write_loc.items():
            out[f"write_loc.{k}"] = t
        for name in ("positions", "recurrent_slots", "sampler"):
            t = getattr(self, name)
            if t is not None:
                out[name] = t
        return out
