"""Reference of the greedy argmax, in numpy (an implementation apart from torch's): the first index of each row's
largest value, the first NaN where a row has one."""

from __future__ import annotations

import numpy as np
import torch


def argmax_rows_ref(logits: torch.Tensor) -> torch.Tensor:
    """[rows, V] -> [rows] int64: np.argmax of each row in float32 (which returns the first NaN where there is one)."""
    return torch.from_numpy(np.argmax(logits.float().cpu().numpy(), axis=-1).astype(np.int64))
