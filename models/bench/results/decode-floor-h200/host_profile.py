"""Host time of the resident engine's decode loop on the H200: cProfile of one request (512 / 1024) at c=1 and 64
requests at c=64, resident-triton (the serve arm), after a warm-up run."""
import cProfile, gc, io, pstats, sys, time
import numpy as np, torch
from models.bench.arms import Arm, Budget
from models.engine import Engine
from models.engine.config import PrefillPlacement
from models.engine.requests import Request, SamplingParams

arm = Arm.of("resident-triton", PrefillPlacement.BESIDE, Budget.WHOLE, "cuda")
for c, gen in ((1, 1024), (64, 256)):
    cfg = arm.config(device="cuda", dtype=torch.bfloat16, max_running=c, max_seq_len=512 + gen, prefill_graphs=6)
    eng = Engine.build("qwen3_5-0.8b", cfg)
    rng = np.random.default_rng(0)
    reqs = lambda: [Request(tuple(rng.integers(0, 1000, 512).tolist()), SamplingParams(max_tokens=gen, ignore_eos=True)) for _ in range(c)]
    eng.run(reqs()); eng.run(reqs())
    gc.collect(); gc.freeze()
    t = time.perf_counter(); eng.run(reqs()); plain = time.perf_counter() - t
    pr = cProfile.Profile(); t = time.perf_counter(); pr.enable(); eng.run(reqs()); pr.disable(); prof = time.perf_counter() - t
    print(f"## c={c}: {c * gen} tokens, run {plain * 1e3:.0f} ms plain, {prof * 1e3:.0f} ms under cProfile\n")
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(40); print(s.getvalue()[:9000])
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats("engine|resplan", 40); print(s.getvalue()[:9000])
    del eng; gc.unfreeze(); gc.collect(); torch.cuda.empty_cache()
