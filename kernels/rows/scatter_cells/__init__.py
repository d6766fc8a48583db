"""Apply a staged upload of cells to the store.

``kernel``: the Triton kernel and its wrapper; ``naive``: its torch reference.
"""

from kernels.rows.scatter_cells.kernel import scatter_cells
from kernels.rows.scatter_cells.naive import scatter_cells_ref

__all__ = ["scatter_cells", "scatter_cells_ref"]
