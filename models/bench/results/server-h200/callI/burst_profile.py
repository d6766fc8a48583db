"""Host profile of the in-process burst on the server's engine (call I of ../RUNS.md; the script that ran, laid out for
the linter, from the repository root): 128 requests at t=0 with the traffic bench's lognormal lengths, on
resident-triton-cache beside the decode steps, budget 2048, 32 running, context 2048, 6 prefill graphs up to 8192
tokens. Two warm-up bursts, one timed plain, one under cProfile. Wrote ``burst_profile.txt``."""

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

dev = "cuda" if torch.cuda.is_available() else "cpu"
name = "resident-triton-cache" if dev == "cuda" else "resident-torch-cache"
arm = Arm.of(name, PrefillPlacement.BESIDE, Budget.AUTO, dev)
model = "qwen3_5-0.8b" if dev == "cuda" else "qwen3_5-tiny"
cfg = arm.config(device=dev, dtype=torch.bfloat16 if dev == "cuda" else torch.float32, max_running=32,
                 max_seq_len=2048, prefill_graphs=6 if dev == "cuda" else 0, prefill_graph_tokens=8192,
                 timing=True)  # fmt: skip
eng = Engine.build(model, cfg)
n = int(sys.argv[1]) if len(sys.argv) > 1 else 128


def burst(seed: int) -> list[Request]:
    g = np.random.default_rng(seed)

    def lognormal(median: int, lo: int, hi: int) -> np.ndarray:
        return np.clip(np.round(median * np.exp(0.9 * g.standard_normal(n))), lo, hi).astype(int)

    prompts, outputs = lognormal(256, 32, 1536), lognormal(96, 8, 384)
    return [Request(tuple(g.integers(10, eng.adapter.vocab_size, int(p)).tolist()),
                    SamplingParams(max_tokens=int(o), ignore_eos=True))
            for p, o in zip(prompts, outputs, strict=True)]  # fmt: skip


eng.run(burst(1))
eng.run(burst(2))
gc.collect()
gc.freeze()
st = eng.stats


def snap() -> dict:
    return dict(steps=st.decode_steps, ns=st.decode_ns, gpu=st.gpu_ms, passes=st.prefill_passes,
                phost=st.prefill_host_ns, plan=st.plan_ns, launch=st.launch_ns, wait=st.wait_ns)  # fmt: skip


a = snap()
t = time.perf_counter()
eng.run(burst(3))
wall = time.perf_counter() - t
d = {k: v - a[k] for k, v in snap().items()}
steps = max(1, d["steps"])
print(f"plain: {wall * 1e3:.0f} ms, {d['steps']} decode steps, step {d['ns'] / steps / 1e3:.0f} us wall, GPU "
      f"{d['gpu'] / steps * 1e3:.0f} us, plan {d['plan'] / steps / 1e3:.0f} launch {d['launch'] / steps / 1e3:.0f} "
      f"wait {d['wait'] / steps / 1e3:.0f} us; {d['passes']} passes, host "
      f"{d['phost'] / max(1, d['passes']) / 1e3:.0f} us each")  # fmt: skip
pr = cProfile.Profile()
t = time.perf_counter()
pr.enable()
eng.run(burst(4))
pr.disable()
print(f"profiled: {(time.perf_counter() - t) * 1e3:.0f} ms")
for key, pattern, count in (("tottime", None, 45), ("cumulative", "engine|resplan|models|kernels|flashinfer|fla", 70)):
    s = io.StringIO()
    stats = pstats.Stats(pr, stream=s).sort_stats(key)
    stats.print_stats(*((pattern,) if pattern else ()), count)
    print(s.getvalue()[:16000])
