"""The reference of the varlen prefill delta rule: each sequence alone through the chunked gated delta rule (UT
transform, float32), in plain torch.

State per head is S [dk, dv]; one token does S <- exp(g) S; S <- S + k (beta (v - S^T k))^T; o = scale * S^T q
(``kernels.gdn_decode.naive.gated_delta_step``, with q already scaled there).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def gdn_prefill_ref(
    q: torch.Tensor,  # [N, hk, dk]: l2-normalised, not scaled
    k: torch.Tensor,  # [N, hk, dk]: l2-normalised
    v: torch.Tensor,  # [N, hv, dv]: value head h reads key head h // (hv // hk)
    g: torch.Tensor,  # [N, hv] float32: log decay (<= 0)
    beta: torch.Tensor,  # [N, hv] float32
    h0: torch.Tensor,  # [S, hv, dk, dv] float32: each sequence's initial state
    cu_seqlens: torch.Tensor,  # [S + 1] int: sequence s is tokens cu[s] .. cu[s + 1] - 1
    scale: float,
    entering: Sequence[tuple[int, int]] | None = None,  # (sequence, 64-token chunk of it) pairs
) -> tuple[torch.Tensor, torch.Tensor] | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every sequence from its h0: outputs o [N, hv, dv] in v's dtype and final states [S, hv, dk, dv] float32 (an
    empty sequence's is its h0). With ``entering`` also the states entering those chunks [len(entering), hv, dk, dv]
    float32, in its order (chunk i of sequence s: the state after its first 64 i tokens, i < its chunk count)."""
    rep = v.shape[1] // k.shape[1]
    o = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
    ht = h0.float().clone()
    cu = cu_seqlens.tolist()
    want = [(int(s), int(i)) for s, i in entering or ()]
    kept: dict[tuple[int, int], torch.Tensor] = {}
    for s in range(len(cu) - 1):
        a, b = cu[s], cu[s + 1]
        mine = [i for t, i in want if t == s]
        if b == a:
            if mine:
                raise ValueError(f"sequence {s} is empty: no chunk {mine[0]} to enter")
            continue
        qs = q[a:b].float().repeat_interleave(rep, dim=1) * scale
        ks = k[a:b].float().repeat_interleave(rep, dim=1)
        out = gated_delta_chunked(qs, ks, v[a:b].float(), g[a:b].float(), beta[a:b].float(), ht[s],
                                  entering=mine if mine else None)  # fmt: skip
        o[a:b], ht[s] = out[0], out[1]
        kept.update({(s, i): x for i, x in zip(mine, out[2] if mine else (), strict=True)})
    if entering is None:
        return o.to(v.dtype), ht
    states = torch.stack([kept[w] for w in want]) if want else ht.new_zeros(0, *ht.shape[1:])
    return o.to(v.dtype), ht, states


def gated_delta_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    chunk_size: int = 64,
    entering: Sequence[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor] | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Same result as gated_delta_sequential, a chunk of c tokens at a time (UT transform). Float32. With
    ``entering`` (chunk indices, each < the chunk count) also the states entering those chunks [len, h, dk, dv], in
    its order: chunk i's is the state after the first c i tokens (c = min(chunk_size, T)).

    Within a chunk, with G_i = cumsum(g)_i and S0 the state entering it, the delta-rule updates u_i solve
        u_i + sum_{j<i} beta_i e^{G_i - G_j} (k_i . k_j) u_j = beta_i v_i - beta_i e^{G_i} S0^T k_i
    (unit lower-triangular), then o_i = e^{G_i} S0^T q_i + sum_{j<=i} e^{G_i - G_j} (q_i . k_j) u_j and
    S_c = e^{G_c} S0 + sum_j e^{G_c - G_j} k_j u_j^T. Every exponent is <= 0, so nothing overflows.

    Everything that does not depend on S0 (the decays, the triangular solve, the intra-chunk attention) is computed
    for all chunks at once; only the three state products run chunk by chunk. A tail shorter than c is padded with
    k = v = beta = g = 0 tokens, which leave the state and the real outputs unchanged.
    """
    T, h = q.shape[0], q.shape[1]
    c = min(chunk_size, T)
    n = -(-T // c)
    pad = n * c - T

    def chunks(x: torch.Tensor) -> torch.Tensor:  # [T, h, ...] -> [h, n, c, ...] float32
        x = x.float()
        if pad:
            x = torch.cat([x, x.new_zeros(pad, *x.shape[1:])])
        return x.reshape(n, c, *x.shape[1:]).movedim(2, 0)

    q, k, v, g, beta = chunks(q), chunks(k), chunks(v), chunks(g), chunks(beta)  # [h, n, c(, d)]
    state = state.float()
    lower = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
    G = g.cumsum(-1)  # [h, n, c]
    decay = (G[..., :, None] - G[..., None, :]).masked_fill(~lower, float("-inf")).exp()  # [h, n, c, c]
    A = (beta[..., :, None] * (k @ k.transpose(-1, -2)) * decay).tril(-1)  # strictly lower
    eye = torch.eye(c, dtype=A.dtype, device=A.device)
    # M^-1 once (c right-hand sides), then two products: a batched triangular solve costs in proportion to its
    # right-hand sides, and [v | k] has dv + dk of them (58 ms of a 64-prompt prefill on the H200 solving for those)
    Minv = torch.linalg.solve_triangular(A + eye, eye.expand_as(A), upper=False, unitriangular=True)
    W = Minv @ (beta[..., None] * v)  # [h, n, c, dv]
    Y = Minv @ ((beta * G.exp())[..., None] * k)  # [h, n, c, dk]: u = W - Y S0
    attn = (q @ k.transpose(-1, -2)) * decay  # [h, n, c, c], lower incl. diagonal
    qG = q * G.exp()[..., None]  # [h, n, c, dk]
    kT = (k * (G[..., -1:] - G).exp()[..., None]).transpose(-1, -2)  # [h, n, dk, c], e^{G_c - G_j} k_j
    last = G[..., -1].exp()[..., None, None]  # [h, n, 1, 1]
    outs = []
    keep = {int(i) for i in entering or ()}
    if any(not 0 <= i < n for i in keep):
        raise ValueError(f"entering {sorted(keep)}: {T} tokens make chunks 0..{n - 1} of {c}")
    kept = {}
    for i, (Wi, Yi, ai, qi, ki, li) in enumerate(zip(*(x.unbind(1) for x in (W, Y, attn, qG, kT, last)), strict=True)):
        if i in keep:
            kept[i] = state
        u = torch.baddbmm(Wi, Yi, state, alpha=-1.0)  # [h, c, dv] = W - Y S  (fused: an eager step is ~5 launches)
        outs.append(torch.baddbmm(torch.bmm(qi, state), ai, u))  # qG S + attn u
        state = torch.baddbmm(li * state, ki, u)  # e^{G_c} S + kT u
    o = torch.stack(outs, dim=1).reshape(h, n * c, v.shape[-1])[:, :T]
    if entering is None:
        return o.transpose(0, 1), state  # [T, h, dv], [h, dk, dv]
    saved = torch.stack([kept[int(i)] for i in entering]) if len(entering) else state.new_zeros(0, *state.shape)
    return o.transpose(0, 1), state, saved


def state_pass_ref(
    k: torch.Tensor,  # [N, H, dk]
    w: torch.Tensor,  # [N, HV, dk]
    u: torch.Tensor,  # [N, HV, dv]
    g: torch.Tensor,  # [N, HV] float32 log2 decays, cumulated within each chunk
    pool: torch.Tensor,  # [slots, HV, dk, dv] updated in place
    slots: torch.Tensor,  # [S]
    fresh: torch.Tensor,  # [S] bool
    cu_seqlens: torch.Tensor,  # [S + 1]
    chunk_offsets: torch.Tensor,  # [S + 1]
    chunk_rows: int,
    chunk: int = 64,
    save_slot: torch.Tensor | None = None,  # [chunk_rows] slot receiving the state entering each row (0: none)
    final_slot: torch.Tensor | None = None,  # [S] slot receiving each sequence's final state too (0: none)
) -> tuple[torch.Tensor, torch.Tensor]:
    """``state_pass.state_pass_``, chunk by chunk in float32: h [chunk_rows, HV, dk, dv] (rows no chunk uses are
    zero) and v_new [N, HV, dv]; each sequence's final state written to ``pool[slots[s]]`` in the pool's dtype, and
    the saves as the kernel stores them (``pool[save_slot[row]] = h[row]``, ``pool[final_slot[s]]`` = the final state,
    where nonzero)."""
    HV, rep = u.shape[1], u.shape[1] // k.shape[1]
    h = torch.zeros(chunk_rows, HV, k.shape[2], u.shape[2], dtype=torch.float32, device=k.device)
    v_new = torch.zeros(u.shape, dtype=torch.float32, device=u.device)
    kf, wf, uf, gf = (x.float() for x in (k.repeat_interleave(rep, dim=1), w, u, g))
    cu, offs = cu_seqlens.tolist(), chunk_offsets.tolist()
    saves = [0] * chunk_rows if save_slot is None else save_slot.tolist()
    finals = [0] * len(slots) if final_slot is None else final_slot.tolist()
    for s, slot in enumerate(slots.tolist()):
        state = torch.zeros_like(h[0]) if bool(fresh[s]) else pool[slot].float()  # [HV, dk, dv]
        for c, a in enumerate(range(cu[s], cu[s + 1], chunk)):
            b = min(a + chunk, cu[s + 1])
            h[offs[s] + c] = state
            if saves[offs[s] + c]:
                pool[saves[offs[s] + c]] = state.to(pool.dtype)
            vn = uf[a:b] - torch.einsum("thk,hkv->thv", wf[a:b], state)  # [t, HV, dv]
            v_new[a:b] = vn
            g_last = gf[b - 1]  # [HV]
            gated = vn * torch.exp2(g_last - gf[a:b])[..., None]
            state = torch.exp2(g_last)[:, None, None] * state + torch.einsum("thk,thv->hkv", kf[a:b], gated)
        pool[slot] = state.to(pool.dtype)
        if finals[s]:
            pool[finals[s]] = state.to(pool.dtype)
    return h.to(k.dtype), v_new.to(u.dtype)
