"""The resident-row ops: the executor's in-graph kernels over the store (scatter staged cells, gather a step's rows,
commit lengths), each beside its torch reference (``naive``). They take plain tensors and integers (a gather, the
row's columns as a ``RowColumns``): nothing here knows resplan's records, which build those values."""

from kernels.rows.commit_lengths import commit_lengths, commit_lengths_ref
from kernels.rows.gather_rows import GatherTargets, PoolSpan, RowColumns, gather_rows, gather_rows_ref
from kernels.rows.scatter_cells import scatter_cells, scatter_cells_ref

__all__ = ["GatherTargets", "PoolSpan", "RowColumns", "commit_lengths", "commit_lengths_ref", "gather_rows",
           "gather_rows_ref", "scatter_cells", "scatter_cells_ref"]  # fmt: skip
