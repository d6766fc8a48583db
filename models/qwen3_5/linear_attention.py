"""Qwen3.5 Gated DeltaNet layer on a slotted recurrent pool (conv state + SSM state per slot).

qkv = silu(causal_conv1d(in_proj_qkv(x))); g = -exp(A_log) softplus(in_proj_a(x) + dt_bias);
beta = sigmoid(in_proj_b(x)); o = gated delta rule(l2norm(q) / sqrt(dk), l2norm(k), v, g, beta);
out = out_proj(rmsnorm(o) * w * silu(in_proj_z(x))).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels.choices import DEFAULT, KernelChoices
from kernels.conv1d_varlen import conv1d_varlen_, conv1d_varlen_ref_
from kernels.gdn_decode import conv1d_decode_step_, gdn_decode_raw_step_, gdn_decode_step_
from kernels.gdn_prefill import gdn_prefill, gdn_prefill_ref
from kernels.norms import gated_rms_norm
from models.layers.fused import PendingNorm, decode_linear, decode_normed_linear, fused_weight
from models.layers.gdn import L2_EPS, causal_conv1d_step, gated_delta_step, gdn_gates, l2norm, normalize_qk
from models.layers.norms import GatedRMSNorm
from models.qwen3_5.config import Qwen35Config


class GatedDeltaNet(nn.Module):
    """Parameter names match transformers' Qwen3_5GatedDeltaNet."""

    def __init__(self, cfg: Qwen35Config) -> None:
        super().__init__()
        self.hk, self.hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        self.dk, self.dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        self.key_dim, self.value_dim, self.conv_dim = cfg.linear_key_dim, cfg.linear_value_dim, cfg.conv_dim
        K = cfg.linear_conv_kernel_dim
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, K, groups=self.conv_dim, padding=K - 1, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.hv))
        self.A_log = nn.Parameter(torch.empty(self.hv).uniform_(0.01, 16).log())
        self.norm = GatedRMSNorm(self.dv, eps=cfg.rms_norm_eps)
        self.out_proj = nn.Linear(self.value_dim, cfg.hidden_size, bias=False)
        self.in_proj_qkv = nn.Linear(cfg.hidden_size, self.conv_dim, bias=False)
        self.in_proj_z = nn.Linear(cfg.hidden_size, self.value_dim, bias=False)
        self.in_proj_b = nn.Linear(cfg.hidden_size, self.hv, bias=False)
        self.in_proj_a = nn.Linear(cfg.hidden_size, self.hv, bias=False)

    @property
    def conv_weight(self) -> torch.Tensor:
        """Depthwise kernel [conv_dim, K]."""
        return self.conv1d.weight[:, 0, :]

    def _project(self, x: torch.Tensor):
        """x [n, hidden] -> mixed qkv [n, C], z [n, hv, dv], g, beta [n, hv] (float32)."""
        z = self.in_proj_z(x).view(x.shape[0], self.hv, self.dv)
        g, beta = gdn_gates(self.in_proj_a(x), self.in_proj_b(x), self.A_log, self.dt_bias)
        return self.in_proj_qkv(x), z, g, beta

    def _split(self, mixed: torch.Tensor, repeat: bool = True):
        """Conv output [n, C] -> q, k [n, hv, dk] (repeated, normed, float32), v [n, hv, dv] float32.

        repeat=False leaves q, k at the hk key heads (value head h reads key head h // (hv // hk)).
        """
        n = mixed.shape[0]
        q, k, v = mixed.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        n_rep = self.hv // self.hk if repeat else 1
        q, k = normalize_qk(q.reshape(n, self.hk, self.dk), k.reshape(n, self.hk, self.dk), n_rep)
        return q, k, v.reshape(n, self.hv, self.dv).float()

    def _out(self, o: torch.Tensor, z: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """o [n, hv, dv] float32 -> out_proj(gated_norm(o, z)) [n, hidden]."""
        y = self.norm(o.to(dtype), z)  # [n, hv, dv]
        return self.out_proj(y.reshape(y.shape[0], -1))

    def prefill(
        self,
        x: torch.Tensor,  # [N, hidden]: the pass's flat token stream
        conv_pool: torch.Tensor,  # [slots, C, K]
        ssm_pool: torch.Tensor,  # [slots, hv, dk, dv]
        batch,  # the pass's PrefillBatch (models.qwen3_5.model): sequences, slots, fla's chunk index
    ) -> torch.Tensor:
        """Every sequence of the stream from its slot's state (zeros when fresh), each slot left with its sequence's
        final conv + SSM state; padding runs as its own sequence on the sink slot. One fused input GEMM, the varlen
        conv, the delta rule (fla-core's kernels, or the torch reference), the gated norm, out_proj. [N, hidden]."""
        p = F.linear(x, self.in_weight())  # [N, C | vd | hv | hv]
        N, C, kd, vd, hv = x.shape[0], self.conv_dim, self.key_dim, self.value_dim, self.hv
        g, beta = gdn_gates(p[:, C + vd + hv :], p[:, C + vd : C + vd + hv], self.A_log, self.dt_bias)  # [N, hv]
        conv_in = (p[:, :C], conv_pool, self.conv_weight, batch.seq_of, batch.cu_seqlens, batch.slots, batch.fresh)
        saves = None if batch.save_slot is None else (batch.save_slot, batch.save_at, batch.final_slot)  # (conv states)
        if batch.fused and self.dk >= 16 and self.dk & (self.dk - 1) == 0:
            # one kernel: conv, silu, q and k l2-normalised per head, q | k | v each contiguous (fla's layout)
            q, k, v = conv1d_varlen_(*conv_in, split=(kd, 2 * kd), normed=True, eps=L2_EPS, block_c=self.dk,
                                     saves=saves)  # fmt: skip
            q, k, v = q.view(N, self.hk, self.dk), k.view(N, self.hk, self.dk), v.view(N, hv, self.dv)
        else:
            mixed = (conv1d_varlen_ if batch.fused or batch.kernels else conv1d_varlen_ref_)(*conv_in, saves=saves)
            q, k, v = mixed.split([kd, kd, self.value_dim], dim=-1)
            q, k = l2norm(q.reshape(N, self.hk, self.dk).float()), l2norm(k.reshape(N, self.hk, self.dk).float())
            v = v.reshape(N, hv, self.dv)
        scale = self.dk**-0.5
        if batch.kernels:  # states read from and written to their slots by the kernel (zeros where fresh), saves too
            o = gdn_prefill(q.to(x.dtype), k.to(x.dtype), v.contiguous(), g, beta, ssm_pool, batch.slots, batch.fresh,
                            batch.cu_seqlens, batch.chunk_indices, batch.chunk_offsets, scale, batch.save_slot,
                            batch.final_slot)  # fmt: skip
        else:
            # a fresh sequence's slot is cleared, not multiplied by 0: it holds what its last owner left (0 * nan)
            h0 = ssm_pool[batch.slots].float().masked_fill(batch.fresh[:, None, None, None], 0)  # [S, hv, dk, dv]
            if batch.save_slot is None:
                o, ht = gdn_prefill_ref(q.float(), k.float(), v.float(), g, beta, h0, batch.cu_seqlens, scale)
                ssm_pool[batch.slots] = ht.to(ssm_pool.dtype)
            else:
                rows = batch.save_slot.nonzero()[:, 0]  # the reference reads lengths on the host anyway
                o, ht, saved = gdn_prefill_ref(q.float(), k.float(), v.float(), g, beta, h0, batch.cu_seqlens, scale,
                                               entering=batch.chunk_indices[rows].tolist())  # fmt: skip
                ssm_pool[batch.slots] = ht.to(ssm_pool.dtype)
                ssm_pool[batch.final_slot] = ht.to(ssm_pool.dtype)  # sequences without a final save: to the sink
                ssm_pool[batch.save_slot[rows]] = saved.to(ssm_pool.dtype)
        z = p[:, C : C + vd]  # [N, vd]
        if batch.fused:
            return F.linear(gated_rms_norm(o, z, self.norm.weight, self.norm.eps, pdl=False), self.out_proj.weight)
        return self._out(o.float(), z.view(N, hv, self.dv), x.dtype)

    def decode(
        self,
        x: torch.Tensor,  # [b, hidden]
        conv_pool: torch.Tensor,  # [slots, C, K]
        ssm_pool: torch.Tensor,  # [slots, hv, dk, dv]
        slots: torch.Tensor,  # [b] int32, 0 (sink) for padding rows
        kc: KernelChoices = DEFAULT,  # fused_decode: the conv and delta-rule steps on Triton (None: on CUDA)
    ) -> torch.Tensor:
        """One token a row: gather the rows' slots, step conv and delta rule, scatter back. Graph-safe. [b, hidden].

        Where ``kc.fused_decode`` says (by default on CUDA) the conv and delta-rule steps are fused Triton kernels
        working in place on the pools by slot; else torch gathers, steps and scatters.
        """
        mixed, z, g, beta = self._project(x)
        if x.is_cuda if kc.fused_decode is None else kc.fused_decode:
            mixed = conv1d_decode_step_(conv_pool, slots, mixed, self.conv_weight)  # [b, C]
            q, k, v = self._split(mixed, repeat=False)  # q, k [b, hk, dk]: the kernel maps value heads to key heads
            o = torch.empty(v.shape, dtype=torch.float32, device=v.device)  # [b, hv, dv]
            gdn_decode_step_(ssm_pool, slots, q, k, v, g, beta, o)
            return self._out(o, z, x.dtype)
        idx = slots.long()
        mixed, conv1 = causal_conv1d_step(mixed, conv_pool[idx], self.conv_weight)  # [b, C], [b, C, K]
        q, k, v = self._split(mixed)
        o, ssm1 = gated_delta_step(ssm_pool[idx].float(), q, k, v, g, beta)  # [b, hv, dv], [b, hv, dk, dv]
        conv_pool[idx] = conv1
        ssm_pool[idx] = ssm1.to(ssm_pool.dtype)
        return self._out(o, z, x.dtype)

    def in_weight(self) -> torch.Tensor:
        """[C + value_dim + 2 hv, hidden]: in_proj_qkv, in_proj_z, in_proj_b, in_proj_a as one GEMM's rows."""
        return fused_weight(self, "in", self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a)

    def decode_fused(
        self,
        x: torch.Tensor | PendingNorm,  # [b, hidden], or the pre-norm that makes it (folded into the input GEMM)
        conv_pool: torch.Tensor,  # [slots, C, K]
        ssm_pool: torch.Tensor,  # [slots, hv, dk, dv]
        slots: torch.Tensor,  # [b] int32, 0 (sink) for padding rows
        kc: KernelChoices,  # the step's kernel choices
    ) -> torch.Tensor:
        """``decode`` in five kernels: one input GEMM, conv step, delta-rule step (norms and gates inside), gated norm,
        out_proj. Triton (CUDA or the interpreter). [b, hidden]."""
        p = decode_normed_linear(x, self.in_weight(), kc)  # [b, C | vd | hv | hv]
        b, C, kd, vd, hv = p.shape[0], self.conv_dim, self.key_dim, self.value_dim, self.hv
        mixed = conv1d_decode_step_(conv_pool, slots, p[:, :C], self.conv_weight, pdl=kc.pdl)  # [b, C]: q | k | v
        q = mixed[:, :kd].view(b, self.hk, self.dk)
        k = mixed[:, kd : 2 * kd].view(b, self.hk, self.dk)
        v = mixed[:, 2 * kd :].view(b, hv, self.dv)
        beta_raw, a_raw = p[:, C + vd : C + vd + hv], p[:, C + vd + hv :]
        o = torch.empty(b, hv, self.dv, dtype=torch.float32, device=p.device)  # [b, hv, dv]
        gdn_decode_raw_step_(ssm_pool, slots, q, k, v, a_raw, beta_raw, self.A_log, self.dt_bias, o, pdl=kc.pdl)
        y = gated_rms_norm(o, p[:, C : C + vd], self.norm.weight, self.norm.eps, pdl=kc.pdl)  # [b, vd]
        return decode_linear(y, self.out_proj.weight, kc)
