"""The server's HTTP front end alone, on the CPU: ``models.server``'s app (the same routes, tokenizer, engine client,
uvicorn settings) over a stand-in engine core that gives every running request one token each ``--step-ms``, driven
by ``models.bench.traffic --url``. What it measures is the front end's own cost, which no GPU hides or adds to: its CPU
time a generated token (from its /metrics), and the latency it adds: ITL p50 over the stand-in's step, TTFT p50 over
one step.

    python -m models.bench.front_end --out /tmp/fe [--step-ms 2 --max-running 32 --requests 128 --gen 256]

With ``--slow-every K --slow-ms M`` every K-th step takes M ms, as a step beside a prefill pass does: the stand-in's
own ITL p50 stays one step, a point mass most gaps share, so the HTTP p50 shows how much the delivery spreads them
(the server's burst ITL p50 sits 0.5 ms above the engine's at the same mean: models/bench/results/README.md).

The stand-in (``PacedEngine``) is a process of its own behind the same ZMQ protocol (``engine_core.serve``): it admits
up to ``--max-running`` requests, sleeps until each step's deadline, then emits a random token id for each (the first
one step after it arrived) until the request's ``max_tokens``. Tokens are ids of a word vocabulary
(``make_checkpoint.word_tokenizer``), so every token decodes to text as a real vocabulary's do.
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import time
from pathlib import Path

import attrs
import numpy as np

from models.cli import OneLineParser, positive_int

VOCAB = 248_320  # Qwen3.5's: the word tokenizer's size, so the detokenizer looks up as many pieces as with a real one


@attrs.define
class _Finished:
    request_id: str
    finish_reason: object  # FinishReason


@attrs.define
class _Stats:
    steps: int = 0
    decode_steps: int = 0
    decode_ns: int = 0
    decode_beside_pass: int = 0
    prefix_hits: int = 0
    prefix_cached_tokens: int = 0
    prefill_passes: int = 0
    prefill_tokens: int = 0
    prefill_ns: int = 0


class PacedEngine:
    """What ``engine_core.serve`` drives (submit, abort, has_work, step, load, stats), with no model: a step sleeps
    until ``step_s`` after the last one (every ``slow_every``-th step ``slow_s``: a step beside a pass), then gives
    each running request one random token."""

    def __init__(self, vocab: int, max_running: int, step_s: float, seed: int = 0, slow_every: int = 0,
                 slow_s: float = 0.0) -> None:  # fmt: skip
        self.vocab, self.max_running, self.step_s = vocab, max_running, step_s
        self.slow_every, self.slow_s = slow_every, slow_s
        self.rng = np.random.default_rng(seed)
        self.waiting: collections.OrderedDict[str, int] = collections.OrderedDict()  # id -> max_tokens
        self.running: dict[str, list[int]] = {}  # id -> [tokens given, max_tokens]
        self.stats = _Stats()
        self.deadline = time.perf_counter()

    def submit(self, request) -> None:
        self.waiting[request.request_id] = request.sampling.max_tokens

    def abort(self, rid: str) -> None:
        self.waiting.pop(rid, None)
        self.running.pop(rid, None)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def load(self):
        from models.engine.requests import EngineLoad

        return EngineLoad(len(self.waiting), len(self.running), 0, 1)

    def step(self):
        from models.engine.requests import FinishReason, StepOutput

        while self.waiting and len(self.running) < self.max_running:
            rid, n = self.waiting.popitem(last=False)
            self.running[rid] = [0, n]
        now = time.perf_counter()
        slow = self.slow_every and (self.stats.steps + 1) % self.slow_every == 0
        self.deadline = max(self.deadline + (self.slow_s if slow else self.step_s), now)
        time.sleep(max(0.0, self.deadline - now))
        rids = list(self.running)
        finished = []
        for rid in rids:
            r = self.running[rid]
            r[0] += 1
            if r[0] == r[1]:
                del self.running[rid]
                finished.append(_Finished(rid, FinishReason.LENGTH))
        self.stats.steps += 1
        self.stats.decode_steps += 1
        self.stats.decode_ns += int(self.step_s * 1e9)
        tokens = self.rng.integers(6, self.vocab, len(rids))  # (ids 0-5: the specials and chat roles)
        return StepOutput(np.array(rids, dtype=object), tokens, tuple(finished))


def build_paced(spec, progress):
    """``engine_core.run_core``'s build for the stand-in: its settings are ``spec.choices``."""
    from models.server.engine_core import ServedModel

    c = spec.choices
    engine = PacedEngine(c["vocab"], c["max_running"], c["step_ms"] / 1e3, spec.seed, c["slow_every"],
                         c["slow_ms"] / 1e3)  # fmt: skip
    return engine, ServedModel("paced", c["vocab"], c["max_seq_len"], (0,), ("a stand-in engine core",), {})


def paced_main(spec, links, parent: int | None, context=None) -> None:
    """The stand-in engine process's body."""
    from models.server.engine_core import run_core

    run_core(build_paced, spec, links, parent, context)


def serve_front_end(tokenizer_dir: Path, port: int, step_ms: float, max_running: int, max_seq_len: int,
                    slow_every: int = 0, slow_ms: float = 0.0) -> None:  # fmt: skip
    """The server's front end over the stand-in, on 127.0.0.1:``port``; prints "ready" once it serves."""
    import uvicorn

    from models.engine.text import Tokenizer
    from models.server.app import ServerState, asgi_app
    from models.server.cli import raise_open_files_limit
    from models.server.client import EngineClient
    from models.server.engine_core import EngineSpec
    from models.server.heap import freeze_heap

    raise_open_files_limit()
    choices = dict(vocab=VOCAB, max_running=max_running, step_ms=step_ms, slow_every=slow_every, slow_ms=slow_ms,
                   max_seq_len=max_seq_len)  # fmt: skip
    spec = EngineSpec(None, choices=choices, burst_wait_ms=0.0)  # (no gathering: the stand-in's TTFT is one step)
    client = EngineClient(spec, engine_main=paced_main)
    client.start()
    state = ServerState(client, Tokenizer.from_pretrained(tokenizer_dir), "paced", 1 << 20)
    freeze_heap()
    server = uvicorn.Server(uvicorn.Config(asgi_app(state), host="127.0.0.1", port=port, log_level="warning"))
    print("ready", flush=True)
    try:
        server.run()
    finally:
        client.shutdown()


def parser() -> OneLineParser:
    ap = OneLineParser(prog="python -m models.bench.front_end", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--out", type=Path, required=True, help="folder for results.md and the traffic runs' reports")
    ap.add_argument("--step-ms", type=float, default=2.0, help="the stand-in's step (default 2 ms, the H200's decode "
                                                              "step at 32 rows of 0.8B)")  # fmt: skip
    ap.add_argument("--slow-every", type=int, default=0, help="every N-th step takes --slow-ms instead (a step beside "
                    "a pass: the stand-in's ITL p50 stays --step-ms, a point mass most gaps share, and any spread the "
                    "delivery adds moves the HTTP p50); default 0: none")  # fmt: skip
    ap.add_argument("--slow-ms", type=float, default=5.0, help="the slow steps' length (default 5 ms)")
    ap.add_argument("--max-running", type=positive_int, default=32, help="requests the stand-in runs at once")
    ap.add_argument("--requests", type=positive_int, default=128, help="requests a round, all sent at t=0")
    ap.add_argument("--gen", type=positive_int, default=256, help="tokens each request generates")
    ap.add_argument("--prompt", type=positive_int, default=512, help="tokens each prompt has")
    ap.add_argument("--rounds", type=positive_int, default=2, help="rounds")
    ap.add_argument("--client-procs", type=positive_int, default=1, help="client processes of the load generator")
    ap.add_argument("--text", action="store_true", help="prompts sent as text (traffic --prompt-text), which the front "
                                                       "end tokenizes; default token ids")  # fmt: skip
    ap.add_argument("--port", type=int, default=8011, help="the front end's port on 127.0.0.1")
    ap.add_argument("--serve", type=Path, default=None, help=argparse.SUPPRESS)  # (the front-end process itself)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    context = args.prompt + args.gen + 8
    if args.serve is not None:
        serve_front_end(args.serve, args.port, args.step_ms, args.max_running, context, args.slow_every, args.slow_ms)
        return 0
    from models.bench.make_checkpoint import word_tokenizer

    args.out.mkdir(parents=True, exist_ok=True)
    tok_dir = args.out / "tokenizer"
    if not (tok_dir / "tokenizer.json").exists():
        word_tokenizer(VOCAB).save_pretrained(tok_dir)
    log = open(args.out / "front_end.log", "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen([sys.executable, "-m", "models.bench.front_end", "--out", str(args.out), "--serve",
                             str(tok_dir), "--port", str(args.port), "--step-ms", str(args.step_ms), "--slow-every",
                             str(args.slow_every), "--slow-ms", str(args.slow_ms), "--max-running",
                             str(args.max_running), "--prompt", str(args.prompt), "--gen", str(args.gen)],
                            stdout=subprocess.PIPE, stderr=log, text=True)  # fmt: skip
    try:
        if not proc.stdout.readline().startswith("ready"):
            raise SystemExit(f"the front end did not start: see {args.out / 'front_end.log'}")
        cmd = [sys.executable, "-m", "models.bench.traffic", "--url", f"http://127.0.0.1:{args.port}", "--model",
               "qwen3_5-0.8b", "--num-requests", str(args.requests), "--rate", "inf", "--prompt-len",
               f"fixed:{args.prompt}", "--gen-len", f"fixed:{args.gen}", "--rounds", str(args.rounds),
               "--client-procs", str(args.client_procs), "--no-progress", "--out",
               str(args.out / "traffic"), *(["--prompt-text", str(tok_dir)] if args.text else [])]  # fmt: skip
        with open(args.out / "traffic.log", "w") as tlog:
            subprocess.run(cmd, stdout=tlog, stderr=subprocess.STDOUT, check=True)
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
    runs = json.loads((args.out / "traffic" / "results.json").read_text())["runs"]
    rows = ["| round | output tok/s | front-end CPU us/token | ITL p50 ms (step " f"{args.step_ms:g}) | "
            "TTFT p50 ms | intake ms (mean: a request's arrival at the server to its submission in the stand-in) | "
            "failed |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for i, r in enumerate(runs):
        rows.append(f"| {i} | {r['tokps']:.0f} | {r['front_cpu_us_token']:.1f} | {r['itl_p50_ms']:.2f} | "
                    f"{r['ttft_p50_ms']:.1f} | {r['engine_intake_ms']:.2f} | {r['failed']} |")  # fmt: skip
    slow = f", every {args.slow_every}th {args.slow_ms:g} ms" if args.slow_every else ""
    text = (f"# The front end over a stand-in engine ({args.max_running} running, a step each {args.step_ms:g} ms"
            f"{slow}{', prompts sent as text' if args.text else ''})"
            f"\n\nCommand: `python -m models.bench.front_end {' '.join(argv if argv is not None else sys.argv[1:])}`"
            "\n\n" + "\n".join(rows) + "\n")  # fmt: skip
    (args.out / "results.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
