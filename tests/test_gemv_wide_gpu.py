"""The 0.8B shape's fused decode at 32 and 64 rows with the weight stream where GEMV_CONFIGS lists those row tiles,
against the same step on cuBLAS (``GemvPick.NEVER``), both measured against the plain torch step in float32 (the same
bf16 weights upcast): the stream's logits are as close to float32 as cuBLAS's are, and the configured GEMMs really
streamed. GPU only: on the CPU no GEMM takes the stream (the interpreter tests of ``kernels.gemv`` cover the padded
row tiles at random shapes).

Why float32 and not cuBLAS as the reference: with random weights the logits reach ~900, where one bf16 step is 4, and
a rounding in an early layer moves every logit of a row by up to a few units, so two bf16 paths differ by more than
any per-logit tolerance at small logits though both may be equally close to the exact result (max |stream - cuBLAS|
was 4 at 32 rows)."""

from __future__ import annotations

import os

import attrs
import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import models.layers.fused as fused  # noqa: E402  (after TRITON_INTERPRET is settled)
from kernels.choices import GemvPick, KernelChoices  # noqa: E402
from kernels.gemv import GEMV_CONFIGS  # noqa: E402
from models.qwen3_5 import KV_POOL  # noqa: E402
from models.qwen3_5.model import PrefillChunk  # noqa: E402
from resplan.buffers import StepBuffers  # noqa: E402
from resplan.layout import KVPool, RowLayout  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
PAGE, PROMPT, PAGES_A_ROW = 16, 20, 2  # a 20-token prompt and its next token: two pages a row


def _decode(model, rows: int, kc: KernelChoices, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """``rows`` random prompts prefilled (one torch pass) into fresh state, then one decode step of every row as ``kc``
    says: its logits [rows, V]."""
    gen = torch.Generator().manual_seed(rows)
    V = model.cfg.vocab_size
    ids = torch.randint(0, V, (rows, PROMPT + 1), generator=gen)
    state = model.allocate_state(1 + rows * PAGES_A_ROW, PAGE, rows + 1, "cuda", dtype)
    pages = [list(range(1 + r * PAGES_A_ROW, 1 + (r + 1) * PAGES_A_ROW)) for r in range(rows)]
    chunks = [PrefillChunk(ids[r, :PROMPT], pages[r], 0, r + 1) for r in range(rows)]
    model.prefill_batch(state, chunks, kc=KernelChoices(prefill_kernels=False, prefill_fused=False))  # (torch: no JIT)
    layout = RowLayout((KVPool(KV_POOL, PAGE, 1 + rows * PAGES_A_ROW, PAGES_A_ROW * PAGE),), positions_pool=KV_POOL,
                       recurrent=True, sampler=False)  # fmt: skip
    bufs = StepBuffers.allocate(layout, rows, "cuda")
    bufs.block_tables[KV_POOL][:, :PAGES_A_ROW] = torch.tensor(pages, dtype=torch.int32)
    bufs.recurrent_slots.copy_(torch.arange(1, rows + 1))
    bufs.seq_lens[KV_POOL].fill_(PROMPT + 1)
    bufs.write_loc[KV_POOL].copy_(torch.tensor([p[PROMPT // PAGE] * PAGE + PROMPT % PAGE for p in pages]))
    bufs.positions.fill_(PROMPT)
    return model.decode(state, ids[:, PROMPT].cuda(), bufs, kc=kc).float()


@pytest.mark.parametrize("rows", [32, 64])
def test_0_8b_decode_with_the_wide_weight_stream_is_as_close_to_float32_as_cublas(rows, monkeypatch):
    from test_gemv_norm import _model

    model = _model("qwen3_5-0.8b", "cuda", torch.bfloat16)
    listed = {(n, k) for tile, n, k in GEMV_CONFIGS if tile == rows}
    assert listed, f"no GEMV_CONFIGS entry at {rows} rows"
    streamed = []
    real = fused.gemv
    monkeypatch.setattr(fused, "gemv", lambda x, w, **k: streamed.append((x.shape[0], *w.shape)) or real(x, w, **k))
    kc = KernelChoices(fused_decode=True)
    got = _decode(model, rows, kc)
    want = _decode(model, rows, attrs.evolve(kc, gemv=GemvPick.NEVER))
    assert {(n, k) for m, n, k in streamed if m == rows} == listed  # the listed shapes streamed, and only they
    ref = _decode(model.float(), rows, KernelChoices(fused_decode=False), torch.float32)  # [rows, V]: plain torch
    err_stream, err_cublas = (got - ref).abs(), (want - ref).abs()
    print(f"\n{rows} rows: |logit| max {float(ref.abs().max()):.4g}; |stream - fp32| mean "
          f"{float(err_stream.mean()):.4g} max {float(err_stream.max()):.4g}; |cuBLAS - fp32| mean "
          f"{float(err_cublas.mean()):.4g} max {float(err_cublas.max()):.4g}")  # fmt: skip
    # the mean over rows x V logits is steady to a few percent between two correct bf16 paths; a wrong partial, tile
    # or row would move it by many times that
    assert float(err_stream.mean()) <= 1.25 * float(err_cublas.mean())
    assert float(err_stream.max()) <= max(2 * float(err_cublas.max()), 0.01 * float(ref.abs().max()))
    top2 = ref.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 2 * float(err_cublas.max())  # rows whose top two no bf16 path could swap
    assert torch.equal(got.argmax(-1)[clear], ref.argmax(-1)[clear])
