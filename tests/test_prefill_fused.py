"""A prefill pass's row-wise work on our Triton kernels (``KernelChoices.prefill_fused``: residual adds folded into the
norms, the varlen conv with q and k normalised in it, RoPE and the K/V write in one kernel, the gated norm, silu_mul)
against the same pass in torch: logits and every pool, fresh and continuing chunks, at exact and at bucket shapes
(padding).

Without CUDA the kernels run in Triton's interpreter (TRITON_INTERPRET=1, set before triton is imported); the mixers
are the torch references on both sides (fla and FlashInfer are the GPU tests')."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from test_prefill_graphs import MODEL, PAGES, PS, _chunks, _pools, _randomize, _state  # noqa: E402

from kernels.choices import KernelChoices  # noqa: E402
from models.layers.flat import bucket_shape  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
pytestmark = pytest.mark.skipif(not INTERPRET, reason="the CPU model's kernels need Triton's interpreter")


# fresh chunks at their exact size and continuing ones in a padded bucket (13-19 s a case in the interpreter: the two
# cases cover both axes; the bucket's padding of fresh chunks is the same padding)
@pytest.mark.parametrize("starts,bucket", [(None, None), ([0, 5, 2, 9], 48)], ids=["fresh-exact", "continuing-bucket"])
def test_the_fused_pass_equals_the_torch_pass(starts, bucket):
    rng = np.random.default_rng(5)
    chunks = _chunks(rng, [6, 1, 17, 9], starts)
    fused, plain = _state(), _state()
    _randomize(fused, 3)
    _randomize(plain, 3)
    shape = None if bucket is None else bucket_shape(bucket, 4, PAGES, PS)
    kc = KernelChoices(prefill_fused=True)
    got = MODEL.prefill_forward(fused, MODEL.prefill_inputs(fused, chunks, shape, kc=kc))[: len(chunks)]
    want = MODEL.prefill_forward(plain, MODEL.prefill_inputs(plain, chunks))
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    for x, y in zip(_pools(fused), _pools(plain), strict=True):
        torch.testing.assert_close(x[1:], y[1:], atol=1e-4, rtol=1e-4)  # the sinks apart (the bucket's padding)
