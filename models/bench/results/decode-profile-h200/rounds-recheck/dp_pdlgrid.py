"""decode_profile with PDL off for the weight streams whose grid has more than PDL_MAX programs (scratch experiment,
after kernel-boundaries.md: an empty chain of 1024-program launches was slower with PDL than without).

    PDL_MAX=0|256|512|100000 python scratch/dp_pdlgrid.py -- <decode_profile args>
"""
import os
import sys

import triton

import kernels.gemv.kernel as gk

LIMIT = int(os.environ.get("PDL_MAX", "100000"))
orig = gk._launch


def patched(x, w, out, config, M, N, K, silu_mul=False, norm=None, pdl=None):
    tile = gk.tile_rows(M) if M else 1
    table = gk.NORM_CONFIGS if norm else gk.SILU_MUL_CONFIGS if silu_mul else gk.GEMV_CONFIGS
    cfg = config or table.get((tile, N, K), gk.DEFAULT_CONFIG[tile])
    programs = triton.cdiv(N, cfg[0]) * (cfg[4] if len(cfg) > 4 else 1)
    return orig(x, w, out, config, M, N, K, silu_mul, norm, pdl if programs <= LIMIT else False)


gk._launch = patched
from models.bench import decode_profile  # noqa: E402

print(f"<!-- dp_pdlgrid: PDL off above {LIMIT} programs -->", flush=True)
decode_profile.main(sys.argv[sys.argv.index("--") + 1:])
