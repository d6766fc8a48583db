"""Add 1 to each live row's APPEND lengths after a forward.

``kernel``: the Triton kernel and its wrapper; ``naive``: its torch reference.
"""

from kernels.rows.commit_lengths.kernel import commit_lengths
from kernels.rows.commit_lengths.naive import commit_lengths_ref

__all__ = ["commit_lengths", "commit_lengths_ref"]
