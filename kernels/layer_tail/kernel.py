"""A decoder layer's tail at one row, as one persistent launch: the mixer's out projection, the MLP and the next
layer's input projection, with the residual adds and pre-norms between them::

    d1 = round(y @ Wo^T)                                   out projection          [H]
    s1 = round(h + d1);  x1 = round(s1 * rstd(s1) * w1')   residual, post-norm     [H]
    g|u = round(x1 @ Wgu^T);  a = round(silu(g) * u)       gate|up, SwiGLU         [I]
    d2 = round(a @ Wd^T)                                   down projection         [H]
    s2 = round(s1 + d2); x2 = round(s2 * rstd(s2) * w2')   residual, next pre-norm [H]
    p  = round(x2 @ Wp^T)                                  next input projection   [NP]

(w' = 1 + w, zero-centred as Qwen3.5's norms, or w; rstd(s) = rsqrt(mean(s^2) + eps); each ``round`` a cast to the
activations' dtype where the kernel chain it replaces stores a tensor: ``gemv``, ``gemv_add_rms_norm``,
``gemv_silu_mul``.) The residual stream leaves as s2 in ``h_out``; the last layer has no next projection (NP = 0) and
leaves s1 in ``h_out`` and d2 as its output, for the final norm.

Why one launch: at one row each projection is a weight stream of 4-17 MB, ~1-4 us at the memory's speed, and a kernel
boundary costs its ramp: the next kernel's loads start only after the previous grid completes. Here P programs (a
configured count a multiprocessor, all resident at once: the wrapper checks) stay through the four projections and
meet at a grid barrier between them. At a barrier a program counts itself (``_arrive``), asks for the first weight
chunk of its share of the next projection (weights never depend on the step), then spins on an acquire load
(``_wait``), which leaves those loads in flight. Projection ``j``'s output is read by every program after barrier
``j``, from L2 (``.cg``: an SM's L1 is not coherent with other SMs' stores).

Measured (an H100, models/bench/results/decode-floor-h200/layer-tail/): an earlier barrier (a fence in every thread,
atomic polling) at one program a multiprocessor was 1.46x slower than the kernel chain over the 0.8B's 24 tails;
this form did not run on a GPU yet. ``KernelChoices.layer_tail`` is off.

Work split: a projection's output rows are cut into blocks of BN rows, each block one program's whole K (in chunks of
BK, or the whole row at once); program ``pid`` takes blocks pid, pid + P, ... The gate|up projection's block is BN
intermediates: their gate rows and their up rows, so a program forms its own slice of ``a``.

In Triton's interpreter (how the kernels run on a CPU) the programs run one after another, so a grid barrier would
never be met: there the wrapper launches the same kernel once per projection (``FIRST``/``LAST`` pick it), each
launch boundary standing for a barrier. Same operations in the same order either way.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from kernels.pdl import launch_options, pdl_wait
from kernels.runtime import interpreted, stream_workspace

OUT, GATE_UP, DOWN, NEXT = 0, 1, 2, 3  # the projections, in order (FIRST, LAST)


@triton.jit
def _tile(w_ptr, row0, c, N, K, BN: tl.constexpr, BK: tl.constexpr):
    """Rows [row0, row0 + BN) of w [N, K], K chunk c ([BN, BK]); rows past N and columns past K read as 0 (a block
    past the last is all masked: no memory traffic)."""
    rows = row0 + tl.arange(0, BN)
    cols = c * BK + tl.arange(0, BK)
    ptrs = w_ptr + rows.to(tl.int64)[:, None] * K + cols[None, :]
    return tl.load(ptrs, mask=(rows < N)[:, None] & (cols < K)[None, :], other=0.0)


@triton.jit
def _residual(h_ptr, d1_ptr, d2_ptr, offs, m, TWO: tl.constexpr):
    """s = round(h + d1), and with TWO round(s + d2), at ``offs`` (0 where not ``m``); d1, d2 from L2."""
    dt = h_ptr.dtype.element_ty
    h = tl.load(h_ptr + offs, mask=m, other=0.0, cache_modifier=".cg").to(tl.float32)
    s = (h + tl.load(d1_ptr + offs, mask=m, other=0.0, cache_modifier=".cg").to(tl.float32)).to(dt)
    if TWO:
        s = (s.to(tl.float32) + tl.load(d2_ptr + offs, mask=m, other=0.0, cache_modifier=".cg").to(tl.float32)).to(dt)
    return s


@triton.jit
def _rstd(h_ptr, d1_ptr, d2_ptr, ho_ptr, eps, H, HP: tl.constexpr, TWO: tl.constexpr, STORE: tl.constexpr):
    """rsqrt(mean(s^2) + eps) of the residual s (``_residual`` over the whole row); with STORE program 0 stores s
    into ho. Every program computes the same."""
    offs = tl.arange(0, HP)
    m = offs < H
    s = _residual(h_ptr, d1_ptr, d2_ptr, offs, m, TWO)
    if STORE:  # (a mask at block shape: the interpreter refuses a scalar one)
        tl.store(ho_ptr + offs, s, mask=m & ((offs * 0 + tl.program_id(0)) == 0))
    sf = s.to(tl.float32)
    return tl.rsqrt(tl.sum(sf * sf, axis=0) / H + eps)


@triton.jit
def _x_chunk(x_ptr, h_ptr, d1_ptr, d2_ptr, nw_ptr, rstd, c, K, BK: tl.constexpr, X: tl.constexpr,
             ZERO_CENTERED: tl.constexpr):  # fmt: skip
    """x[c BK : (c + 1) BK] in float32 (0 past K). X = 0: x at x_ptr, written by an earlier kernel; 1: the same,
    written by other programs of this launch (read from L2: an SM's L1 is not coherent with other SMs' stores);
    2 / 3: the pre-norm's output round(s * rstd * w') formed here from the residual s1 / s2 (``_residual``)."""
    cols = c * BK + tl.arange(0, BK)
    m = cols < K
    if X == 0:
        x = tl.load(x_ptr + cols, mask=m, other=0.0).to(tl.float32)
    elif X == 1:
        x = tl.load(x_ptr + cols, mask=m, other=0.0, cache_modifier=".cg").to(tl.float32)
    else:
        s = _residual(h_ptr, d1_ptr, d2_ptr, cols, m, X == 3).to(tl.float32)
        nw = tl.load(nw_ptr + cols, mask=m, other=0.0).to(tl.float32)
        if ZERO_CENTERED:
            nw = nw + 1.0
        x = (s * rstd * nw).to(h_ptr.dtype.element_ty).to(tl.float32)
    return x


@triton.jit
def _block_dot(w_ptr, first, row0, N, K: tl.constexpr, x_ptr, h_ptr, d1_ptr, d2_ptr, nw_ptr, rstd, BN: tl.constexpr,
               BK: tl.constexpr, X: tl.constexpr, ZERO_CENTERED: tl.constexpr):  # fmt: skip
    """sum_k w[row0 + i, k] x[k] over the block's BN rows ([BN] float32), chunk 0 of w given (``first``)."""
    acc = tl.sum(first.to(tl.float32) * _x_chunk(x_ptr, h_ptr, d1_ptr, d2_ptr, nw_ptr, rstd, 0, K, BK, X,
                                                 ZERO_CENTERED)[None, :], axis=1)  # fmt: skip
    for c in tl.static_range(1, (K + BK - 1) // BK):  # (constexpr arithmetic: a static range's end)
        w = _tile(w_ptr, row0, c, N, K, BN, BK)
        x = _x_chunk(x_ptr, h_ptr, d1_ptr, d2_ptr, nw_ptr, rstd, c, K, BK, X, ZERO_CENTERED)
        acc += tl.sum(w.to(tl.float32) * x[None, :], axis=1)
    return acc


@triton.jit
def _projection(w_ptr, first, out_ptr, N: tl.constexpr, K: tl.constexpr, x_ptr, h_ptr, d1_ptr, d2_ptr, nw_ptr, rstd,
                BN: tl.constexpr, BK: tl.constexpr, X: tl.constexpr, ZERO_CENTERED: tl.constexpr):  # fmt: skip
    """out[n] = round(sum_k w[n, k] x[k]) over this program's blocks (pid, pid + P, ...); ``first``: chunk 0 of block
    pid. Chunk 0 of a program's next block is asked for before this block's sum."""
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    w0 = first
    for b in range(pid, tl.cdiv(N, BN), P):
        w_next = _tile(w_ptr, (b + P) * BN, 0, N, K, BN, BK)
        acc = _block_dot(w_ptr, w0, b * BN, N, K, x_ptr, h_ptr, d1_ptr, d2_ptr, nw_ptr, rstd, BN, BK, X,
                         ZERO_CENTERED)  # fmt: skip
        rows = b * BN + tl.arange(0, BN)
        tl.store(out_ptr + rows, acc.to(out_ptr.dtype.element_ty), mask=rows < N)
        w0 = w_next


@triton.jit
def _gate_up(w_ptr, first_g, first_u, a_ptr, NI: tl.constexpr, H: tl.constexpr, h_ptr, d1_ptr, nw_ptr, rstd,
             BN: tl.constexpr, BK: tl.constexpr, ZERO_CENTERED: tl.constexpr):  # fmt: skip
    """a[i] = round(silu(g_i) * u_i), g_i = round(x1 . w[i]), u_i = round(x1 . w[I + i]), over this program's blocks
    of BN intermediates (x1 the post-norm's output, formed from h and d1); ``first_g``/``first_u``: chunk 0 of block
    pid's gate rows and up rows."""
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    wg, wu = first_g, first_u
    dt = a_ptr.dtype.element_ty
    for b in range(pid, tl.cdiv(NI, BN), P):
        wg_next = _tile(w_ptr, (b + P) * BN, 0, NI, H, BN, BK)
        wu_next = _tile(w_ptr + NI * H, (b + P) * BN, 0, NI, H, BN, BK)
        g = _block_dot(w_ptr, wg, b * BN, NI, H, a_ptr, h_ptr, d1_ptr, d1_ptr, nw_ptr, rstd, BN, BK, 2,
                       ZERO_CENTERED).to(dt).to(tl.float32)  # fmt: skip
        u = _block_dot(w_ptr + NI * H, wu, b * BN, NI, H, a_ptr, h_ptr, d1_ptr, d1_ptr, nw_ptr, rstd, BN, BK, 2,
                       ZERO_CENTERED).to(dt).to(tl.float32)  # fmt: skip
        rows = b * BN + tl.arange(0, BN)
        tl.store(a_ptr + rows, (g * tl.sigmoid(g) * u).to(dt), mask=rows < NI)
        wg, wu = wg_next, wu_next


@triton.jit
def _arrive(sync_ptr):
    """Count this program on ``sync_ptr[0]`` once all its threads' stores are made: the CTA barrier orders them
    before the counting thread's release (cumulative), as CUDA's grid sync does. Returns nothing; ``_wait`` after."""
    tl.debug_barrier()
    tl.atomic_add(sync_ptr, 1, sem="release")


@triton.jit
def _load_acquire(ptrs):
    """``ld.acquire.gpu`` of int32s: the loads after it see what was stored before the release it reads."""
    return tl.inline_asm_elementwise("ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", [ptrs], dtype=tl.int32,
                                     is_pure=False, pack=1)  # fmt: skip


@triton.jit
def _wait(sync_ptr, target):
    """Spin until the count at ``sync_ptr[0]`` reaches ``target`` (P times the barrier's number in the launch): every
    program's stores before its ``_arrive`` visible after this. Between the two a program asks for the next
    projection's weights; the acquire load orders only what comes after it, so they stay in flight."""
    one = sync_ptr + tl.arange(0, 1)
    seen = tl.max(_load_acquire(one), axis=0)
    while seen < target:
        seen = tl.max(_load_acquire(one), axis=0)


@triton.jit
def _wait_before(J: tl.constexpr, sync_ptr, FIRST: tl.constexpr, PDL: tl.constexpr):
    """The wait in front of projection J: PDL's where J is the launch's first, else the launch's barrier J - FIRST."""
    if FIRST == J:
        pdl_wait(PDL)
    else:
        _wait(sync_ptr, (J - FIRST) * tl.num_programs(0))


@triton.jit
def _barrier_reset(sync_ptr):
    """After a launch's last barrier: the last program to get here sets the count (and this exit count) back to 0,
    once no program reads the count again."""
    left = tl.atomic_add(sync_ptr + 1, 1, sem="acq_rel")
    if left == tl.num_programs(0) - 1:
        tl.atomic_xchg(sync_ptr, 0)
        tl.atomic_xchg(sync_ptr + 1, 0)


@triton.jit
def _layer_tail_kernel(
    y_ptr,  # [D], the mixer's output
    h_ptr,  # [H], the residual stream before this layer's MLP; only read
    wo_ptr,  # [H, D]
    nw1_ptr,  # [H], the post-norm
    wgu_ptr,  # [2I, H], gate rows then up rows
    wd_ptr,  # [H, I]
    nw2_ptr,  # [H], the next layer's pre-norm (NP > 0)
    wp_ptr,  # [NP, H], the next layer's input projection (NP > 0)
    d1_ptr,  # [H] scratch: the out projection
    a_ptr,  # [I] scratch: silu(g) * u
    d2_ptr,  # [H]: the down projection (scratch, or the output where NP == 0)
    p_ptr,  # [NP]: the next input projection (NP > 0)
    ho_ptr,  # [H]: the residual stream after the layer (s2; s1 where NP == 0), not h's memory
    sync_ptr,  # int32 [34]: barrier count, exit count, fence pad; 0 between launches
    eps1,
    eps2,
    H: tl.constexpr,
    D: tl.constexpr,
    NI: tl.constexpr,  # the MLP's intermediate width
    NP: tl.constexpr,
    HP: tl.constexpr,  # next_power_of_2(H)
    BN_OUT: tl.constexpr,
    BN_GU: tl.constexpr,
    BN_DOWN: tl.constexpr,
    BN_NEXT: tl.constexpr,
    BK_OUT: tl.constexpr,  # each projection's K chunk (a power of two; at least K: the whole row at once)
    BK_GU: tl.constexpr,
    BK_DOWN: tl.constexpr,
    BK_NEXT: tl.constexpr,
    FIRST: tl.constexpr,  # the projections [FIRST, LAST) of this launch (OUT .. NEXT)
    LAST: tl.constexpr,
    PERSISTENT: tl.constexpr,  # more than one projection a launch: grid barriers between them
    ZERO_CENTERED: tl.constexpr,
    PDL: tl.constexpr,
):
    pid = tl.program_id(0)
    # Each projection's first weight chunk is asked for before the wait in front of it (PDL's or a grid barrier,
    # after this program counted itself): weights are constant through the step.
    if FIRST == 0:
        w_first = _tile(wo_ptr, pid * BN_OUT, 0, H, D, BN_OUT, BK_OUT)
        pdl_wait(PDL)
        _projection(wo_ptr, w_first, d1_ptr, H, D, y_ptr, h_ptr, d1_ptr, d2_ptr, nw1_ptr, 0.0, BN_OUT, BK_OUT, 0,
                    ZERO_CENTERED)  # fmt: skip
    if FIRST <= 1 and LAST > 1:
        if FIRST < 1:
            _arrive(sync_ptr)
        g_first = _tile(wgu_ptr, pid * BN_GU, 0, NI, H, BN_GU, BK_GU)
        u_first = _tile(wgu_ptr + NI * H, pid * BN_GU, 0, NI, H, BN_GU, BK_GU)
        _wait_before(1, sync_ptr, FIRST, PDL)
        rstd = _rstd(h_ptr, d1_ptr, d2_ptr, ho_ptr, eps1, H, HP, False, NP == 0)  # s1 stored where it is the output
        _gate_up(wgu_ptr, g_first, u_first, a_ptr, NI, H, h_ptr, d1_ptr, nw1_ptr, rstd, BN_GU, BK_GU, ZERO_CENTERED)
    if FIRST <= 2 and LAST > 2:
        if FIRST < 2:
            _arrive(sync_ptr)
        w_first = _tile(wd_ptr, pid * BN_DOWN, 0, H, NI, BN_DOWN, BK_DOWN)
        _wait_before(2, sync_ptr, FIRST, PDL)
        _projection(wd_ptr, w_first, d2_ptr, H, NI, a_ptr, h_ptr, d1_ptr, d2_ptr, nw1_ptr, 0.0, BN_DOWN, BK_DOWN, 1,
                    ZERO_CENTERED)  # fmt: skip
    if NP > 0 and FIRST <= 3 and LAST > 3:
        if FIRST < 3:
            _arrive(sync_ptr)
        w_first = _tile(wp_ptr, pid * BN_NEXT, 0, NP, H, BN_NEXT, BK_NEXT)
        _wait_before(3, sync_ptr, FIRST, PDL)
        rstd = _rstd(h_ptr, d1_ptr, d2_ptr, ho_ptr, eps2, H, HP, True, True)  # s2, the stream after the layer
        _projection(wp_ptr, w_first, p_ptr, NP, H, y_ptr, h_ptr, d1_ptr, d2_ptr, nw2_ptr, rstd, BN_NEXT, BK_NEXT, 3,
                    ZERO_CENTERED)  # fmt: skip
    if PERSISTENT:
        _barrier_reset(sync_ptr)


# (BN_OUT, BN_GU, BN_DOWN, BN_NEXT, BK, num_warps, programs a multiprocessor): rows of a block per projection, the K
# chunk (0: each projection's whole row at once), warps a program, and P over the multiprocessor count
DEFAULT_CONFIG = (8, 4, 8, 16, 1024, 8, 1)

_REGISTERS, _THREADS, _BLOCKS = 65536, 2048, 32  # an sm_90 multiprocessor's register file, threads, resident blocks


def _resident(kernel, warps: int, device: torch.device) -> int:
    """Programs of a compiled kernel one multiprocessor of ``device`` holds at once (registers, shared memory,
    threads)."""
    kernel._init_handles()  # (loads it: n_regs is known from then on)
    per_warp = -(-kernel.n_regs * 32 // 256) * 256  # registers are granted a warp at a time, in units of 256
    props = torch.cuda.get_device_properties(device)
    smem = getattr(props, "shared_memory_per_multiprocessor", 228 * 1024)
    by_smem = smem // kernel.metadata.shared if kernel.metadata.shared else _BLOCKS
    return min(_REGISTERS // (per_warp * warps), _THREADS // (32 * warps), by_smem, _BLOCKS)


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


_sync = stream_workspace("layer-tail barrier", lambda device: torch.zeros(34, dtype=torch.int32, device=device))
_checked: set = set()  # persistent launches whose programs were checked to fit at once


def layer_tail(
    y: torch.Tensor,  # [1, D], the mixer's output (before its out projection)
    h: torch.Tensor,  # [1, H], the residual stream before the layer's mixer output is added; only read
    wo: torch.Tensor,  # [H, D], the out projection
    nw1: torch.Tensor,  # [H], the post-norm's weight
    eps1: float,
    wgu: torch.Tensor,  # [2I, H], gate rows then up rows
    wd: torch.Tensor,  # [H, I], the down projection
    h_out: torch.Tensor,  # [1, H], not h's memory: receives the residual stream after the layer
    nw2: torch.Tensor | None = None,  # [H], the next layer's pre-norm (None: no next layer)
    eps2: float = 0.0,
    wp: torch.Tensor | None = None,  # [NP, H], the next layer's input projection (None: no next layer)
    *,
    zero_centered: bool = True,
    persistent: bool | None = None,  # one launch with grid barriers; None: where compiled (a GPU)
    programs: int | None = None,  # P; None: the config's count a multiprocessor (a GPU), 4 (the interpreter)
    config: tuple[int, ...] = DEFAULT_CONFIG,
    pdl: bool | None = None,  # launch with PDL (kernels.pdl); None reads the process default
) -> torch.Tensor:
    """The layer's tail (module doc): p [1, NP] (h_out = s2), or without a next layer d2 [1, H] (h_out = s1)."""
    (_, D), (H, _), two_i = y.shape, wo.shape, wgu.shape[0]
    inter = two_i // 2
    assert y.shape == (1, D) and h.shape == (1, H) and h_out.shape == (1, H), (y.shape, h.shape, h_out.shape)
    assert wo.shape == (H, D) and wgu.shape == (2 * inter, H) and wd.shape == (H, inter), (wgu.shape, wd.shape)
    assert (nw2 is None) == (wp is None), "the next layer's pre-norm and input projection come together"
    for t in (y, h, h_out, wo, nw1, wgu, wd) + (() if wp is None else (wp, nw2)):
        assert t.is_contiguous(), "layer_tail reads contiguous tensors"
    assert h_out.data_ptr() != h.data_ptr(), "h_out must be another buffer than h (every program reads h)"
    np_ = 0 if wp is None else wp.shape[0]
    assert wp is None or wp.shape == (np_, H), wp.shape
    compiled = not interpreted()
    if persistent is None:
        persistent = compiled
    assert not (persistent and not compiled), "a persistent launch needs its programs resident at once: compiled only"
    bn_out, bn_gu, bn_down, bn_next, bk, warps, per_sm = config
    if programs is None:
        programs = per_sm * _multiprocessors(y.device) if compiled else 4

    def chunk(k: int) -> int:
        return triton.next_power_of_2(k) if bk == 0 else min(bk, triton.next_power_of_2(k))

    d1 = torch.empty(H, dtype=y.dtype, device=y.device)
    a = torch.empty(inter, dtype=y.dtype, device=y.device)
    d2 = torch.empty(1, H, dtype=y.dtype, device=y.device)
    out = d2 if wp is None else torch.empty(1, np_, dtype=y.dtype, device=y.device)
    sync = _sync(y.device)
    last = NEXT + 1 if wp is not None else DOWN + 1
    phases = [(OUT, last)] if persistent else [(j, j + 1) for j in range(last)]
    for first, stop in phases:
        args = (y, h, wo, nw1, wgu, wd, nw1 if nw2 is None else nw2, wo if wp is None else wp, d1, a, d2, out, h_out,
                sync, float(eps1), float(eps2))  # fmt: skip
        kwargs = dict(H=H, D=D, NI=inter, NP=np_, HP=triton.next_power_of_2(H), BN_OUT=bn_out, BN_GU=bn_gu,
                      BN_DOWN=bn_down, BN_NEXT=bn_next, BK_OUT=chunk(D), BK_GU=chunk(H), BK_DOWN=chunk(inter),
                      BK_NEXT=chunk(H), FIRST=first, LAST=stop, PERSISTENT=persistent, ZERO_CENTERED=zero_centered,
                      num_warps=warps, **launch_options(pdl))  # fmt: skip
        key = (programs, y.dtype, tuple(sorted(kwargs.items())))
        if persistent and y.is_cuda and key not in _checked:  # programs that cannot all be resident would never meet
            kernel = _layer_tail_kernel.warmup(*args, grid=(programs,), **kwargs)
            fits = _resident(kernel, warps, y.device) * _multiprocessors(y.device)
            if programs > fits:
                raise ValueError(f"layer_tail: {programs} persistent programs, but only {fits} fit on the GPU at once "
                                 f"(config {config}): grid barriers would wait forever")  # fmt: skip
            _checked.add(key)
        _layer_tail_kernel[(programs,)](*args, **kwargs)
    return out
