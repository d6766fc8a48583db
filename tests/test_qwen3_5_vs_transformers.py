"""Qwen35Model against transformers' Qwen3_5ForCausalLM with the same seeded random weights (float32, CPU).

Tolerance: logits must agree to ATOL = RTOL = 1e-4 in float32 (observed max |diff| is ~2e-6 on logits of size ~1-10,
the rest being float reassociation: chunked vs recurrent delta rule, paged vs dense attention). Greedy tokens must be
equal. Our-vs-ours comparisons (chunked vs whole prefill, padded vs unpadded batch) use SELF_ATOL = 1e-5.

Weights: transformers' own init leaves the (1 + w) norms at exactly 1 and tiny projections, which would hide norm and
gating mistakes, so every parameter is redrawn (unit-scale projections, non-trivial norm weights, slow-enough GDN
decays that the recurrent state matters) before both models get the same state_dict.
"""

from __future__ import annotations

import copy
import math
import os

import attrs
import pytest
import torch

from kernels.choices import DEFAULT, KernelChoices
from models.qwen3_5 import KV_POOL, Qwen35Model, qwen3_5_0_8b, qwen3_5_2b, tiny
from resplan.buffers import StepBuffers
from resplan.layout import KVPool, RowLayout

transformers = pytest.importorskip("transformers")

ATOL = RTOL = 1e-4  # ours vs transformers, float32 logits
SELF_ATOL = 1e-5  # ours vs ours (chunking, batching), float32
PAGE_SIZE = 4  # small, so every request crosses several pages
NUM_PAGES = 48
NUM_SLOTS = 6
MAX_SEQ_LEN = 64
DECODE_STEPS = 16

TINY_TIED = attrs.evolve(tiny, name="tiny-tied", tie_word_embeddings=True)
TRITON_RUNS = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"
# decode paths: the plain-torch step, and the fused Triton step (compiled on CUDA, else Triton's interpreter)
DECODE_PATHS = [
    pytest.param(False, id="torch"),
    pytest.param(True, id="fused", marks=pytest.mark.skipif(not TRITON_RUNS, reason="needs TRITON_INTERPRET=1")),
]


def randomize_(model: torch.nn.Module, seed: int) -> None:
    """Redraw every parameter (seeded) so that each piece of the math moves the logits."""
    gen = torch.Generator().manual_seed(seed)
    randn = lambda shape: torch.randn(shape, generator=gen)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):  # decay rate exp(A_log) in [0.05, 2]: the state carries over many tokens
                p.copy_(torch.empty(p.shape).uniform_(0.05, 2.0, generator=gen).log())
            elif name.endswith("dt_bias"):
                p.copy_(0.5 * randn(p.shape))
            elif name.endswith("linear_attn.norm.weight"):  # plain weight, around 1
                p.copy_(1.0 + 0.3 * randn(p.shape))
            elif p.ndim == 1:  # (1 + w) norms: w around 0 but not 0
                p.copy_(0.3 * randn(p.shape))
            elif name.endswith("embed_tokens.weight"):
                p.copy_(randn(p.shape))
            else:  # projections and the conv kernel: unit-scale outputs
                p.copy_(randn(p.shape) / math.sqrt(p.shape[-1]))


def make_pair(cfg, seed: int = 0):
    """(transformers model, our model) with identical seeded weights, eval mode, float32."""
    torch.manual_seed(seed)
    hf = transformers.Qwen3_5ForCausalLM(cfg.to_hf()).eval()
    randomize_(hf, seed)
    ours = Qwen35Model(cfg).eval()
    ours.load_state_dict(hf.state_dict(), strict=True)
    return hf, ours


@pytest.fixture(scope="module")
def pair():
    return make_pair(tiny)


def prompt(length: int, seed: int) -> torch.Tensor:
    return torch.randint(0, tiny.vocab_size, (length,), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def hf_greedy(hf, ids: torch.Tensor, steps: int):
    """transformers step by step with its own cache: prompt logits [T, V], step logits [steps, V], tokens [steps]."""
    out = hf(ids[None], use_cache=True)
    cache, prompt_logits = out.past_key_values, out.logits[0]
    last, step_logits, tokens = prompt_logits[-1], [], []
    for _ in range(steps):
        tok = last.argmax()
        tokens.append(tok)
        last = hf(tok.view(1, 1), past_key_values=cache, use_cache=True).logits[0, -1]
        step_logits.append(last)
    return prompt_logits, torch.stack(step_logits), torch.stack(tokens)


# -- a tiny host-side planner: page allocator, requests, StepBuffers ------------------------------------------------


class PageAllocator:
    """Pages 1 .. n-1 in a seeded shuffled order (page 0 is the sink), so a request's pages are not contiguous."""

    def __init__(self, num_pages: int, seed: int) -> None:
        self.free = (torch.randperm(num_pages - 1, generator=torch.Generator().manual_seed(seed)) + 1).tolist()

    def take(self) -> int:
        return self.free.pop()


@attrs.define(eq=False)
class Request:
    ids: torch.Tensor  # prompt
    slot: int
    pages: list[int] = attrs.Factory(list)
    length: int = 0  # tokens stored in the KV pages

    def reserve(self, n_tokens: int, alloc: PageAllocator) -> None:
        """Grow the page list until it holds n_tokens."""
        while len(self.pages) * PAGE_SIZE < n_tokens:
            self.pages.append(alloc.take())


def layout() -> RowLayout:
    pool = KVPool(KV_POOL, page_size=PAGE_SIZE, num_pages=NUM_PAGES, max_seq_len=MAX_SEQ_LEN)
    return RowLayout(pools=(pool,), positions_pool=KV_POOL, recurrent=True, sampler=False)


def fill(bufs: StepBuffers, rows: list[Request | None]) -> None:
    """Write the step's rows into the static buffers in place (None = padding row: the trash row's values)."""
    bt, sl, wl = bufs.block_tables[KV_POOL], bufs.seq_lens[KV_POOL], bufs.write_loc[KV_POOL]
    bt.zero_()
    for r, req in enumerate(rows):
        if req is None:
            sl[r], wl[r], bufs.positions[r], bufs.recurrent_slots[r] = 1, 0, 0, 0
            continue
        L = req.length
        bt[r, : len(req.pages)] = torch.tensor(req.pages, dtype=torch.int32)
        sl[r] = L + 1
        wl[r] = req.pages[L // PAGE_SIZE] * PAGE_SIZE + L % PAGE_SIZE
        bufs.positions[r] = L
        bufs.recurrent_slots[r] = req.slot


def prefill_request(model: Qwen35Model, state, req: Request, alloc: PageAllocator) -> torch.Tensor:
    req.reserve(len(req.ids), alloc)
    logits = model.prefill(state, req.ids, req.pages, start=0, rec_slot=req.slot)
    req.length = len(req.ids)
    return logits


def decode_step(model, state, bufs, rows: list[Request | None], tokens: list[int], alloc,
                kc: KernelChoices = DEFAULT) -> torch.Tensor:  # fmt: skip
    """Reserve pages, fill the buffers, run one decode (its kernels as ``kc`` says); advances each real request by one
    token."""
    for req in rows:
        if req is not None:
            req.reserve(req.length + 1, alloc)
    fill(bufs, rows)
    logits = model.decode(state, torch.tensor(tokens, dtype=torch.int64), bufs, kc=kc)
    for req in rows:
        if req is not None:
            req.length += 1
    return logits


# -- (0) parameters line up with transformers ---------------------------------------------------------------------


@pytest.mark.parametrize("cfg", [tiny, TINY_TIED, qwen3_5_0_8b, qwen3_5_2b], ids=lambda c: c.name)
def test_state_dict_matches_transformers(cfg):
    with torch.device("meta"):
        hf = transformers.Qwen3_5ForCausalLM(cfg.to_hf())
        ours = Qwen35Model(cfg)
    want = {k: tuple(v.shape) for k, v in hf.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    assert got == want
    assert (ours.lm_head.weight is ours.model.embed_tokens.weight) == cfg.tie_word_embeddings


def test_to_hf_round_trips_the_shape():
    hf_cfg = qwen3_5_0_8b.to_hf()
    assert hf_cfg.layer_types == list(qwen3_5_0_8b.layer_types)
    assert hf_cfg.layer_types.count("full_attention") == 6
    assert hf_cfg.rope_parameters["partial_rotary_factor"] == 0.25
    assert qwen3_5_0_8b.rotary_dim == 64 == 2 * sum(qwen3_5_0_8b.mrope_section)
    assert set(tiny.layer_types) == {"linear_attention", "full_attention"}


# -- (a) prompt logits ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cfg", [tiny, TINY_TIED], ids=lambda c: c.name)
@pytest.mark.parametrize("length", [1, 7, 70], ids=lambda n: f"T={n}")
def test_prefill_logits_match_transformers(cfg, length):
    hf, ours = make_pair(cfg, seed=1)
    ids = prompt(length, seed=length)
    with torch.no_grad():
        want = hf(ids[None]).logits[0]  # [T, V]
    state = ours.allocate_state(NUM_PAGES, PAGE_SIZE, NUM_SLOTS, "cpu", torch.float32)
    req = Request(ids, slot=3)
    got = prefill_request(ours, state, req, PageAllocator(NUM_PAGES, seed=length))
    torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("offset", [5, 37], ids=lambda p: f"pos_offset={p}")
def test_prefill_pos_offset_matches_transformers_positions(pair, offset):
    hf, ours = pair
    ids = prompt(9, seed=offset)
    with torch.no_grad():
        want = hf(ids[None], position_ids=torch.arange(9)[None] + offset).logits[0]
    state = ours.allocate_state(NUM_PAGES, PAGE_SIZE, NUM_SLOTS, "cpu", torch.float32)
    got = ours.prefill(state, ids, [7, 3, 11], start=0, rec_slot=1, pos_offset=offset)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)


# -- (b) batched greedy decode through StepBuffers ------------------------------------------------------------------

PROMPT_LENS = (5, 10)  # two requests: they start on different pages and cross page boundaries at different steps


@pytest.fixture(scope="module")
def hf_reference(pair):
    hf, _ = pair
    return [hf_greedy(hf, prompt(n, seed=100 + i), DECODE_STEPS) for i, n in enumerate(PROMPT_LENS)]


# the torch path with the padding row first, between and last; the fused path (~22 s a case in the interpreter) with it
# between real rows, its padding otherwise covered by test_padding_rows_do_not_disturb_real_rows
@pytest.mark.parametrize("pad_row,fused", [pytest.param(r, False, id=f"pad=row{r}-torch") for r in (0, 1, 2)]
                         + [pytest.param(1, *DECODE_PATHS[1].values, id="pad=row1-fused", marks=DECODE_PATHS[1].marks)])
def test_batched_greedy_decode_matches_transformers(pair, hf_reference, pad_row, fused):
    _, ours = pair
    kc = KernelChoices(fused_decode=fused)
    alloc = PageAllocator(NUM_PAGES, seed=pad_row)
    state = ours.allocate_state(NUM_PAGES, PAGE_SIZE, NUM_SLOTS, "cpu", torch.float32)
    reqs = [Request(prompt(n, seed=100 + i), slot=NUM_SLOTS - 1 - i) for i, n in enumerate(PROMPT_LENS)]
    rows: list[Request | None] = list(reqs)
    rows.insert(pad_row, None)  # b = 3 with one padding row
    bufs = StepBuffers.allocate(layout(), size=3)

    last = []
    for req, (want_prompt, _, _) in zip(reqs, hf_reference, strict=True):
        got_prompt = prefill_request(ours, state, req, alloc)
        torch.testing.assert_close(got_prompt, want_prompt, atol=ATOL, rtol=RTOL)
        last.append(got_prompt[-1])

    got_logits, got_tokens = [[] for _ in reqs], [[] for _ in reqs]
    for _ in range(DECODE_STEPS):
        toks = [int(lg.argmax()) for lg in last]
        for i, t in enumerate(toks):
            got_tokens[i].append(t)
        row_tokens = [0 if req is None else toks[reqs.index(req)] for req in rows]
        logits = decode_step(ours, state, bufs, rows, row_tokens, alloc, kc)  # [3, V]
        assert torch.isfinite(logits).all()
        last = [logits[rows.index(req)] for req in reqs]
        for i in range(len(reqs)):
            got_logits[i].append(last[i])

    for i, (_, want_steps, want_tokens) in enumerate(hf_reference):
        assert got_tokens[i] == want_tokens.tolist(), f"request {i}: greedy tokens differ"
        torch.testing.assert_close(torch.stack(got_logits[i]), want_steps, atol=ATOL, rtol=RTOL)
        assert len(reqs[i].pages) > 1 + PROMPT_LENS[i] // PAGE_SIZE  # decode really crossed into new pages


# -- (c) chunked prefill == whole prefill ---------------------------------------------------------------------------

CHUNKINGS = [(13,), (3, 4, 6), (8, 5), (1,) * 13, (6, 1, 6)]


@pytest.mark.parametrize("chunks", CHUNKINGS[1:], ids=lambda c: "chunks=" + "+".join(map(str, c)))
def test_chunked_prefill_equals_whole_prefill(pair, chunks):
    _, ours = pair
    ids = prompt(sum(chunks), seed=7)
    pages = [9, 2, 30, 17]  # holds 16 tokens
    whole = ours.allocate_state(NUM_PAGES, PAGE_SIZE, NUM_SLOTS, "cpu", torch.float32)
    want = ours.prefill(whole, ids, pages, start=0, rec_slot=2)

    chunked = ours.allocate_state(NUM_PAGES, PAGE_SIZE, NUM_SLOTS, "cpu", torch.float32)
    got, start = [], 0
    for n in chunks:
        got.append(ours.prefill(chunked, ids[start : start + n], pages, start=start, rec_slot=2))
        start += n
    torch.testing.assert_close(torch.cat(got), want, atol=SELF_ATOL, rtol=SELF_ATOL)
    for name, t in whole.tensors().items():  # same KV pages, same conv and SSM state in the slot
        torch.testing.assert_close(chunked.tensors()[name], t, atol=SELF_ATOL, rtol=SELF_ATOL, msg=name)


def test_first_chunk_ignores_stale_slot_state(pair):
    """start == 0 runs from zero state even when the slot still holds a previous request's state."""
    _, ours = pair
    ids = prompt(6, seed=8)
    clean = ours.allocate_state(NUM_PAGES, PAGE_SIZE, NUM_SLOTS, "cpu", torch.float32)
    want = ours.prefill(clean, ids, [4, 5], start=0, rec_slot=1)
    dirty = ours.allocate_state(NUM_PAGES, PAGE_SIZE, NUM_SLOTS, "cpu", torch.float32)
    ours.prefill(dirty, prompt(11, seed=9), [6, 7, 8], start=0, rec_slot=1)  # leaves state in slot 1
    got = ours.prefill(dirty, ids, [4, 5], start=0, rec_slot=1)
    torch.testing.assert_close(got, want, atol=0, rtol=0)


# -- (d) padding rows do not disturb real rows ----------------------------------------------------------------------


@pytest.mark.parametrize("fused", DECODE_PATHS)
def test_padding_rows_do_not_disturb_real_rows(pair, fused):
    _, ours = pair
    kc = KernelChoices(fused_decode=fused)
    base = ours.allocate_state(NUM_PAGES, PAGE_SIZE, NUM_SLOTS, "cpu", torch.float32)
    reqs = [Request(prompt(n, seed=200 + i), slot=1 + 2 * i) for i, n in enumerate((6, 9))]
    prompt_alloc = PageAllocator(NUM_PAGES, seed=11)
    toks = [int(prefill_request(ours, base, r, prompt_alloc)[-1].argmax()) for r in reqs]

    # the same two requests decoded alone (b = 2) and among padding rows (b = 5), from identical copies of the state
    plain_reqs, padded_reqs = reqs, [attrs.evolve(r, pages=list(r.pages)) for r in reqs]
    plain, padded = base.clone(), base.clone()
    plain_bufs, padded_bufs = StepBuffers.allocate(layout(), size=2), StepBuffers.allocate(layout(), size=5)
    plain_alloc, padded_alloc = copy.deepcopy(prompt_alloc), copy.deepcopy(prompt_alloc)  # hand out pages alike
    for _ in range(5):
        a = decode_step(ours, plain, plain_bufs, plain_reqs, toks, plain_alloc, kc)  # [2, V]
        rows = [None, padded_reqs[0], None, None, padded_reqs[1]]
        b = decode_step(ours, padded, padded_bufs, rows, [0, toks[0], 0, 0, toks[1]], padded_alloc, kc)  # [5, V]
        assert torch.isfinite(b).all()
        torch.testing.assert_close(b[[1, 4]], a, atol=SELF_ATOL, rtol=SELF_ATOL)
        toks = [int(x) for x in a.argmax(-1)]

    # padding wrote only the sink page and the sink slot: everything else is the same in both runs
    for name, t in plain.tensors().items():
        torch.testing.assert_close(padded.tensors()[name][1:], t[1:], atol=SELF_ATOL, rtol=SELF_ATOL, msg=name)
    assert any(padded.tensors()[name][0].abs().sum() > 0 for name in padded.tensors())  # the sinks were written


# -- (e) several requests' chunks in one pass == one request at a time -----------------------------------------------


@pytest.mark.parametrize(
    "lens,starts",
    [((5, 13, 1), (0, 0, 0)), ((7, 3, 9, 2), (0, 6, 0, 11)), ((70, 4), (0, 0))],
    ids=["fresh", "continuations", "over-a-chunk"],
)
def test_prefill_batch_equals_one_at_a_time(pair, lens, starts):
    """Last-token logits, every KV page, every conv and SSM slot: prefill_batch == prefill per chunk. A chunk with
    start > 0 continues its request's state (written by an earlier chunk of the same prompt in both runs)."""
    from models.qwen3_5 import PrefillChunk

    _, ours = pair
    n_pages, ps = 64, PAGE_SIZE
    base = ours.allocate_state(n_pages, ps, NUM_SLOTS, "cpu", torch.float32)
    gen = torch.Generator().manual_seed(sum(lens))
    perm = (torch.randperm(n_pages - 3, generator=gen) + 1).tolist()  # the last two pages: the stale prefills
    chunks = []
    for r, (T, s) in enumerate(zip(lens, starts, strict=True)):
        ids = prompt(s + T, seed=300 + r)
        pages, perm = perm[: -(-(s + T) // ps)], perm[-(-(s + T) // ps) :]
        if s:  # the request's first s tokens, prefilled before (same in both runs)
            ours.prefill(base, ids[:s], pages, start=0, rec_slot=1 + r)
        else:  # a stale state in the slot, which a first chunk must ignore
            ours.prefill(base, prompt(6, seed=400 + r), [n_pages - 1, n_pages - 2], start=0, rec_slot=1 + r)
        chunks.append(PrefillChunk(ids[s:], pages, s, 1 + r))
    one, many = base.clone(), base.clone()
    want = torch.stack([ours.prefill(one, c.token_ids, c.pages, c.start, c.rec_slot)[-1] for c in chunks])
    got = ours.prefill_batch(many, chunks)
    torch.testing.assert_close(got, want, atol=SELF_ATOL, rtol=SELF_ATOL)
    for name, t in one.tensors().items():
        torch.testing.assert_close(many.tensors()[name][1:], t[1:], atol=SELF_ATOL, rtol=SELF_ATOL, msg=name)


def test_prefill_batch_refuses_two_chunks_of_one_request(pair):
    from models.qwen3_5 import PrefillChunk

    _, ours = pair
    state = ours.allocate_state(NUM_PAGES, PAGE_SIZE, NUM_SLOTS, "cpu", torch.float32)
    a = PrefillChunk(prompt(4, seed=1), [1], 0, 2)
    with pytest.raises(ValueError, match="one recurrent slot"):
        ours.prefill_batch(state, [a, attrs.evolve(a, pages=[2])])
