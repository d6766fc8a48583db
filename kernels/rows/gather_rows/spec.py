"""What ``gather_rows`` reads and writes, in plain integers and tensors: where each piece of a store row sits
(``RowColumns``) and the buffers a gather fills (``GatherTargets``). The store's owner builds both once, from its own
description of a row (resplan's ``RowLayout`` and ``StepBuffers``: ``resplan.executor.row_columns``,
``gather_targets``)."""

from __future__ import annotations

import attrs
import torch


@attrs.frozen
class PoolSpan:
    """One KV pool's cells of a row: its stored length L at ``len_col``, its block table row[start : start + width]."""

    start: int
    width: int  # W
    len_col: int
    page_size: int
    append: bool  # APPEND (this step writes token L: seq_len L + 1, a write location) or READ (seq_len L)


@attrs.frozen(cache_hash=True)
class RowColumns:
    """Where a gather finds each piece of a row of ``width`` cells; a column of -1: the row has no such cell. Static:
    hashable, one compiled launch configuration a value."""

    width: int
    pools: tuple[PoolSpan, ...]
    pos_len_col: int = -1  # the stored length the positions ride on
    pos_col: int = -1  # the position offset (position = row[pos_len_col] + row[pos_col])
    rec_col: int = -1  # the recurrent slot
    sampler_col: int = -1  # the first of the ``sampler_cells`` sampler cells
    sampler_cells: int = 4


@attrs.frozen(eq=False)
class GatherTargets:
    """The buffers a gather of ``size`` rows fills, each pool's in ``RowColumns.pools``' order."""

    size: int  # b
    block_tables: tuple[torch.Tensor, ...]  # per pool [b, W] int32
    seq_lens: tuple[torch.Tensor, ...]  # per pool [b] int32
    write_loc: tuple[torch.Tensor | None, ...]  # per pool [b] int32 (APPEND), None (READ)
    positions: torch.Tensor | None = None  # [b] int32
    recurrent_slots: torch.Tensor | None = None  # [b] int32
    sampler: torch.Tensor | None = None  # [b, sampler_cells] int32
