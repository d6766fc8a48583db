"""The causal depthwise conv of a varlen prefill pass (sequences back to back, each on its recurrent slot's state).

``kernel``: the Triton kernels and their wrapper; ``naive``: the torch reference.
"""

from kernels.conv1d_varlen.kernel import TOKEN_CLASSES, conv1d_varlen_, token_class, untuned_sizes
from kernels.conv1d_varlen.naive import conv1d_varlen_ref_

__all__ = ["TOKEN_CLASSES", "conv1d_varlen_", "conv1d_varlen_ref_", "token_class", "untuned_sizes"]
