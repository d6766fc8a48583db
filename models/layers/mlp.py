"""SwiGLU feed-forward: down(silu(gate(x)) * up(x)); the fused decode form runs gate|up as one GEMM."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels.choices import KernelChoices
from models.layers.fused import PendingNorm, decode_normed_linear, decode_silu_mul_linear, fused_weight


class SwiGLU(nn.Module):
    """down_proj(silu(gate_proj(x)) * up_proj(x)), no biases."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    def forward_one_gemm(self, x: torch.Tensor) -> torch.Tensor:
        """The same map with gate|up as one GEMM over the fused weight (a prefill pass's many rows)."""
        gate, up = F.linear(x, self.gate_up_weight()).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)

    def gate_up_weight(self) -> torch.Tensor:
        """[2I, hidden]: gate_proj's rows then up_proj's (see models.layers.fused)."""
        return fused_weight(self, "gate_up", self.gate_proj, self.up_proj)

    def forward_fused(self, x: torch.Tensor | PendingNorm, kc: KernelChoices) -> torch.Tensor:
        """The same map in two kernels where the weight stream serves the down GEMM: one gate|up GEMM, then the down
        GEMM with silu_mul folded into its input loads; elsewhere three (gate|up GEMM, silu_mul, down GEMM). Triton;
        CUDA or the interpreter (models.layers.fused.decode_silu_mul_linear). ``x`` [b, hidden], or the pre-norm that
        makes it, applied by the gate|up GEMM (folded into it where ``decode_normed_linear`` folds). ``kc``: the step's
        kernel choices."""
        return decode_silu_mul_linear(decode_normed_linear(x, self.gate_up_weight(), kc), self.down_proj.weight, kc)
