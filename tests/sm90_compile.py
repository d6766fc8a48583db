"""Compile the project's Triton kernels for sm_90 on a machine without a GPU, as the code calls them: run with
``python tests/sm90_compile.py`` (the repository on PYTHONPATH, TRITON_INTERPRET unset); prints one line a kernel
that did not compile, then the kernels whose PTX holds a release fence (``kernels.fence``), then a count of what did
compile, and exits 1 on a failure.

Triton's active driver is replaced by one that names an sm_90 target and no device, and every launch compiles
(Triton's own ptxas) instead of running: a kernel's outputs are left as they were, so what runs around the kernels
runs on garbage. It drives (1) the tiny model's engine on CPU tensors with the Triton paths the GPU takes (the fused
decode, the executor's row kernels, the prefill's fused row-wise work, PDL launches), both arms (its attention
torch's: ``TritonDecode`` takes CUDA or the interpreter); (2) the weight stream at every configured shape
(``GEMV_CONFIGS``, ``NORM_CONFIGS``, ``SILU_MUL_CONFIGS``), which the engine streams on CUDA only, and with the
weight tile first in tl.dot; (3) the paged decode attention at the 0.8B shape, 1 to 64 rows; (4) greedy's argmax
and the sampled draw over the 0.8B vocabulary at 1 to 64 rows."""

from __future__ import annotations

import collections
import sys
import traceback

import torch
from triton.backends.compiler import GPUTarget
from triton.runtime import driver
from triton.runtime.autotuner import Autotuner
from triton.runtime.jit import JITFunction


class CompileOnlyDriver:
    """What a JIT function asks the active driver while it binds and compiles: device 0, stream 0, sm_90."""

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self) -> GPUTarget:
        return GPUTarget("cuda", 90, 32)

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")


compiled: collections.Counter[str] = collections.Counter()
fenced: set[str] = set()  # kernels of which a compiled variant holds ``kernels.fence.release_fence``'s fence
failed: list[str] = []
_run = JITFunction.run


def _compile_only(self, *args, grid, warmup, **kwargs):
    """JITFunction.run, compiling and never launching."""
    name = self.fn.__name__
    try:
        kernel = _run(self, *args, grid=grid, warmup=True, **kwargs)
    except Exception as e:  # noqa: BLE001 (reported, then the caller goes on without its output)
        failed.append(f"{name}: {type(e).__name__}: {str(e)[-600:]}")
        return None
    compiled[name] += 1
    if "fence.acq_rel.gpu" in kernel.asm.get("ptx", ""):
        fenced.add(name)
    return kernel


def _tuned_compile_only(self, *args, **kwargs):
    """Autotuner.run: every configuration compiled (``warmup``), none timed."""
    kwargs.pop("warmup", None)
    return self.warmup(*args, **kwargs)


def _engines() -> None:
    from kernels.choices import GemvPick, KernelChoices
    from models.engine import Engine, EngineConfig, Planning
    from models.engine.requests import Request, SamplingParams

    kc = KernelChoices(pdl=True, gemv=GemvPick.EVERY, fused_decode=True, prefill_fused=True, row_kernels=True,
                       argmax=True)
    for planning in (Planning.RESIDENT, Planning.HOST):
        cfg = EngineConfig(planning=planning, max_running=4, max_seq_len=128, kernels=kc)
        engine = Engine.build("qwen3_5-tiny", cfg)
        engine.run([Request(tuple(range(1, 20 + 7 * i)), SamplingParams(max_tokens=3, ignore_eos=True))
                    for i in range(3)])  # fmt: skip


def _weight_streams() -> None:
    from kernels.gemv import GEMV_CONFIGS, NORM_CONFIGS, SILU_MUL_CONFIGS, gemv, gemv_add_rms_norm, gemv_silu_mul

    bf16 = dict(dtype=torch.bfloat16)
    for (tile, n, k), config in GEMV_CONFIGS.items():
        gemv(torch.zeros(tile, k, **bf16), torch.empty(n, k, **bf16), config=config, pdl=True)
    for (tile, n, k), config in SILU_MUL_CONFIGS.items():
        gemv_silu_mul(torch.zeros(tile, 2 * k, **bf16), torch.empty(n, k, **bf16), config=config, pdl=True)
    for rows, config in ((16, (64, 128, 4, 3, 1, 1)), (64, (64, 128, 4, 1, 8, 1))):  # the weight tile first (SWAP)
        gemv(torch.zeros(rows, 3584, **bf16), torch.empty(1024, 3584, **bf16), config=config, pdl=True)
    for (_, n, k), config in NORM_CONFIGS.items():
        h, d, out = (torch.zeros(1, k, **bf16) for _ in range(3))
        gemv_add_rms_norm(h, d, torch.zeros(k, **bf16), 1e-6, torch.empty(n, k, **bf16), out, config=config, pdl=True)


def _attention() -> None:
    from kernels.paged_decode import paged_decode

    hq, hk, dim, ps, width = 8, 2, 256, 16, 40  # the 0.8B shape, 640-token tables
    for b in (1, 16, 64):
        q = torch.zeros(b, hq, dim, dtype=torch.bfloat16)
        kv = torch.zeros(2, 2, ps, hk, dim, dtype=torch.bfloat16)
        table, lens = torch.ones(b, width, dtype=torch.int32), torch.zeros(b, dtype=torch.int32)
        paged_decode(q, kv, table, lens, dim**-0.5, torch.empty_like(q), torch.empty(1 << 22), pdl=True)


def _argmax() -> None:
    from kernels.argmax import argmax_rows

    for b in (1, 16, 64):  # the 0.8B vocabulary: 122 tiles a row
        argmax_rows(torch.zeros(b, 248320, dtype=torch.bfloat16), torch.empty(b, dtype=torch.int64), pdl=True)


def _sample() -> None:
    from kernels.sample import sample_rows
    from models.engine.sampler import COLUMNS
    from resplan.layout import SamplerCell

    # (the engines above draw greedily: a sampled draw compiled, not run, would hand them garbage token ids)
    for b, V in ((1, 248320), (16, 248320), (64, 248320), (4, 200)):  # 0.8B: 61 tiles a row; a head under 256
        for head in (torch.empty(b, min(V, 256), dtype=torch.int64), None):  # (a sampled graph's draw keeps none)
            lse = torch.empty(b) if head is not None else None  # (a logprobs step's draw sums the rows' log-sum-exp)
            sample_rows(torch.zeros(b, V, dtype=torch.bfloat16), torch.zeros(b, len(SamplerCell), dtype=torch.int32),
                        torch.zeros(b, dtype=torch.int64), COLUMNS, torch.empty(b, dtype=torch.int64), head,
                        pdl=True, lse=lse)  # fmt: skip


def main() -> int:
    driver.set_active(CompileOnlyDriver())
    JITFunction.run, Autotuner.run = _compile_only, _tuned_compile_only
    for part in (_engines, _weight_streams, _attention, _argmax, _sample):
        try:
            part()
        except Exception:  # noqa: BLE001 (a part that breaks on garbage outputs is a failure of the check)
            failed.append(f"{part.__name__}: {traceback.format_exc()[-1500:]}")
    for line in failed:
        print("FAILED", line)
    print("fenced:", sorted(fenced))
    print("compiled:", dict(compiled))
    return int(bool(failed))


if __name__ == "__main__":
    sys.exit(main())
