"""decode_profile with the one-kernel mixer at MIXER_WARPS warps (scratch experiment).

    MIXER_WARPS=16 python scratch/dp_warps.py -- <decode_profile args>
"""
import functools
import os
import sys

import models.qwen3_5.linear_attention as la

W = int(os.environ.get("MIXER_WARPS", "8"))
la.gdn_decode_mixer_step_ = functools.partial(la.gdn_decode_mixer_step_, num_warps=W)
from models.bench import decode_profile  # noqa: E402

print(f"<!-- dp_warps: the mixer at {W} warps -->", flush=True)
decode_profile.main(sys.argv[sys.argv.index("--") + 1:])
