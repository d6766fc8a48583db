# ruff: noqa: B023, I001  (as run: each closure is timed inside its own loop iteration)
"""The GDN decode mixer alone at the 0.8B shape (scratch probe, GPU): registers and spills per num_warps, and a layer's
mixer cost in a captured chain of 18 layers (PDL on): one kernel (warps 4, 8, 16) against the three it replaces."""
import statistics

import torch

import kernels.gdn_decode.mixer as mx
from kernels.gdn_decode import conv1d_decode_step_, gdn_decode_raw_step_
from kernels.norms import gated_rms_norm


class Spy:
    def __init__(self, k):
        self.k, self.last = k, None

    def __getitem__(self, grid):
        f = self.k[grid]

        def run(*a, **kw):
            self.last = f(*a, **kw)
            return self.last
        return run


spy = Spy(mx._gdn_decode_mixer_kernel)
mx._gdn_decode_mixer_kernel = spy
dev, dt = "cuda", torch.bfloat16
hk = hv = 16
dk = dv = 128
C, vd, KW, L = 2 * hk * dk + hv * dv, hv * dv, 4, 18
A_log, dt_bias = torch.rand(hv, device=dev), torch.randn(hv, device=dev)
nw = torch.randn(dv, device=dev, dtype=dt)
cw = torch.randn(C, KW, device=dev, dtype=dt) * 0.3


def timed(fn, iters=200):
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    xs = []
    for _ in range(iters):
        torch.cuda.synchronize()
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        xs.append(start.elapsed_time(end) * 1e3)
    return statistics.median(xs)


for b in (1, 16, 64):
    slots = torch.arange(1, b + 1, device=dev, dtype=torch.int32)
    conv = [torch.randn(b + 1, C, KW, device=dev, dtype=dt) for _ in range(L)]
    ssm = [torch.randn(b + 1, hv, dk, dv, device=dev) * 0.1 for _ in range(L)]
    p = [torch.randn(b, C + vd + 2 * hv, device=dev, dtype=dt) for _ in range(L)]
    o = torch.empty(b, hv, dv, device=dev)

    def three():
        for i in range(L):
            m = conv1d_decode_step_(conv[i], slots, p[i][:, :C], cw, pdl=True)
            gdn_decode_raw_step_(ssm[i], slots, m[:, : hk * dk].view(b, hk, dk),
                                 m[:, hk * dk: 2 * hk * dk].view(b, hk, dk), m[:, 2 * hk * dk:].view(b, hv, dv),
                                 p[i][:, C + vd + hv:], p[i][:, C + vd: C + vd + hv], A_log, dt_bias, o, pdl=True)
            gated_rms_norm(o, p[i][:, C: C + vd], nw, 1e-6, pdl=True)

    res = {"three": timed(three)}
    for w in (4, 8, 16):
        def one(w=w):
            for i in range(L):
                mx.gdn_decode_mixer_step_(conv[i], ssm[i], slots, p[i], cw, A_log, dt_bias, nw, 1e-6, hk, pdl=True,
                                          num_warps=w)
        res[f"one w{w}"] = timed(one)
        k = spy.last
        print(f"b={b} warps={w}: regs {k.n_regs}, spills {k.n_spills}", flush=True)
    print(f"b={b}: us a layer (18 in a graph): " + ", ".join(f"{n} {t / L:.2f}" for n, t in res.items()), flush=True)

# Does a torch.profiler run slow the graphs timed after it in this process?
b = 1
slots = torch.arange(1, b + 1, device=dev, dtype=torch.int32)
conv = [torch.randn(b + 1, C, KW, device=dev, dtype=dt) for _ in range(L)]
ssm = [torch.randn(b + 1, hv, dk, dv, device=dev) * 0.1 for _ in range(L)]
p = [torch.randn(b, C + vd + 2 * hv, device=dev, dtype=dt) for _ in range(L)]


def one():
    for i in range(L):
        mx.gdn_decode_mixer_step_(conv[i], ssm[i], slots, p[i], cw, A_log, dt_bias, nw, 1e-6, hk, pdl=True)


before = timed(one)
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]):
    one()
    torch.cuda.synchronize()
after = timed(one)
print(f"profiler effect: 18 mixers in a graph {before:.1f} us before a profiler run, {after:.1f} us after", flush=True)
