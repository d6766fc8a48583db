"""Debug row check: after a replay (and after the host advanced its streams by the same rule), compare every row
the step read and the trash row with the host streams. Off by default; it reads the store back, so it syncs."""

from __future__ import annotations

import attrs
import numpy as np
from beartype import beartype
from jaxtyping import Int32, Integer, jaxtyped

from resplan.buffers import StepBuffers
from resplan.layout import StreamMode
from resplan.state import PlannerState
from resplan.streams import HostStreams


@attrs.frozen
class Mismatch:
    """One cell that disagrees: which request (-1 for the trash row), which cell, device value, host value."""

    handle: int
    what: str
    device: int
    host: int


@jaxtyped(typechecker=beartype)  # a debug entry point, never on the step path: check its arguments
def row_check(
    store: Int32[np.ndarray, "S width"],  # read back after the replay
    state: PlannerState,
    handles: Integer[np.ndarray, " n"],  # the step's rows
    streams: HostStreams,  # host truth after the step (APPEND lengths already advanced)
    buffers: StepBuffers | None = None,  # the bucket's buffers, to check the write location the step used
) -> list[Mismatch]:
    """Mismatches between device rows and host streams: lengths, used block-table columns, narrow cells, write loc."""
    lay = state.cfg.layout
    out: list[Mismatch] = []
    if store[0].any():
        col = int(np.flatnonzero(store[0])[0])
        out.append(Mismatch(-1, f"trash row cell {col}", int(store[0, col]), 0))
    wl = None if buffers is None else {k: v.cpu().numpy() for k, v in buffers.write_loc.items()}
    for r, h in enumerate(np.asarray(handles).tolist()):
        slot = int(state.slot_of[h])
        if slot == 0:
            out.append(Mismatch(h, "slot", 0, -1))
            continue
        row = store[slot]
        for p in lay.pools:
            s = streams.kv[p.key]
            L = int(s.lengths[h])
            c = lay.len_col(p.key)
            if row[c] != L:
                out.append(Mismatch(h, f"{p.key}.len", int(row[c]), L))
            used = -(-L // p.page_size)
            sp = lay.span(p.key)
            dev = row[sp.start : sp.start + used]
            host = s.pages[h, :used]
            bad = np.flatnonzero(dev != host)
            if bad.size:
                j = int(bad[0])
                out.append(Mismatch(h, f"{p.key}.page[{j}]", int(dev[j]), int(host[j])))
            if wl is not None and p.mode is StreamMode.APPEND and L > 0:
                t = L - 1  # the token this step wrote
                want = int(s.pages[h, t // p.page_size]) * p.page_size + t % p.page_size
                if wl[p.key][r] != want:
                    out.append(Mismatch(h, f"{p.key}.write_loc", int(wl[p.key][r]), want))
        for name, col, arr in (
            ("pos_offset", lay.pos_col, streams.pos_offset),
            ("recurrent_slot", lay.rec_col, streams.recurrent_slot),
        ):
            if col is not None and row[col] != arr[h]:
                out.append(Mismatch(h, name, int(row[col]), int(arr[h])))
        if lay.sampler_col is not None:
            sc = lay.sampler_col
            dev = row[sc : sc + streams.sampler.shape[1]]
            bad = np.flatnonzero(dev != streams.sampler[h])
            if bad.size:
                j = int(bad[0])
                out.append(Mismatch(h, f"sampler[{j}]", int(dev[j]), int(streams.sampler[h, j])))
    return out
