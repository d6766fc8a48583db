"""The delta rule of a varlen prefill pass: sequences back to back, each from its own initial state.

``kernel``: fla-core's chunked kernels (CUDA only; imported where fla is installed: ``gdn_prefill``); ``naive``: the
torch reference, each sequence alone (``gdn_prefill_ref``); ``indices``: fla's chunk index for a fixed-shape pass.
"""

from kernels.gdn_prefill.indices import CHUNK, chunk_index, chunk_rows
from kernels.gdn_prefill.naive import gated_delta_chunked, gdn_prefill_ref
from kernels.gdn_prefill.state_pass import KEY_DIMS as STATE_PASS_KEY_DIMS

try:
    from kernels.gdn_prefill.kernel import gdn_prefill

    HAVE_FLA = True  # fla-core installed (the GPU extra)
except ImportError as missing:  # fla-core absent: a CPU environment
    HAVE_FLA = False
    _why = f"{type(missing).__name__}: {missing}"

    def gdn_prefill(*args, **kwargs):
        """Refused: the CUDA prefill delta rule is fla-core's (``kernel.gdn_prefill``), which did not import here."""
        raise RuntimeError(f"the CUDA prefill delta rule needs fla-core (pip install 'resplan[gpu]'): {_why}")


__all__ = ["CHUNK", "HAVE_FLA", "STATE_PASS_KEY_DIMS", "chunk_index", "chunk_rows", "gated_delta_chunked",
           "gdn_prefill", "gdn_prefill_ref"]  # fmt: skip
