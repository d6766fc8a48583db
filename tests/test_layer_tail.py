"""The layer's tail (kernels.layer_tail: out projection, MLP, the next layer's input projection at one row) against its
torch reference (the chain it replaces, float64 between the same roundings), and the model's one-row decode with its
tails (``KernelChoices.layer_tail``) against the fused step without.

Fresh random inputs per case; widths off the tiles (H not a power of two, K not a multiple of the K chunk, row counts
not a multiple of a block, more blocks than programs). In float32 the kernel and the reference round nowhere but
their float32/float64 sums, so they agree closely; in bf16 a sum that lands near a rounding boundary may round the
other way and carry one ulp into what follows, so the comparison allows a few ulps of the output's scale. Without
CUDA the kernel runs in Triton's interpreter, once a projection (a grid barrier cannot be met there); on a GPU
(``pytest -m gpu``) the persistent launch (grid barriers) must equal the once-a-projection launches bit for bit, over
repeated launches and in a captured graph (its barrier count set back to 0 each time).
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from one_row import decode_one_row, model_with_norms  # noqa: E402  (after TRITON_INTERPRET is settled)

import models.qwen3_5.model as qwen_model  # noqa: E402
from kernels.choices import KernelChoices  # noqa: E402
from kernels.layer_tail import layer_tail, layer_tail_ref  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
DEVICE = "cpu" if INTERPRET or not torch.cuda.is_available() else "cuda"
EPS = 1e-6
SMALL = (8, 4, 8, 16, 64, 4, 1)  # layer_tail config: many K chunks and blocks at test sizes
WHOLE = (2, 2, 2, 8, 0, 4, 1)  # each projection's whole row a block (K chunk 0), blocks of 2 and 8 rows
# (H, D, I, NP): the next projection's rows, or None for the last layer
SHAPES = [(96, 160, 200, 300), (100, 130, 70, 37), (64, 96, 96, None)]


def _case(seed: int, H: int, D: int, I: int, NP: int | None, dtype: torch.dtype):  # noqa: E741 (the MLP's width)
    """layer_tail's positional inputs (h_out last), weights scaled to keep activations near 1, the residual at 3."""
    gen = torch.Generator().manual_seed(seed)

    def r(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * scale).to(dtype=dtype, device=DEVICE)

    nxt = (r(H, scale=0.3), EPS, r(NP, H, scale=H**-0.5)) if NP else (None, 0.0, None)
    return (r(1, D), r(1, H, scale=3), r(H, D, scale=D**-0.5), r(H, scale=0.3), EPS, r(2 * I, H, scale=H**-0.5),
            r(H, I, scale=I**-0.5), torch.empty(1, H, dtype=dtype, device=DEVICE), *nxt)  # fmt: skip


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    """Within 1e-5 of the scale (float32), or 4 bf16 ulps of the scale (bf16: 2^-7 relative a ulp)."""
    scale = want.float().abs().max().item()
    tol = scale * (1e-5 if dtype == torch.float32 else 4 * 2**-7)
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_layer_tail_matches_reference(shape, dtype):
    H, D, I, NP = shape  # noqa: E741
    args = _case(2 * SHAPES.index(shape) + (dtype == torch.bfloat16), H, D, I, NP, dtype)
    y, h, wo, nw1, eps1, wgu, wd, h_out, nw2, eps2, wp = args
    h_before = h.clone()
    out = layer_tail(*args, config=SMALL if dtype == torch.bfloat16 else WHOLE, programs=3)
    want, want_h = layer_tail_ref(y, h, wo, nw1, eps1, wgu, wd, nw2, eps2, wp)
    assert out.shape == ((1, NP) if NP else (1, H))
    _close(out, want, dtype)
    _close(h_out, want_h, dtype)
    assert torch.equal(h, h_before), "h is only read"


def test_layer_tail_programs_do_not_change_the_result():
    """The split of blocks over programs moves no sum between programs: 1, 3 and 7 programs give the same bits."""
    args = _case(7, 100, 130, 70, 37, torch.bfloat16)
    outs = []
    for programs in (1, 3, 7):
        out = layer_tail(*args, config=SMALL, programs=programs)
        outs.append((out.clone(), args[7].clone()))
    for out, h_out in outs[1:]:
        assert torch.equal(out, outs[0][0]) and torch.equal(h_out, outs[0][1])


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="a persistent launch runs compiled only")
@pytest.mark.parametrize("NP", [8224, 5120, None])
def test_persistent_equals_once_a_projection(NP):
    """The 0.8B shape, one program a multiprocessor: the persistent launch (grid barriers) against one launch a
    projection (kernel boundaries), bit for bit, three launches in a row and three replays of a captured graph."""
    args = list(_case(11, 1024, 2048, 3584, NP, torch.bfloat16))
    phases = layer_tail(*args, persistent=False)
    phases_h = args[7].clone()
    _close(phases, layer_tail_ref(*args[:7], *args[8:])[0], torch.bfloat16)
    for _ in range(3):
        args[7].zero_()
        assert torch.equal(layer_tail(*args, persistent=True), phases) and torch.equal(args[7], phases_h)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        layer_tail(*args, persistent=True)  # (the stream's barrier count made before the capture)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out = layer_tail(*args, persistent=True)
    torch.cuda.current_stream().wait_stream(stream)
    for _ in range(3):
        args[7].zero_()
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, phases) and torch.equal(args[7], phases_h)


def _decode_one_row(model, layer_tail_on: bool, steps: int, device: str, dtype: torch.dtype) -> list:
    """``one_row.decode_one_row`` on the fused decode with the layer tails on or off: the float logits of each step."""
    kc = KernelChoices(fused_decode=True, layer_tail=layer_tail_on)
    return [logits.float() for logits in decode_one_row(model, kc, steps, device, dtype)]


def test_model_decode_with_layer_tails_equals_without(monkeypatch):
    """The tiny model in float32 (the interpreter: the tails once a projection): two one-row steps with its four
    layers' tails as layer_tail launches against the fused step's kernel chain; the same logits to float32 sums in
    another order, the same tokens."""
    calls = []
    real = layer_tail
    monkeypatch.setattr(qwen_model, "layer_tail", lambda *a, **k: calls.append(1) or real(*a, **k))
    model = model_with_norms("qwen3_5-tiny", DEVICE, torch.float32)
    chain = _decode_one_row(model, False, 2, DEVICE, torch.float32)
    assert not calls
    tails = _decode_one_row(model, True, 2, DEVICE, torch.float32)
    assert len(calls) == 2 * 4
    for a, b in zip(tails, chain, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        assert torch.equal(a.argmax(-1), b.argmax(-1))


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU")
def test_0_8b_decode_with_layer_tails_equals_without_gpu():
    """Qwen3.5-0.8B's shape in bf16, compiled: three one-row steps with the 24 persistent tails against the fused step.
    Logits within 0.5% of their scale (bf16 roundings of float32 sums in another order, carried through 24 layers);
    the same argmax wherever the chain's top two are further apart than twice that."""
    model = model_with_norms("qwen3_5-0.8b", "cuda", torch.bfloat16)
    chain = _decode_one_row(model, False, 3, "cuda", torch.bfloat16)
    tails = _decode_one_row(model, True, 3, "cuda", torch.bfloat16)
    for a, b in zip(tails, chain, strict=True):
        print(f"\nmax |logit diff| {float((a - b).abs().max()):.4g}, max |logit| {float(b.abs().max()):.4g}")
        atol = 0.005 * float(b.abs().max())
        torch.testing.assert_close(a, b, atol=atol, rtol=0)
        top2 = b[0].topk(2).values
        if float(top2[0] - top2[1]) > 2 * atol:
            assert torch.equal(a.argmax(-1), b.argmax(-1))
