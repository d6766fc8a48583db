"""The pure planner: ``plan(state, step, streams) -> (state', program)``, ``commit``, ``release``, ``mark_stale``.
Each returns a new state and leaves the one it was given as it was.

A row mirrors the host exactly when ``row_ok[handle]``. Between two resident steps the device advances every APPEND
length by one in the graph and the host advances its streams by the same rule, so an ok row needs only the cell of a
page its next token opens (a **crossing**: ``L % page_size == 0``). A row that is not ok (new, displaced earlier, or
stale after a host-planned step) is written whole from the streams. A step of ``tokens`` = k sub-steps (each
gathering the rows and committing +1 in the graph) needs the cell of the page any of its k tokens opens: with
k <= page_size at most one a row, at the first multiple of the page size in [L, L + k).
"""

from __future__ import annotations

import numpy as np

from resplan.layout import CELL_DTYPE, StreamMode
from resplan.records import FlushProgram, Step
from resplan.state import FREE, Ledger, PlanError, PlannerConfig, PlannerState, PoolConsts
from resplan.streams import HostStreams

_NO_CELLS = (np.zeros(0, CELL_DTYPE), np.zeros(0, CELL_DTYPE))


def plan(state: PlannerState, step: Step, streams: HostStreams) -> tuple[PlannerState, FlushProgram]:
    """Place the step's rows in slots and say what must move so the device rows mirror ``streams``."""
    cfg = state.cfg
    bi = cfg.bucket_index.get(step.bucket)
    if bi is None:
        raise PlanError(f"bucket {step.bucket} is not captured; captured buckets are {[b.size for b in cfg.buckets]}")
    if step.seq <= state.last_seq:
        raise PlanError(f"step seq {step.seq} is not after the last planned step {state.last_seq}")
    if step.seq <= state.committed_seq:  # its reads would count as committed: a release would free its slots at once
        raise PlanError(f"step seq {step.seq} is not after the committed step {state.committed_seq}")
    if state.committed_seq < state.prev_seq:
        raise PlanError(
            f"step {step.seq} planned while steps {state.prev_seq} and {state.last_seq} are both uncommitted; "
            "a plan is built only behind the commit of the step before the last"
        )
    if step.tokens != 1:
        _check_tokens(cfg, step)
    h = step.handles
    try:
        ok = state.ledger.row_ok[h]
    except IndexError:
        raise PlanError(f"a handle of step {step.seq} is outside [0, {cfg.capacity})") from None
    if ok.tobytes() == cfg.all_ok[h.size]:
        return _plan_steady(state, step, streams, bi)
    return _plan_general(state, step, streams, bi, ok)


def _check_tokens(cfg: PlannerConfig, step: Step) -> None:
    """A step runs 1 <= tokens <= page_size tokens a row: at most one page opens a row in it."""
    if step.tokens < 1:
        raise PlanError(f"step {step.seq} runs {step.tokens} tokens a row: a step runs at least one")
    ps = min((p.page_size for p in cfg.append_pools), default=step.tokens)
    if step.tokens > ps:
        raise PlanError(f"step {step.seq} runs {step.tokens} tokens a row, more than a page ({ps}): a row could open "
                        "two pages in it")  # fmt: skip


def _plan_steady(state: PlannerState, step: Step, streams: HostStreams, bi: int) -> tuple[PlannerState, FlushProgram]:
    """Every row mirrors the host: stage crossings, upload the slot row if it changed, advance the LRU clock."""
    cfg, h = state.cfg, step.handles
    slots = state.ledger.slot_of[h]
    staged_idx, staged_val, crossings = _crossings(cfg, streams, h, slots, step.tokens)
    slot_row, rows = _slot_row_if_changed(state, bi, slots, step)
    read = state.slot_read.copy()
    read[slots] = step.seq
    new = PlannerState(cfg, state.ledger, read, step.seq, state.last_seq, state.committed_seq, rows)
    if slot_row is None and crossings == 0:
        return new, FlushProgram(step.bucket, step.seq)
    return new, FlushProgram(
        step.bucket, step.seq, slot_row=slot_row, staged_idx=staged_idx, staged_val=staged_val, crossings=crossings
    )


def _slot_row_if_changed(
    state: PlannerState, bi: int, slots: np.ndarray, step: Step
) -> tuple[np.ndarray | None, tuple[bytes, ...]]:
    """(the bucket's new slot row, or None when it equals the one it last uploaded; the per-bucket record)."""
    key = slots.tobytes()
    rows = state.last_slot_rows
    if key == rows[bi]:
        return None, rows
    return _slot_row(slots, step), rows[:bi] + (key,) + rows[bi + 1 :]


def _slot_row(slots: np.ndarray, step: Step) -> np.ndarray:
    """The bucket's slot row: the rows' slots, then 0 (the trash row) for padding. Rows must be distinct."""
    _check_distinct(slots, step)
    row = np.zeros(step.bucket, CELL_DTYPE)
    row[: slots.size] = slots
    return row


def _check_distinct(values: np.ndarray, step: Step) -> None:
    """Raise naming a handle that appears twice in the step (distinct handles hold distinct slots)."""
    s = np.sort(values)
    if (s[1:] == s[:-1]).any():
        h = np.sort(step.handles)
        raise PlanError(f"handle {int(h[1:][h[1:] == h[:-1]][0])} appears twice in step {step.seq}")


def _crossings(
    cfg: PlannerConfig, streams: HostStreams, h: np.ndarray, slots: np.ndarray, tokens: int = 1
) -> tuple[np.ndarray, np.ndarray, int]:
    """Staged cells for rows one of whose next ``tokens`` tokens opens a page: store[slot, start + c] = pages[h, c],
    c = the page of the first multiple of the page size in [L, L + tokens) (tokens 1: L // ps where L % ps == 0)."""
    idx_parts, val_parts = [], []
    for p in cfg.append_pools:
        s = streams.kv[p.key]
        L = s.lengths[h]
        if tokens == 1:
            try:
                opens = p.opens_page[L]
            except IndexError:
                _check_span(p, h, L // p.page_size + 1)
                raise
        else:
            first = -(-L // p.page_size) * p.page_size  # [n] the first position at or after L that opens a page
            opens = first < L + tokens
            _check_span(p, h, np.where(opens, first // p.page_size + 1, 0))
        if opens.tobytes().find(1) < 0:
            continue
        at = opens.nonzero()[0]
        col = p.page_col[L[at]] if tokens == 1 else first[at] // p.page_size
        idx_parts.append(p.cell_base[slots[at]] + col)
        val_parts.append(s.pages[h[at], col])
    if not idx_parts:
        return *_NO_CELLS, 0
    if len(idx_parts) == 1:
        return idx_parts[0], val_parts[0].astype(CELL_DTYPE, copy=False), int(idx_parts[0].size)
    idx = np.concatenate(idx_parts)
    return idx, np.concatenate(val_parts).astype(CELL_DTYPE, copy=False), int(idx.size)


def _check_span(p: PoolConsts, handles: np.ndarray, n_pages: np.ndarray) -> None:
    """A stream may not hold more pages than its row's span (the pool bound makes this unreachable)."""
    over = n_pages > p.span_width
    if over.any():
        i = int(over.nonzero()[0][0])
        raise PlanError(
            f"request {int(handles[i])}: pool {p.key!r} stream needs {int(n_pages[i])} pages, "
            f"its row holds {p.span_width}"
        )


def _plan_general(
    state: PlannerState, step: Step, streams: HostStreams, bi: int, ok: np.ndarray
) -> tuple[PlannerState, FlushProgram]:
    """Some rows need a whole-row write; new ones take free slots first, then displace the least recently run."""
    cfg, h, seq, lg = state.cfg, step.handles, step.seq, state.ledger
    n = h.size
    slot_of = lg.slot_of.copy()
    row_ok = lg.row_ok.copy()
    owner = lg.slot_owner.copy()
    taken = lg.slot_taken.copy()
    read = state.slot_read.copy()
    epochs = [e.copy() for e in lg.slot_epoch]
    slots = slot_of[h]
    new_at = (slots == 0).nonzero()[0]
    k = new_at.size
    displaced = np.zeros(0, np.int32)
    taken_count = lg.taken_count
    if k:
        hn = h[new_at]
        _check_distinct(hn, step)
        free = ((owner == FREE) & (read <= state.committed_seq)).nonzero()[0]
        if free.size >= k:
            take = free[:k]
        else:
            victims = _victims(state, owner, read, taken, slots, k - free.size)
            displaced = owner[victims].copy()
            slot_of[displaced] = 0
            row_ok[displaced] = False
            take = np.concatenate([free, victims])
        owner[take] = hn
        slot_of[hn] = take
        taken[take] = taken_count + np.arange(k)
        taken_count += k
        slots[new_at] = take
    whole_at = (~ok).nonzero()[0]
    steady_at = ok.nonzero()[0]
    is_new = np.zeros(n, bool)
    is_new[new_at] = True
    runs = _whole_rows(cfg, streams, h[whole_at], slots[whole_at], is_new[whole_at], epochs, step.tokens)
    staged_idx, staged_val, crossings = _crossings(cfg, streams, h[steady_at], slots[steady_at], step.tokens)
    slot_row, rows = _slot_row_if_changed(state, bi, slots, step)
    row_ok[h] = True
    read[slots] = seq
    ledger = Ledger(owner, taken, tuple(epochs), slot_of, row_ok, taken_count)
    new = PlannerState(cfg, ledger, read, seq, state.last_seq, state.committed_seq, rows)
    program = FlushProgram(
        step.bucket,
        seq,
        slot_row,
        *runs,
        staged_idx=staged_idx,
        staged_val=staged_val,
        rows_whole=int(whole_at.size),
        new_rows=int(k),
        crossings=crossings,
        displaced=displaced,
    )
    return new, program


def _victims(
    state: PlannerState, owner: np.ndarray, read: np.ndarray, taken: np.ndarray, step_slots: np.ndarray, need: int
) -> np.ndarray:
    """The ``need`` least recently run held slots (by last plan seq, ties by take order) outside this step and
    outside any uncommitted step."""
    in_step = np.zeros(owner.size, bool)
    in_step[step_slots] = True  # slot 0 (new rows) marks the trash row, which is never held anyway
    cand = ((owner >= 0) & (read <= state.committed_seq) & ~in_step).nonzero()[0]
    if cand.size < need:
        raise PlanError(
            f"out of slots: {need} more needed, {cand.size} displaceable of {owner.size - 1}; a store of 2B+1 rows "
            "cannot run out unless two steps are uncommitted"
        )
    order = np.lexsort((taken[cand], read[cand]))
    return cand[order[:need]]


def _whole_rows(
    cfg: PlannerConfig,
    streams: HostStreams,
    h: np.ndarray,  # [k] handles written whole
    slots: np.ndarray,  # [k] their slots
    is_new: np.ndarray,  # [k] bool: took its slot this step (READ spans are written too)
    epochs: list[np.ndarray],  # per READ pool [S], updated in place (already a copy)
    tokens: int = 1,  # the tokens each row runs in the step: an APPEND span's pages cover them
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Runs (slot, first col, cells) for rows written whole: the narrow cells joined with the first span's used
    pages (an APPEND span's: through the step's last token), then one run per further written span; a run that starts
    where the last one ended joins it."""
    k = h.size
    if k == 0:
        return _NO_CELLS[0], _NO_CELLS[0], _NO_CELLS[0], _NO_CELLS[0]
    lay = cfg.layout
    narrow = np.zeros((k, lay.narrow), CELL_DTYPE)
    spans: list[tuple[PoolConsts, np.ndarray, np.ndarray]] = []  # pool, [k] pages used, [k] bool written
    read_i = 0
    for p in cfg.pools:
        s = streams.kv[p.key]
        L = s.lengths[h]
        narrow[:, p.len_col] = L
        used = -(-(L + tokens * (p.mode is StreamMode.APPEND)) // p.page_size)
        _check_span(p, h, used)
        if p.mode is StreamMode.READ:
            ep = s.epoch[h]
            write = is_new | (epochs[read_i][slots] != ep)
            epochs[read_i][slots[write]] = ep[write]
            read_i += 1
        else:
            write = np.ones(k, bool)
        spans.append((p, np.where(write, used, 0), write))
    if lay.pos_col is not None:
        narrow[:, lay.pos_col] = streams.pos_offset[h]
    if lay.rec_col is not None:
        narrow[:, lay.rec_col] = streams.recurrent_slot[h]
    if lay.sampler_col is not None:
        narrow[:, lay.sampler_col : lay.sampler_col + streams.sampler.shape[1]] = streams.sampler[h]
    # run 0 of each row: narrow cells + the first span's used pages (the first span starts where narrow ends)
    p0, used0, _ = spans[0]
    head = np.concatenate([narrow, _used_pages(streams, p0, h, used0)], axis=1)  # [k, narrow + max used]
    head_len = lay.narrow + used0
    run_slot, run_col, run_len = [slots], [np.zeros(k, np.int64)], [head_len]
    cells = [head[np.arange(head.shape[1]) < head_len[:, None]]]
    end = p0.span_start + used0  # [k] where each row's last run ends
    for p, used, write in spans[1:]:
        if (write & (used > 0) & (end == p.span_start)).any():
            return _whole_rows_joined(lay, streams, spans, narrow, h, slots)
        at = (used > 0).nonzero()[0]
        pages = _used_pages(streams, p, h[at], used[at])
        run_slot.append(slots[at])
        run_col.append(np.full(at.size, p.span_start, np.int64))
        run_len.append(used[at])
        cells.append(pages[np.arange(pages.shape[1]) < used[at][:, None]])
        end = np.where(used > 0, p.span_start + used, end)
    return (
        np.concatenate(run_slot).astype(CELL_DTYPE),
        np.concatenate(run_col).astype(CELL_DTYPE),
        np.concatenate(run_len).astype(CELL_DTYPE),
        np.concatenate(cells).astype(CELL_DTYPE, copy=False),
    )


def _used_pages(streams: HostStreams, p: PoolConsts, h: np.ndarray, used: np.ndarray) -> np.ndarray:
    """[k, max(used)] the first pages of each handle's stream (columns past a row's used count are junk)."""
    return streams.kv[p.key].pages[h, : int(used.max(initial=0))]


def _whole_rows_joined(lay, streams, spans, narrow, h, slots):
    """Row by row, for the rare layout where a full span runs straight into the next written one."""
    run_slot, run_col, run_len, cells = [], [], [], []
    for i in range(h.size):
        run_slot.append(int(slots[i]))
        run_col.append(0)
        run_len.append(lay.narrow)
        cells.append(narrow[i])
        end = lay.narrow
        for p, used, _ in spans:
            u = int(used[i])
            if u == 0:
                continue
            if p.span_start == end:
                run_len[-1] += u
            else:
                run_slot.append(int(slots[i]))
                run_col.append(p.span_start)
                run_len.append(u)
            cells.append(streams.kv[p.key].pages[h[i], :u])
            end = p.span_start + u
    return (
        np.asarray(run_slot, CELL_DTYPE),
        np.asarray(run_col, CELL_DTYPE),
        np.asarray(run_len, CELL_DTYPE),
        np.concatenate(cells).astype(CELL_DTYPE, copy=False),
    )


def commit(state: PlannerState, seq: int) -> PlannerState:
    """Step ``seq`` has run on the device: every slot last read at or before it stops cooling."""
    if seq <= state.committed_seq:
        return state
    st = state
    return PlannerState(st.cfg, st.ledger, st.slot_read, st.last_seq, st.prev_seq, seq, st.last_slot_rows)


def release(state: PlannerState, handles: int | np.ndarray) -> PlannerState:
    """Requests that left the device (finished, aborted, or offloaded: a reload is written whole) give their slots
    up; each cools until the commit of the last step that read it."""
    h = np.atleast_1d(np.asarray(handles))
    if h.size and (h.min() < 0 or h.max() >= state.cfg.capacity):
        raise PlanError(f"release: a handle is outside [0, {state.cfg.capacity})")
    lg = state.ledger
    slots = lg.slot_of[h]
    held = slots != 0
    if not held.any():
        return state
    owner = lg.slot_owner.copy()
    slot_of = lg.slot_of.copy()
    row_ok = lg.row_ok.copy()
    owner[slots[held]] = FREE
    slot_of[h] = 0
    row_ok[h] = False
    return _with_ledger(state, Ledger(owner, lg.slot_taken, lg.slot_epoch, slot_of, row_ok, lg.taken_count))


def mark_stale(state: PlannerState, handles: np.ndarray) -> PlannerState:
    """A host-planned (prefill, mixed or eager) step moved these rows: the next resident step writes them whole."""
    h = np.asarray(handles)
    if h.size == 0:
        return state
    if h.min() < 0 or h.max() >= state.cfg.capacity:
        raise PlanError(f"mark_stale: a handle is outside [0, {state.cfg.capacity})")
    lg = state.ledger
    if not lg.row_ok[h].any():
        return state
    row_ok = lg.row_ok.copy()
    row_ok[h] = False
    return _with_ledger(state, Ledger(lg.slot_owner, lg.slot_taken, lg.slot_epoch, lg.slot_of, row_ok, lg.taken_count))


def _with_ledger(st: PlannerState, ledger: Ledger) -> PlannerState:
    return PlannerState(st.cfg, ledger, st.slot_read, st.last_seq, st.prev_seq, st.committed_seq, st.last_slot_rows)
