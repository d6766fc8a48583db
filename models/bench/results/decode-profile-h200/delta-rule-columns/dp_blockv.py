"""decode_profile with the GDN delta rule's state columns a program (block_v) varied in one process (scratch
experiment, after delta-rule-tiles.md was timed with the old first-variant bias).

    BLOCK_VS=64,32,16,8 python scratch/dp_blockv.py -- <decode_profile args> --pdl on,on,on,on

Each capture takes the next value of BLOCK_VS (so give as many identical variants, here by repeating --pdl on, as
values); the table's rows per batch are in BLOCK_VS's order.
"""
import os
import sys

import models.qwen3_5.linear_attention as la
from models.bench import decode_profile as dp

VALUES = [int(v) for v in os.environ["BLOCK_VS"].split(",")]
state = {"v": None, "i": 0}
orig = la.gdn_decode_raw_step_


def patched(*a, **kw):
    kw["block_v"] = state["v"] or None  # 0: the default (block_v_for)
    return orig(*a, **kw)


la.gdn_decode_raw_step_ = patched
graph = dp.Graph


def capture(step, dev):
    state["v"] = VALUES[state["i"] % len(VALUES)]
    state["i"] += 1
    print(f"<!-- capture {state['i']}: block_v {state['v']} -->", flush=True)
    return graph(step, dev)


dp.Graph = capture
dp.main(sys.argv[sys.argv.index("--") + 1:])
