"""Fill a bucket's StepBuffers from the store rows of a step's slots.

``kernel``: the Triton kernel and its wrapper; ``naive``: its torch reference.
"""

from kernels.rows.gather_rows.kernel import gather_rows
from kernels.rows.gather_rows.naive import gather_rows_ref

__all__ = ["gather_rows", "gather_rows_ref"]
