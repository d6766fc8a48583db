"""The project's Triton kernels compile for sm_90 on this CPU (``tests/sm90_compile.py``, Triton's own ptxas): the
interpreter runs a kernel's Python, while the compiler builds both sides of a static branch and checks shapes the
interpreter broadcasts (an early ``return`` in a constexpr branch, an accumulator of another shape: three device
calls were lost to such errors before this check), and the kernels whose last program reads what the others stored
carry ``kernels.fence.release_fence`` in their PTX. In a process of its own, without TRITON_INTERPRET: under it
``triton.jit`` makes interpreted functions, which no compiler takes."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# kernels every run must reach: the decode step's, the executor's row kernels, the prefill's, the attention's, the
# greedy argmax's two, the sampler's three
EXPECTED = {"_gemv_kernel", "_split_kernel", "_combine_kernel", "_gdn_decode_kernel", "_conv1d_decode_kernel",
            "_add_rms_norm_kernel", "_gated_rms_norm_kernel", "_attn_prep_kernel", "_scatter_cells_kernel",
            "_gather_rows_kernel", "_commit_lengths_kernel", "_conv_kernel", "_state_kernel", "_tile_kernel",
            "_row_kernel", "_group_max_kernel", "_tile_head_kernel", "_draw_row_kernel"}  # fmt: skip


def test_every_triton_kernel_compiles_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "sm90_compile.py")], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    compiled = ast.literal_eval(done.stdout.rsplit("compiled: ", 1)[1].strip())
    assert compiled.keys() >= EXPECTED, sorted(EXPECTED - compiled.keys())
    # kernels.fence.release_fence (compiled only: the interpreter runs programs one after another) in the kernels
    # whose last program reads what the others stored: the split-K weight stream and the sampler's bound
    fenced = ast.literal_eval(done.stdout.rsplit("fenced: ", 1)[1].split("\n", 1)[0].strip())
    assert set(fenced) >= {"_gemv_kernel", "_group_max_kernel"}, fenced
