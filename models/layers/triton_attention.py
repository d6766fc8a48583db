"""Our plan-free paged decode attention (``kernels.paged_decode``) behind the decode-attention call signature.

Like XQA it reads the gathered block table and lengths on the device, so a bucket that uses it takes no host plan;
unlike XQA it splits short rows over many programs (XQA's split unit is 256 tokens: at one row of 640 tokens it runs 6
CTAs). Runs compiled on CUDA and, under ``TRITON_INTERPRET=1``, on the CPU (how CI tests the engine with it).
"""

from __future__ import annotations

import torch

from kernels.paged_decode import device_sms, paged_decode, workspace_elements
from kernels.runtime import interpreted
from models.layers.decode_attention import Backend


class TritonDecode:
    """Split-KV decode attention for batches up to ``max_batch`` rows of up to ``max_pages_per_row`` pages; one
    instance serves every bucket (the split count follows the batch size, fixed per captured shape)."""

    backend = Backend.TRITON

    def __init__(
        self,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        *,
        max_batch: int,
        max_pages_per_row: int,
        device: torch.device | str = "cuda",
        dtype: torch.dtype = torch.bfloat16,
        sm_scale: float | None = None,
        pdl: bool | None = None,  # launch with PDL (kernels.pdl); None: the process default, an engine passes a bool
    ) -> None:
        dev = torch.device(device)
        self.pdl = pdl
        if dev.type != "cuda" and not interpreted():
            raise ValueError(f"Triton attention on {dev} needs TRITON_INTERPRET=1 (the interpreter); or use CUDA")
        if num_qo_heads % num_kv_heads:
            raise ValueError(f"num_qo_heads {num_qo_heads} is not a multiple of num_kv_heads {num_kv_heads}")
        if head_dim < 16 or head_dim & (head_dim - 1):
            raise ValueError(f"head_dim {head_dim}: the Triton decode kernel needs a power of two >= 16")
        self.num_qo_heads, self.num_kv_heads, self.head_dim = num_qo_heads, num_kv_heads, head_dim
        self.page_size, self.max_batch, self.max_pages_per_row = page_size, max_batch, max_pages_per_row
        self.sm_scale = float(head_dim**-0.5 if sm_scale is None else sm_scale)
        n = workspace_elements(max_batch, num_qo_heads, num_kv_heads, head_dim, max_pages_per_row * page_size,
                               device_sms(dev))  # fmt: skip
        self.workspace = torch.empty(n, dtype=torch.float32, device=dev)  # split partials, rewritten every call
        self.out = torch.empty(max_batch, num_qo_heads, head_dim, dtype=dtype, device=dev)

    def __call__(
        self,
        q: torch.Tensor,  # [b, hq, d]
        kv: torch.Tensor,  # [P, 2, ps, hk, d]
        block_table: torch.Tensor,  # [b, W] int32
        seq_lens: torch.Tensor,  # [b] int32
        scale: float | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        b = q.shape[0]
        if b > self.max_batch or block_table.shape[1] > self.max_pages_per_row:
            raise ValueError(f"{b} rows x {block_table.shape[1]} pages exceed this attention's "
                             f"{self.max_batch} x {self.max_pages_per_row}")  # fmt: skip
        out = self.out[:b] if out is None else out
        return paged_decode(q.contiguous(), kv, block_table, seq_lens, self.sm_scale if scale is None else scale,
                            out, self.workspace, pdl=self.pdl)  # fmt: skip
