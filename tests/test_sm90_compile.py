"""Triton kernels compiled for sm_90 on the CPU (no GPU: Triton's own ptxas), at the variants the interpreter cannot
vouch for: the interpreter runs a kernel's Python, while the compiler builds both sides of a static branch and checks
shapes the interpreter broadcasts (an early ``return`` in a constexpr branch, an accumulator of another shape). In a
process of its own without TRITON_INTERPRET: under it ``triton.jit`` makes interpreted functions, which no compiler
takes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

_COMPILE = textwrap.dedent('''
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from kernels.gemv.kernel import _gemv_kernel as fn

    PTRS = {"x_ptr": "*bf16", "w_ptr": "*bf16", "y_ptr": "*bf16", "d_ptr": "*bf16", "nw_ptr": "*bf16",
            "ho_ptr": "*bf16", "part_ptr": "*fp32", "count_ptr": "*i32"}
    FLAGS = dict(SILU_MUL=False, NORM=False, HAS_DELTA=False, ZERO_CENTERED=False, NORM_BLOCK=1, PDL=True)
    CASES = [  # (rows, dot, swap, split, fold)
        (1, False, False, 1, ""), (1, False, False, 4, ""), (1, False, False, 1, "norm"), (1, False, False, 1, "silu"),
        (16, True, False, 8, ""), (16, True, True, 1, ""), (64, True, True, 8, ""),
    ]
    for rows, dot, swap, split, fold in CASES:
        const = dict(FLAGS, SILU_MUL=fold == "silu", NORM=fold == "norm", HAS_DELTA=fold == "norm",
                     NORM_BLOCK=1024 if fold == "norm" else 1, FENCE=split > 1, BLOCK_M=rows,
                     BLOCK_N=64 if dot else 4, BLOCK_K=128 if dot else 512, DOT=dot, SPLIT=split, SWAP=swap)
        sig = {p.name: "constexpr" if p.name in const else PTRS.get(p.name, "fp32" if p.name == "eps" else "i32")
               for p in fn.params}
        src = ASTSource(fn=fn, signature=sig, constexprs={(fn.arg_names.index(k),): v for k, v in const.items()})
        try:
            assert "cubin" in triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm
        except Exception as e:
            print(f"gemv {(rows, dot, swap, split, fold)}: {type(e).__name__}: {str(e)[-400:]}")
''')


def test_the_weight_stream_compiles_for_sm90():
    """``kernels.gemv``'s kernel at one row (plain, split K, the norm and silu_mul folds) and at 16 and 64 rows
    (tl.dot, the weight tile first or second, split K)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", _COMPILE], env=env, capture_output=True, text=True, timeout=300,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == "", done.stdout
