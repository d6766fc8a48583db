"""The decode loop on the CPU: a tiny model with random weights serves a handful of requests in both planning arms
(resident: decode steps planned through resplan; host: every step's buffers rebuilt from the host streams), shows
that both produce the same tokens, and summarises what each arm did.

    python -m models.demo [--model qwen3_5-tiny] [--arms resident,host] [-c 4] [-n 12] [--order turns] ...

Every option is listed by --help. The same prompts, sampling settings and schedule go to both arms; the forward reads
the same static buffers in both, so the tokens must be identical, greedy or seeded.
"""

from __future__ import annotations

import argparse
import sys

import attrs

from kernels.runtime import interpreted
from models.cli import OneLineParser, budget_field, positive_int, seed, token_budget
from models.engine import (
    BESIDE_TOKEN_BUDGET,
    IN_STEP_TOKEN_BUDGET,
    MODELS,
    Engine,
    EngineConfig,
    EngineStats,
    InvalidRequest,
    Limits,
    Order,
    Planning,
    Request,
    StepOutput,
    build_adapter,
    validate,
)
from models.engine.adapters import model_context
from models.engine.compare import random_requests, run_arms
from models.layers.decode_attention import Backend


def _range(text: str) -> tuple[int, int]:
    """'8' or '4:24' -> (lo, hi), inclusive."""
    lo, _, hi = text.partition(":")
    a, b = int(lo), int(hi or lo)
    if a <= 0 or b < a:
        raise argparse.ArgumentTypeError(f"expected N or LO:HI with 0 < LO <= HI, got {text!r}")
    return a, b


class _CutToContext(tuple):
    """--gen-len's default (lo, hi): its top is cut to what the context leaves beside the longest prompt (16:40 in
    whisper-test's 64 tokens); a range the user gives is never cut, and refused if it does not fit."""

    def __str__(self) -> str:
        return f"{self[0]}:{self[1]}, its top cut to what the context leaves beside the longest prompt"


def _arms(text: str) -> tuple[Planning, ...]:
    try:
        arms = tuple(Planning(a.strip()) for a in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"arms are 'resident' and/or 'host', comma-separated; got {text!r}") from None
    if len(set(arms)) != len(arms):
        raise argparse.ArgumentTypeError(f"an arm is named twice in {text!r}")
    return arms


def parser() -> argparse.ArgumentParser:
    ap = OneLineParser(
        prog="python -m models.demo",
        description=__doc__,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ap.add_argument("--model", default="qwen3_5-tiny", choices=sorted(MODELS),
                    help="model to serve, random weights (the *-tiny / whisper-test ones are CPU-sized)")
    ap.add_argument("--arms", type=_arms, default="resident,host",
                    help="planning arms to run, comma-separated: resident (resplan) and/or host (rebuild each step)")
    ap.add_argument("-c", "--concurrency", type=positive_int, default=4, help="requests admitted at once (max running)")
    ap.add_argument("-n", "--requests", type=positive_int, default=12, help="number of requests")
    ap.add_argument("--prompt-len", type=_range, default="4:24", help="prompt tokens, N or LO:HI (drawn per request)")
    ap.add_argument("--gen-len", type=_range, default=_CutToContext((16, 48)),
                    help="max new tokens, N or LO:HI (drawn per request)")
    ap.add_argument("--page-size", type=positive_int, default=4, help="tokens a KV page holds")
    ap.add_argument("--num-pages", type=positive_int, default=None,
                    help="pages of each appended KV pool, sink page included (default: room for every running request "
                         "at full context; fewer forces offloads under KV pressure)")
    ap.add_argument("--max-seq-len", type=positive_int, default=None,
                    help="context per request: a prompt and its new tokens (default: 128, or the model's context if "
                         "that is shorter; more than the model's is refused)")
    ap.add_argument("--order", choices=[o.value for o in Order], default=Order.ARRIVAL.value,
                    help="decode order: arrival (rows run to completion) or turns (rows take turns, displacing slots)")
    ap.add_argument("--max-bucket", type=positive_int, default=None,
                    help="widest decode bucket, at most the concurrency; buckets are 1, 2, 4, 8, 16, 24, ... up to it "
                         "(default: concurrency). With -c above twice it, TURNS order displaces slots")
    ap.add_argument("--token-budget", type=token_budget, default="auto", metavar="auto|N",
                    help="prefill tokens per step: prompts longer than this prefill in chunks beside the running rows; "
                         f"auto (the default): the engine's, {BESIDE_TOKEN_BUDGET} where passes run beside the decode "
                         f"steps (CUDA), {IN_STEP_TOKEN_BUDGET} where they run in the step (a CPU)")
    ap.add_argument("--attention", choices=["torch", "triton"], default="torch",
                    help="decode attention: plain torch, or our plan-free split-KV Triton kernel (on a CPU it runs in "
                         "Triton's interpreter: set TRITON_INTERPRET=1)")
    ap.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=True,
                    help="resident arm: launch each decode step before reading the last one's tokens (the host arm "
                         "always reads them first: it builds the next step's inputs from them)")
    ap.add_argument("--row-check", action=argparse.BooleanOptionalAction, default=True,
                    help="after every resident decode step, compare every row it read with the host streams")
    ap.add_argument("--temperature", type=float, default=0.0, help="sampling temperature, 0 = greedy")
    ap.add_argument("--top-p", type=float, default=1.0, help="nucleus mass, in (0, 1]")
    ap.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens, 0 = off (at most 256)")
    ap.add_argument("--seed", type=seed, default=0, help="seed of the weights, the prompts and the sampling")
    ap.add_argument("--show", type=int, default=4, help="requests whose tokens are printed")
    ap.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True, help="tqdm progress bars")
    return ap


def config(args, context: int) -> EngineConfig:
    """The engine config the options ask for; ``context``: the model's."""
    return EngineConfig(
        max_running=args.concurrency,
        max_bucket=args.max_bucket,
        order=Order(args.order),
        page_size=args.page_size,
        num_pages=args.num_pages,
        max_seq_len=args.max_seq_len or min(128, context),
        row_check=args.row_check,
        attention=Backend(args.attention),
        **budget_field(args.token_budget),
    )


def progress(args, requests: list[Request]):
    """A per-arm tqdm bar over the tokens asked for (a request that stops early gives its remainder back)."""
    asked = {r.request_id: r.sampling.max_tokens for r in requests}
    total = sum(asked.values())

    def make(arm: Planning, engine: Engine):
        if not args.progress:
            return None
        from tqdm import tqdm

        bar = tqdm(total=total, desc=f"{arm.value:>8}", unit="tok", file=sys.stderr, dynamic_ncols=True)

        def on_step(out: StepOutput) -> None:  # a finished request gives back the tokens it did not use
            bar.update(out.tokens.size + sum(asked[r.request_id] - len(r.tokens) for r in out.finished))
            bar.set_postfix(steps=engine.stats.steps, refresh=False)
            if not engine.has_work():
                bar.close()

        return on_step

    return make


def summary(engines: dict[Planning, tuple[Engine, float]]) -> str:
    """One column per arm."""

    def rows(s: EngineStats, wall: float, e: Engine) -> list[tuple[str, str]]:
        d = max(s.decode_steps, 1)
        return [
            ("steps (decode / mixed / prefill)", f"{s.steps} ({s.decode_steps} / {s.mixed_steps} / {s.prefill_steps})"),
            ("decode rows run (+ padding)", f"{s.rows_decoded} (+{s.padded_rows})"),
            ("tokens generated", f"{s.tokens}"),
            ("prefill chunks", f"{s.prefill_chunks}"),
            ("rows written whole (new)", f"{s.rows_whole} ({s.new_rows})" if e.resident else "every row, every step"),
            ("crossings staged", f"{s.crossings}" if e.resident else "-"),
            ("displacements", f"{s.displacements}" if e.resident else "-"),
            ("H2D copies / decode step", f"{s.h2d_copies / d:.2f}"),
            ("H2D bytes / decode step", f"{s.h2d_bytes / d:.1f}"),
            ("decode steps with no planning H2D", f"{s.empty_flushes}" if e.resident else "0"),
            ("input-id copies", f"{s.ids_copies}" if e.resident else f"{s.decode_steps} (every decode step)"),
            ("overlapped steps (rows dropped)", f"{s.overlapped} ({s.discarded})" if e.config.overlap else "off"),
            ("planner us / decode step", f"{s.plan_ns / d / 1e3:.1f}"),
            ("early plans (used / dropped)", f"{s.early_steps} ({s.early_hits} / {s.early_drops})"
             if e.resident else "-"),
            ("offloads / reloads", f"{s.offloads} / {s.reloads}"),
            ("refused admits", f"{s.refused_admits}"),
            ("row check (steps, mismatches)",
             "-" if not e.resident else f"{s.row_checks}, {s.mismatches}" if e.config.row_check else "off"),
            ("wall s (tokens/s)", f"{wall:.2f} ({s.tokens / wall:.0f})"),
        ]

    cols = {arm: rows(e.stats, wall, e) for arm, (e, wall) in engines.items()}
    names = [name for name, _ in next(iter(cols.values()))]
    w0 = max(len(n) for n in names)
    widths = {arm: max(len(arm.value), *(len(v) for _, v in c)) for arm, c in cols.items()}
    lines = ["  ".join([" " * w0, *(arm.value.rjust(widths[arm]) for arm in cols)])]
    for i, name in enumerate(names):
        lines.append("  ".join([name.ljust(w0), *(cols[arm][i][1].rjust(widths[arm]) for arm in cols)]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    context = model_context(args.model)
    try:
        cfg = config(args, context)
    except ValueError as e:
        ap.error(str(e))
    if args.attention == "triton" and not interpreted():
        ap.error("--attention triton runs on the CPU in Triton's interpreter: TRITON_INTERPRET=1 python -m models.demo "
                 "--attention triton")
    if args.max_seq_len is not None and args.max_seq_len > context:
        ap.error(f"argument --max-seq-len: {args.max_seq_len} is longer than {args.model}'s context of {context}")
    if isinstance(args.gen_len, _CutToContext):  # the default range, its top cut to what the context leaves
        room = cfg.max_seq_len - args.prompt_len[1]
        if room < 1:
            ap.error(f"a prompt of {args.prompt_len[1]} tokens leaves no room for new ones in a context of "
                     f"{cfg.max_seq_len}: lower --prompt-len or raise --max-seq-len")  # fmt: skip
        args.gen_len = (min(16, room), min(48, room))
    if args.prompt_len[1] + args.gen_len[1] > cfg.max_seq_len:
        ap.error(f"a prompt of {args.prompt_len[1]} tokens and {args.gen_len[1]} new ones do not fit a context of "
                 f"{cfg.max_seq_len} (such a request would end at the context): lower --prompt-len or --gen-len, or "
                 "raise --max-seq-len")  # fmt: skip
    adapter = build_adapter(args.model, seed=args.seed)
    requests = random_requests(adapter, args.requests, args.prompt_len, args.gen_len, args.seed, args.temperature,
                               args.top_p, args.top_k)
    limits = Limits(adapter.name, adapter.vocab_size, cfg.max_seq_len)
    for r in requests:  # the engine would refuse these one by one; say so once, up front
        try:
            validate(r, limits)
        except InvalidRequest as e:
            ap.error(str(e))
    for arm in args.arms:  # and what an engine refuses at build (too few pages, an attention the model has not)
        try:
            Engine(adapter, attrs.evolve(cfg, planning=arm, overlap=args.overlap and arm is Planning.RESIDENT))
        except ValueError as e:
            ap.error(str(e))
    how = "greedy" if args.temperature == 0 else (
        f"temperature {args.temperature}, top-p {args.top_p}, top-k {args.top_k}, seeded")
    print(f"resplan demo: {args.model} (random weights, seed {args.seed}), {args.requests} requests, "
          f"c={args.concurrency}, prompts {args.prompt_len[0]}-{args.prompt_len[1]} tokens, "
          f"{args.gen_len[0]}-{args.gen_len[1]} new tokens, {how}", flush=True)
    runs = run_arms(adapter, cfg, requests, args.arms, make_on_step=progress(args, requests),
                    per_arm={Planning.RESIDENT: dict(overlap=args.overlap)})
    e0 = next(iter(runs.values())).engine
    print(f"order {e0.config.order.value}, buckets {e0.buckets}, page size {e0.config.page_size}, "
          f"pages {[p.num_pages for p in e0.admission.page_pools.values()]}, "
          f"token budget {e0.config.token_budget}, "
          f"attention {args.attention}")
    print(f"layout: {e0.layout.describe(2 * e0.buckets[-1] + 1)}")
    arms = list(runs)
    first = runs[arms[0]].tokens
    for i in range(min(args.show, len(requests))):
        toks = first[i]
        head = " ".join(str(t) for t in toks[:12]) + (" ..." if len(toks) > 12 else "")
        print(f"  {requests[i].request_id}: prompt {len(requests[i].prompt):3d}, {len(toks):3d} new: {head}")
    ok = True
    if len(arms) > 1:
        same = sum(all(runs[a].tokens[i] == first[i] for a in arms) for i in range(len(requests)))
        ok = same == len(requests)
        print(f"same tokens in {' and '.join(a.value for a in arms)}: {same}/{len(requests)} requests"
              + ("" if ok else "  <-- MISMATCH"))
    print(summary({arm: (r.engine, r.wall_s) for arm, r in runs.items()}))
    print("H2D per decode step: resident, the flush program and, when they changed, the input ids and their sources "
          "(a steady step: none); host, the bucket's buffers and the input ids (two copies).")
    mismatches = sum(r.engine.stats.mismatches for r in runs.values())
    return 0 if ok and mismatches == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
