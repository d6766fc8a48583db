"""FlashInfer decode backends (XQA, FA2) against ``paged_decode_attention``: eager, and replayed in a captured CUDA
graph with new block tables / lengths / cache contents (XQA with no re-plan, FA2 re-planned before every replay).

GPU only (skipped without CUDA or flashinfer). On the H200:
    pytest -m gpu tests/test_flashinfer_attention.py -x -q                 # everything (JIT: one build per shape)
    pytest -m gpu tests/test_flashinfer_attention.py -k "d256 and g4" -q   # the Qwen3.5 shape first
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from resplan import Graph

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::UserWarning")]

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    flashinfer = pytest.importorskip("flashinfer")

from models.layers.flashinfer_attention import FA2Decode, XQADecode  # noqa: E402
from models.layers.paged import paged_decode_attention  # noqa: E402

DEV = "cuda"
DTYPE = torch.bfloat16
HK = 2  # kv heads
W = 8  # block-table columns: a row holds up to W * page_size tokens
MAX_B = 64
ROUNDS = 3  # graph replays with fresh rows
SINK_K = 30.0  # the sink page's keys: any leak past seq_len dominates the softmax and fails the comparison
RTOL = ATOL = 1e-2

CASES = [
    pytest.param(d, g, ps, b, id=f"d{d}-g{g}-ps{ps}-b{b}")
    for d in (128, 256)
    for g in (4, 8)
    for ps in (16, 64)
    for b in (1, 7, 64)
]


def _cache(num_pages: int, ps: int, d: int, gen: torch.Generator) -> torch.Tensor:
    kv = torch.empty(num_pages, 2, ps, HK, d, dtype=DTYPE, device=DEV)
    _refill(kv, gen)
    return kv


def _refill(kv: torch.Tensor, gen: torch.Generator) -> None:
    kv.copy_(torch.randn(kv.shape, generator=gen, device=DEV, dtype=torch.float32))
    kv[0, 0] = SINK_K


def _rows(rng: np.random.Generator, b: int, ps: int, num_pages: int) -> tuple[np.ndarray, np.ndarray]:
    """Random rows: distinct pages from 1.., 0 past the used columns; lengths in [1, W * ps], one full, one of 1."""
    sl = rng.integers(1, W * ps + 1, size=b)
    sl[0] = W * ps
    if b > 1:
        sl[-1] = 1
    npages = -(-sl // ps)
    pages = rng.permutation(np.arange(1, num_pages))[: int(npages.sum())].astype(np.int32)
    bt = np.zeros((b, W), dtype=np.int32)
    bt[np.arange(W)[None, :] < npages[:, None]] = pages
    return bt, sl.astype(np.int32)


def _close(out: torch.Tensor, ref: torch.Tensor) -> None:
    assert out.shape == ref.shape and out.dtype == ref.dtype
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), ref.float(), rtol=RTOL, atol=ATOL)


def _capture(fn):
    """Warm fn up on a side stream, then capture it (resplan's Graph): (graph, its static output)."""
    box = {}

    def run() -> None:
        box["out"] = fn()

    graph = Graph(run, torch.device("cuda"))
    return graph.graph, box["out"]


class _Case:
    def __init__(self, d: int, g: int, ps: int, b: int, seed: int = 0) -> None:
        self.d, self.hq, self.ps, self.b = d, g * HK, ps, b
        self.scale = d**-0.5
        self.rng = np.random.default_rng(seed)
        self.gen = torch.Generator(device=DEV).manual_seed(seed)
        self.num_pages = 1 + b * W + 5
        self.kv = _cache(self.num_pages, ps, d, self.gen)
        # static decode-step buffers (fixed addresses, as StepBuffers)
        self.q = torch.empty(b, self.hq, d, dtype=DTYPE, device=DEV)
        self.block_table = torch.zeros(b, W, dtype=torch.int32, device=DEV)
        self.seq_lens = torch.ones(b, dtype=torch.int32, device=DEV)
        self.bt_np, self.sl_np = self.new_rows()

    def new_rows(self) -> tuple[np.ndarray, np.ndarray]:
        bt, sl = _rows(self.rng, self.b, self.ps, self.num_pages)
        self.block_table.copy_(torch.from_numpy(bt))
        self.seq_lens.copy_(torch.from_numpy(sl))
        self.q.copy_(torch.randn(self.q.shape, generator=self.gen, device=DEV))
        self.bt_np, self.sl_np = bt, sl
        return bt, sl

    def ref(self) -> torch.Tensor:
        return paged_decode_attention(self.q, self.kv, self.block_table, self.seq_lens, self.scale)


@pytest.mark.parametrize("d,g,ps,b", CASES)
def test_xqa_matches_torch(d, g, ps, b):
    c = _Case(d, g, ps, b)
    xqa = XQADecode(c.hq, HK, d, ps, max_batch=MAX_B, device=DEV)
    out = xqa(c.q, c.kv, c.block_table, c.seq_lens, c.scale)
    torch.cuda.synchronize()
    _close(out, c.ref())


@pytest.mark.parametrize("d,g,ps,b", CASES)
def test_xqa_graph_replays_new_tables_without_plan(d, g, ps, b):
    c = _Case(d, g, ps, b, seed=1)
    xqa = XQADecode(c.hq, HK, d, ps, max_batch=MAX_B, device=DEV)
    xqa(c.q, c.kv, c.block_table, c.seq_lens, c.scale)  # eager first call: JIT build outside capture
    graph, out = _capture(lambda: xqa(c.q, c.kv, c.block_table, c.seq_lens, c.scale))
    for _ in range(ROUNDS):
        c.new_rows()
        _refill(c.kv, c.gen)
        graph.replay()
        torch.cuda.synchronize()
        _close(out, c.ref())


@pytest.mark.parametrize("d,g,ps,b", CASES)
def test_fa2_matches_torch(d, g, ps, b):
    c = _Case(d, g, ps, b, seed=2)
    fa2 = FA2Decode(b, W, c.hq, HK, d, ps, device=DEV, sm_scale=c.scale)
    fa2.schedule(c.bt_np, c.sl_np)
    out = fa2(c.q, c.kv, c.block_table, c.seq_lens, c.scale)
    torch.cuda.synchronize()
    _close(out, c.ref())


@pytest.mark.parametrize("d,g,ps,b", CASES)
def test_fa2_graph_replays_after_replan(d, g, ps, b):
    c = _Case(d, g, ps, b, seed=3)
    fa2 = FA2Decode(b, W, c.hq, HK, d, ps, device=DEV, sm_scale=c.scale)
    fa2.schedule(c.bt_np, c.sl_np)
    fa2(c.q, c.kv, c.block_table, c.seq_lens, c.scale)  # eager first call: JIT build outside capture
    graph, out = _capture(lambda: fa2(c.q, c.kv, c.block_table, c.seq_lens, c.scale))
    for _ in range(ROUNDS):
        bt, sl = c.new_rows()
        _refill(c.kv, c.gen)
        fa2.schedule(bt, sl)  # every replay whose page counts may change: never replay stale plans
        graph.replay()
        torch.cuda.synchronize()
        _close(out, c.ref())


@pytest.mark.parametrize("d,b", [pytest.param(d, b, id=f"d{d}-b{b}") for d in (128, 256) for b in (7, 64)])
def test_fa2_tensor_cores_graph(d, b):
    """The tensor-core (prefill-kernel) fa2 decode path, same contract; Qwen3.5's group of 4, page size 16."""
    c = _Case(d, 4, 16, b, seed=4)
    fa2 = FA2Decode(b, W, c.hq, HK, d, 16, device=DEV, sm_scale=c.scale, use_tensor_cores=True)
    fa2.schedule(c.bt_np, c.sl_np)
    _close(fa2(c.q, c.kv), c.ref())
    graph, out = _capture(lambda: fa2(c.q, c.kv))
    for _ in range(ROUNDS):
        bt, sl = c.new_rows()
        fa2.schedule(bt, sl)
        graph.replay()
        torch.cuda.synchronize()
        _close(out, c.ref())


def test_one_graph_serves_xqa_for_several_layers():
    """Several layers (distinct caches) captured in one graph share the XQA workspace and output buffer."""
    c = _Case(256, 4, 16, 7, seed=5)
    xqa = XQADecode(c.hq, HK, 256, 16, max_batch=MAX_B, device=DEV)
    kvs = [c.kv] + [_cache(c.num_pages, 16, 256, c.gen) for _ in range(2)]
    outs = [torch.empty(7, c.hq, 256, dtype=DTYPE, device=DEV) for _ in kvs]

    def step():
        for kv, o in zip(kvs, outs, strict=True):
            o.copy_(xqa(c.q, kv, c.block_table, c.seq_lens, c.scale))

    step()
    graph, _ = _capture(step)
    for _ in range(ROUNDS):
        c.new_rows()
        graph.replay()
        torch.cuda.synchronize()
        for kv, o in zip(kvs, outs, strict=True):
            _close(o, paged_decode_attention(c.q, kv, c.block_table, c.seq_lens, c.scale))
