"""The resident-row Triton kernels against their torch references (and a plain-Python reading of the spec).

On a machine without CUDA the kernels run in Triton's interpreter (TRITON_INTERPRET=1, set here before the kernels
are imported unless the environment already says otherwise); with CUDA and no TRITON_INTERPRET they run compiled on
the GPU, and the ``gpu`` test also replays them inside a captured CUDA graph.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kernels import (  # noqa: E402  (after TRITON_INTERPRET is settled)
    commit_lengths,
    commit_lengths_ref,
    gather_rows,
    gather_rows_ref,
    scatter_cells,
    scatter_cells_ref,
)
from resplan.buffers import StepBuffers  # noqa: E402
from resplan.executor import gather_targets, row_columns  # noqa: E402
from resplan.layout import SAMPLER_CELLS, KVPool, RowLayout, StreamMode  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
DEVICE = "cpu" if INTERPRET or not torch.cuda.is_available() else "cuda"
POISON = -7
SEEDS = (0, 1, 2)

LAYOUTS = {
    # one APPEND pool + positions + recurrent slot + sampler (Qwen3.5-like hybrid)
    "qwen35": RowLayout(
        pools=(KVPool("attn", page_size=4, num_pages=64, max_seq_len=40),),
        positions_pool="attn",
        recurrent=True,
        sampler=True,
    ),
    # APPEND self-attention pool + READ cross-attention pool + positions (Whisper-like)
    "whisper": RowLayout(
        pools=(
            KVPool("self", page_size=4, num_pages=64, max_seq_len=48),
            KVPool("cross", page_size=8, num_pages=32, max_seq_len=200, mode=StreamMode.READ),
        ),
        positions_pool="self",
        recurrent=False,
        sampler=False,
    ),
    # two APPEND pools (one of page size 1, span capped by its pool) + positions + sampler
    "two_append": RowLayout(
        pools=(
            KVPool("full", page_size=4, num_pages=64, max_seq_len=64),
            KVPool("swa", page_size=1, num_pages=25, max_seq_len=100),
        ),
        positions_pool="full",
        recurrent=False,
        sampler=True,
    ),
    # the most pools one launch takes, a READ one among them, no narrow extras
    "four_pools": RowLayout(
        pools=(
            KVPool("a", page_size=2, num_pages=16, max_seq_len=16),
            KVPool("b", page_size=4, num_pages=16, max_seq_len=36, mode=StreamMode.READ),
            KVPool("c", page_size=8, num_pages=16, max_seq_len=64),
            KVPool("d", page_size=16, num_pages=64, max_seq_len=208),
        ),
        positions_pool=None,
        recurrent=False,
        sampler=False,
    ),
}


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randint(g: torch.Generator, lo: int, hi: int, shape) -> torch.Tensor:
    return torch.randint(lo, hi, tuple(shape), generator=g, dtype=torch.int64).to(torch.int32)


def make_case(layout: RowLayout, seed: int, n_slots: int = 13, b: int = 9, n_pad: int = 3):
    """A random store (row 0 all zero) and a slot row of b - n_pad distinct live slots and n_pad zeros, shuffled.

    The live rows' stored lengths cover, per pool: 0, a page boundary, a random length, the span's last token
    (W * ps - 1) and the full span (W * ps: for APPEND its write page lies past the span, so it reads page 0).
    """
    g = _gen(seed)
    store = _randint(g, 1, 2**20, (n_slots, layout.width))  # distinct-ish page ids: a wrong column shows
    if layout.positions_pool is not None:
        store[:, layout.pos_col] = _randint(g, -3, 500, (n_slots,))
    if layout.recurrent:
        store[:, layout.rec_col] = _randint(g, 0, 100, (n_slots,))
    if layout.sampler:
        store[:, layout.sampler_col : layout.sampler_col + len(SAMPLER_CELLS)] = _randint(
            g, -(2**31), 2**31 - 1, (n_slots, len(SAMPLER_CELLS))
        )
    live = (torch.randperm(n_slots - 1, generator=g)[: b - n_pad] + 1).to(torch.int32)
    slot_row = torch.cat([live, torch.zeros(n_pad, dtype=torch.int32)])[torch.randperm(b, generator=g)]
    for sp in layout.spans:
        cap_tokens = sp.width * sp.page_size
        special = [0, sp.page_size, (sp.width // 2) * sp.page_size, cap_tokens - 1, cap_tokens]
        rand = _randint(g, 0, cap_tokens + 1, (n_slots,)).tolist()
        lens = (special + rand)[: len(live)]
        perm = torch.randperm(len(live), generator=g).tolist()
        for i, s in enumerate(live.tolist()):
            store[s, layout.len_col(sp.pool)] = lens[perm[i]]
        # rows not gathered get random lengths too
        others = [s for s in range(1, n_slots) if s not in set(live.tolist())]
        for s in others:
            store[s, layout.len_col(sp.pool)] = rand[s]
    store[0] = 0
    return store.to(DEVICE), slot_row.to(DEVICE)


def poisoned(layout: RowLayout, b: int) -> StepBuffers:
    bufs = StepBuffers.allocate(layout, b, device=DEVICE)
    for t in bufs.tensors().values():
        t.fill_(POISON)
    return bufs


def spec_gather(store: torch.Tensor, slot_row: torch.Tensor, layout: RowLayout) -> dict[str, torch.Tensor]:
    """The gather spec read literally, one row and one cell at a time, in plain Python."""
    rows, out = store.cpu().tolist(), {}
    slots = slot_row.cpu().tolist()
    for p in layout.pools:
        sp, lc = layout.span(p.key), layout.len_col(p.key)
        ps, width, append = sp.page_size, sp.width, int(p.mode is StreamMode.APPEND)
        bt, sl, wl = [], [], []
        for s in slots:
            L = rows[s][lc]
            n_used = -(-(L + append) // ps)
            bt.append([rows[s][sp.start + j] if j < min(n_used, width) else 0 for j in range(width)])
            sl.append(L + append)
            page = rows[s][sp.start + L // ps] if L // ps < width else 0
            wl.append(page * ps + L % ps)
        out[f"block_table.{p.key}"] = bt
        out[f"seq_lens.{p.key}"] = sl
        if append:
            out[f"write_loc.{p.key}"] = wl
    if layout.positions_pool is not None:
        out["positions"] = [rows[s][layout.len_col(layout.positions_pool)] + rows[s][layout.pos_col] for s in slots]
    if layout.recurrent:
        out["recurrent_slots"] = [rows[s][layout.rec_col] for s in slots]
    if layout.sampler:
        out["sampler"] = [rows[s][layout.sampler_col : layout.sampler_col + len(SAMPLER_CELLS)] for s in slots]
    return {k: torch.tensor(v, dtype=torch.int32) for k, v in out.items()}


def assert_bufs_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], what: str) -> None:
    assert got.keys() == want.keys(), what
    for k in want:
        g, w = got[k].cpu(), want[k].cpu()
        assert torch.equal(g, w), f"{what}: {k} differs\n got  {g.tolist()}\n want {w.tolist()}"


def gather(store, slot_row, layout: RowLayout, bufs: StepBuffers, **kw) -> None:
    """The kernel over a layout's row and a bucket's buffers, described to it as the executor describes them."""
    gather_rows(store, slot_row, row_columns(layout), gather_targets(layout, bufs), **kw)


def gather_ref(store, slot_row, layout: RowLayout, bufs: StepBuffers) -> None:
    """The reference, called as ``gather``."""
    gather_rows_ref(store, slot_row, row_columns(layout), gather_targets(layout, bufs))


def append_len_cols(layout: RowLayout) -> tuple[int, ...]:
    return tuple(layout.len_col(p.key) for p in layout.append_pools)


# -- gather_rows --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("max_block_w", [1024, 8], ids=["one_block", "chunked"])
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("layout_id", list(LAYOUTS))
def test_gather_rows_matches_reference(layout_id: str, seed: int, max_block_w: int) -> None:
    layout = LAYOUTS[layout_id]
    store, slot_row = make_case(layout, seed)
    before = store.clone()
    b = slot_row.shape[0]

    want = poisoned(layout, b)
    gather_ref(store, slot_row, layout, want)
    assert_bufs_equal(want.tensors(), spec_gather(store, slot_row, layout), "reference vs spec")

    got = poisoned(layout, b)
    gather(store, slot_row, layout, got, max_block_w=max_block_w)
    assert_bufs_equal(got.tensors(), want.tensors(), "kernel vs reference")
    assert torch.equal(store, before), "gather must not write the store"


@pytest.mark.parametrize("layout_id", list(LAYOUTS))
def test_gather_rows_padding_reads_trash_row(layout_id: str) -> None:
    """All-padding bucket: block tables 0, APPEND seq_len 1 / write_loc 0, READ seq_len 0, narrow cells 0."""
    layout = LAYOUTS[layout_id]
    store, _ = make_case(layout, seed=5)
    slot_row = torch.zeros(4, dtype=torch.int32, device=DEVICE)
    got = poisoned(layout, 4)
    gather(store, slot_row, layout, got)
    for name, t in got.tensors().items():
        pool = name.split(".", 1)[1] if "." in name else None
        want = 1 if name.startswith("seq_lens.") and layout.pool(pool).mode is StreamMode.APPEND else 0
        assert bool((t == want).all()), f"{name}: {t.tolist()}"


# -- scatter_cells ------------------------------------------------------------------------------------------------
def make_staging(store: torch.Tensor, n: int, cap: int, seed: int,
                 low: int = -(2**31)) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """A staging buffer with n live entries (distinct flat indices off the trash row, values in [low, 2^31)) and
    stale entries after them."""
    g = _gen(seed + 100)
    row_w = store.shape[1]
    idx = torch.randperm(store.numel() - row_w, generator=g)[:cap] + row_w
    val = _randint(g, low, 2**31 - 1, (cap,))
    staging = torch.empty(2 + 2 * cap, dtype=torch.int32)
    staging[0], staging[1] = n, 12345
    staging[2::2], staging[3::2] = idx.to(torch.int32), val
    return staging.to(DEVICE), idx[:n]


@pytest.mark.parametrize(
    ("n", "cap", "max_block"),
    [(0, 6, 1024), (5, 12, 1024), (12, 12, 1024), (17, 40, 8), (40, 40, 16)],
    ids=["empty", "partial", "full", "partial_chunked", "full_chunked"],
)
@pytest.mark.parametrize("seed", SEEDS)
def test_scatter_cells_matches_reference(seed: int, n: int, cap: int, max_block: int) -> None:
    layout = LAYOUTS["whisper"]
    store, _ = make_case(layout, seed)
    staging, live_idx = make_staging(store, n, cap, seed)

    want_store, want_staging = store.clone(), staging.clone()
    scatter_cells_ref(want_store, want_staging)
    changed = (want_store != store).view(-1).nonzero().flatten().cpu()
    assert set(changed.tolist()) <= set(live_idx.tolist()), "reference wrote outside the live entries"

    got_staging = staging.clone()
    scatter_cells(store, got_staging, max_block=max_block)
    assert torch.equal(store, want_store)
    assert int(got_staging[0]) == 0, "count must be reset"
    assert torch.equal(got_staging[1:], staging[1:]), "only the count may change in the staging buffer"
    assert torch.equal(got_staging, want_staging)

    # a replay with no new upload scatters nothing
    again = store.clone()
    scatter_cells(store, got_staging, max_block=max_block)
    assert torch.equal(store, again)
    assert int(got_staging[0]) == 0


# -- commit_lengths -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("max_block", [1024, 4], ids=["one_block", "tiled"])
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("layout_id", list(LAYOUTS))
def test_commit_lengths_matches_reference(layout_id: str, seed: int, max_block: int) -> None:
    layout = LAYOUTS[layout_id]
    store, slot_row = make_case(layout, seed)
    cols = append_len_cols(layout)

    expected = store.clone()
    for s in slot_row.cpu().tolist():
        if s != 0:
            for c in cols:
                expected[s, c] += 1

    want = store.clone()
    commit_lengths_ref(want, slot_row, cols)
    assert torch.equal(want, expected), "reference vs spec"

    commit_lengths(store, slot_row, cols, max_block=max_block)
    assert torch.equal(store, expected), "kernel vs spec"
    assert bool((store[0] == 0).all()), "the trash row must stay zero"


# -- the three in a step's order ----------------------------------------------------------------------------------
@pytest.mark.parametrize("layout_id", list(LAYOUTS))
def test_step_cycle_matches_reference(layout_id: str) -> None:
    """scatter -> gather -> commit -> gather again, kernels against references on twin stores."""
    layout = LAYOUTS[layout_id]
    store, slot_row = make_case(layout, seed=7)
    staging, _ = make_staging(store, 6, 8, seed=7, low=0)  # (a cell may be a stored length: never negative)
    store_ref, staging_ref = store.clone(), staging.clone()
    cols = append_len_cols(layout)
    b = slot_row.shape[0]
    for step in range(2):
        got, want = poisoned(layout, b), poisoned(layout, b)
        scatter_cells(store, staging)
        scatter_cells_ref(store_ref, staging_ref)
        gather(store, slot_row, layout, got)
        gather_ref(store_ref, slot_row, layout, want)
        commit_lengths(store, slot_row, cols)
        commit_lengths_ref(store_ref, slot_row, cols)
        assert_bufs_equal(got.tensors(), want.tensors(), f"step {step}")
        assert torch.equal(store, store_ref), f"step {step}: stores differ"


def test_wrappers_reject_bad_inputs() -> None:
    layout = LAYOUTS["qwen35"]
    store, slot_row = make_case(layout, seed=0)
    bufs = poisoned(layout, slot_row.shape[0])
    with pytest.raises(AssertionError):
        gather(store.long(), slot_row, layout, bufs)
    with pytest.raises(AssertionError):
        gather(store, slot_row[:-1], layout, bufs)
    with pytest.raises(AssertionError):
        gather(store[:, :-1].contiguous(), slot_row, layout, bufs)
    with pytest.raises(AssertionError):
        scatter_cells(store, torch.zeros(5, dtype=torch.int32, device=DEVICE))
    with pytest.raises(AssertionError):
        commit_lengths(store, slot_row.long(), append_len_cols(layout))


# -- CUDA graph ---------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs CUDA and compiled Triton")
@pytest.mark.parametrize("layout_id", list(LAYOUTS))
def test_step_in_cuda_graph(layout_id: str) -> None:
    """Capture scatter -> gather -> commit once; replays follow new uploads and new slot rows like the references."""
    layout = LAYOUTS[layout_id]
    store, slot_row = make_case(layout, seed=11)
    staging, _ = make_staging(store, 0, 8, seed=11)
    cols = append_len_cols(layout)
    b = slot_row.shape[0]
    bufs = poisoned(layout, b)
    gather(store, slot_row, layout, bufs)  # compile outside the capture
    scatter_cells(store, staging)
    commit_lengths(store, slot_row, cols)
    store_ref = store.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        scatter_cells(store, staging)
        gather(store, slot_row, layout, bufs)
        commit_lengths(store, slot_row, cols)
    torch.cuda.synchronize()
    assert torch.equal(store, store_ref), "capture must not run the kernels"
    for step in range(3):
        new_staging, _ = make_staging(store, 5, 8, seed=20 + step, low=0)
        staging.copy_(new_staging)
        _, new_slots = make_case(layout, seed=30 + step)
        slot_row.copy_(new_slots)
        staging_ref, want = staging.clone(), poisoned(layout, b)
        scatter_cells_ref(store_ref, staging_ref)
        gather_ref(store_ref, slot_row, layout, want)
        commit_lengths_ref(store_ref, slot_row, cols)
        for t in bufs.tensors().values():
            t.fill_(POISON)
        graph.replay()
        torch.cuda.synchronize()
        assert_bufs_equal(bufs.tensors(), want.tensors(), f"replay {step}")
        assert torch.equal(store, store_ref), f"replay {step}: stores differ"
        assert int(staging[0]) == 0
