"""decode_profile with every one-row weight stream reading its whole slice in one tile (scratch experiment: the
whole-slices A/B of 2026-12-02 was timed with the baseline first, before decode_profile's late profiling).

    SLICE=0|1 python scratch/dp_slices.py -- <decode_profile args>

SLICE=1: each one-row config of GEMV_CONFIGS, NORM_CONFIGS and SILU_MUL_CONFIGS gets block_k = next_pow2(K), one
stage, so under PDL a program reads all of its weight bytes before its wait; block_n and warps unchanged.
"""
import os
import sys

import triton

from kernels.gemv import kernel as gk

on = os.environ.get("SLICE", "0") == "1"
changed = {}
if on:
    for table in (gk.GEMV_CONFIGS, gk.NORM_CONFIGS, gk.SILU_MUL_CONFIGS):
        for (t, n, k), cfg in list(table.items()):
            if t == 1 and n != 248320:
                new = (cfg[0], triton.next_power_of_2(k), cfg[2], 1)
                changed[(t, n, k)] = (cfg, new)
                table[(t, n, k)] = new
print(f"<!-- dp_slices: SLICE={int(on)}: {changed} -->", flush=True)
from models.bench import decode_profile  # noqa: E402

decode_profile.main(sys.argv[sys.argv.index("--") + 1:])
