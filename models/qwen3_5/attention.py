"""Qwen3.5 gated full attention on a paged KV cache.

q_proj yields, per head, a query and an output gate; q and k get a zero-centred RMSNorm over head_dim, then partial
RoPE; out = o_proj(attn(q, k, v) * sigmoid(gate)).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels.attention_prep import attention_prep_
from kernels.choices import KernelChoices
from kernels.gates import sigmoid_gate_mul
from models.layers.fused import PendingNorm, decode_linear, decode_normed_linear, fused_weight
from models.layers.norms import ZeroCenteredRMSNorm
from models.layers.paged import paged_decode_attention, write_kv
from models.layers.prefill_attention import paged_prefill_ref
from models.layers.rope import apply_partial_rope
from models.qwen3_5.config import Qwen35Config


class GatedAttention(nn.Module):
    """Parameter names match transformers' Qwen3_5Attention."""

    def __init__(self, cfg: Qwen35Config) -> None:
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.scale = cfg.head_dim**-0.5
        hidden = cfg.hidden_size
        self.q_proj = nn.Linear(hidden, self.n_heads * self.head_dim * 2, bias=False)
        self.k_proj = nn.Linear(hidden, self.n_kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, self.n_kv * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, hidden, bias=False)
        self.q_norm = ZeroCenteredRMSNorm(self.head_dim, eps=cfg.rms_norm_eps)
        self.k_norm = ZeroCenteredRMSNorm(self.head_dim, eps=cfg.rms_norm_eps)

    def _qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x [n, hidden] -> q [n, hq, d], k, v [n, hk, d], gate [n, hq * d]."""
        return self._heads(self.q_proj(x), self.k_proj(x), self.v_proj(x), cos, sin)

    def _heads(self, qg: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """The projections (qg [n, hq 2d], k, v [n, hk d]) -> normed, rotated q [n, hq, d] and k [n, hk, d], v
        [n, hk, d], gate [n, hq * d]."""
        n, d = qg.shape[0], self.head_dim
        q, gate = qg.view(n, self.n_heads, 2 * d).chunk(2, dim=-1)  # [n, hq, d] each
        q = apply_partial_rope(self.q_norm(q), cos, sin)
        k = apply_partial_rope(self.k_norm(k.view(n, self.n_kv, d)), cos, sin)
        return q, k, v.view(n, self.n_kv, d), gate.reshape(n, -1)

    def _out(self, o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """o [n, hq, d] -> o_proj(o * sigmoid(gate)) [n, hidden]."""
        return self.o_proj(o.reshape(o.shape[0], -1) * torch.sigmoid(gate))

    def prefill(
        self,
        x: torch.Tensor,  # [N, hidden]: the pass's flat token stream
        kv: torch.Tensor,  # [num_pages, 2, ps, hk, d]
        cos: torch.Tensor,  # [N, rot]
        sin: torch.Tensor,
        batch,  # the pass's PrefillBatch (models.qwen3_5.model)
        kernel=None,  # the pass's FlashInferPrefill (models.layers.prefill_attention), for batch.kernels
    ) -> torch.Tensor:
        """K/V of every token written at its slot, then each sequence attends causally over its own stream (its
        earlier chunks' pages and its own tokens): FlashInfer's paged prefill, or the torch reference. [N, hidden]."""
        if batch.fused:  # q|k|v GEMM, then norms, RoPE and the K/V write in one kernel
            qkv = F.linear(x, self.qkv_weight())  # [N, hq 2d + 2 hk d]
            q = attention_prep_(qkv, self.q_norm.weight, self.k_norm.weight, cos, sin, kv, batch.write_loc,
                                self.n_heads, self.q_norm.eps, pdl=False)  # fmt: skip
        else:
            q, k, v, gate = self._qkv_fused(x, cos, sin)
            write_kv(kv, batch.write_loc, k, v)
        if batch.kernels:
            o = kernel(batch.attn, q, kv)  # [N, hq, d]
        else:
            o = paged_prefill_ref(q, kv, batch.cu_seqlens, batch.kv_indptr, batch.kv_indices, batch.kv_lens,
                                  self.scale)  # fmt: skip
        if batch.fused:
            return F.linear(sigmoid_gate_mul(o, qkv, pdl=False), self.o_proj.weight)
        return self._out(o, gate)

    def _qkv_fused(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """``_qkv`` through the fused q|k|v GEMM: x [n, hidden] -> q [n, hq, d], k, v [n, hk, d], gate [n, hq * d]."""
        qg, k, v = F.linear(x, self.qkv_weight()).split(
            [self.n_heads * 2 * self.head_dim, self.n_kv * self.head_dim, self.n_kv * self.head_dim], dim=-1)
        return self._heads(qg, k, v, cos, sin)

    def decode(
        self,
        x: torch.Tensor,  # [b, hidden]
        kv: torch.Tensor,  # [num_pages, 2, ps, hk, d]
        block_table: torch.Tensor,  # [b, W] int32
        seq_lens: torch.Tensor,  # [b] int32, stored length + 1
        write_loc: torch.Tensor,  # [b] int32, flat slot of this step's token
        cos: torch.Tensor,  # [b, rot]
        sin: torch.Tensor,
        attn=None,  # a bucket's DecodeAttention (models.layers.flashinfer_attention); None = plain torch
    ) -> torch.Tensor:
        """One token a row: write its K/V at write_loc, attend over seq_lens tokens. Graph-safe. out [b, hidden]."""
        q, k, v, gate = self._qkv(x, cos, sin)
        write_kv(kv, write_loc, k, v)
        if attn is None:
            o = paged_decode_attention(q, kv, block_table, seq_lens, self.scale)  # [b, hq, d]
        else:
            o = attn(q, kv, block_table, seq_lens, self.scale)
        return self._out(o, gate)

    def qkv_weight(self) -> torch.Tensor:
        """[hq 2d + 2 hk d, hidden]: q_proj (query | gate per head), k_proj, v_proj as one GEMM's rows."""
        return fused_weight(self, "qkv", self.q_proj, self.k_proj, self.v_proj)

    def decode_fused(
        self,
        x: torch.Tensor | PendingNorm,  # [b, hidden], or the pre-norm that makes it (folded into the qkv GEMM)
        kv: torch.Tensor,  # [num_pages, 2, ps, hk, d]
        block_table: torch.Tensor,  # [b, W] int32
        seq_lens: torch.Tensor,  # [b] int32
        write_loc: torch.Tensor,  # [b] int32
        cos: torch.Tensor,  # [b, rot]
        sin: torch.Tensor,
        attn=None,
        *,
        kc: KernelChoices,  # the step's kernel choices
    ) -> torch.Tensor:
        """``decode`` in five kernels around the attention: qkv GEMM, prologue (norms, RoPE, K/V write), attention,
        sigmoid gate, o_proj. Triton (CUDA or the interpreter). [b, hidden]."""
        qkv = decode_normed_linear(x, self.qkv_weight(), kc)  # [b, hq 2d + 2 hk d]
        q = attention_prep_(qkv, self.q_norm.weight, self.k_norm.weight, cos, sin, kv, write_loc, self.n_heads,
                            self.q_norm.eps, pdl=kc.pdl)  # fmt: skip
        if attn is None:
            o = paged_decode_attention(q, kv, block_table, seq_lens, self.scale)  # [b, hq, d]
        else:
            o = attn(q, kv, block_table, seq_lens, self.scale)
        return decode_linear(sigmoid_gate_mul(o, qkv, pdl=kc.pdl), self.o_proj.weight, kc)
