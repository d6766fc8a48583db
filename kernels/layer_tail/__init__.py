"""A decoder layer's tail at one row (out projection, MLP, the next layer's input projection) as one persistent
launch with grid barriers between its projections.

``kernel``: the Triton kernel and its wrapper; ``naive``: its torch reference.
"""

from kernels.layer_tail.kernel import DEFAULT_CONFIG, layer_tail
from kernels.layer_tail.naive import layer_tail_ref

__all__ = ["DEFAULT_CONFIG", "layer_tail", "layer_tail_ref"]
