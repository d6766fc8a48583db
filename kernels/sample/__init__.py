"""A sampled step's draw (top-k, top-p, Gumbel-max over each row's head of the vocabulary), written into the step's
token buffer.

``kernel``: the Triton kernels and their wrapper; ``naive``: the reference and the noise's hash.
"""

from kernels.sample.kernel import sample_rows
from kernels.sample.naive import CellColumns, sample_rows_ref

__all__ = ["CellColumns", "sample_rows", "sample_rows_ref"]
