"""Decode rows in the prefill pass (``PrefillPlacement.IN_PASS``): a mixed step is one forward, each decode row one
token of the pass at its stream's end. The engine gives the tokens it gives with a decode graph beside the pass, for
both models and both planning arms, synchronous and overlapped, greedy and sampled rows, with offloads under KV
pressure and with prefill graphs; the budget counts the rows' tokens, and a budget with no room beside them is
refused."""

from __future__ import annotations

import attrs
import pytest

from models.engine import Engine, EngineConfig, Planning, PrefillPlacement, build_adapter
from models.engine.compare import random_requests

IN_PASS = PrefillPlacement.IN_PASS


def _requests(adapter):
    """12 greedy requests and 6 sampled ones (temperature, top-p, top-k), varied prompts and outputs."""
    greedy = random_requests(adapter, 12, prompt_len=(3, 30), gen_len=(2, 14), seed=4)
    sampled = random_requests(adapter, 6, prompt_len=(3, 30), gen_len=(2, 14), seed=5, temperature=0.8, top_p=0.9,
                              top_k=20)  # fmt: skip
    return greedy + [attrs.evolve(r, request_id=f"s{i}") for i, r in enumerate(sampled)]


@pytest.mark.parametrize(
    "model,planning,overlap,num_pages,prefill_graphs",
    [
        ("qwen3_5-tiny", Planning.RESIDENT, True, None, 0),
        ("qwen3_5-tiny", Planning.RESIDENT, False, 20, 0),  # offloads under KV pressure
        ("qwen3_5-tiny", Planning.HOST, True, 20, 0),
        ("qwen3_5-tiny", Planning.RESIDENT, True, None, 3),  # passes padded to token buckets
        ("whisper-test", Planning.RESIDENT, True, 20, 0),
        ("whisper-test", Planning.HOST, False, None, 0),
    ],
)
def test_decode_rows_in_the_pass_give_the_tokens_of_a_decode_graph_beside_it(model, planning, overlap, num_pages,
                                                                            prefill_graphs):  # fmt: skip
    adapter = build_adapter(model, seed=0)
    reqs = _requests(adapter)
    base = EngineConfig(page_size=4, max_seq_len=64, max_running=4, token_budget=12, planning=planning,
                        overlap=overlap, num_pages=num_pages, prefill_graphs=prefill_graphs,
                        prefill_graph_tokens=16, row_check=planning is Planning.RESIDENT)  # fmt: skip
    beside = [r.tokens for r in Engine(adapter, base).run(reqs)]
    engine = Engine(adapter, attrs.evolve(base, prefill=IN_PASS))
    inside = [r.tokens for r in engine.run(reqs)]
    assert inside == beside
    st = engine.stats
    assert st.pass_rows > 0 and st.mismatches == 0
    assert num_pages is None or st.offloads > 0


def test_the_budget_counts_the_decode_rows_and_must_leave_room_beside_them():
    adapter = build_adapter("qwen3_5-tiny", seed=0)
    with pytest.raises(ValueError, match="leaves no prompt token"):
        EngineConfig(page_size=4, max_seq_len=64, max_running=4, token_budget=4, prefill=IN_PASS)
    engine = Engine(adapter, EngineConfig(page_size=4, max_seq_len=64, max_running=4, token_budget=12,
                                          prefill=IN_PASS, timing=False))  # fmt: skip
    sizes = []
    real = engine.prefill.run

    def run(chunks, requests, rows, row_ids, *rest):
        sizes.append(sum(c.n for c in chunks) + rows.size)
        return real(chunks, requests, rows, row_ids, *rest)

    engine.prefill.run = run
    engine.run(_requests(adapter))
    assert sizes and max(sizes) <= 12


@pytest.mark.parametrize("seed", [0, 6, 7, 20])  # mixed steps, refused admits and pre-plan drops (6, 20: offloads)
def test_decode_rows_in_the_pass_with_requests_arriving_between_steps(seed):
    """test_engine_admit's arrivals (refused admits, pre-plans dropped, pools checked after every step): the resident
    arm with its decode rows in the pass, overlapped, gives the host arm's results with every row checked."""
    from test_engine_admit import _arrivals, _serve

    cfg, reqs, arrive = _arrivals(seed)
    if cfg.token_budget is not None and cfg.token_budget <= cfg.widest_bucket:
        cfg = attrs.evolve(cfg, token_budget=cfg.widest_bucket + 3)
    _, host = _serve(attrs.evolve(cfg, planning=Planning.HOST), reqs, arrive)
    res, results = _serve(attrs.evolve(cfg, planning=Planning.RESIDENT, prefill=IN_PASS, overlap=True), reqs, arrive)
    assert [results[r.request_id] for r in reqs] == [host[r.request_id] for r in reqs]
    assert res.stats.pass_rows > 0 and res.stats.mismatches == 0, res.stats.first_mismatches
