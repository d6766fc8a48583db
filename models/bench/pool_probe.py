"""Where non-finite values enter an engine's pools: serve a workload, and after every step look at every KV page and
recurrent slot (and the decode attention's output rows) for NaN or inf; report the first step that left one, what
kind of step it was, and whose cells they are (the sink page or slot, a request's own, a free one).

    python -m models.bench.pool_probe --arms host,resident-xqa-sync,resident-triton-sync --num-requests 128 \\
        --max-running 32 --token-budget 2048

A debugging tool (it syncs and scans the pools after each step), not a benchmark. The workload and engine options
are the traffic benchmark's (``python -m models.bench.traffic --help``: every engine arm at every ``--prefill``
placement and ``--token-budget``, each probed in turn), all requests at t=0.
"""

from __future__ import annotations

import numpy as np
import torch

from models.bench.traffic import parser as traffic_parser
from models.bench.traffic import setup_run
from models.engine import Engine
from models.engine.adapters import build_adapter


def nonfinite(engine: Engine) -> dict:
    """Pages, slots and attention-output rows holding a NaN or inf now (syncs)."""
    state = engine.model_state
    pages = torch.zeros(state.kv[0].shape[0], dtype=torch.bool, device=state.kv[0].device)
    for kv in state.kv:
        pages |= ~torch.isfinite(kv).flatten(1).all(1)
    slots = torch.zeros(state.conv[0].shape[0], dtype=torch.bool, device=state.conv[0].device)
    for pool in (*state.conv, *state.ssm):
        slots |= ~torch.isfinite(pool).flatten(1).all(1)
    out = {}  # XQA and fa2 write into a static output: its rows hold the last layer's output of each row
    for b, attn in engine.graphs.attn.items():
        o = getattr(attn, "out", None)
        if o is not None and id(o) not in out:
            out[id(o)] = (b, torch.nonzero(~torch.isfinite(o).flatten(1).all(1)).flatten().tolist())
    return dict(pages=torch.nonzero(pages).flatten().tolist(), slots=torch.nonzero(slots).flatten().tolist(),
                out={b: rows for b, rows in out.values() if rows})


def owners(engine: Engine, pages: list[int], slots: list[int]) -> dict:
    """Who holds each page and slot: 'sink', 'free', or the handle and its status."""
    s = engine.streams.kv["kv"]
    held = engine.admission.n_pages["kv"]
    who = {}
    for p in pages:
        if p == 0:
            who[f"page {p}"] = "sink"
            continue
        hs = [h for h in range(held.size) if p in s.pages[h, : held[h]]]
        who[f"page {p}"] = f"handle {hs[0]} ({engine.scheduler.status[hs[0]]})" if hs else "free"
    for x in slots:
        hs = np.flatnonzero(engine.streams.recurrent_slot == x)
        who[f"slot {x}"] = "sink" if x == 0 else f"handle {hs[0]}" if hs.size else "free"
    return who


def probe(engine: Engine, requests: list) -> None:
    """Serve ``requests`` through the engine's interface, scanning the pools after every step (module doc)."""
    st = engine.stats
    for r in requests:
        engine.submit(r)
    step, first, ever_pages, ever_slots = 0, None, set(), set()
    results = []
    while engine.has_work():
        before = (st.decode_steps, st.mixed_steps, st.prefill_steps)
        rows = engine.scheduler.decode_rows().copy()
        results += engine.step().finished
        if engine.device.type == "cuda":
            torch.cuda.synchronize()
        kind = ("decode", "mixed", "prefill")[int(np.argmax([a - b for a, b in zip(
            (st.decode_steps, st.mixed_steps, st.prefill_steps), before, strict=True)]))]  # fmt: skip
        bad = nonfinite(engine)
        ever_pages |= set(bad["pages"])
        ever_slots |= set(bad["slots"])
        if first is None and (bad["pages"] or bad["slots"] or any(bad["out"].values())):
            first = step
            print(f"  first non-finite after step {step} ({kind}, {rows.size} decode rows): {bad}")
            print(f"  owners: {owners(engine, bad['pages'][:8], bad['slots'][:8])}")
        step += 1
    firsts = [r.tokens[0] for r in results]
    print(f"  {step} steps; pages ever non-finite: {sorted(ever_pages)[:16]} ({len(ever_pages)}); slots: "
          f"{sorted(ever_slots)[:16]} ({len(ever_slots)}); first tokens: {firsts[:8]} ...")


def parser():
    return traffic_parser("python -m models.bench.pool_probe", __doc__, run_options=False)


def main(argv: list[str] | None = None) -> None:
    ap = parser()
    args = ap.parse_args(argv)
    run = setup_run(ap, args)
    adapter = build_adapter(args.model, seed=0, device=run.device, dtype=run.dtype)
    reqs = run.rounds[0].requests(adapter.vocab_size, run.sampling, args.seed, "p-")
    for arm in run.arms:
        print(f"{arm.label}:", flush=True)
        try:
            eng = Engine(adapter, run.config(arm))
        except ValueError as e:
            ap.error(f"engine {arm.label}: {e}")
        probe(eng, reqs)
        del eng


if __name__ == "__main__":
    main()
