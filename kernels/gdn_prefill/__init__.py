"""The delta rule of a varlen prefill pass: sequences back to back, each from its own initial state.

``kernel``: fla-core's chunked kernels (CUDA only; imported where fla is installed: ``gdn_prefill``); ``naive``: the
torch reference, each sequence alone (``gdn_prefill_ref``); ``indices``: fla's chunk index for a fixed-shape pass.
"""

from importlib.util import find_spec

from kernels.gdn_prefill.indices import CHUNK, chunk_index, chunk_rows
from kernels.gdn_prefill.naive import gated_delta_chunked, gdn_prefill_ref

HAVE_FLA = find_spec("fla") is not None  # fla-core installed (the GPU extra)


if HAVE_FLA:
    from kernels.gdn_prefill.kernel import gdn_prefill
else:

    def gdn_prefill(*args, **kwargs):
        """Refused: the CUDA prefill delta rule is fla-core's (``kernel.gdn_prefill``), not installed here."""
        raise RuntimeError("the CUDA prefill delta rule needs fla-core (pip install 'resplan[gpu]')")


__all__ = ["CHUNK", "HAVE_FLA", "chunk_index", "chunk_rows", "gated_delta_chunked", "gdn_prefill", "gdn_prefill_ref"]
