"""Greedy decoding's argmax over the vocabulary, written into the step's token buffer (on CUDA by default,
``KernelChoices.argmax``).

``kernel``: the Triton kernels and their wrapper; ``naive``: the reference.
"""

from kernels.argmax.kernel import argmax_rows
from kernels.argmax.naive import argmax_rows_ref

__all__ = ["argmax_rows", "argmax_rows_ref"]
