"""The static buffers a decode forward reads. The resident gather and the host-planned arm fill the same ones."""

from __future__ import annotations

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
    sampler: torch.Tensor | None  # [b, 4] int32: temperature, top_p (float32 bits), top_k, seed

    @classmethod
    def allocate(cls, layout: RowLayout, size: int, device: torch.device | str = "cpu") -> StepBuffers:
        """Zeroed buffers for a bucket of ``size`` rows laid out for ``layout``."""
        i32 = dict(dtype=torch.int32, device=device)
        return cls(
            size=size,
            block_tables={s.pool: torch.zeros(size, s.width, **i32) for s in layout.spans},
            seq_lens={p.key: torch.zeros(size, **i32) for p in layout.pools},
            write_loc={p.key: torch.zeros(size, **i32) for p in layout.pools if p.mode is StreamMode.APPEND},
            positions=torch.zeros(size, **i32) if layout.positions_pool is not None else None,
            recurrent_slots=torch.zeros(size, **i32) if layout.recurrent else None,
            sampler=torch.zeros(size, len(SAMPLER_CELLS), **i32) if layout.sampler else None,
        )

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
