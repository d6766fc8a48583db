"""Causal paged attention of a flat prefill pass (models.layers.flat): each sequence's queries over its own stream,
its earlier chunks' pages and its own tokens, whose K/V the pass has already written.

* ``FlashInferPrefill``: FlashInfer's ``BatchPrefillWithPagedKVCacheWrapper`` (fa2 backend, NHD, our 5-D cache as
  is), one wrapper per pass shape. Its ``plan`` is host work run before each pass (``prepare``). For a token bucket's
  shape the wrapper is in CUDA-graph mode: fixed total rows and batch size fix its grid and tile size, so a graph
  captured once replays every later plan of that shape (scheduler.cuh's PrefillSplitQOKVIndptr).
* ``paged_prefill_ref``: the torch reference, one sequence at a time (``models.layers.paged.paged_prefill_attention``).

flashinfer is imported inside the constructor, so this module imports on a machine without it.
"""

from __future__ import annotations

import numpy as np
import torch

from models.layers.flashinfer_attention import WorkspaceKind, Workspaces
from models.layers.flat import PassShape, device_array
from models.layers.paged import paged_prefill_attention

DTYPES = (torch.bfloat16, torch.float16)  # the activations FlashInfer's paged prefill has kernels for
HEAD_DIMS = (64, 128, 256)  # the head widths it has kernels for


def paged_prefill_ref(
    q: torch.Tensor,  # [N, hq, d]
    kv: torch.Tensor,  # [num_pages, 2, ps, hk, d]
    cu_seqlens: torch.Tensor,  # [S + 1]
    kv_indptr: torch.Tensor,  # [S + 1]
    kv_indices: torch.Tensor,  # [P]
    kv_lens: torch.Tensor,  # [S]
    scale: float,
    causal: bool = True,
) -> torch.Tensor:
    """Query i of a sequence of T tokens over a stream of L tokens sees tokens t <= L - T + i (causal), or all L of
    them (not: cross-attention over a context): out [N, hq, d], 0 for tokens of no sequence or over an empty stream.
    Host loop over the sequences: the CPU path."""
    out = torch.zeros_like(q)
    cu, ind, lens = cu_seqlens.tolist(), kv_indptr.tolist(), kv_lens.tolist()
    for s in range(len(cu) - 1):
        a, b = cu[s], cu[s + 1]
        if a < b and lens[s] > 0:
            pages = kv_indices[ind[s] : ind[s + 1]]
            out[a:b] = paged_prefill_attention(q[a:b], kv, pages, lens[s] - (b - a), lens[s], scale, causal=causal)
    return out


class FlashInferPrefill:
    """FlashInfer's paged prefill for every pass shape the engine runs, causal (a stream over its own pages) or not (a
    read-only context); ``prepare(shape, ...)`` plans a pass and returns the wrapper whose ``run`` the pass calls
    (``__call__``). Its split-KV partials live in the prefill workspace of ``workspaces`` (the owner's; None: a
    private one), one pass at a time."""

    def __init__(self, n_heads: int, n_kv_heads: int, head_dim: int, page_size: int, dtype: torch.dtype,
                 device: torch.device | str, scale: float, causal: bool = True,
                 workspaces: Workspaces | None = None) -> None:  # fmt: skip
        import flashinfer

        if dtype not in DTYPES:
            raise ValueError(f"FlashInfer's paged prefill runs bf16 or fp16, not {dtype}")
        self._flashinfer = flashinfer
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.page_size, self.dtype, self.scale, self.causal = page_size, dtype, scale, causal
        self.device = torch.device(device)
        ws = Workspaces(self.device) if workspaces is None else workspaces.on(self.device)
        self.workspace = ws.get(WorkspaceKind.PREFILL)  # split-KV partials; one pass at a time
        self.wrappers: dict[tuple[PassShape | None, bool], object] = {}  # (bucket shape, True) or (None, False)

    def _wrapper(self, shape: PassShape, seqs: int, pages: int, graphed: bool):
        """The bucket's CUDA-graph wrapper, or the one eager wrapper every exact-shape pass plans afresh (a wrapper per
        exact shape would pin buffers for every length traffic brings)."""
        key = (shape, True) if graphed else (None, False)
        w = self.wrappers.get(key)
        if w is None:
            if graphed:
                dev, i32 = self.device, torch.int32
                w = self._flashinfer.BatchPrefillWithPagedKVCacheWrapper(
                    self.workspace, "NHD", use_cuda_graph=True, backend="fa2",
                    qo_indptr_buf=torch.zeros(seqs + 1, dtype=i32, device=dev),
                    paged_kv_indptr_buf=torch.zeros(seqs + 1, dtype=i32, device=dev),
                    paged_kv_indices_buf=torch.zeros(pages, dtype=i32, device=dev),
                    paged_kv_last_page_len_buf=torch.zeros(seqs, dtype=i32, device=dev))  # fmt: skip
            else:
                w = self._flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD", backend="fa2")
            self.wrappers[key] = w
        return w

    def prepare(
        self,
        shape: PassShape,  # the pass's (a graph's key: its wrapper keeps its grid for it)
        cu_seqlens: np.ndarray,  # [S + 1] int32 queries of each sequence
        kv_indptr: np.ndarray,  # [S + 1] int32 each sequence's pages in kv_indices
        kv_indices: np.ndarray,  # [P] int32, past kv_indptr[-1] unused
        kv_last_page_len: np.ndarray,  # [S] int32 tokens on each sequence's last page (1 .. page_size)
        graphed: bool,
    ):
        """FlashInfer's plan for this pass (host arrays in; its buffers written before the pass runs). The page list
        goes to the device first, asynchronously: a CUDA-graph wrapper copies a host page list synchronously, which
        would hold the host until the GPU has run everything queued before it (a decode graph beside the pass)."""
        w = self._wrapper(shape, len(cu_seqlens) - 1, len(kv_indices), graphed)
        used = int(kv_indptr[-1])
        pages = device_array(kv_indices[:used], self.device)
        w.plan(torch.from_numpy(cu_seqlens), torch.from_numpy(kv_indptr), pages, torch.from_numpy(kv_last_page_len),
               self.n_heads, self.n_kv_heads, self.head_dim, self.page_size, causal=self.causal, sm_scale=self.scale,
               q_data_type=self.dtype, kv_data_type=self.dtype)  # fmt: skip
        return w

    @staticmethod
    def __call__(wrapper, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        """out [N, hq, d] of the pass ``wrapper`` was prepared for. Graph-safe."""
        return wrapper.run(q, kv)
