"""Fill a bucket's step buffers from the store rows of a step's slots.

``kernel``: the Triton kernel and its wrapper; ``naive``: its torch reference; ``spec``: the row's columns and the
buffers it fills, as plain integers and tensors.
"""

from kernels.rows.gather_rows.kernel import gather_rows
from kernels.rows.gather_rows.naive import gather_rows_ref
from kernels.rows.gather_rows.spec import GatherTargets, PoolSpan, RowColumns

__all__ = ["GatherTargets", "PoolSpan", "RowColumns", "gather_rows", "gather_rows_ref"]
