"""Paged decode attention split over the KV length, reading the block tables on the device (plan-free).

``kernel``: the Triton kernel and its wrapper; ``naive``: its torch reference.
"""

from kernels.paged_decode.kernel import (
    BLOCK_S,
    CPU_SMS,
    MIN_SPLIT_TOKENS,
    PROGRAMS_PER_SM,
    device_sms,
    num_splits,
    paged_decode,
    split_tokens,
    workspace_elements,
)
from kernels.paged_decode.naive import paged_decode_ref

__all__ = [
    "BLOCK_S", "CPU_SMS", "MIN_SPLIT_TOKENS", "PROGRAMS_PER_SM", "device_sms", "num_splits", "paged_decode",
    "split_tokens", "workspace_elements", "paged_decode_ref"
]
