"""Greedy decoding's argmax over the vocabulary, in one launch into the step's token buffer.

``kernel``: the Triton kernel and its wrapper; ``naive``: its reference.
"""

from kernels.argmax.kernel import argmax_rows, chunks_for
from kernels.argmax.naive import argmax_rows_ref

__all__ = ["argmax_rows", "argmax_rows_ref", "chunks_for"]
