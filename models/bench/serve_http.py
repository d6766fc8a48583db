"""The server against the engine it wraps, on the same traffic: ``python -m models.server`` on a checkpoint directory,
driven through HTTP by ``models.bench.traffic --url``, beside ``models.bench.traffic``'s in-process arm of the same
engine (``resident-triton-cache``: the server's default on CUDA, the prefix cache on) at the same concurrency, context
and placement.

    python -m models.bench.serve_http --model-dir /tmp/qwen3_5-0.8b --make qwen3_5-0.8b --out results/server-h200

Steps, each logged under ``--out``: (1) the checkpoint is written if ``--make`` names a shape and the directory has none
(``models.bench.make_checkpoint``); (2) the server starts (the seconds from its launch to "ready": the first start of a
machine compiles every kernel, later starts find them in the on-disk caches) and three requests, one after another,
measure the first TTFTs after ready (the client made before the first is timed); (3) each workload (``--workloads``:
poisson, burst, connections) runs round by round, each round of poisson and burst once through HTTP and once in-process
(a fresh ``traffic`` process of its own beside the idle server, on the same draw: ``--seed`` + the round), the two
alternating which goes first; connections through HTTP only; (4) the server is stopped by SIGTERM (its drain) and
started again, timed warm; (5) ``results.md`` compares them: output tok/s, TTFT p50 and ITL p50 through HTTP against
in-process (medians over rounds, and the round-paired ratio and differences, median [min-max]: a burst's TTFT p50 is
its queue for the slots and moves by tens of ms between rounds of either side), the TTFT paired request by request
(``per_request``: each request's difference, and how much of it is a fixed cost and how much grows with the wait;
every request's pair in ``{workload}-ttft-by-request.csv``),
the front end's CPU a generated token,
the engine's decode step, and what places the ITL p50: its 30th and 70th percentiles and the share of decode steps
beside a prefill pass. (Under a burst about half the decode steps run beside a pass, so the ITL p50 sits at the edge
of the decode-only steps' point mass: a few percent more steps beside a pass, as arrivals spread over tens of
milliseconds bring, move it by ~0.3 ms.)

Poisson and burst go out from one client process, so a burst reaches the server in request order, the order the
in-process arm takes it in: spread over several processes, its shares interleave as the processes' sends happen to
(measured on the CPU: the first 32 the engine took held 16 of the list's first 32), which is another burst whose
waves of slots hold other requests.

CPUs: the client processes run on the server's machine here, where clients elsewhere would not take its CPUs;
``--server-cpus`` and ``--client-cpus`` keep the two apart (the in-process arm runs on the server's).

Workloads: poisson (``--num-requests`` at ``--rate`` req/s), burst (``--num-requests`` at t=0), and connections
(``--connections`` streaming requests at t=0 with fixed lengths: every connection held until its tokens arrive).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from models.cli import OneLineParser, burst_wait_ms, positive_int

WORKLOADS = {  # name -> traffic options
    "poisson": lambda a: ["--num-requests", str(a.num_requests), "--rate", str(a.rate)],
    "burst": lambda a: ["--num-requests", str(a.num_requests), "--rate", "inf"],
    "connections": lambda a: ["--num-requests", str(a.connections), "--rate", "inf", "--prompt-len", "fixed:128",
                              "--gen-len", "fixed:64", "--warmup", "0"],
}  # fmt: skip


CONNECTION_PROCS = 4  # client processes holding the connections workload's streams (a thousand at once)


def parser() -> OneLineParser:
    from models.server.engine_core import BURST_WAIT_MS

    ap = OneLineParser(prog="python -m models.bench.serve_http", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--model-dir", type=Path, required=True, help="the checkpoint directory the server serves")
    ap.add_argument("--make", default=None, help="write a random-weight checkpoint of this shape there first, if it "
                                                 "has none (e.g. qwen3_5-0.8b)")  # fmt: skip
    ap.add_argument("--model", default="qwen3_5-0.8b", help="the in-process arm's model (the checkpoint's shape)")
    ap.add_argument("--workloads", default="poisson,burst,connections", help="comma-separated: poisson, burst, "
                                                                              "connections")  # fmt: skip
    ap.add_argument("--num-requests", type=positive_int, default=128, help="requests of poisson and burst")
    ap.add_argument("--rate", type=float, default=40.0, help="poisson's arrivals a second (default 40)")
    ap.add_argument("--connections", type=positive_int, default=1000, help="streams held at once (default 1000)")
    ap.add_argument("--max-running", type=positive_int, default=32, help="the engine's concurrency, both sides")
    ap.add_argument("--max-seq-len", type=positive_int, default=2048, help="the engine's context, both sides")
    ap.add_argument("--rounds", type=positive_int, default=3,
                    help="rounds of each workload, each its own draw (default 3); poisson's and burst's each run once "
                         "through HTTP and once in-process, an engine built for it (~15 s on the H200) beside the "
                         "idle server, so the GPU holds both")
    ap.add_argument("--seed", type=int, default=0, help="round r draws its traffic from seed + r (default 0)")
    ap.add_argument("--port", type=int, default=8000, help="the server's port (127.0.0.1)")
    ap.add_argument("--front-ends", type=positive_int, default=1,
                    help="the server's front-end processes (its --front-ends; default 1)")
    ap.add_argument("--burst-wait-ms", type=burst_wait_ms, default=None,
                    help="the server's --burst-wait-ms: an idle engine's wait for a pass's worth of requests "
                         f"before its first step (default: the server's, {BURST_WAIT_MS:g} ms)")  # fmt: skip
    ap.add_argument("--client-procs", type=positive_int, default=None,
                    help="client processes the HTTP requests are spread over (default: 1 for poisson and burst, "
                         "which then reach the server in request order, as the in-process arm takes them; 4 for "
                         "connections). Over several, a burst's shares interleave as the processes' sends do (one "
                         "starting 2 ms late sends its share after the others'): another burst, whose first waves "
                         "of slots hold other requests, its TTFT p50 and tok/s a few percent off either way")
    ap.add_argument("--server-cpus", type=cpu_set, default=None,
                    help="CPUs (e.g. 0-1,8-9) the server's processes and the in-process arm run on (default: any)")
    ap.add_argument("--client-cpus", type=cpu_set, default=None,
                    help="CPUs the HTTP client processes run on (default: any); apart from --server-cpus, as clients "
                         "on other machines would be")  # fmt: skip
    ap.add_argument("--prompt-text", action="store_true",
                    help="the HTTP side sends its prompts as text (traffic --prompt-text with the checkpoint "
                         "directory's tokenizer), which the server tokenizes; the in-process side takes the ids. With "
                         "the word-level tokenizer --make writes, the text encodes to the same ids but for special "
                         "tokens (3 of the 248,320 ids)")  # fmt: skip
    ap.add_argument("--out", type=Path, required=True, help="folder for the logs and results.md")
    return ap


def cpu_set(text: str) -> frozenset[int]:
    """A CPU list as taskset writes it ("0-3,8"), each CPU one this process may run on."""
    cpus = set()
    for part in text.split(","):
        lo, dash, hi = part.partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()) or int(hi or lo) < int(lo):
            raise argparse.ArgumentTypeError(f"{text!r} is not a CPU list such as 0-3,8")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    if not cpus <= os.sched_getaffinity(0):
        raise argparse.ArgumentTypeError(f"{text!r}: this process may run on CPUs {sorted(os.sched_getaffinity(0))}")
    return frozenset(cpus)


def pinned(cpus: frozenset[int] | None):
    """A Popen ``preexec_fn`` that keeps the child (and the processes it starts) on ``cpus``; None: no pinning."""
    return None if cpus is None else lambda: os.sched_setaffinity(0, cpus)


class ServerProcess:
    """``python -m models.server`` on 127.0.0.1, its output in a log file; ``ready_s``: launch to "ready"."""

    def __init__(self, args, log: Path) -> None:
        self.log = log
        self.f = open(log, "w")  # noqa: SIM115 (closed by stop)
        t0 = time.perf_counter()
        self.proc = subprocess.Popen([sys.executable, "-m", "models.server", "--model-dir", str(args.model_dir),
                                      "--port", str(args.port), "--max-running", str(args.max_running),
                                      "--max-seq-len", str(args.max_seq_len), "--front-ends", str(args.front_ends),
                                      *([] if args.burst_wait_ms is None else ["--burst-wait-ms",
                                                                               str(args.burst_wait_ms)]),
                                      "--no-progress"],
                                     stdout=subprocess.PIPE, stderr=self.f, text=True,
                                     preexec_fn=pinned(args.server_cpus))  # fmt: skip
        line = self.proc.stdout.readline()  # "ready: URL (...)" once it serves, or "" when it exits first
        self.ready_s = time.perf_counter() - t0
        if not line.startswith("ready"):
            self.stop()
            raise SystemExit(f"the server did not start: see {log}")
        self.url = f"http://127.0.0.1:{args.port}"

    def stop(self) -> float:
        """SIGTERM (a drain), then the seconds until it exited."""
        t0 = time.perf_counter()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.f.close()
        return time.perf_counter() - t0


def stages(log: Path) -> str:
    """The engine's start-up stages as its server logged them ("[  3.1 s] loading weights" lines)."""
    return "; ".join(line.strip() for line in log.read_text().splitlines() if line.startswith("[")) or "-"


def first_ttfts_ms(url: str, vocab: int, tokens: int, n: int = 3) -> list[float]:
    """``n`` streamed completions of a ``tokens``-token prompt, one after another, right after ready: ms from each
    one's send to its first token (the client and its connection pool made before the first is timed)."""
    import httpx

    out = []
    with httpx.Client(timeout=60) as client:
        for k in range(n):
            body = {"prompt": [(7 * i + k) % vocab for i in range(tokens)], "max_tokens": 4, "temperature": 0,
                    "stream": True, "ignore_eos": True}  # fmt: skip
            t0 = time.perf_counter()
            ttft = float("nan")
            with client.stream("POST", url + "/v1/completions", json=body) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {") and ttft != ttft:
                        ttft = (time.perf_counter() - t0) * 1e3
            out.append(ttft)
    return out


def traffic(args, workload: str, out: Path, url: str | None, rnd: int, rounds: int = 1) -> list[dict]:
    """``rounds`` rounds of a workload from round ``rnd`` on (through ``url``, else in-process): their runs of
    results.json."""
    cmd = [sys.executable, "-m", "models.bench.traffic", *WORKLOADS[workload](args), "--rounds", str(rounds),
           "--seed", str(args.seed + rnd), "--no-progress", "--out", str(out), "--model", args.model]  # fmt: skip
    if url is not None:
        procs = args.client_procs or (CONNECTION_PROCS if workload == "connections" else 1)
        cmd += ["--url", url, "--client-procs", str(procs)]
        if args.prompt_text:
            cmd += ["--prompt-text", str(args.model_dir)]
    else:
        cmd += ["--arms", "resident-triton-cache", "--max-running", str(args.max_running), "--max-seq-len",
                str(args.max_seq_len)]  # fmt: skip
    with open(out.with_suffix(".log"), "w") as log:
        cpus = args.client_cpus if url is not None else args.server_cpus
        subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=True, preexec_fn=pinned(cpus))
    return json.loads((out / "results.json").read_text())["runs"]


def _spread(xs: list[float], fmt: str) -> str:
    """Median [min-max] of the rounds' values that are numbers (NaN: a round with nothing to say); "-" if none."""
    xs = [x for x in xs if not math.isnan(x)]
    return f"{statistics.median(xs):{fmt}} [{min(xs):{fmt}} - {max(xs):{fmt}}]" if xs else "-"


def paired(http: list[dict], engine: list[dict]) -> str:
    """Round by round, HTTP against in-process: the output tok/s ratio, and the TTFT p50 and ITL p50 differences
    (ms), each median [min-max] over rounds."""
    pairs = list(zip(http, engine, strict=True))
    return (f"{_spread([h['tokps'] / e['tokps'] for h, e in pairs], '.3f')} | "
            f"{_spread([h['ttft_p50_ms'] - e['ttft_p50_ms'] for h, e in pairs], '+.1f')} | "
            f"{_spread([h['itl_p50_ms'] - e['itl_p50_ms'] for h, e in pairs], '+.2f')}")  # fmt: skip


def per_request(http: list[dict], engine: list[dict]) -> str:
    """Request by request within a round (one draw on both sides): d = TTFT through HTTP - in-process (ms), and its
    least-squares fit d = fixed + pace x the in-process TTFT. The median of d over a round's requests, the fixed ms
    and the pace (%), each median [min-max] over rounds. The pace is what a slower engine or a later admission adds
    to every later request's wait; the fixed part is what each request pays once (intake, delivery). A round with
    fewer than two pairs (its requests failed through HTTP) is left out; "-" where none is left."""
    meds, fixed, pace = [], [], []
    for h, e in zip(http, engine, strict=True):
        a, b = (np.array([np.nan if t is None else t for t in r["request_ttft_ms"]]) for r in (h, e))
        both = ~np.isnan(a) & ~np.isnan(b)
        d, x = a[both] - b[both], b[both]
        if d.size < 2:  # (a round whose requests failed through HTTP: nothing to pair)
            for xs in (meds, fixed, pace):
                xs.append(math.nan)
            continue
        meds.append(float(np.median(d)))
        slope, icept = np.polyfit(x, d, 1) if np.ptp(x) > 0 else (0.0, float(d.mean()))
        fixed.append(float(icept))
        pace.append(float(slope) * 100)
    return f"{_spread(meds, '+.1f')} | {_spread(fixed, '+.1f')} | {_spread(pace, '+.1f')}"


def write_pairs(http: list[dict], engine: list[dict], path: Path) -> None:
    """Every request's TTFT on both sides, round by round, as CSV (round, request, HTTP ms, in-process ms; empty
    where it failed): what ``per_request`` fits, kept for a closer look (by wave of slots, by prompt length)."""
    lines = ["round,request,http_ms,in_process_ms"]
    for rnd, (h, e) in enumerate(zip(http, engine, strict=True)):
        for j, (a, b) in enumerate(zip(h["request_ttft_ms"], e["request_ttft_ms"], strict=True)):
            lines.append(f"{rnd},{j},{'' if a is None else f'{a:.3f}'},{'' if b is None else f'{b:.3f}'}")
    path.write_text("\n".join(lines) + "\n")


def _edges(runs: list[dict]) -> str:
    """The ITL's 30th and 70th percentiles (ms, each the median over rounds): around a burst's p50 they show whether
    the p50 sits in the decode-only steps' point mass or past its edge, which a small change of schedule moves."""
    deciles = [r["itl_ms_deciles"] for r in runs if r.get("itl_ms_deciles")]
    if not deciles:
        return "-"
    return f"{statistics.median(d[2] for d in deciles):.2f} / {statistics.median(d[6] for d in deciles):.2f}"


def _beside_share(runs: list[dict]) -> float:
    """The in-process engine's share of decode steps launched beside a prefill pass (median over rounds)."""
    shares = [r["decode_beside_pass"] / r["decode_steps"] for r in runs if r.get("decode_steps")]
    return statistics.median(shares) if shares else float("nan")


def _median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def _ttft_means(http: list[dict], engine: list[dict]) -> str:
    """TTFT means (ms, each the median over rounds): the client's through HTTP, the server's own (a request's arrival
    at the server to its first token reaching the front end) and in-process. Client less server is what the client
    and the network add; server less in-process is what the server adds, intake and engine alike."""
    inproc = statistics.median(float(np.mean([t for t in r["request_ttft_ms"] if t is not None])) for r in engine)
    return f"{_median(http, 'ttft_mean_ms'):.1f} / {_median(http, 'server_ttft_mean_ms'):.1f} / {inproc:.1f}"


def _passes(http: list[dict], engine: list[dict]) -> str:
    """The engine's prefill passes, HTTP / in-process (medians over rounds): prompt tokens a pass, wall ms a pass."""
    return (f"{_median(http, 'engine_tokens_per_pass'):.0f} / {_median(engine, 'prefill_tokens_per_pass'):.0f}; "
            f"{_median(http, 'engine_pass_ms'):.2f} / {_median(engine, 'prefill_ms'):.2f}")


def _gc(runs: list[dict]) -> str:
    """The server's processes' garbage collections a round (ms, median over rounds): front end / engine (NaN where
    the server does not report them: ``remote.server_costs``)."""
    return f"{_median(runs, 'front_gc_ms'):.1f} / {_median(runs, 'engine_gc_ms'):.1f}"


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    workloads = args.workloads.split(",")
    bad = [w for w in workloads if w not in WORKLOADS]
    if bad:
        parser().error(f"argument --workloads: {bad[0]!r} is not one of {', '.join(WORKLOADS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.make and not (args.model_dir / "config.json").exists():
        subprocess.run([sys.executable, "-m", "models.bench.make_checkpoint", "--model", args.make, "--out",
                        str(args.model_dir)], check=True)  # fmt: skip
    from models.engine.adapters import MODEL_CONFIGS

    vocab = MODEL_CONFIGS[args.model].vocab_size
    lines = []
    server = ServerProcess(args, args.out / "server-1.log")
    prompt = min(512, args.max_seq_len - 8)
    ttft = first_ttfts_ms(server.url, vocab, prompt)
    lines.append(f"- start 1: ready in {server.ready_s:.1f} s; the first requests after ready ({prompt}-token prompt, "
                 f"streamed, one after another): TTFT {' / '.join(f'{t:.1f}' for t in ttft)} ms; the stages: "
                 f"{stages(server.log)}")  # fmt: skip
    http, engine = {}, {}
    try:
        for w in workloads:
            if w == "connections":
                http[w] = traffic(args, w, args.out / f"{w}-http", server.url, 0, args.rounds)
                continue
            http[w], engine[w] = [], []
            for r in range(args.rounds):  # (the server idles while its engine's twin runs in a process beside it)
                sides = [(http[w], "http", server.url), (engine[w], "engine", None)]
                for runs, side, url in sides if r % 2 == 0 else sides[::-1]:
                    runs += traffic(args, w, args.out / f"{w}-{side}-round{r}", url, r)
    finally:
        drained = server.stop()
    lines.append(f"- SIGTERM: the server drained and exited in {drained:.1f} s")
    again = ServerProcess(args, args.out / "server-2.log")
    ttft2 = first_ttfts_ms(again.url, vocab, prompt)
    again.stop()
    lines.append(f"- start 2 (compile caches on disk): ready in {again.ready_s:.1f} s; first requests' TTFT "
                 f"{' / '.join(f'{t:.1f}' for t in ttft2)} ms; the stages: {stages(again.log)}")  # fmt: skip
    table = ["| workload | HTTP output tok/s | in-process tok/s | ratio | HTTP TTFT p50 ms | in-process TTFT p50 ms | "
             "HTTP ITL p50 ms | in-process ITL p50 ms | ITL p30 / p70 ms (HTTP; in-process) | failed | front-end CPU "
             "us/token | engine decode step ms (HTTP / in-process) | decode steps beside a pass (HTTP / in-process) | "
             "engine intake ms (HTTP, mean: arrival at the server to submission in the engine) | GC ms a round, "
             "front end / engine (HTTP) | paired by round: tok/s ratio | TTFT p50 difference ms | ITL p50 difference "
             "ms | paired by request: TTFT difference ms, median | its fit: fixed ms | its fit: pace % | TTFT mean ms: "
             "client through HTTP / the server's own / in-process | engine prefill passes: prompt tokens a pass, ms a "
             "pass (HTTP / in-process) |",
             "|" + "---|" * 23]  # fmt: skip
    for w in workloads:
        h = http[w]
        if w == "connections":
            table.append(f"| connections ({args.connections} streams at once) | {_median(h, 'tokps'):.0f} | - | - | "
                         f"{_median(h, 'ttft_p50_ms'):.1f} | - | {_median(h, 'itl_p50_ms'):.2f} | - | {_edges(h)}; - | "
                         f"{sum(r['failed'] for r in h)} | {_median(h, 'front_cpu_us_token'):.0f} | "
                         f"{_median(h, 'engine_decode_step_ms'):.2f} / - | "
                         f"{_median(h, 'engine_beside_share'):.0%} / - | "
                         f"{_median(h, 'engine_intake_ms'):.2f} | {_gc(h)} |" + " - |" * 8)  # fmt: skip
            continue
        e = engine[w]
        write_pairs(h, e, args.out / f"{w}-ttft-by-request.csv")
        table.append(f"| {w} | {_median(h, 'tokps'):.0f} | {_median(e, 'tokps'):.0f} | "
                     f"{_median(h, 'tokps') / _median(e, 'tokps'):.3f} | {_median(h, 'ttft_p50_ms'):.1f} | "
                     f"{_median(e, 'ttft_p50_ms'):.1f} | {_median(h, 'itl_p50_ms'):.2f} | "
                     f"{_median(e, 'itl_p50_ms'):.2f} | {_edges(h)}; {_edges(e)} | {sum(r['failed'] for r in h)} | "
                     f"{_median(h, 'front_cpu_us_token'):.0f} | {_median(h, 'engine_decode_step_ms'):.2f} / "
                     f"{_median(e, 'decode_step_ms'):.2f} | {_median(h, 'engine_beside_share'):.0%} / "
                     f"{_beside_share(e):.0%} | {_median(h, 'engine_intake_ms'):.2f} | {_gc(h)} | "
                     f"{paired(h, e)} | {per_request(h, e)} | {_ttft_means(h, e)} | {_passes(h, e)} |")  # fmt: skip
    text = (f"# The server against the engine it wraps\n\nCommand: `python -m models.bench.serve_http "
            f"{' '.join(argv if argv is not None else sys.argv[1:])}` (pid {os.getpid()})\n\n"
            + ("Prompts through HTTP sent as text, which the server tokenized.\n\n" if args.prompt_text else "")
            + "\n".join(lines)
            + "\n\n" + "\n".join(table) + "\n")  # fmt: skip
    (args.out / "results.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
