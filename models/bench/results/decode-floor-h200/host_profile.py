"""Host time of the resident engine's decode loop on the H200 (call 5 of RUNS.md; the script that ran, laid out for
the linter, from the repository root): cProfile of one request (512 / 1024) at c=1 and 64 requests (512 / 256) at c=64,
resident-triton beside with whole prompts (the serve arm), after two warm-up runs. Wrote ``host_profile.txt``."""

import cProfile
import gc
import io
import pstats
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
    t = time.perf_counter()
    eng.run(reqs())
    plain = time.perf_counter() - t
    pr = cProfile.Profile()
    t = time.perf_counter()
    pr.enable()
    eng.run(reqs())
    pr.disable()
    prof = time.perf_counter() - t
    print(f"## c={c}: {c * gen} tokens, run {plain * 1e3:.0f} ms plain, {prof * 1e3:.0f} ms under cProfile\n")
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(40)
    print(s.getvalue()[:9000])
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats("engine|resplan", 40)
    print(s.getvalue()[:9000])
    del eng
    gc.unfreeze()
    gc.collect()
    torch.cuda.empty_cache()
