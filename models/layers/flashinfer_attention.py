"""FlashInfer paged decode attention behind one call signature (TORCH / FA2 / XQA), for FlashInfer 0.7.2.post1.

Every backend is a callable ``attn(q, kv, block_table, seq_lens, scale) -> out [b, hq, d]`` over our cache layout
(see ``models.layers.paged``): ``kv[num_pages, 2, page_size, n_kv_heads, head_dim]`` (NHD, K at [:, 0], V at [:, 1]),
page 0 the sink page, ``block_table [b, W] int32`` (0 past the used columns), ``seq_lens [b] int32`` (>= 1 on an
APPEND pool: the stored length + 1, this step's K/V already written at ``write_loc``).

* ``TorchDecode``: ``paged_decode_attention``; reads the gathered table and lengths in the graph; CPU and GPU.
* ``XQADecode``: ``flashinfer.decode.trtllm_batch_decode_with_kv_cache(..., backend="xqa", kv_layout="NHD")``.
  Reads ``block_table`` and ``seq_lens`` on the device inside the graph: no host plan, so a captured graph replays
  with new tables/lengths written in place. Our NHD 5-D cache is taken as is (no HND conversion).
* ``FA2Decode``: ``flashinfer.BatchDecodeWithPagedKVCacheWrapper(use_cuda_graph=True, backend="fa2")``: ignores the
  device ``block_table``/``seq_lens``; ``plan(block_tables_np, seq_lens_np)`` must run on the host before every
  replay (the host-planned baseline): a replay with new lengths and no re-plan runs a stale schedule, which can hang
  the GPU.

The FlashInfer workspaces an attention writes belong to whoever built it (``Workspaces``: an engine makes one and
passes it to every attention it builds, decode and prefill); there is no process-wide cache.

flashinfer is imported lazily (inside constructors/calls), so this module imports on a machine without it.
The API facts below are those of the flashinfer-python 0.7.2.post1 wheel's sources (decode.py, xqa.py, csrc/xqa).
"""

from __future__ import annotations

import enum
import math
from typing import Protocol

import numpy as np
import torch

from models.layers.decode_attention import Backend
from models.layers.paged import paged_decode_attention
from resplan.pinned import PinnedRing, host_zeros

DEFAULT_WORKSPACE_BYTES = 128 << 20  # FlashInfer's recommended float workspace (XQA: 8 MiB semaphores + scratch)
XQA_SEMAPHORE_BYTES = 8 << 20  # xqa_batch_decode_with_kv_cache reserves the first 8 MiB of the workspace for them
XQA_PAGE_SIZES = (16, 32, 64, 128)  # gen_xqa_module (jit/xqa.py) accepts exactly these
FA2_GROUP_SIZES = (1, 2, 3, 4, 6, 8, 16)  # DISPATCH_GQA_GROUP_SIZE of the CUDA-core decode kernel


class DecodeAttention(Protocol):
    """One attention call of a decode step; graph-safe (no host sync, no data-dependent shapes)."""

    backend: Backend

    def __call__(
        self,
        q: torch.Tensor,  # [b, hq, d]
        kv: torch.Tensor,  # [num_pages, 2, ps, hk, d]
        block_table: torch.Tensor,  # [b, W] int32
        seq_lens: torch.Tensor,  # [b] int32
        scale: float,
    ) -> torch.Tensor: ...  # [b, hq, d] in q's dtype


class TorchDecode:
    """The plain-torch reference (``paged_decode_attention``)."""

    backend = Backend.TORCH

    def __call__(self, q, kv, block_table, seq_lens, scale):
        return paged_decode_attention(q, kv, block_table, seq_lens, scale)


# -- workspaces -------------------------------------------------------------------------------------------------------


def _device(device: torch.device | str) -> torch.device:
    """``device`` with its index ("cuda" names the current device)."""
    dev = torch.device(device)
    return torch.device("cuda", torch.cuda.current_device()) if dev.type == "cuda" and dev.index is None else dev


class WorkspaceKind(enum.Enum):
    """What a FlashInfer workspace holds. Kinds never share memory: XQA's first 8 MiB are semaphores that must stay
    zero between launches (the kernel resets them), while fa2 writes split-KV partials from offset 0 of its float
    workspace, and the prefill pass (on a stream of its own beside the decode steps) writes its own partials."""

    XQA = "xqa"  # XQA decode: 8 MiB of semaphores, then multi-block scratch
    FA2 = "fa2"  # fa2 decode: split-KV partials
    PREFILL = "prefill"  # paged prefill: split-KV partials of one pass at a time


class Workspaces:
    """The FlashInfer workspaces of one owner (an engine, a benchmark, a test): one zeroed uint8 buffer per kind on
    ``device``, shared by every layer and bucket of that kind the owner builds, made when first asked for. One stream
    a kind: two streams running XQA at once on one workspace would race on its semaphores."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = _device(device)
        self._buffers: dict[WorkspaceKind, torch.Tensor] = {}  # kind -> [nbytes] uint8

    def get(self, kind: WorkspaceKind, nbytes: int = DEFAULT_WORKSPACE_BYTES) -> torch.Tensor:
        """The kind's workspace [>= nbytes] uint8: zeroed when made by the first ask, the same buffer for every later
        one."""
        ws = self._buffers.get(kind)
        if ws is None:
            ws = self._buffers[kind] = torch.zeros(nbytes, dtype=torch.uint8, device=self.device)
        elif ws.numel() < nbytes:
            raise ValueError(f"the {kind.value} workspace holds {ws.numel()} bytes, {nbytes} asked for: one buffer a "
                             "kind, sized by its first ask")  # fmt: skip
        return ws

    def on(self, device: torch.device | str) -> Workspaces:
        """These workspaces, checked to live on ``device`` (an attention's)."""
        if _device(device) != self.device:
            raise ValueError(f"workspaces on {self.device} given to an attention on {device}")
        return self


def _check_common(num_qo_heads: int, num_kv_heads: int, head_dim: int) -> None:
    if num_qo_heads % num_kv_heads:
        raise ValueError(f"num_qo_heads {num_qo_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    if head_dim % 16 or not 16 <= head_dim <= 512:
        raise ValueError(f"head_dim {head_dim}: must be a multiple of 16 in [16, 512]")


# -- XQA ---------------------------------------------------------------------------------------------------------------


class XQADecode:
    """FlashInfer XQA decode over our NHD cache; the block table and lengths are read on the device (no plan).

    ``flashinfer.decode.trtllm_batch_decode_with_kv_cache`` (decode.py:3710) with ``backend="xqa"`` forwards to
    ``xqa_batch_decode_with_kv_cache`` (decode.py:4592) and then ``flashinfer.xqa.xqa`` (xqa.py:188):

    * ``query [b, hq, d]`` (q_len_per_req=1), read through its data pointer only: must be contiguous.
    * ``kv_cache``: our 5-D tensor, split by ``unbind(dim=1)``; with ``kv_layout="NHD"`` (the trtllm entry point
      defaults to ``"HND"``!) each half is ``[P, ps, hk, d]``; page/token/head strides go to the kernel
      (csrc/xqa/xqa_wrapper.cu:73-75), so the K/V views need not be contiguous, only ``stride(-1) == 1``.
    * ``block_tables [b, W] int32`` contiguous: the kernel takes ``W = block_tables.shape[-1]`` as the row stride
      and sets ``max_seq_len = W * page_size`` itself (xqa.py:363), ignoring the ``max_seq_len`` argument. Its
      grid depends only on (b, hk, W, #SMs), so a captured graph stays valid for any lengths <= W * page_size.
    * ``seq_lens [b]``: documented uint32, reinterpreted from int32 in C++ (no dtype check): our int32 is fine.
    * scales: the wrapper turns (bmm1, bmm2, o_scale) into ``q_scale = bmm1 / (bmm2 * o_scale) * sqrt(d)`` and
      ``kv_scale = bmm2 * o_scale`` (decode.py:4741-4742); for a bf16 (unquantised) cache the kernel applies
      ``q_scale / sqrt(d)`` to QK^T and ignores kv_scale (csrc/xqa/mha.cu:1816-1818, 2614). So the softmax scale
      is ``bmm1 / (bmm2 * o_scale)``: pass ``bmm1_scale = scale``, ``bmm2_scale = 1``, ``o_scale = 1``. A bmm2
      other than 1 would silently change the softmax temperature, not scale the output.
    * workspace: uint8, zeroed once; its first 8 MiB are semaphores (decode.py:4739), the rest multi-block scratch.
    * ``out``: ``[b, hq, d]`` in q's dtype, contiguous.

    JIT: one module per (dtype, page_size, head_dim, group size); the first call compiles ``csrc/xqa/mha.cu`` with
    nvcc (minutes), so call once eagerly before capturing. Supported on sm_90/100/120 (xqa.py:402-403).
    """

    backend = Backend.XQA

    def __init__(
        self,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        *,
        max_batch: int,
        device: torch.device | str = "cuda",
        dtype: torch.dtype = torch.bfloat16,
        workspaces: Workspaces | None = None,  # the owner's (None: a private one); takes its XQA workspace
        enable_pdl: bool | None = None,
    ) -> None:
        from flashinfer.decode import trtllm_batch_decode_with_kv_cache

        _check_common(num_qo_heads, num_kv_heads, head_dim)
        if page_size not in XQA_PAGE_SIZES:
            raise ValueError(f"XQA page_size {page_size}: must be one of {XQA_PAGE_SIZES}")
        if head_dim > 256 and num_qo_heads // num_kv_heads > 16:
            raise ValueError("XQA with head_dim > 256 needs a group size <= 16")
        if dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"XQA dtype {dtype}: bf16 or fp16")
        self.num_qo_heads, self.num_kv_heads, self.head_dim = num_qo_heads, num_kv_heads, head_dim
        self.page_size, self.max_batch, self.dtype = page_size, max_batch, dtype
        self.enable_pdl = enable_pdl
        self._decode = trtllm_batch_decode_with_kv_cache
        ws = Workspaces(device) if workspaces is None else workspaces.on(device)
        self.workspace = ws.get(WorkspaceKind.XQA)
        if self.workspace.numel() * self.workspace.element_size() <= XQA_SEMAPHORE_BYTES:
            raise ValueError("XQA workspace must be larger than its 8 MiB semaphore area")
        # Static output: run() returns out[:b], valid until the next call (layers consume it at once).
        self.out = torch.empty(max_batch, num_qo_heads, head_dim, dtype=dtype, device=device)

    def __call__(
        self,
        q: torch.Tensor,
        kv: torch.Tensor,
        block_table: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        b = q.shape[0]
        if b > self.max_batch:
            raise ValueError(f"batch {b} > max_batch {self.max_batch}")
        if tuple(kv.shape[2:]) != (self.page_size, self.num_kv_heads, self.head_dim) or kv.shape[1] != 2:
            raise ValueError(f"kv {tuple(kv.shape)}: expected [P, 2, {self.page_size}, {self.num_kv_heads}, d]")
        if not block_table.is_contiguous() or block_table.dtype != torch.int32 or block_table.shape[0] != b:
            raise ValueError("block_table must be a contiguous [b, W] int32 tensor (its row stride is W)")
        if seq_lens.dtype != torch.int32 or tuple(seq_lens.shape) != (b,):
            raise ValueError("seq_lens must be a [b] int32 tensor")
        if out is None:
            out = self.out[:b]
        return self._decode(
            query=q.contiguous(),
            kv_cache=kv,
            workspace_buffer=self.workspace,
            block_tables=block_table,
            seq_lens=seq_lens,
            max_seq_len=block_table.shape[1] * self.page_size,  # unused by xqa (it derives W * page_size)
            bmm1_scale=float(self.head_dim**-0.5 if scale is None else scale),
            bmm2_scale=1.0,
            out=out,
            sinks=None,
            kv_layout="NHD",
            enable_pdl=self.enable_pdl,
            backend="xqa",
            q_len_per_req=1,
            o_scale=1.0,
        )


# -- FA2 (host-planned) ---------------------------------------------------------------------------------------------


def build_paged_kv_csr(
    block_tables: np.ndarray,  # [b, W] int, 0 past the used columns
    seq_lens: np.ndarray,  # [b] int, >= 0
    page_size: int,
    indptr: np.ndarray | None = None,  # [b + 1] int32 out
    indices: np.ndarray | None = None,  # [>= b * W] int32 out
    last_page_len: np.ndarray | None = None,  # [b] int32 out
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """FlashInfer's CSR page description of the rows, vectorised: (indptr, indices[:nnz], last_page_len, nnz).

    Row i uses its first ``ceil(seq_lens[i] / page_size)`` block-table columns; ``last_page_len`` is in
    [1, page_size] (0 for an empty row). Writes into the given arrays when passed (pinned host buffers).
    """
    bt = np.asarray(block_tables)
    b, W = bt.shape
    sl = np.asarray(seq_lens).astype(np.int64, copy=False)
    npages = (sl + page_size - 1) // page_size
    if b and int(npages.max()) > W:
        raise ValueError(f"a row needs {int(npages.max())} pages, the block table has {W} columns")
    if indptr is None:
        indptr = np.empty(b + 1, dtype=np.int32)
    if indices is None:
        indices = np.empty(b * W, dtype=np.int32)
    if last_page_len is None:
        last_page_len = np.empty(b, dtype=np.int32)
    indptr[0] = 0
    np.cumsum(npages, out=indptr[1 : b + 1])
    nnz = int(indptr[b])
    indices[:nnz] = bt[np.arange(W)[None, :] < npages[:, None]]  # row-major: row 0's pages, then row 1's, ...
    last_page_len[:b] = np.where(npages > 0, sl - (npages - 1) * page_size, 0)
    return indptr[: b + 1], indices[:nnz], last_page_len[:b], nnz


class FA2Decode:
    """``BatchDecodeWithPagedKVCacheWrapper`` in CUDA-graph mode for one bucket of ``batch_size`` rows.

    Constructor (decode.py:1211): ``(float_workspace_buffer, kv_layout="NHD", use_cuda_graph=True,
    use_tensor_cores, paged_kv_indptr_buffer [b+1], paged_kv_indices_buffer [>= b*W],
    paged_kv_last_page_len_buffer [b], backend="fa2")``; the batch size is frozen by the buffers. We pin
    ``backend="fa2"``: "auto" may resolve to cuDNN on other parts and freezes that into the graph.

    ``plan()`` (decode.py:1834/1975) per step, on the host, outside capture. What it costs:
    * our numpy CSR build (``build_paged_kv_csr``) into pinned buffers + one H2D of the page indices;
    * its H2D copies of indptr / last_page_len / indices into the fixed buffers (decode.py:2115-2121);
    * a host scheduler: ``cudaOccupancyMaxActiveBlocksPerMultiprocessor`` + a binary search over KV chunk sizes
      on the host indptr (csrc scheduler.cuh:150-210), writing request/tile indices into a pinned buffer and one
      more H2D (scheduler.cuh:504); in graph mode ``split_kv`` and the padded grid depend only on the batch size,
      so the captured launch stays valid while the tile tables change with the lengths;
    * Python argument handling (tens of microseconds). ``models/bench/attention.py`` measures the total.
    ``run()`` reads only the fixed buffers and the plan info captured at capture time; ``block_table`` and
    ``seq_lens`` passed to ``__call__`` are ignored (they must describe the same rows the plan did).

    Hazard: plan() fills pinned host buffers (ours and FlashInfer's own page-locked int workspace) that the H2D
    copies read asynchronously, so plan() waits on an event recorded after the previous plan's copies: at most
    one plan may be in flight ahead of the GPU.
    """

    backend = Backend.FA2

    def __init__(
        self,
        batch_size: int,
        max_pages_per_row: int,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        *,
        device: torch.device | str = "cuda",
        dtype: torch.dtype = torch.bfloat16,
        sm_scale: float | None = None,
        use_tensor_cores: bool = False,
        workspaces: Workspaces | None = None,  # the owner's (None: a private one); takes its fa2 workspace
        enable_pdl: bool | None = None,
    ) -> None:
        import flashinfer

        _check_common(num_qo_heads, num_kv_heads, head_dim)
        if not use_tensor_cores and num_qo_heads // num_kv_heads not in FA2_GROUP_SIZES:
            raise ValueError(f"fa2 CUDA-core decode supports group sizes {FA2_GROUP_SIZES}")
        b, W = batch_size, max_pages_per_row
        self.batch_size, self.max_pages_per_row = b, W
        self.num_qo_heads, self.num_kv_heads, self.head_dim = num_qo_heads, num_kv_heads, head_dim
        self.page_size, self.dtype, self.enable_pdl = page_size, dtype, enable_pdl
        self.sm_scale = float(head_dim**-0.5 if sm_scale is None else sm_scale)
        dev = torch.device(device)
        self.workspace = (Workspaces(dev) if workspaces is None else workspaces.on(dev)).get(WorkspaceKind.FA2)
        # fixed device buffers the captured kernel reads
        self.indptr_buf = torch.zeros(b + 1, dtype=torch.int32, device=dev)
        self.indices_buf = torch.zeros(b * W, dtype=torch.int32, device=dev)
        self.last_page_len_buf = torch.ones(b, dtype=torch.int32, device=dev)
        # host staging, one entry: pinned, so every H2D of plan() is asynchronous; (indptr [b + 1], indices [b W],
        # last page lengths [b])
        self._staging = PinnedRing(1, lambda pinned: (host_zeros(b + 1, torch.int32, pinned),
                                                      host_zeros(b * W, torch.int32, pinned),
                                                      host_zeros(b, torch.int32, pinned).fill_(1)),
                                   dev.type == "cuda")  # fmt: skip
        self._indices_stage = torch.zeros(b * W, dtype=torch.int32, device=dev)  # plan() copies it D2D
        self._scheduled = False
        self.wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace,
            "NHD",
            use_cuda_graph=True,
            use_tensor_cores=use_tensor_cores,
            paged_kv_indptr_buffer=self.indptr_buf,
            paged_kv_indices_buffer=self.indices_buf,
            paged_kv_last_page_len_buffer=self.last_page_len_buf,
            backend="fa2",
        )
        self.out = torch.empty(b, num_qo_heads, head_dim, dtype=dtype, device=dev)

    def schedule(self, block_tables: np.ndarray, seq_lens: np.ndarray) -> None:
        """The next replay's split-KV schedule (FlashInfer's ``plan()``), built on the host from host numpy tables
        [b, W] and lengths [b] (the same rows the device buffers hold). Call on the stream the graph replays on,
        outside capture, before every replay."""
        if block_tables.shape != (self.batch_size, self.max_pages_per_row):
            raise ValueError(f"block_tables {block_tables.shape} != ({self.batch_size}, {self.max_pages_per_row})")
        _, (indptr, indices, last) = self._staging.take()  # once the previous plan's H2D copies have read them
        _, _, _, nnz = build_paged_kv_csr(
            block_tables, seq_lens, self.page_size, indptr.numpy(), indices.numpy(), last.numpy()
        )
        self._indices_stage[:nnz].copy_(indices[:nnz], non_blocking=True)
        self.wrapper.plan(
            indptr,  # host tensor: plan() reads it on the host and copies it H2D
            self._indices_stage[:nnz],  # device tensor: copied D2D into indices_buf, no host sync
            last,
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            self.page_size,
            pos_encoding_mode="NONE",
            q_data_type=self.dtype,
            kv_data_type=self.dtype,
            o_data_type=self.dtype,
            sm_scale=self.sm_scale,
            non_blocking=True,
        )
        self._staging.done()
        self._scheduled = True

    def __call__(
        self,
        q: torch.Tensor,
        kv: torch.Tensor,
        block_table: torch.Tensor | None = None,
        seq_lens: torch.Tensor | None = None,
        scale: float | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if not self._scheduled:
            raise RuntimeError("FA2Decode: schedule() before the first run")
        if q.shape[0] != self.batch_size:
            raise ValueError(f"q has {q.shape[0]} rows, this wrapper is scheduled for {self.batch_size}")
        if scale is not None and not math.isclose(scale, self.sm_scale, rel_tol=1e-6):
            raise ValueError(f"scale {scale} != the planned sm_scale {self.sm_scale} (set at construction)")
        return self.wrapper.run(q.contiguous(), kv, out=self.out if out is None else out, enable_pdl=self.enable_pdl)


# -- dispatch --------------------------------------------------------------------------------------------------------


def make_decode_attention(
    backend: Backend,
    *,
    batch_size: int,
    max_pages_per_row: int,
    num_qo_heads: int,
    num_kv_heads: int,
    head_dim: int,
    page_size: int,
    device: torch.device | str = "cuda",
    dtype: torch.dtype = torch.bfloat16,
    sm_scale: float | None = None,
    workspaces: Workspaces | None = None,
    **kwargs,
) -> DecodeAttention:
    """The attention callable of one captured bucket. XQA and TRITON objects may be shared between buckets (size them
    with the largest); FA2 needs one per bucket (its batch size is frozen); TORCH is stateless. ``workspaces``: the
    owner's FlashInfer workspaces, which XQA and FA2 take theirs from (None: a private one; pass one to share it
    between buckets). ``kwargs`` go to the XQA or TRITON object (TRITON: ``pdl``)."""
    if backend is Backend.TORCH:
        return TorchDecode()
    if backend is Backend.XQA:
        return XQADecode(num_qo_heads, num_kv_heads, head_dim, page_size, max_batch=batch_size, device=device,
                         dtype=dtype, workspaces=workspaces, **kwargs)  # fmt: skip
    if backend is Backend.TRITON:
        from models.layers.triton_attention import TritonDecode

        return TritonDecode(num_qo_heads, num_kv_heads, head_dim, page_size, max_batch=batch_size,
                            max_pages_per_row=max_pages_per_row, device=device, dtype=dtype, sm_scale=sm_scale,
                            **kwargs)  # fmt: skip
    if backend is Backend.FA2:
        return FA2Decode(
            batch_size,
            max_pages_per_row,
            num_qo_heads,
            num_kv_heads,
            head_dim,
            page_size,
            device=device,
            dtype=dtype,
            sm_scale=sm_scale,
            workspaces=workspaces,
            **kwargs,
        )
    raise ValueError(f"unknown backend {backend}")


def decode_attention(
    attn: DecodeAttention | None,
    q: torch.Tensor,
    kv: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """``attn(...)``, or the torch path when ``attn`` is None (the hook ``GatedAttention.decode`` would call)."""
    if attn is None:
        return paged_decode_attention(q, kv, block_table, seq_lens, scale)
    return attn(q, kv, block_table, seq_lens, scale)


# -- paged prefill (eager; one request's chunk, as GatedAttention.prefill) ------------------------------------------


class FlashInferPrefill:
    """``BatchPrefillWithPagedKVCacheWrapper`` for one request's chunk, same contract as ``paged_prefill_attention``.

    plan(qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads, num_kv_heads,
    head_dim_qk, page_size, causal=..., sm_scale=..., q_data_type=..., kv_data_type=...) (prefill.py:3215), then
    run(q [T, hq, d], kv) (prefill.py:4027). With ``causal=True`` and T < kv_len the mask is aligned bottom-right
    (query i sits at kv position kv_len - T + i), i.e. ``start = kv_len - T`` as in our torch prefill. Host
    metadata is built on the CPU; the page ids stay on the device (no sync). Not for capture (plans per chunk).
    """

    def __init__(
        self,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        *,
        device: torch.device | str = "cuda",
        dtype: torch.dtype = torch.bfloat16,
        workspaces: Workspaces | None = None,  # the owner's (None: a private one); takes its prefill workspace
        backend: str = "fa2",
    ) -> None:
        import flashinfer

        _check_common(num_qo_heads, num_kv_heads, head_dim)
        self.num_qo_heads, self.num_kv_heads, self.head_dim = num_qo_heads, num_kv_heads, head_dim
        self.page_size, self.dtype = page_size, dtype
        ws = (Workspaces(device) if workspaces is None else workspaces.on(device)).get(WorkspaceKind.PREFILL)
        self.wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend=backend)

    def __call__(
        self, q: torch.Tensor, kv: torch.Tensor, pages: torch.Tensor, start: int, kv_len: int, scale: float
    ) -> torch.Tensor:
        T, ps = q.shape[0], self.page_size
        if start + T != kv_len:
            raise ValueError("FlashInferPrefill expects the chunk to end the stream: start + T == kv_len")
        n = -(-kv_len // ps)
        self.wrapper.plan(
            torch.tensor([0, T], dtype=torch.int32),
            torch.tensor([0, n], dtype=torch.int32),
            pages[:n].to(torch.int32),
            torch.tensor([kv_len - (n - 1) * ps], dtype=torch.int32),
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            ps,
            causal=True,
            sm_scale=float(scale),
            q_data_type=self.dtype,
            kv_data_type=self.dtype,
        )
        return self.wrapper.run(q.contiguous(), kv)


# -- GDN decode (notes; not wired) ------------------------------------------------------------------------------------
#
# flashinfer.gdn_decode.gated_delta_rule_decode_pretranspose (gdn_decode.py:633), CuTe-DSL kernels, "SM90+":
#   (q [B,1,H,K], k [B,1,H,K], v [B,1,HV,V] bf16/fp16, state=None, A_log [HV] f32, a [B,1,HV], dt_bias [HV] bf16/f32,
#    b [B,1,HV], scale=None (-> K^-0.5), output [B,1,HV,V] bf16 or None, use_qk_l2norm=True,
#    initial_state [pool, HV, V, K] (V-major, K contiguous), initial_state_indices [B] int32/int64,
#    output_state_indices=None, backend="auto"|"flashinfer")  -> (output, initial_state); state updated in place.
# Gates in-kernel: g = -exp(A_log) * softplus(a + dt_bias) (beta 1, threshold 20), beta = sigmoid(b); l2norm eps
# 1e-6 (gdn_kernels/gdn_decode_pretranspose.py:241, 268) -- the same as kernels/gdn_decode/naive.py.
# State dtype: float32 pool -> "legacy" pretranspose kernel (K, V >= 128, pool stride(0) % 4 == 0; negative index
# = padding row, output 0, state untouched); bfloat16 pool with K = V = 128 -> the bf16-state kernel (index -1 is
# redirected to slot 0). Our state is float32 [h, dk, dv] (K-major): the pool must be stored transposed,
# [slots, HV, dv, dk], to use it; gated_delta_rule_decode (gdn_decode.py:1151) takes K-major [B, HV, K, V] float32
# but has no pool/indices (gather + scatter around it). Conv1d is not included. Eager warm-up before capture
# (it compiles, and caches per-B aux tensors on first call).
