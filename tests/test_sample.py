"""kernels.sample (a sampled step's draw) against its torch reference on fresh random rows: vocabularies below the
head's length, of one tile and of several (ending inside a tile), every temperature / top-k / top-p regime, banned
stop ids, equal logits across tiles (the head's order among them by id), rows of -inf, a NaN, both output dtypes. The
reference against the engine's torch-op sampler (``topk``) where no head holds a tie. Without CUDA the kernels run in
Triton's interpreter (with the tile load both vocabulary kernels share, ``kernels.tiles.load_row_tile``); on a GPU
compiled; float32 logits (keyed scaled, 32 bits) and bf16 (keyed raw, 16 bits)."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kernels.sample import sample_rows, sample_rows_ref  # noqa: E402  (after TRITON_INTERPRET)
from kernels.sample.kernel import BLOCK, tiling  # noqa: E402
from kernels.sample.naive import scaled_logits  # noqa: E402
from models.engine.sampler import COLUMNS, Sampler  # noqa: E402
from resplan.layout import BANNED_STOPS, SamplerCell  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
DEVICE = "cpu" if INTERPRET or not torch.cuda.is_available() else "cuda"
DTYPES = [torch.float32, torch.bfloat16]  # (bf16 logits take the 16-bit keys)
pytestmark = [pytest.mark.gpu] if DEVICE == "cuda" else []


def _cells(g: torch.Generator, b: int, V: int, *, greedy_frac=0.25, ban_frac=0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(cells [b, 16] int32, positions [b] int64) with random regimes: temperature 0 (a quarter), 0.3-1.5; top-k off,
    1, small or above the head; top-p 1, 0.9, tiny; random seeds; ``ban_frac`` of the rows under their min_tokens with
    1-11 random stop ids."""
    cells = torch.full((b, len(SamplerCell)), -1, dtype=torch.int32)
    temp = torch.rand(b, generator=g) * 1.2 + 0.3
    temp[torch.rand(b, generator=g) < greedy_frac] = 0.0
    cells[:, SamplerCell.TEMPERATURE] = temp.view(torch.int32)
    top_p = torch.tensor([1.0, 0.9, 0.5, 1e-6])[torch.randint(0, 4, (b,), generator=g)]
    cells[:, SamplerCell.TOP_P] = top_p.view(torch.int32)
    top_k = torch.tensor([0, 1, 20, 300], dtype=torch.int32)
    cells[:, SamplerCell.TOP_K] = top_k[torch.randint(0, 4, (b,), generator=g)]
    cells[:, SamplerCell.SEED] = torch.randint(-(2**31), 2**31 - 1, (b,), generator=g, dtype=torch.int32)
    positions = torch.randint(0, 2**40, (b,), generator=g)
    banned = torch.rand(b, generator=g) < ban_frac
    cells[:, SamplerCell.MIN_POSITION] = torch.where(banned, (positions + 1).clamp(max=2**31 - 1), 0).int()
    positions = torch.where(banned, positions.clamp(max=2**31 - 2), positions)
    stops = torch.randint(0, V, (b, BANNED_STOPS), generator=g, dtype=torch.int32)
    count = torch.randint(1, BANNED_STOPS + 1, (b, 1), generator=g)  # (the engine packs a row's stop ids first)
    stops[torch.arange(BANNED_STOPS)[None, :] >= count] = -1
    cells[:, SamplerCell.STOP_0 :] = stops
    return cells, positions


def _draw(x, cells, positions, out_dtype=torch.int64, rows_a_launch=None, **kw):
    b, V = x.shape
    out = torch.full((b,), -7, dtype=out_dtype, device=x.device)
    head = torch.full((b, min(V, kw.get("candidates", 256))), -7, dtype=torch.int64, device=x.device)
    sample_rows(x, cells.to(x.device), positions.to(x.device), COLUMNS, out, head, rows_a_launch=rows_a_launch, **kw)
    return out.cpu().long(), head.cpu()


def _check(x, cells, positions, out_dtype=torch.int64, rows_a_launch=None, **kw):
    tokens, head = _draw(x, cells, positions, out_dtype, rows_a_launch, **kw)
    want_tokens, want_head = sample_rows_ref(x.cpu(), cells, positions, COLUMNS, kw.get("candidates", 256))
    assert torch.equal(head, want_head), (head != want_head).nonzero()[:5]
    assert torch.equal(tokens, want_tokens), (tokens, want_tokens)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("V", [7, 200, 256, 3000, 2 * BLOCK + 123])
def test_draws_equal_the_reference_on_random_rows(V, dtype):
    """Random logits (ties improbable in float32, frequent in bf16) in every sampling regime, stop ids banned in half
    the rows: the same head (ids, in order) and the same token as the reference; the rows drawn 4 a launch group
    (as a batch larger than the workspace is) where the vocabulary is 3000."""
    g = torch.Generator().manual_seed(V)
    b = 6
    x = (torch.randn(b, V, generator=g) * 4).to(dtype).to(DEVICE)
    cells, positions = _cells(g, b, V, ban_frac=0.5)
    _check(x, cells, positions, rows_a_launch=4 if V == 3000 else None)


def _kept_a_tile(x, cells, positions, K):
    """[b, tiles]: the keys each tile keeps for the row's select (``kernel``'s module doc, re-derived here on the
    scaled values, whose order is the keys'): those >= the K-th largest group maximum, at most K. The tail past V is
    -inf here (key 0 in the kernel: the two differ only where fewer than K groups hold a logit)."""
    b, V = x.shape
    block, tiles, groups = tiling(V, K)
    s = torch.full((b, tiles * block), float("-inf"))
    s[:, :V] = scaled_logits(x.cpu().float(), cells, positions, COLUMNS)
    gmax = s.view(b, tiles * groups, -1).amax(-1)
    low = gmax.topk(K, dim=-1).values[:, -1:] if gmax.shape[1] >= K else float("-inf")  # (too few groups: every key)
    return (s >= low).view(b, tiles, block).sum(-1).clamp(max=K)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("candidates, fast_slots", [(16, 48), (256, 16)])
def test_rows_whose_tiles_keep_more_than_the_fast_select_reads(candidates, fast_slots, dtype):
    """The row's select over the few slots a tile it reads where each tile kept few keys, and over every tile's K
    slots where one kept more (here 12 and 4 slots a tile of 4): with a head of 16, a batch holding rows of both kinds
    (some rows' heads clustered in one tile); with a head of 256, every row of the second. The same head and token as
    the reference."""
    V = 2 * BLOCK + 123
    g = torch.Generator().manual_seed(5 + candidates)
    b = 6
    x = torch.randn(b, V, generator=g) * 4
    x[:2, 100:140] += 40.0  # (two rows' heads in tile 0)
    x = x.to(dtype).to(DEVICE)
    cells, positions = _cells(g, b, V, ban_frac=0.5)
    kept = _kept_a_tile(x, cells, positions, candidates).amax(-1)  # [b]
    fast_w = fast_slots // 4
    assert (kept > fast_w).any() and ((kept <= fast_w).any() or candidates == 256), kept
    _check(x, cells, positions, candidates=candidates, fast_slots=fast_slots)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_equal_logits_across_tiles_order_the_head_by_id_and_int32_outputs(dtype):
    """Logits of a few distinct values (hundreds of copies of each, in every tile), -0.0 among them: the head is
    each value's ids in ascending order, as the reference's stable sort orders them; the token into an int32 buffer."""
    V = 2 * BLOCK + 5
    g = torch.Generator().manual_seed(1)
    x = (torch.randint(0, 6, (4, V), generator=g).float() - 3.0).to(dtype).to(DEVICE)
    x[:, ::7] = -0.0
    cells, positions = _cells(g, 4, V, greedy_frac=0.5)
    _check(x, cells, positions, out_dtype=torch.int32)


def test_rows_of_minus_inf_and_a_nan():
    """A row all -inf but one id (drawn at any temperature), a row all -inf (its head's first: id 0, as the
    reference), and a greedy row with a NaN (the largest, so drawn)."""
    V = BLOCK + 77
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4, V, generator=g)
    x[0] = float("-inf")
    x[0, V - 50] = 1.0  # (in the second tile)
    x[1] = float("-inf")
    x[2, 999] = float("nan")
    cells, positions = _cells(g, 4, V, greedy_frac=0.0)
    cells[2, SamplerCell.TEMPERATURE] = 0
    tokens, head = _draw(x.to(DEVICE), cells, positions)
    want_tokens, want_head = sample_rows_ref(x, cells, positions, COLUMNS)
    assert tokens[0] == V - 50 and tokens[2] == 999
    assert torch.equal(head[[0, 2]], want_head[[0, 2]]) and torch.equal(tokens[[0, 1, 2]], want_tokens[[0, 1, 2]])


def test_the_reference_draws_as_the_engines_torch_sampler():
    """Where no row's head holds equal logits (float32 normals), the reference and ``Sampler``'s torch ops (``topk``)
    draw the same tokens and heads: the kernel's semantics are the engine's."""
    V = 5000
    g = torch.Generator().manual_seed(3)
    x = torch.randn(16, V, generator=g) * 3
    cells, positions = _cells(g, 16, V, ban_frac=0.5)
    tokens, head = Sampler(V, "cpu").draw(x, cells, positions)
    want_tokens, want_head = sample_rows_ref(x, cells, positions, COLUMNS)
    assert torch.equal(head, want_head) and torch.equal(tokens, want_tokens)


def test_the_engines_sampler_on_the_kernel_draws_into_the_step_buffer_and_hands_its_head_to_draw():
    """``Sampler`` with the kernel chosen: a call writes the reference's tokens into the buffer it is given, and
    ``draw`` returns them with the head."""
    from kernels.choices import KernelChoices

    V = 3000
    g = torch.Generator().manual_seed(4)
    x = (torch.randn(5, V, generator=g) * 3).to(DEVICE)
    cells, positions = _cells(g, 5, V, ban_frac=0.5)
    cells, positions = cells.to(DEVICE), positions.to(DEVICE)
    sampler = Sampler(V, DEVICE, KernelChoices(sampler=True))
    want_tokens, want_head = sample_rows_ref(x.cpu(), cells.cpu(), positions.cpu(), COLUMNS)
    out = torch.full((5,), -7, dtype=torch.int64, device=DEVICE)
    assert sampler(x, cells, positions, out) is out and torch.equal(out.cpu(), want_tokens)
    tokens, head = sampler.draw(x, cells, positions)
    assert torch.equal(tokens.cpu(), want_tokens) and torch.equal(head.cpu(), want_head)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_the_rows_log_sum_exp_is_torchs(dtype):
    """``lse``: each row's log-sum-exp of its raw logits (no temperature, no bans) as torch.logsumexp of them in
    float32 (within float32 rounding: the kernel sums by tiles), a row all -inf but one, a row all -inf (-inf), a
    row with a NaN (NaN); the draw the same as without it."""
    V = BLOCK + 77  # (two tiles: the row's sum combines them)
    g = torch.Generator().manual_seed(6)
    x = torch.randn(4, V, generator=g) * 4
    x[1] = float("-inf")
    x[1, V - 3] = 2.0
    x[2] = float("-inf")
    x[3, 10] = float("nan")
    x = x.to(dtype)
    cells, positions = _cells(g, 4, V, ban_frac=0.5)
    lse = torch.full((4,), -7.0, device=DEVICE)
    out = torch.full((4,), -7, dtype=torch.int64, device=DEVICE)
    sample_rows(x.to(DEVICE), cells.to(DEVICE), positions.to(DEVICE), COLUMNS, out, lse=lse)
    want = torch.logsumexp(x.float(), -1)
    assert torch.allclose(lse.cpu(), want, rtol=1e-6, atol=1e-6, equal_nan=True), (lse, want)
    assert lse[2] == float("-inf") and torch.isnan(lse[3])
    assert torch.equal(out.cpu(), _draw(x.to(DEVICE), cells, positions)[0])
