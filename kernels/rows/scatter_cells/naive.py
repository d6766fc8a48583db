"""The torch reference of ``scatter_cells``: same signature, in place. It reads the staged count on the host (a
reference, not a capture-safe path)."""

from __future__ import annotations

import torch


def scatter_cells_ref(store: torch.Tensor, staging: torch.Tensor) -> None:
    """store.view(-1)[staging[2 + 2i]] = staging[3 + 2i] for i < staging[0]; then staging[0] = 0 (in place)."""
    n = int(staging[0])
    entries = staging[2 : 2 + 2 * n].view(n, 2).long()
    store.view(-1)[entries[:, 0]] = entries[:, 1].to(store.dtype)
    staging[0] = 0
