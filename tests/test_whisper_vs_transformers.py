"""Paged Whisper (models.whisper) against transformers' WhisperForConditionalGeneration, same random weights.

float32 on the CPU. The decode walk runs our ``decode`` on StepBuffers this file fills from a tiny page allocator
(shuffled page ids, so block tables are not contiguous; rows cross page boundaries; the cross context spans several
pages) and compares every step with transformers stepping its own cache, one request at a time. transformers is
imported inside fixtures, after collection: importing it probes for a package named ``kernels`` and so imports ours.
"""

from __future__ import annotations

import math

import attrs
import numpy as np
import pytest
import torch

from models.whisper import WhisperModel, tiny, whisper_large_v3, whisper_tiny
from resplan.buffers import StepBuffers
from resplan.layout import SINK_PAGE, RowLayout

CFG = tiny
STEPS = 16  # greedy decode steps after the prompt
# Logits reach |6|; our float32 paths differ from transformers' by <= 2e-6 (prompt: 0). A wrong position, a dropped
# or extra token, a misplaced K/V moves them by > 100 * ATOL (test_tolerance_sees_off_by_one_buffers checks that).
ATOL, RTOL = 5e-5, 1e-5
START = CFG.decoder_start_token_id
PROMPTS = {"A": [START, 3, 7], "B": [START, 11, 5, 9, 2]}  # different lengths: rows sit at different positions
SEEDS = {"A": 1, "B": 2}  # input-feature seeds


# -- weights and reference ---------------------------------------------------------------------------------------
def _randomize_(model: torch.nn.Module, seed: int) -> None:
    """O(1) random weights: transformers' init_std=0.02 gives near-flat logits and fragile greedy ties. Token
    embeddings get std 0.2, else the tied head mostly echoes the input token and the greedy walk repeats one token."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # a tied weight is listed once
            noise = torch.randn(p.shape, generator=g)
            if p.ndim == 1:
                p.copy_((1.0 if name.endswith("layer_norm.weight") else 0.0) + 0.1 * noise)
            elif "embed_tokens" in name:
                p.copy_(0.2 * noise)
            elif "embed_positions" in name:
                p.copy_(noise)
            else:
                p.copy_(noise / math.sqrt(p[0].numel()))  # 1 / sqrt(fan_in)


def _features(seed: int) -> torch.Tensor:
    return torch.randn(CFG.num_mel_bins, CFG.n_frames, generator=torch.Generator().manual_seed(100 + seed))  # [M, F]


@pytest.fixture(scope="module")
def hf():
    from transformers import WhisperForConditionalGeneration

    torch.manual_seed(0)
    model = WhisperForConditionalGeneration(CFG.to_hf(attn_implementation="eager")).eval()
    _randomize_(model, seed=0)
    return model


@pytest.fixture(scope="module")
def ours(hf) -> WhisperModel:
    model = WhisperModel(CFG).eval()
    model.load_state_dict(hf.state_dict(), strict=True)
    return model


@attrs.frozen(eq=False)
class Reference:
    prompt_logits: torch.Tensor  # [T, V]
    step_logits: torch.Tensor  # [STEPS, V]: logits of decode step i, fed tokens[i]
    tokens: list[int]  # STEPS + 1 greedy tokens: tokens[0] from the prompt, tokens[i + 1] from step i


@pytest.fixture(scope="module")
def reference(hf) -> dict[str, Reference]:
    """transformers, one request at a time: prompt forward, then STEPS greedy steps through its own KV cache."""
    from transformers.modeling_outputs import BaseModelOutput

    out: dict[str, Reference] = {}
    with torch.no_grad():
        for name, prompt in PROMPTS.items():
            enc = BaseModelOutput(last_hidden_state=hf.model.encoder(_features(SEEDS[name])[None]).last_hidden_state)
            o = hf(encoder_outputs=enc, decoder_input_ids=torch.tensor([prompt]), use_cache=True)
            prompt_logits, cache = o.logits[0], o.past_key_values
            tokens, steps = [int(prompt_logits[-1].argmax())], []
            for _ in range(STEPS):
                o = hf(encoder_outputs=enc, decoder_input_ids=torch.tensor([[tokens[-1]]]), past_key_values=cache)
                cache = o.past_key_values
                steps.append(o.logits[0, -1])
                tokens.append(int(o.logits[0, -1].argmax()))
            ref = Reference(prompt_logits, torch.stack(steps), tokens)
            # The walk must be worth comparing: varied tokens, and no near-tie that float noise could flip.
            assert len(set(tokens)) > 5, f"degenerate reference walk {tokens}"
            top2 = torch.cat([prompt_logits[-1:], ref.step_logits]).topk(2, dim=-1).values
            assert (top2[:, 0] - top2[:, 1]).min() > 10 * ATOL, "a greedy near-tie: pick another weight seed"
            out[name] = ref
    return out


# -- a tiny host side: page allocator, requests, buffer filling --------------------------------------------------
class Pages:
    """Pool pages 1 .. n-1 (0 is the sink) handed out in a seeded shuffled order."""

    def __init__(self, num_pages: int, seed: int) -> None:
        self.free = [int(p) for p in np.random.default_rng(seed).permutation(np.arange(1, num_pages))]

    def take(self, n: int) -> list[int]:
        assert len(self.free) >= n, "test pool too small"
        taken, self.free = self.free[:n], self.free[n:]
        return taken


@attrs.define
class Request:
    name: str
    cross_pages: list[int]
    cross_len: int
    self_pages: list[int]
    length: int  # self tokens stored


@attrs.frozen
class Case:
    self_ps: int
    cross_ps: int
    pad_row: int  # where the padding row sits in the bucket of 3


CASES = {
    "ps4-pad-last": Case(4, 4, 2),
    "self-ps3-cross-ps5-pad-first": Case(3, 5, 0),
    "self-ps4-cross-ps8-pad-middle": Case(4, 8, 1),
}


class Walk:
    """Our model's state, page allocators and a bucket's StepBuffers, driven like the host-planned arm would."""

    def __init__(self, model: WhisperModel, case: Case, num_pages: int = 40) -> None:
        self.model, self.case = model, case
        ps = {"self": case.self_ps, "cross": case.cross_ps}
        npages = {"self": num_pages, "cross": num_pages}
        specs = model.kv_pool_specs()
        self.layout = RowLayout(
            pools=tuple(s.layout_pool(ps[s.key], npages[s.key]) for s in specs),
            positions_pool="self",
            recurrent=False,
            sampler=False,
        )
        self.state = model.allocate_state(npages, ps)  # on the model's device
        self.device = model.proj_out.weight.device
        self.pages = {k: Pages(num_pages, seed=case.self_ps * 10 + case.cross_ps + (k == "cross")) for k in ps}

    def admit(self, name: str, chunks: tuple[int, ...] | None = None) -> tuple[Request, torch.Tensor]:
        """encode + prefill (in chunks of the given sizes): -> the request and its prompt logits [T, V]."""
        feats, prompt = _features(SEEDS[name]).to(self.device), torch.tensor(PROMPTS[name])
        cross_pages = self.pages["cross"].take(-(-CFG.max_source_positions // self.case.cross_ps))
        cross_len = self.model.encode(self.state, feats, cross_pages)
        T = len(prompt)
        req = Request(name, cross_pages, cross_len, self.pages["self"].take(-(-T // self.case.self_ps)), 0)
        logits = []
        for n in chunks or (T,):
            ids = prompt[req.length : req.length + n]
            logits.append(self.model.prefill(self.state, ids, req.self_pages, req.length, cross_pages, cross_len))
            req.length += n
        assert req.length == T
        return req, torch.cat(logits)

    def fill(self, bufs: StepBuffers, rows: list[Request | None]) -> None:
        """Write this step's buffers in place (their addresses are what a captured graph holds)."""
        ps = self.case.self_ps
        bt = {k: np.zeros(tuple(t.shape), np.int32) for k, t in bufs.block_tables.items()}
        lens = {k: np.zeros(bufs.size, np.int32) for k in bufs.seq_lens}
        loc, pos = np.zeros(bufs.size, np.int32), np.zeros(bufs.size, np.int32)
        for i, r in enumerate(rows):
            if r is None:  # padding: the trash row's reading
                lens["self"][i] = 1
                continue
            L = r.length
            if L // ps == len(r.self_pages):
                r.self_pages += self.pages["self"].take(1)
            bt["self"][i, : len(r.self_pages)] = r.self_pages
            bt["cross"][i, : len(r.cross_pages)] = r.cross_pages
            lens["self"][i], lens["cross"][i] = L + 1, r.cross_len
            loc[i] = r.self_pages[L // ps] * ps + L % ps
            pos[i] = L
        for k in bt:
            bufs.block_tables[k].copy_(torch.from_numpy(bt[k]))
            bufs.seq_lens[k].copy_(torch.from_numpy(lens[k]))
        bufs.write_loc["self"].copy_(torch.from_numpy(loc))
        bufs.positions.copy_(torch.from_numpy(pos))

    def step(self, bufs: StepBuffers, ids: torch.Tensor, rows: list[Request | None]) -> torch.Tensor:
        """One decode step of the bucket: ids [b] -> logits [b, V]; stored lengths advance."""
        self.fill(bufs, rows)
        logits = self.model.decode(self.state, ids, bufs)
        for r in rows:
            if r is not None:
                r.length += 1
        return logits


def _bucket(case: Case, reqs: list[Request]) -> list[Request | None]:
    rows: list[Request | None] = list(reqs)
    rows.insert(case.pad_row, None)
    return rows


def _walk(walk: Walk, rows: list[Request | None], first: dict[str, int]) -> dict[str, tuple[torch.Tensor, list[int]]]:
    """STEPS greedy decode steps of a bucket: -> per request (logits [STEPS, V], tokens fed then chosen)."""
    bufs = StepBuffers.allocate(walk.layout, len(rows))
    ids = torch.tensor([first[r.name] if r else 0 for r in rows])  # padding rows feed token 0
    logits = {r.name: [] for r in rows if r}
    tokens = {r.name: [first[r.name]] for r in rows if r}
    for _ in range(STEPS):
        out = walk.step(bufs, ids, rows)  # [b, V]
        assert torch.isfinite(out).all(), "a row (padding included) produced a non-finite logit"
        ids = out.argmax(-1)
        for i, r in enumerate(rows):
            if r is not None:
                logits[r.name].append(out[i])
                tokens[r.name].append(int(ids[i]))
    return {k: (torch.stack(logits[k]), tokens[k]) for k in logits}


# -- structure ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cfg", [tiny, whisper_tiny, whisper_large_v3], ids=["tiny", "whisper-tiny", "large-v3"])
def test_state_dict_matches_transformers(cfg):
    from transformers import WhisperForConditionalGeneration

    with torch.device("meta"):  # shapes only: large-v3 is 1.5 B parameters
        theirs = WhisperForConditionalGeneration(cfg.to_hf()).state_dict()
        mine = WhisperModel(cfg).state_dict()
    assert list(mine) == list(theirs)
    assert {k: tuple(v.shape) for k, v in mine.items()} == {k: tuple(v.shape) for k, v in theirs.items()}


def test_load_state_dict_strict_keeps_the_tie(hf, ours):
    assert ours.proj_out.weight is ours.model.decoder.embed_tokens.weight
    for k, v in hf.state_dict().items():
        torch.testing.assert_close(ours.state_dict()[k], v, rtol=0, atol=0, msg=k)


def test_pool_specs(ours):
    self_spec, cross_spec = ours.kv_pool_specs()
    assert (self_spec.key, self_spec.mode.value, cross_spec.key, cross_spec.mode.value) == (
        "self",
        "append",
        "cross",
        "read",
    )
    for s in (self_spec, cross_spec):
        assert (s.num_layers, s.n_kv_heads, s.head_dim) == (CFG.decoder_layers, CFG.decoder_attention_heads, 16)
    state = ours.allocate_state({"self": 5, "cross": 3}, {"self": 4, "cross": 8})
    assert [tuple(t.shape) for t in state["self"]] == [(5, 2, 4, 4, 16)] * CFG.decoder_layers
    assert [tuple(t.shape) for t in state["cross"]] == [(3, 2, 8, 4, 16)] * CFG.decoder_layers


# -- (a) encoder, cross K/V and prompt logits ----------------------------------------------------------------------
def test_cross_pool_holds_transformers_cross_kv(hf, ours):
    """encode's pages hold, token t at pages[t // ps] offset t % ps, what transformers caches for cross-attention."""
    walk = Walk(ours, CASES["self-ps3-cross-ps5-pad-first"])
    req, _ = walk.admit("A")
    with torch.no_grad():
        enc = hf.model.encoder(_features(SEEDS["A"])[None]).last_hidden_state[0]  # [S, d]
    assert req.cross_len == CFG.max_source_positions == enc.shape[0]
    t = torch.arange(req.cross_len)
    pages = torch.tensor(req.cross_pages)[t // 5]
    for layer, cache in zip(hf.model.decoder.layers, walk.state["cross"], strict=True):
        k, v = layer.encoder_attn.k_proj(enc), layer.encoder_attn.v_proj(enc)  # [S, d]
        torch.testing.assert_close(cache[pages, 0, t % 5].flatten(1), k, atol=ATOL, rtol=RTOL)
        torch.testing.assert_close(cache[pages, 1, t % 5].flatten(1), v, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("chunks", [None, (2, 3), (1, 1, 1, 1, 1)], ids=["one-chunk", "chunks-2-3", "token-by-token"])
def test_prompt_logits_match(ours, reference, chunks):
    walk = Walk(ours, CASES["ps4-pad-last"])
    _, logits = walk.admit("B", chunks)  # 5 tokens over pages of 4: the prompt already crosses a page
    torch.testing.assert_close(logits, reference["B"].prompt_logits, atol=ATOL, rtol=RTOL)


# -- (b) the decode walk -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_greedy_decode_walk_matches(ours, reference, case):
    walk = Walk(ours, case)
    reqs = [walk.admit(name)[0] for name in PROMPTS]
    cross_before = [t.clone() for t in walk.state["cross"]]
    got = _walk(walk, _bucket(case, reqs), {k: r.tokens[0] for k, r in reference.items()})
    for name, (logits, tokens) in got.items():
        torch.testing.assert_close(logits, reference[name].step_logits, atol=ATOL, rtol=RTOL, msg=name)
        assert tokens == reference[name].tokens, name
    for a, b in zip(walk.state["cross"], cross_before, strict=True):
        assert torch.equal(a, b), "the decode walk wrote the READ pool"
    assert all(r.length == len(PROMPTS[r.name]) + STEPS for r in reqs)
    assert any(len(r.self_pages) > 2 for r in reqs)  # the walk crossed pages


# -- (c) padding rows ----------------------------------------------------------------------------------------------
def test_padding_rows_do_not_disturb_real_rows(ours, reference):
    """The same walk with and without a padding row: real rows agree to float noise, tokens exactly."""
    case = CASES["self-ps4-cross-ps8-pad-middle"]
    first = {k: r.tokens[0] for k, r in reference.items()}
    with_pad, without = Walk(ours, case), Walk(ours, case)
    got_pad = _walk(with_pad, _bucket(case, [with_pad.admit(n)[0] for n in PROMPTS]), first)
    got_plain = _walk(without, [without.admit(n)[0] for n in PROMPTS], first)
    for name in PROMPTS:
        torch.testing.assert_close(got_pad[name][0], got_plain[name][0], atol=1e-5, rtol=1e-6, msg=name)
        assert got_pad[name][1] == got_plain[name][1], name


def test_padding_only_step_writes_only_the_sink(ours):
    """A bucket of padding rows (cross seq_len 0) gives finite logits and touches no page but the self sink."""
    walk = Walk(ours, CASES["ps4-pad-last"])
    for name in PROMPTS:
        walk.admit(name)
    before = {k: [t.clone() for t in v] for k, v in walk.state.items()}
    bufs = StepBuffers.allocate(walk.layout, 3)
    logits = walk.step(bufs, torch.tensor([0, 5, CFG.vocab_size - 1]), [None, None, None])
    assert torch.isfinite(logits).all()
    for key, caches in walk.state.items():
        for now, was in zip(caches, before[key], strict=True):
            assert torch.equal(now[SINK_PAGE + 1 :], was[SINK_PAGE + 1 :]), key
    assert all(torch.equal(a, b) for a, b in zip(walk.state["cross"], before["cross"], strict=True))


def test_prefill_without_cross_context_is_finite(ours):
    walk = Walk(ours, CASES["ps4-pad-last"])
    logits = ours.prefill(walk.state, torch.tensor(PROMPTS["B"]), walk.pages["self"].take(2), 0, [], 0)
    assert logits.shape == (len(PROMPTS["B"]), CFG.vocab_size) and torch.isfinite(logits).all()


# -- the tolerance has teeth ---------------------------------------------------------------------------------------
PERTURBATIONS = {
    "cross-len-minus-1": lambda b: b.seq_lens["cross"].sub_(1),
    "self-len-minus-1": lambda b: b.seq_lens["self"].sub_(1),
    "position-plus-1": lambda b: b.positions.add_(1),
    "write-loc-plus-1": lambda b: b.write_loc["self"].add_(1),
}


@pytest.mark.parametrize("perturb", list(PERTURBATIONS.values()), ids=list(PERTURBATIONS))
def test_tolerance_sees_off_by_one_buffers(ours, reference, perturb):
    """An off-by-one in any buffer moves the first step's logits far outside ATOL: the comparisons above can fail."""
    case = CASES["ps4-pad-last"]
    walk = Walk(ours, case)
    rows = _bucket(case, [walk.admit(n)[0] for n in PROMPTS])
    bufs = StepBuffers.allocate(walk.layout, len(rows))
    walk.fill(bufs, rows)
    perturb(bufs)
    ids = torch.tensor([reference[r.name].tokens[0] if r else 0 for r in rows])
    out = ours.decode(walk.state, ids, bufs)
    for i, r in enumerate(rows):
        if r is not None:
            assert (out[i] - reference[r.name].step_logits[0]).abs().max() > 100 * ATOL, r.name


# -- CUDA graph ----------------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_decode_replays_in_a_cuda_graph():
    """decode captured once replays the walk: same logits as eager decode on a twin state, step after step."""
    torch.manual_seed(0)
    model = WhisperModel(CFG).cuda().eval()
    _randomize_(model, seed=0)
    case = CASES["self-ps3-cross-ps5-pad-first"]
    eager_walk, graph_walk = Walk(model, case), Walk(model, case)
    rows_e = _bucket(case, [eager_walk.admit(n)[0] for n in PROMPTS])
    rows_g = _bucket(case, [graph_walk.admit(n)[0] for n in PROMPTS])
    bufs_e = StepBuffers.allocate(eager_walk.layout, 3, device="cuda")
    bufs_g = StepBuffers.allocate(graph_walk.layout, 3, device="cuda")
    ids_g = torch.zeros(3, dtype=torch.long, device="cuda")
    graph_walk.fill(bufs_g, rows_g)  # step 0's buffers: the warm-up writes step 0's slots, the first replay rewrites
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        model.decode(graph_walk.state, ids_g, bufs_g)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        logits_g = model.decode(graph_walk.state, ids_g, bufs_g)
    ids = torch.tensor([3, 0, 7], device="cuda")
    for _ in range(STEPS):
        want = eager_walk.step(bufs_e, ids, rows_e)
        graph_walk.fill(bufs_g, rows_g)
        ids_g.copy_(ids)
        graph.replay()
        for r in rows_g:
            if r is not None:
                r.length += 1
        torch.testing.assert_close(logits_g, want, atol=1e-5, rtol=1e-5)
        ids = want.argmax(-1)
