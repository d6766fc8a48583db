"""The resident decode step's host time on the GPU machine, split: per step wall, wait, plan, launch and the rest
(stats deltas over a plain run), then cProfile's costliest functions. c=1 (512/1024) and c=64 (512/256)."""

import cProfile
import gc
import io
import pstats
import sys
import time

import numpy as np
import torch

from models.bench.arms import Arm, Budget
from models.engine import Engine
from models.engine.config import PrefillPlacement
from models.engine.requests import Request, SamplingParams

arm = Arm.of("resident-triton", PrefillPlacement.BESIDE, Budget.WHOLE, "cuda")
for c, gen in ((1, 1024), (64, 256)):
    cfg = arm.config(device="cuda", dtype=torch.bfloat16, max_running=c, max_seq_len=512 + gen, prefill_graphs=6)
    eng = Engine.build("qwen3_5-0.8b", cfg)
    rng = np.random.default_rng(0)

    def reqs(c=c, gen=gen, rng=rng):
        return [Request(tuple(rng.integers(0, 1000, 512).tolist()), SamplingParams(max_tokens=gen, ignore_eos=True))
                for _ in range(c)]  # fmt: skip

    eng.run(reqs())
    eng.run(reqs())
    gc.collect()
    gc.freeze()
    st = eng.stats
    for rep in range(3):
        a = dict(steps=st.decode_steps, ns=st.decode_ns, plan=st.plan_ns, launch=st.launch_ns, wait=st.wait_ns)
        t = time.perf_counter()
        eng.run(reqs())
        wall = time.perf_counter() - t
        b = dict(steps=st.decode_steps, ns=st.decode_ns, plan=st.plan_ns, launch=st.launch_ns, wait=st.wait_ns)
        d = {k: b[k] - a[k] for k in a}
        n = max(1, d["steps"])
        step, wait, plan, launch = (d[k] / n / 1e3 for k in ("ns", "wait", "plan", "launch"))
        print(f"c={c} rep {rep}: {wall * 1e3:.0f} ms, {d['steps']} steps; step {step:.1f} us, wait {wait:.1f}, "
              f"host {step - wait:.1f} (plan {plan:.1f}, launch {launch:.1f}, rest {step - wait - plan - launch:.1f})")
    sys.stdout.flush()
    pr = cProfile.Profile()
    pr.enable()
    eng.run(reqs())
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(45)
    print(s.getvalue()[:12000])
    del eng
    gc.unfreeze()
    gc.collect()
    torch.cuda.empty_cache()
