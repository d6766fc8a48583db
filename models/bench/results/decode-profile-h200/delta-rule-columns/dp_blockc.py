"""decode_profile with the GDN conv step's channels a program (block_c, 256 in the kernel's wrapper) varied in one
process (scratch experiment). Each capture takes the next value of BLOCK_CS; repeat --pdl on as many times.

    BLOCK_CS=256,128,64 python scratch/dp_blockc.py -- <decode_profile args> --pdl on,on,on
"""
import os
import sys

import torch
import triton

import models.qwen3_5.linear_attention as la
from kernels.gdn_decode import kernel as gk
from kernels.pdl import launch_options
from models.bench import decode_profile as dp

VALUES = [int(v) for v in os.environ["BLOCK_CS"].split(",")]
state = {"v": 256, "i": 0}


def conv(conv_pool, slots, x, weight, out=None, pdl=None):
    _, C, K = conv_pool.shape
    b = x.shape[0]
    out = torch.empty_like(x) if out is None else out
    _conv = gk._conv1d_decode_kernel
    _conv[(b, triton.cdiv(C, state["v"]))](
        conv_pool, slots, x, weight, out, *conv_pool.stride(), x.stride(0), *weight.stride(), out.stride(0),
        C=C, K=K, BLOCK_C=state["v"], BLOCK_K=triton.next_power_of_2(K), num_warps=4, **launch_options(pdl))
    return out


la.conv1d_decode_step_ = conv
graph = dp.Graph


def capture(step, dev):
    state["v"] = VALUES[state["i"] % len(VALUES)]
    state["i"] += 1
    print(f"<!-- capture {state['i']}: block_c {state['v']} -->", flush=True)
    return graph(step, dev)


dp.Graph = capture
dp.main(sys.argv[sys.argv.index("--") + 1:])
