"""The traffic benchmark: requests arriving over time with varied prompt and output lengths, arms alternated in one run.

    python -m models.bench.traffic --num-requests 128 --rate inf \\
        --prompt-len lognormal:median=256,sigma=0.9,min=32,max=1536 \\
        --gen-len lognormal:median=96,sigma=0.9,min=8,max=384 --max-running 32 --prefill in-step,beside \\
        --token-budget 1024,2048 --out models/bench/results/traffic-h200/burst

Arrivals: ``--rate R`` requests/s (Poisson; ``inf``: all at t=0), ``--num-requests N``; lengths ``--prompt-len`` and
``--gen-len`` as distributions (``fixed:512``, ``uniform:32,1536``, ``lognormal:median=256,sigma=0.9,min=32,max=1536``);
or ``--trace FILE.jsonl`` (one ``{"arrival_s", "prompt_len", "output_len"}`` a line) to replay your own traffic.
``--sampled-frac`` of the requests sample (``--temperature``, ``--top-p``, ``--top-k``), ``--stop-frac`` carry stop
tokens (random ids: with random weights they rarely fire; the requests end at their length), ``--scored-frac`` score
their prompts as an eval harness's loglikelihood requests do (``--gen-len fixed:1 --scored-frac 1``: such traffic).

Traffic that repeats itself, for a prefix cache (``--shape``; default ``independent``: every prompt its own random
tokens): ``system-prompt``: every prompt begins with one shared prefix of ``--system-len`` random tokens (default 2000;
drawn anew each round), then its own ``--prompt-len`` tokens. ``chat``: ``--users`` users (default 64) starting at
``--rate`` (Poisson; inf: all at t=0), each sending ``--turns`` turns (default 6) in a closed loop: turn 1 is a message
of ``--prompt-len`` tokens; turn k+1 is sent once turn k has finished plus ``--think-s`` (default 0), its prompt the
whole history: turn k's prompt, exactly the tokens turn k generated (in process: the engine's result; with ``--url``:
the ids the server returned, ``return_token_ids``) and a new message; replies of ``--gen-len`` tokens. A trace says
the same per line (``"prefix_id"``/``"prefix_len"``, ``"session"``/``"turn"``/``"think_s"``: ``workload.load_trace``).
The workload's description names the shape, and the report counts the prompt tokens sent (``prompt tokens``): a chat
resends its history every turn. A turn's TTFT counts from when it was due (the previous turn's end plus think time).

Every arm (``models/bench/arms.py``: an engine arm of ``--arms``, host, host-overlap, host-triton-overlap, resident-fa2,
resident-xqa, resident-triton, ..., at a placement of ``--prefill`` and a budget of ``--token-budget``, labelled by the
three: ``resident-triton beside 2048``) gets its own engine, built once and warmed up on traffic of the same shape. Each
round draws its own traffic from the distributions (a trace: the same every round), serves it once untimed
(``--prerun``: the process's one-time costs of the round's prefill shapes would otherwise fall on whichever arm meets
them first), then serves it timed in every arm, the arm order reversed every other round. A request's TTFT counts from
its arrival, not from when the engine loop got to it. Per arm (median [min-max] over rounds): output tok/s (and its
ratio to host, host-overlap and host-triton-overlap, paired by round) and requests/s, TTFT and ITL p50/p90/p99, TPOT
mean, decode steps, mixed steps and their mean wall time, prefill passes (tokens, wall and GPU time a pass), decode
steps beside a pass in flight (passes beside the decode steps), H2D copies a decode step, peak GPU memory, and whether
its first tokens (and all tokens) equal those of the host arm at its placement and budget. (With passes beside the
decode steps, or arrivals over time, two arms batch their rows by their own timing, so in bf16 a near-tie may break the
other way.)

A busy host (``--host-load F[,F...]``, ``models/bench/host_load.py``): during every timed run a background thread
holds the interpreter a fraction F of each millisecond (a pure-Python spin, then a sleep), as an in-process server
does while it detokenizes and writes streams. Every arm runs at every load, an arm's loads one after another and the
whole order reversed every other round; the report has a block of rows a load, each row naming F and the fraction
of the run's wall time the thread actually held the interpreter, and pairs each arm's ratios with the host arms at
its own load.

Writes ``results.md``, ``results.json``, ``ttft_cdf.png``, ``itl_cdf.png`` and ``timeline.png`` (the last round of
each arm: rows, prompt tokens and wall time of every step) under ``--out``. Where an arm's tokens differ from the host
arm's or from its twin's (the same arm without its prefix cache, or at one token a launch: ``resident-triton`` for
``resident-triton-cache`` and ``resident-triton-k4``), ``results.json``'s row names each such request, round by round,
with the first token that differs (``differ_from_host``, ``differ_from_twin``); each run's ``request_ttft_ms`` is
every request's TTFT in request order (with ``--url`` too, null for a failed one), which pairs two runs of one draw
request by request (``models.bench.serve_http``). Runs on a CPU too
(tiny model, the ``host-torch`` and ``resident-torch`` arms), which is how its tests run it.

Under torchrun (``python -m torch.distributed.run --nproc-per-node 2 -m models.bench.traffic ...``) every arm's
engine is tensor-parallel over the group (models.engine.tensor_parallel). Rank 0 drives the arrivals and writes the
report; the other ranks follow its steps. Its passes run in the step (``--prefill`` in-step, the default there, or
in-pass): a pass beside the decode steps would land when each rank's GPU has run it, and the ranks would batch
differently (``RankEngine`` refuses it).

With ``--url http://HOST:PORT`` no engine is built: the same traffic (the same rounds, arrivals, lengths, trace and
prompt ids, drawn from the same seeds; prompt ids from ``--model``'s vocabulary, by default the served model where
its id is one of ``--model``'s names, and from the server's own where it says a smaller one: /tokenizer_info's
``vocab_size``) is sent as streaming completions to an OpenAI-compatible server, as ``vllm
bench serve`` does (``models/bench/remote.py``: the requests, how they are timed, what fails): the warm-up once, then
each round, served once untimed first (``--prerun``, with other prompt ids) and then timed. With ``--prompt-text DIR``
each prompt goes as text, as clients send it (its ids decoded with DIR's tokenizer, special tokens dropped; the server
tokenizes it, and its prompt tokens are what the text encodes to). The report names the URL
and the server's model: requests completed and failed (with their errors), output and total tok/s, req/s, goodput
under ``--goodput ttft:MS,tpot:MS,itl:MS,e2el:MS`` (req/s and the share of the requests), TTFT, ITL, TPOT and E2EL
(mean, p50, p90, p99), and the client's send lag; ``results.md``, ``results.json``, ``ttft_cdf.png`` and
``itl_cdf.png`` under ``--out``. The engine options and ``--host-load`` are refused with it.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import attrs
import numpy as np
import torch

from models.bench.arms import (
    Arm,
    add_arm_options,
    add_host_load_option,
    budget_text,
    build_arms,
    default_placement,
    frozen_heap,
    paired_ratio,
    parse_arms,
    planner_yardstick,
    round_order,
    twin,
)
from models.bench.host_load import HostLoad, host_load_text, load_text
from models.bench.remote import DECILES, goodput_targets, server_url
from models.bench.workload import Lengths, Sampling, Workload, WorkloadError, arrival_times, continued, load_trace
from models.cli import OneLineParser, fraction, positive_int, rate
from models.engine import Engine, EngineConfig, PrefillPlacement
from models.engine.adapters import MODEL_CONFIGS, build_adapter, model_context
from models.engine.tensor_parallel import RankEngine, build_rank_adapter, join_group

SHAPES = ("independent", "system-prompt", "chat")
GPU_ARMS = "host,host-overlap,host-triton-overlap,resident-fa2,resident-xqa,resident-triton"
CPU_ARMS = "host-torch,resident-torch"
COUNTERS = ("decode_steps", "mixed_steps", "prefill_steps", "prefill_passes", "prefill_tokens", "prefill_ns",
            "prefill_host_ns", "prefill_gpu_ms", "mixed_ns", "decode_ns", "gpu_ms", "h2d_copies", "rows_decoded",
            "tokens", "early_hits", "early_steps", "decode_beside_pass", "prefix_hits",
            "prefix_cached_tokens")  # fmt: skip


def seconds(text: str) -> float:
    """A finite number >= 0."""
    try:
        t = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (math.isfinite(t) and t >= 0):
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, got {text}")
    return t


def parser(prog: str = "python -m models.bench.traffic", description: str = __doc__,
           run_options: bool = True) -> OneLineParser:
    """The benchmark's options: traffic, engine and (``run_options``) rounds, warm-up and output."""
    ap = OneLineParser(prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_argument_group("traffic")
    g.add_argument("--num-requests", type=positive_int, default=None, help="requests in the workload (default 128)")
    g.add_argument("--rate", type=rate, default=None,
                   help="arrivals a second, Poisson; inf: all at t=0 (default inf)")
    g.add_argument("--prompt-len", default=None,
                   help="prompt lengths: fixed:N, uniform:LO,HI or lognormal:median=M,sigma=S,min=LO,max=HI "
                        "(default lognormal:median=256,sigma=0.9,min=32,max=1536)")
    g.add_argument("--gen-len", default=None,
                   help="tokens each request generates, same forms (default lognormal:median=96,sigma=0.9,min=8,"
                        "max=384)")
    g.add_argument("--trace", type=Path, default=None,
                   help='JSON lines, one {"arrival_s", "prompt_len", "output_len"} a request (instead of the four '
                        'options above), optionally with "prefix_id" and "prefix_len" (a shared prefix), "session", '
                        '"turn" and "think_s" (a chat: a turn continues the session\'s previous one); models/bench/'
                        "workload.py's load_trace")
    g.add_argument("--shape", choices=SHAPES, default="independent",
                   help="how the prompts repeat themselves: independent (every prompt its own random tokens, the "
                        "default), system-prompt (every prompt begins with one shared prefix of --system-len tokens, "
                        "then its own --prompt-len tokens) or chat (--users users, each sending --turns turns in a "
                        "closed loop: a turn's prompt is the whole history, the previous turn's prompt and the "
                        "tokens it generated, then a new message of --prompt-len tokens; --rate: users starting)")
    g.add_argument("--system-len", type=positive_int, default=None,
                   help="system-prompt: the shared prefix's tokens, the same for the whole round (default 2000)")
    g.add_argument("--users", type=positive_int, default=None, help="chat: users, each a chat (default 64)")
    g.add_argument("--turns", type=positive_int, default=None, help="chat: turns each user sends (default 6)")
    g.add_argument("--think-s", type=seconds, default=None,
                   help="chat: seconds between a reply's end and the user's next message (default 0)")
    g.add_argument("--seed", type=int, default=0, help="draws the workload (the warm-up uses seed + 1)")
    g.add_argument("--sampled-frac", type=fraction, default=0.0, help="fraction of requests that sample (default 0)")
    g.add_argument("--temperature", type=float, default=0.8, help="sampled requests' temperature")
    g.add_argument("--top-p", type=float, default=0.95, help="sampled requests' top-p")
    g.add_argument("--top-k", type=int, default=50, help="sampled requests' top-k (0 = off)")
    g.add_argument("--stop-frac", type=fraction, default=0.0, help="fraction of requests with stop tokens (default 0)")
    g.add_argument("--stop-tokens", type=positive_int, default=4, help="stop tokens such a request carries")
    g.add_argument("--scored-frac", type=fraction, default=0.0,
                   help="fraction of requests that score their prompt, as an eval harness's loglikelihood requests do "
                        "(each prompt token's logprob and its output's, k = 1; through --url: echo with logprobs 1, "
                        "the echo chunk not timed as a token); default 0")  # fmt: skip
    e = ap.add_argument_group("engine (as in models.bench.serve)")
    e.add_argument("--model", default="qwen3_5-0.8b", help="a text model: " + ", ".join(
        m for m in MODEL_CONFIGS if m.startswith("qwen")) + " (random weights); with --url, the vocabulary and "
        "context the prompts are drawn for (default: the served model where its id is one of these)")  # fmt: skip
    e.add_argument("--device", default=None, help="cuda or cpu (default: cuda where there is one)")
    e.add_argument("--dtype", default=None, help="bfloat16 or float32 (default: bfloat16 on cuda, float32 on cpu)")
    e.add_argument("--arms", default=None,
                   help=f"engine arms, comma-separated (default on cuda: {GPU_ARMS}; on cpu: {CPU_ARMS}); each runs "
                        "at every --prefill placement and --token-budget")  # fmt: skip
    add_arm_options(e, "auto", "; under torchrun in-step, passed to every rank's RankEngine: a tensor-parallel "
                               "engine runs its passes in the step, in-step or in-pass")  # fmt: skip
    e.add_argument("--max-running", type=positive_int, default=32, help="requests admitted at once (default 32)")
    e.add_argument("--max-bucket", type=positive_int, default=None, help="widest decode bucket (default: max-running)")
    e.add_argument("--page-size", type=positive_int, default=16, help="tokens a KV page holds (default 16)")
    e.add_argument("--num-pages", type=positive_int, default=None,
                   help="KV pages (sink included; default: every running request at the context)")
    e.add_argument("--max-seq-len", type=positive_int, default=None,
                   help="the engine's context (default: the longest prompt + output of the workload)")
    e.add_argument("--prefill-graphs", type=int, default=6,
                   help="token buckets of prefill CUDA graphs, halving down from --prefill-graph-tokens (default 6: "
                        "256 ... 8192); a pass is padded to the smallest that holds it (0: eager prefill)")
    e.add_argument("--prefill-graph-tokens", type=positive_int, default=8192,
                   help="the largest token bucket; longer passes run eagerly (default 8192)")
    if not run_options:
        return ap
    r = ap.add_argument_group("run")
    r.add_argument("--rounds", type=positive_int, default=2, help="rounds; the arm order reverses every other round")
    r.add_argument("--warmup", type=int, default=None,
                   help="warm-up requests per arm (with --url: sent once), same distributions, at most 16 new "
                        "tokens (default 2 x max-running)")
    r.add_argument("--out", type=Path, required=True, help="folder for results.md, results.json and the plots")
    r.add_argument("--prerun", action=argparse.BooleanOptionalAction, default=True,
                   help="serve each round's traffic once, untimed, before timing it in every arm (default on): the "
                        "first arm to meet a round's prefill shapes pays the process's one-time costs for them (on "
                        "the H200 152-166 ms a pass, against 78-101 ms for the same passes in the arms after it)")
    add_host_load_option(r, "; under torchrun, in rank 0's process, which drives the steps")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    s = ap.add_argument_group("server (--url: the traffic sent to an OpenAI-compatible server instead of the arms)")
    s.add_argument("--url", type=server_url, default=None,
                   help="the server's root, e.g. http://127.0.0.1:8000: streaming POST /v1/completions, no engine "
                        "built here (the engine options but --model, and --host-load, are refused with it); with "
                        "$OPENAI_API_KEY set, every request carries it as a bearer key (a server's --api-key)")
    s.add_argument("--served-model", default=None,
                   help="the model the requests name (default: the first id of the server's /v1/models)")
    s.add_argument("--goodput", type=goodput_targets, default=None, metavar="NAME:MS[,NAME:MS...]",
                   help="latency targets a request must all meet to count toward goodput, NAME one of ttft, tpot, "
                        "itl (every gap of the request), e2el, e.g. ttft:500,tpot:50 (with --url)")
    s.add_argument("--prompt-text", type=Path, default=None, metavar="DIR",
                   help="send each prompt as text, as clients do: its ids decoded with the tokenizer in DIR (the "
                        "served checkpoint's directory), which the server tokenizes; its prompt tokens are what that "
                        "text encodes to (default: token ids; not for chats, whose turns repeat the returned ids)")
    s.add_argument("--max-connections", type=positive_int, default=None,
                   help="connections to the server at most (default: no cap, one a request in flight; with a cap, "
                        "requests past it wait for a connection, in their TTFT)")
    s.add_argument("--client-procs", type=positive_int, default=None,
                   help="client processes the requests are spread over (default 1): one Python process streams a "
                        "few thousand events a second; past that the client, not the server, sets the pace")
    s.add_argument("--ready-timeout", type=float, default=60.0,
                   help="seconds to wait for the server's /health (or /v1/models) to answer (default 60)")
    s.add_argument("--request-timeout", type=float, default=600.0,
                   help="seconds a request may wait for the server's next bytes before it fails (default 600)")
    return ap


@attrs.frozen(eq=False)
class Setup:
    """Everything the run needs, checked before any engine is built: every arm's config has been built once."""

    arms: list[Arm]  # every engine arm at every placement and budget asked for, in the order they run
    device: str
    dtype: torch.dtype
    rounds: list[Workload]  # the workload of each round
    warmup: Workload
    sampling: Sampling
    max_seq_len: int
    description: str
    knobs: dict  # the EngineConfig fields every arm shares (device, dtype, max_running, ...)

    def config(self, arm: Arm, **more) -> EngineConfig:
        """``arm``'s engine config with the run's knobs (and ``more``: timing)."""
        return arm.config(**self.knobs, **more)


def setup_run(ap: argparse.ArgumentParser, args: argparse.Namespace, ranks: int = 1) -> Setup:
    """Parse and check the workload and engine arguments, and build every arm's config, for an engine on one device
    or (``ranks`` > 1) a tensor-parallel one (``ap.error`` on the first problem)."""
    try:
        return _setup_run(args, ranks)
    except ValueError as e:  # a WorkloadError naming its argument, or an arm's config refused
        ap.error(str(e))
    raise AssertionError("unreachable")


def check_model(model: str) -> None:
    """A text model of MODEL_CONFIGS, or a ``WorkloadError`` naming --model."""
    if model not in MODEL_CONFIGS or not model.startswith("qwen"):
        raise WorkloadError("--model", f"{model!r}: the traffic benchmark serves the text models "
                                       f"{', '.join(m for m in MODEL_CONFIGS if m.startswith('qwen'))}")  # fmt: skip


def _setup_run(args: argparse.Namespace, ranks: int) -> Setup:
    check_model(args.model)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device not in ("cuda", "cpu"):
        raise WorkloadError("--device", f"{device!r}: cuda or cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise WorkloadError("--device", "cuda: no CUDA GPU here (use --device cpu with qwen3_5-tiny)")
    dtype = args.dtype or ("bfloat16" if device == "cuda" else "float32")
    if dtype not in ("bfloat16", "float32"):
        raise WorkloadError("--dtype", f"{dtype!r}: bfloat16 or float32")
    if args.prefill_graphs < 0:
        raise WorkloadError("--prefill-graphs", f"must be >= 0, got {args.prefill_graphs}")
    try:
        names = parse_arms(args.arms or (GPU_ARMS if device == "cuda" else CPU_ARMS), device)
    except ValueError as e:
        raise WorkloadError("--arms", str(e)) from None
    arms = arms_for(names, args.prefill, args.token_budget, device, ranks)
    traffic = draw_traffic(args, args.max_running)
    rounds, warmup, longest = traffic.rounds, traffic.warmup, traffic.longest
    context = model_context(args.model)
    if args.max_seq_len is not None:
        if args.max_seq_len > context:
            raise WorkloadError("--max-seq-len", f"{args.max_seq_len} is over {args.model}'s context of {context}")
        if longest > args.max_seq_len:
            raise WorkloadError(traffic.lengths_arg, f"a request of {longest} tokens (prompt + output) does not fit "
                                                     f"--max-seq-len {args.max_seq_len}")  # fmt: skip
    elif longest > context:
        raise WorkloadError(traffic.lengths_arg, f"a request of {longest} tokens (prompt + output) is over "
                                                 f"{args.model}'s context of {context}")  # fmt: skip
    max_seq_len = args.max_seq_len or longest
    knobs = dict(device=device, dtype=getattr(torch, dtype), max_running=args.max_running, max_bucket=args.max_bucket,
                 page_size=args.page_size, num_pages=args.num_pages, max_seq_len=max_seq_len,
                 prefill_graphs=args.prefill_graphs if device == "cuda" else 0,
                 prefill_graph_tokens=args.prefill_graph_tokens)  # fmt: skip
    for arm in arms:  # each config built once here, so a refused one ends the run before any engine is built
        try:
            arm.config(**knobs)
        except ValueError as e:
            raise ValueError(f"arm {arm.label}: {e}") from None
    return Setup(arms, device, knobs["dtype"], rounds, warmup, traffic.sampling, max_seq_len, traffic.description,
                 knobs)  # fmt: skip


@attrs.frozen(eq=False)
class Traffic:
    """A run's traffic, drawn before anything serves it: each round's workload, the warm-up's, and how they sample."""

    rounds: list[Workload]
    warmup: Workload
    sampling: Sampling
    description: str
    longest: int  # the most tokens (prompt + output) a request of a round or of the warm-up holds
    lengths_arg: str  # the argument the lengths came from: --trace or --prompt-len/--gen-len


def draw_traffic(args: argparse.Namespace, max_running: int) -> Traffic:
    """Every round's workload and the warm-up's (``max_running``: the warm-up's size by default, and how many of the
    longest prompts it also runs), each drawn from its own seed, or a ``WorkloadError`` naming the argument."""
    sampling = Sampling(args.sampled_frac, args.temperature, args.top_p, args.top_k, args.stop_frac,
                        args.stop_tokens, args.scored_frac)  # fmt: skip
    n_rounds = getattr(args, "rounds", 1)
    rngs = [np.random.default_rng([args.seed, r]) for r in range(n_rounds)]
    warm_rng = np.random.default_rng([args.seed, n_rounds])
    shape = getattr(args, "shape", "independent")
    shaped = {"--system-len": "system-prompt", "--users": "chat", "--turns": "chat", "--think-s": "chat"}
    for opt, needs in shaped.items():
        if getattr(args, opt[2:].replace("-", "_"), None) is not None and (shape != needs or args.trace is not None):
            raise WorkloadError(opt, f"applies to --shape {needs}" + (", not a trace (its lines give its shape)"
                                                                      if args.trace is not None else ""))  # fmt: skip
    if args.trace is not None:
        given = [f"--{k.replace('_', '-')}" for k in ("num_requests", "rate", "prompt_len", "gen_len")
                 if getattr(args, k) is not None]  # fmt: skip
        if shape != "independent":
            given.append("--shape")
        if given:
            raise WorkloadError("--trace", f"a trace gives arrivals and lengths: drop {', '.join(given)}")
        trace = load_trace(args.trace)
        source = f"trace {args.trace}"
        rounds = [Workload.build(**trace, sampling=sampling, rng=g, shape=trace_shape(trace)) for g in rngs]
        pick = warm_rng.permutation(trace["prompt_len"].size)  # a trace is the same traffic every round
        warm_prompt, warm_out = rounds[0].prompt_bound[pick], trace["output_len"][pick]
    else:
        rate = args.rate if args.rate is not None else math.inf
        p_text = args.prompt_len or "lognormal:median=256,sigma=0.9,min=32,max=1536"
        g_text = args.gen_len or "lognormal:median=96,sigma=0.9,min=8,max=384"
        p_len, g_len = Lengths.parse("--prompt-len", p_text), Lengths.parse("--gen-len", g_text)
        # each round draws its own traffic from the distributions: replaying one draw would repeat every prefill
        # pass's exact shape from round to round, which real traffic does not (and prefill graphs capture repeats)
        if shape == "chat":
            if args.num_requests is not None:
                raise WorkloadError("--num-requests", "a chat workload sends --users x --turns requests")
            users, turns, think = args.users or 64, args.turns or 6, args.think_s or 0.0
            n = users * turns
            desc = (f"{users} users x {turns} turns, messages {p_text}, replies {g_text}, think {think:g} s, users "
                    "starting")  # fmt: skip
            shape_text = f"{users} chats of {turns} turns, each turn's prompt the whole history"
            k = np.tile(np.arange(turns), users)
            more = dict(after=np.where(k > 0, np.arange(n) - 1, -1), think_s=np.where(k > 0, think, 0.0))
            draws = [(np.repeat(arrival_times(rate, users, g), turns), p_len.sample(g, n), g_len.sample(g, n))
                     for g in rngs]  # fmt: skip
            source = f"{desc} at rate {rate:g} users/s"
        else:
            n = args.num_requests or 128
            draws = [(arrival_times(rate, n, g), p_len.sample(g, n), g_len.sample(g, n)) for g in rngs]
            source = f"rate {rate:g} requests/s, prompts {p_text}, outputs {g_text}"
            more, shape_text = {}, ""
            if shape == "system-prompt":
                system = args.system_len or 2000
                more = dict(prefix_id=np.zeros(n, np.int64), prefix_len=np.full(n, system, np.int64))
                shape_text = f"a shared system prompt of {system} tokens before every prompt"
                source = f"rate {rate:g} requests/s, a system prompt of {system} tokens shared by every request, " \
                         f"then prompts {p_text}, outputs {g_text}"  # fmt: skip
        rounds = [Workload.build(*d, sampling, g, shape=shape_text, **more) for d, g in zip(draws, rngs, strict=True)]
        warm_prompt, warm_out = p_len.sample(warm_rng, 4096), g_len.sample(warm_rng, 4096)
        if shape == "system-prompt":
            warm_prompt = warm_prompt + rounds[0].prefix_len[0]
        elif shape == "chat":  # the warm-up's prompts are independent, as long as the chats' turns can be
            warm_prompt = warm_rng.choice(rounds[0].prompt_bound, 4096)
    n_warm = getattr(args, "warmup", None)
    n_warm = n_warm if n_warm is not None else 2 * max_running
    if n_warm < 0:
        raise WorkloadError("--warmup", f"must be >= 0, got {n_warm}")
    n_warm = min(n_warm, warm_prompt.size)
    # the warm-up also runs the longest prompts at once, so the passes with the largest temporaries have run (the
    # allocator holds their blocks, the kernels for their shapes are compiled) before anything is timed
    n_long = max_running if n_warm else 0
    longest_prompt = max(int(w.prompt_bound.max()) for w in rounds)
    warmup = Workload.build(np.zeros(n_warm + n_long), np.concatenate([warm_prompt[:n_warm],
                            np.full(n_long, longest_prompt)]), np.minimum(np.concatenate([warm_out[:n_warm],
                            np.full(n_long, 2)]), 16), sampling, warm_rng)  # fmt: skip
    longest = int(max(max((w.prompt_bound + w.output_len).max() for w in rounds),
                      (warmup.prompt_len + warmup.output_len).max(initial=0)))  # fmt: skip
    return Traffic(rounds, warmup, sampling, f"{source}: round 0 {rounds[0].describe()}", longest,
                   "--trace" if args.trace is not None else {"chat": "--prompt-len/--gen-len/--turns",
                   "system-prompt": "--system-len/--prompt-len/--gen-len"}.get(shape, "--prompt-len/--gen-len"))


def trace_shape(trace: dict[str, np.ndarray]) -> str:
    """What a trace's prompts share, for its description ("" for independent prompts)."""
    parts = []
    ids = np.unique(trace["prefix_id"][trace["prefix_id"] >= 0])
    if ids.size:
        lens = np.unique(trace["prefix_len"][trace["prefix_id"] >= 0])
        parts.append(f"{ids.size} shared prefix{'es' if ids.size > 1 else ''} of {', '.join(map(str, lens))} tokens "
                     f"before {int((trace['prefix_id'] >= 0).sum())} prompts")  # fmt: skip
    later = trace["after"] >= 0
    if later.any():
        firsts = np.setdiff1d(trace["after"][later], np.flatnonzero(later)).size  # continued, continuing none
        parts.append(f"{firsts} chats, {int(later.sum())} turns continuing one (each prompt the whole history)")
    return "; ".join(parts)


def arms_for(names: list[str], prefill: tuple[PrefillPlacement, ...] | None, budgets: tuple, device: str,
             ranks: int) -> list[Arm]:  # fmt: skip
    """The run's arms: every engine arm at every placement (default: the engine's for the device; in the step for a
    tensor-parallel engine, which refuses a pass beside the decode steps) and every budget."""
    if prefill is None:
        prefill = (PrefillPlacement.IN_STEP if ranks > 1 else default_placement(device),)
    beside = [p.value for p in prefill if p.beside]
    if ranks > 1 and beside:
        raise WorkloadError("--prefill", f"{beside[0]}: a tensor-parallel engine runs its passes in the step (the "
                                         "ranks would batch differently beside the decode steps); in-step or "
                                         "in-pass")  # fmt: skip
    try:
        return build_arms(names, prefill, budgets, device)
    except ValueError as e:
        raise WorkloadError("--prefill", str(e)) from None


# -- serving the workload ------------------------------------------------------------------------------------------
def drive(engine: Engine, workload: Workload, requests: list, wait: bool = True,
          progress: Callable[[], None] | None = None, log: dict | None = None) -> tuple[list, list, float]:
    """Serve ``requests``, each submitted when it arrives (``wait``: sleep while none is due and nothing runs;
    ``progress`` is called as each finishes), through the engine core's interface: submit, step, has_work, each
    step's output handing over the results it finished. A chat's later turn is submitted once the turn it continues
    has finished (plus its think time, and not before its arrival), its prompt that turn's prompt, the tokens it
    generated and its own (``continued``). Returns (results in request order, one (start s, wall s, kind, decode
    rows, prompt tokens) a step, wall s); ``log`` gets, in request order, each request's prompt as submitted
    (``prompts``) and when it was submitted and finished (``submit_s``, ``finish_s``: seconds from the start)."""
    st, steps, n = engine.stats, [], len(requests)
    done: dict = {}
    nexts: dict[int, list[int]] = {}  # a request: the chat turns that continue it
    for j in np.flatnonzero(workload.after >= 0):
        nexts.setdefault(int(workload.after[j]), []).append(int(j))
    due = [(float(workload.arrival_s[j]), int(j)) for j in np.flatnonzero(workload.after < 0)]  # a heap
    heapq.heapify(due)
    index = {r.request_id: j for j, r in enumerate(requests)}
    prompts: list = [None] * n
    submit_s, finish_s = [math.nan] * n, [math.nan] * n
    t0 = time.perf_counter()
    while due or engine.has_work():
        now = time.perf_counter()
        while due and (not wait or t0 + due[0][0] <= now):
            at, j = heapq.heappop(due)
            a = int(workload.after[j])
            req = requests[j] if a < 0 else continued(requests[j], (*prompts[a], *done[requests[a].request_id].tokens))
            prompts[j], submit_s[j] = req.prompt, now - t0
            engine.submit(req, arrived=t0 + at if wait else now)
        if not engine.has_work():
            if due:
                time.sleep(max(0.0, t0 + due[0][0] - time.perf_counter()))
            continue
        before = (st.decode_steps, st.mixed_steps, st.prefill_steps, st.rows_decoded, st.prefill_tokens)
        ts = time.perf_counter()
        out = engine.step()
        te = time.perf_counter()
        for result in out.finished:
            done[result.request_id] = result
            j = index[result.request_id]
            finish_s[j] = te - t0
            for k in nexts.get(j, ()):  # the chat's next turn: due after its think time, not before its arrival
                heapq.heappush(due, (max(float(workload.arrival_s[k]), te - t0 + float(workload.think_s[k])), k))
            if progress is not None:
                progress()
        d = [a - b for a, b in zip((st.decode_steps, st.mixed_steps, st.prefill_steps, st.rows_decoded,
                                     st.prefill_tokens), before, strict=True)]  # fmt: skip
        kind = "decode" if d[0] else "mixed" if d[1] else "prefill" if d[2] else "land"
        steps.append((ts - t0, te - ts, kind, d[3], d[4]))
    wall = time.perf_counter() - t0
    if log is not None:
        log.update(prompts=prompts, submit_s=submit_s, finish_s=finish_s)
    return [done[r.request_id] for r in requests], steps, wall


def serve(engine: Engine | RankEngine, workload: Workload, requests: list, wait: bool = True,
          progress: Callable[[], None] | None = None, log: dict | None = None):
    """``drive`` on one engine, or on a tensor-parallel group: rank 0 drives and then releases the others, which
    follow its steps (they return None)."""
    if not isinstance(engine, RankEngine):
        return drive(engine, workload, requests, wait, progress, log)
    if engine.tp.rank != 0:
        engine.follow()
        return None
    try:
        return drive(engine, workload, requests, wait, progress, log)
    finally:
        engine.close()


def _pct(x, q) -> float:
    return float(np.percentile(x, q)) if len(x) else float("nan")


def timed_run(engine: Engine, workload: Workload, requests: list, cuda: bool,
              progress: Callable[[], None] | None = None, load: float = 0.0) -> dict:  # fmt: skip
    """One timed run of the workload under host load ``load``: its metrics (module doc), tokens and step log."""
    st = engine.stats
    before = {k: getattr(st, k) for k in COUNTERS}
    st.itl.clear()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    log: dict = {}
    with frozen_heap(), HostLoad(load) as busy:
        results, steps, wall = serve(engine, workload, requests, progress=progress, log=log)
    d = {k: getattr(st, k) - v for k, v in before.items()}
    itl = np.concatenate(st.itl) * 1e3 if st.itl else np.zeros(0)
    ttft = np.array([r.ttft_s for r in results]) * 1e3
    ttft_ms = ttft.tolist()  # (request order: also what pairs a run with another of its draw)
    tpot = np.array([r.itl_s for r in results if len(r.tokens) > 1]) * 1e3
    out_tokens = sum(len(r.tokens) for r in results)
    per = lambda k, n: d[k] / n if n else float("nan")  # noqa: E731
    return dict(
        tokps=out_tokens / wall, reqps=len(results) / wall, wall_s=wall, output_tokens=out_tokens,
        prompt_tokens=sum(len(p) for p in log["prompts"]),
        ttft_p50_ms=_pct(ttft, 50), ttft_p90_ms=_pct(ttft, 90), ttft_p99_ms=_pct(ttft, 99),
        itl_p50_ms=_pct(itl, 50), itl_p90_ms=_pct(itl, 90), itl_p99_ms=_pct(itl, 99),
        itl_ms_deciles=np.percentile(itl, DECILES).tolist() if itl.size else [],
        tpot_mean_ms=float(tpot.mean()) if tpot.size else float("nan"),
        decode_steps=d["decode_steps"], mixed_steps=d["mixed_steps"], prefill_steps=d["prefill_steps"],
        decode_beside_pass=d["decode_beside_pass"],
        decode_step_ms=per("decode_ns", d["decode_steps"]) / 1e6, mixed_ms=per("mixed_ns", d["mixed_steps"]) / 1e6,
        decode_gpu_ms=per("gpu_ms", d["decode_steps"]), prefill_passes=d["prefill_passes"],
        prefill_tokens=d["prefill_tokens"], prefix_hits=d["prefix_hits"],
        prefix_cached_tokens=d["prefix_cached_tokens"],
        prefill_tokens_per_pass=per("prefill_tokens", d["prefill_passes"]),
        prefill_ms=per("prefill_ns", d["prefill_passes"]) / 1e6,
        prefill_host_ms=per("prefill_host_ns", d["prefill_passes"]) / 1e6,
        prefill_gpu_ms=per("prefill_gpu_ms", d["prefill_passes"]) if cuda else float("nan"),
        prefill_tokps=d["prefill_tokens"] / (d["prefill_ns"] / 1e9) if d["prefill_ns"] else float("nan"),
        h2d_per_decode_step=per("h2d_copies", d["decode_steps"]),
        early_hits=d["early_hits"], early_steps=d["early_steps"],
        peak_gpu_gib=torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan"),
        ttft_ms=ttft_ms, itl_ms=itl.tolist(), steps=steps, request_ttft_ms=ttft_ms,
        tokens=[r.tokens for r in results], finish=[r.finish_reason.value for r in results],
        host_load=load, host_load_achieved=busy.achieved,
    )  # fmt: skip


# -- the report ----------------------------------------------------------------------------------------------------
COLUMNS = (  # (header, key, format): median [min-max] over rounds
    ("output tok/s", "tokps", "{:.0f}"), ("req/s", "reqps", "{:.2f}"),
    ("TTFT p50 ms", "ttft_p50_ms", "{:.0f}"), ("TTFT p90 ms", "ttft_p90_ms", "{:.0f}"),
    ("TTFT p99 ms", "ttft_p99_ms", "{:.0f}"), ("ITL p50 ms", "itl_p50_ms", "{:.2f}"),
    ("ITL p90 ms", "itl_p90_ms", "{:.2f}"), ("ITL p99 ms", "itl_p99_ms", "{:.1f}"),
    ("TPOT mean ms", "tpot_mean_ms", "{:.2f}"), ("decode steps", "decode_steps", "{:.0f}"),
    ("decode step ms", "decode_step_ms", "{:.2f}"), ("beside a pass", "decode_beside_pass", "{:.0f}"),
    ("mixed steps", "mixed_steps", "{:.0f}"),
    ("mixed step ms", "mixed_ms", "{:.1f}"), ("prefill passes", "prefill_passes", "{:.0f}"),
    ("tokens a pass", "prefill_tokens_per_pass", "{:.0f}"), ("pass ms", "prefill_ms", "{:.1f}"),
    ("pass host ms", "prefill_host_ms", "{:.1f}"), ("pass GPU ms", "prefill_gpu_ms", "{:.1f}"),
    ("prefill tok/s", "prefill_tokps", "{:.0f}"),
    ("H2D / decode step", "h2d_per_decode_step", "{:.2f}"), ("peak GPU GiB", "peak_gpu_gib", "{:.1f}"),
    ("prompt tokens", "prompt_tokens", "{:.0f}"), ("prompt tokens computed", "prefill_tokens", "{:.0f}"),
    ("prefix hits", "prefix_hits", "{:.0f}"), ("prompt tokens from the cache", "prefix_cached_tokens", "{:.0f}"),
)  # fmt: skip


def _cell(values: list[float], fmt: str) -> str:
    if all(math.isnan(v) for v in values):
        return "-"  # not measured here (GPU time and memory on a CPU)
    med = fmt.format(float(np.median(values)))
    if len(values) == 1:
        return med
    return f"{med} [{fmt.format(min(values))}-{fmt.format(max(values))}]"


def same_tokens(diffs: list[list[list[int]]], n: int) -> tuple[str, str]:
    """(first tokens equal, all tokens equal) of n requests, from their ``token_differences`` round by round, as
    "k/n" (lowest round); "-" where there was nothing to compare with (no rounds)."""
    if not diffs:
        return "-", "-"
    firsts = [n - sum(first == 0 for _, first, _, _ in rnd) for rnd in diffs]  # (the first token differs: at 0)
    whole = [n - len(rnd) for rnd in diffs]
    return f"{min(firsts)}/{n}", f"{min(whole)}/{n}"


def token_differences(runs: list[dict], base: list[dict]) -> list[list[list[int]]]:
    """Round by round, each request whose tokens differ from ``base``'s: [request index, first token index that
    differs, its token count, base's token count] (what ``same_tokens`` counts)."""
    out = []
    for r, b in zip(runs, base, strict=False):
        rnd = []
        for i, (x, y) in enumerate(zip(r["tokens"], b["tokens"], strict=True)):
            if x != y:
                first = next((j for j, (p, q) in enumerate(zip(x, y, strict=False)) if p != q),
                             min(len(x), len(y)))
                rnd.append([i, first, len(x), len(y)])
        out.append(rnd)
    return out


def summarize(runs: list[dict], arms: list[Arm], loads: tuple[float, ...] = (0.0,)) -> tuple[str, list[dict]]:
    """The report's table (one row an arm at a host load: its engine arm, placement, budget and load, the loads one
    block after another) and its rows as dicts. An arm is compared with the host arm (host, else host-torch),
    host-overlap and host-triton-overlap at its own placement, budget and load; an arm with the prefix cache with the
    same arm without it, and an arm of k tokens a launch with the same arm at one (its twin)."""
    head = ["arm", "prefill", "token budget", "host load (achieved)", "output tok/s", "vs host", "vs host-overlap",
            "vs host-triton-overlap", *(h for h, _, _ in COLUMNS[1:]), "vs twin", "TTFT p50 twin / this",
            "all tokens = twin", "first tokens = host", "all tokens = host"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rows = []
    for load in loads:
        by_label = {a.label: [r for r in runs if r["label"] == a.label and r["host_load"] == load] for a in arms}
        for arm in arms:
            rs = by_label[arm.label]
            if not rs:
                continue
            base = by_label.get(arm.peer("host").label) or by_label.get(arm.peer("host-torch").label, [])
            host_over = by_label.get(arm.peer("host-overlap").label, [])
            host_triton = by_label.get(arm.peer("host-triton-overlap").label, [])
            plain_name = twin(arm.name)  # (the same arm, no cache, one token a launch)
            plain = by_label.get(arm.peer(plain_name).label, []) if plain_name else []
            n = len(rs[0]["tokens"])
            differ_host = token_differences(rs, base) if rs is not base else []
            differ_plain = token_differences(rs, plain) if plain else []
            first, whole = same_tokens(differ_host, n)
            vs_plain = paired_ratio(rs, plain, "tokps") if plain else "-"
            ttft_cut = paired_ratio(rs, plain, "ttft_p50_ms", invert=True) if plain else "-"
            plain_same = same_tokens(differ_plain, n)[1]
            achieved = [r["host_load_achieved"] for r in rs]
            row = dict(arm=arm.name, label=arm.label, prefill=arm.prefill.value, token_budget=arm.token_budget,
                       host_load=load, host_load_achieved=float(np.median(achieved)),
                       first_tokens_same=first, tokens_same=whole, vs_twin=vs_plain, ttft_cut=ttft_cut,
                       tokens_same_twin=plain_same,
                       differ_from_host=differ_host, differ_from_twin=differ_plain,
                       vs_host=paired_ratio(rs, base, "tokps") if rs is not base else "-",
                       vs_host_overlap=paired_ratio(rs, host_over, "tokps") if rs is not host_over else "-",
                       vs_host_triton_overlap=paired_ratio(rs, host_triton, "tokps") if rs is not host_triton
                       else "-")  # fmt: skip
            for _, key, _ in COLUMNS:
                vals = [r[key] for r in rs]
                row[key] = dict(median=float(np.median(vals)), min=float(min(vals)), max=float(max(vals)))
            rows.append(row)
            cells = [_cell([r[key] for r in rs], fmt) for _, key, fmt in COLUMNS]
            lead = [arm.name, arm.prefill.value, budget_text(arm.token_budget), load_text(load, achieved), cells[0],
                    row["vs_host"], row["vs_host_overlap"], row["vs_host_triton_overlap"]]  # fmt: skip
            lines.append("| " + " | ".join([*lead, *cells[1:], vs_plain, ttft_cut, plain_same, first, whole]) + " |")
    return "\n".join(lines), rows


def series(label: str, load: float) -> str:
    """An arm at a host load in the plots' legends: its label, and its load where it has one."""
    return f"{label} load {load:g}" if load else label


def plot(runs: list[dict], labels: list[str], out: Path, timeline: bool = True) -> None:
    """TTFT and ITL CDFs per arm (every round), and (``timeline``) the last round's step timeline per arm (arms by
    label, at a host load: ``series``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    of = lambda r: series(r["label"], r.get("host_load", 0.0))  # a server's runs (--url) have no host load

    for key, name, log in (("ttft_ms", "TTFT", False), ("itl_ms", "ITL", True)):
        fig, ax = plt.subplots(figsize=(6, 4))
        for arm in labels:
            x = np.sort(np.concatenate([np.asarray(r[key]) for r in runs if of(r) == arm] or [np.zeros(0)]))
            if x.size:
                ax.plot(x, np.arange(1, x.size + 1) / x.size, label=arm)
        ax.set_xlabel(f"{name} (ms)")
        ax.set_ylabel("fraction of " + ("requests" if key == "ttft_ms" else "token gaps"))
        if log:
            ax.set_xscale("log")
        ax.grid(alpha=0.3)
        if ax.lines:  # (no token gaps at all: outputs of one token, as scoring traffic's)
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / f"{name.lower()}_cdf.png", dpi=110)
        plt.close(fig)
    if not timeline:
        return
    last = {arm: [r for r in runs if of(r) == arm][-1] for arm in labels if any(of(r) == arm for r in runs)}
    fig, axes = plt.subplots(3, len(last), figsize=(4.5 * len(last), 7), sharex="col", squeeze=False)
    for j, (arm, r) in enumerate(last.items()):
        t = np.array([s[0] for s in r["steps"]])
        for i, (k, label) in enumerate(((3, "decode rows"), (4, "prompt tokens"), (1, "step ms"))):
            y = np.array([s[k] for s in r["steps"]], float) * (1e3 if k == 1 else 1)
            axes[i, j].plot(t, y, ".", ms=2)
            axes[i, j].set_ylabel(label)
        axes[0, j].set_title(arm, fontsize=9)
        axes[2, j].set_xlabel("time (s)")
        axes[2, j].set_yscale("log")
    fig.tight_layout()
    fig.savefig(out / "timeline.png", dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> list[dict]:
    ap = parser()
    args = ap.parse_args(argv)
    if args.url is not None:
        return main_url(ap, args, argv)
    for name in ("served_model", "goodput", "max_connections", "client_procs", "prompt_text"):  # --url's
        if getattr(args, name) is not None:
            ap.error(f"argument --{name.replace('_', '-')}: applies to a server's traffic, with --url")
    ranks = int(os.environ.get("WORLD_SIZE", "1"))  # under torchrun, the group join_group joins below
    run = setup_run(ap, args, ranks)
    args.out.mkdir(parents=True, exist_ok=True)
    cuda = run.device == "cuda"
    print(f"workload: {run.description}", flush=True)
    host_speed = planner_yardstick()
    tp = join_group(cuda)  # under torchrun: this process's rank of a tensor-parallel group; else None
    lead = tp is None or tp.rank == 0
    if tp is None:
        adapter = build_adapter(args.model, seed=0, device=run.device, dtype=run.dtype)
    else:
        try:
            adapter = build_rank_adapter(args.model, tp, 0, run.device, run.dtype)
        except ValueError as e:
            ap.error(str(e))
    configs = {arm.label: run.config(arm, timing=True) for arm in run.arms}
    engines = {}
    for i, arm in enumerate(run.arms):
        cfg = configs[arm.label]
        try:
            engines[arm.label] = Engine(adapter, cfg) if tp is None else RankEngine(adapter, cfg, tp)
        except ValueError as e:
            ap.error(f"engine {arm.label}: {e}")
        warm = run.warmup.requests(adapter.vocab_size, run.sampling, args.seed + 1, prefix=f"warmup{i}-")
        serve(engines[arm.label], run.warmup, warm, wait=False)  # JIT, allocator, graphs of the shapes it will see
        if lead:
            print(f"built and warmed up {arm.label}", flush=True)
    total = len(run.arms) * len(args.host_load) * sum(w.n for w in run.rounds)
    bar = None
    if not args.no_progress and lead:
        from tqdm import tqdm

        bar = tqdm(total=total, unit="req", desc="traffic", file=sys.stderr)
    width = max(len(a.label) for a in run.arms)
    runs: list[dict] = []
    for rnd in range(args.rounds):
        speed = planner_yardstick(2000)  # the host's speed can drift during a run: each round says where it was
        if lead:
            (bar.write if bar is not None else print)(f"round {rnd}: {speed}")
        order = round_order(run.arms, args.host_load, rnd)
        work = run.rounds[rnd]
        if args.prerun:
            serve(engines[order[0][0].label], work, work.requests(adapter.vocab_size, run.sampling, args.seed + rnd,
                                                               f"pre{rnd}-"))  # fmt: skip
        for arm, load in order:
            eng = engines[arm.label]
            if not lead:
                eng.follow()  # rank 0's timed run
                continue
            if bar is not None:
                bar.set_postfix_str(f"round {rnd} {series(arm.label, load)}")
            r = timed_run(eng, work, work.requests(adapter.vocab_size, run.sampling, args.seed + rnd, f"{rnd}-"),
                          cuda, progress=(lambda: bar.update(1)) if bar is not None else None, load=load)  # fmt: skip
            r.update(arm=arm.name, label=arm.label, prefill=arm.prefill.value, token_budget=arm.token_budget,
                     round=rnd, yardstick=speed)  # fmt: skip
            runs.append(r)
            line = (f"round {rnd} {arm.label:{width}s} host load {load_text(load, [r['host_load_achieved']]):11s} "
                    f"{r['tokps']:7.0f} tok/s  TTFT p50 {r['ttft_p50_ms']:6.0f} ms  "
                    f"ITL p50/p99 {r['itl_p50_ms']:.2f}/{r['itl_p99_ms']:.1f} ms  {r['prefill_passes']} passes of "
                    f"{r['prefill_tokens_per_pass']:.0f} tokens, {r['prefill_ms']:.1f} ms each")  # fmt: skip
            (bar.write if bar is not None else print)(line)
    if bar is not None:
        bar.close()
    if tp is not None:
        tp.leave()
        if not lead:
            return []
    table, rows = summarize(runs, run.arms, args.host_load)
    device_name = torch.cuda.get_device_name() if cuda else "CPU"
    command = "python -m models.bench.traffic " + " ".join(argv if argv is not None else sys.argv[1:])
    resolved = "; ".join(f"{arm.name} {cfg.prefill.value} {budget_text(cfg.token_budget)}"
                         for arm, cfg in zip(run.arms, configs.values(), strict=True))  # fmt: skip
    head = (f"Traffic benchmark on {device_name} (torch {torch.__version__}), {args.model} (random weights, "
            f"{str(run.dtype).removeprefix('torch.')}). Workload: {run.description}. Engine: "
            f"{'' if tp is None else f'tensor parallel over {tp.world} ranks, '}max_running {args.max_running}, "
            f"page size {args.page_size}, context {run.max_seq_len}, prefill graphs: "
            f"{run.knobs['prefill_graphs']} token buckets up to {args.prefill_graph_tokens}, none past the smallest "
            f"that holds an arm's largest pass (each captured at engine build). Arms, each with the prefill placement "
            f"and token budget its engine config resolved "
            f"(budget: prompt tokens a pass, or whole prompts): {resolved}. {args.rounds} rounds, each its own "
            f"draw of the traffic, {'served once untimed first, then ' if args.prerun else ''}timed in every arm, the "
            f"arm order reversed every other round; cells are median [min-max] over rounds, ratios paired by round "
            f"with the host arm at the same placement, budget and host load. Host load: "
            f"{host_load_text(args.host_load)}. Host yardstick: {host_speed}.\n\n"
            f"Command: `{command}`\n\n")  # fmt: skip
    (args.out / "results.md").write_text(head + table + "\n")
    keep = [{k: v for k, v in r.items() if k not in ("tokens", "ttft_ms", "itl_ms", "steps")} for r in runs]
    (args.out / "results.json").write_text(json.dumps(dict(command=command, workload=run.description, rows=rows,
                                                           runs=keep), indent=1))  # fmt: skip
    plot(runs, [series(a.label, load) for a in run.arms for load in args.host_load], args.out)
    print(table)
    return runs


# -- a server's traffic (--url) ------------------------------------------------------------------------------------
def prompt_tokenizer(path: Path | None, traffic: Traffic, vocab: int):
    """``--prompt-text``'s tokenizer (``models.engine.text.Tokenizer``), or None; WorkloadError for a chat's traffic
    or a tokenizer smaller than the vocabulary the prompt ids are drawn from."""
    if path is None:
        return None
    if any(w.after is not None and (w.after >= 0).any() for w in traffic.rounds):
        raise WorkloadError("--prompt-text", "a chat's later turns repeat the token ids the server returned: send "
                                             "a chat's prompts as ids (drop --prompt-text)")  # fmt: skip
    from models.engine.text import Tokenizer, TokenizerError

    try:
        tok = Tokenizer.from_pretrained(path)
    except TokenizerError as e:
        raise WorkloadError("--prompt-text", str(e)) from None
    if len(tok.hf) < vocab:
        raise WorkloadError("--prompt-text", f"the tokenizer in {path} has {len(tok.hf)} tokens, fewer than the "
                                             f"{vocab} the prompt ids are drawn from (--model)")  # fmt: skip
    return tok


ENGINE_ONLY = ("device", "dtype", "arms", "prefill", "token_budget", "max_running", "max_bucket", "page_size",
               "num_pages", "max_seq_len", "prefill_graphs", "prefill_graph_tokens", "host_load")  # fmt: skip


def given_options(ap: argparse.ArgumentParser, args: argparse.Namespace, argv: list[str] | None) -> set[str]:
    """The options (dests) given on the command line, told apart from their defaults by parsing ``argv`` again into a
    namespace whose every field is already set to a marker (argparse fills in only the fields a namespace lacks)."""
    unset = object()
    again = ap.parse_args(argv, argparse.Namespace(**dict.fromkeys(vars(args), unset)))
    return {k for k, v in vars(again).items() if v is not unset}


def main_url(ap: argparse.ArgumentParser, args: argparse.Namespace, argv: list[str] | None) -> list[dict]:
    """``--url``: the traffic sent to an OpenAI-compatible server (module doc); returns each timed round's metrics."""
    from models.bench import remote

    given = given_options(ap, args, argv)
    engine = [f"--{k.replace('_', '-')}" for k in ENGINE_ONLY if k in given]
    if engine:
        ap.error(f"argument --url: the server is measured, no engine is built here: drop {', '.join(engine)}")
    for name in ("ready_timeout", "request_timeout"):
        if not getattr(args, name) > 0:
            ap.error(f"argument --{name.replace('_', '-')}: must be > 0 seconds, got {getattr(args, name)}")
    try:
        check_model(args.model)
        traffic = draw_traffic(args, args.max_running)
        server = remote.connect(args.url, args.served_model, args.ready_timeout)
        if "model" not in given and server.model in MODEL_CONFIGS and server.model.startswith("qwen"):
            args.model = server.model  # the prompt ids are drawn from the served model's vocabulary
        context, whose = ((server.max_model_len, "the server's max_model_len") if server.max_model_len else
                          (model_context(args.model), f"{args.model}'s context"))  # fmt: skip
        if traffic.longest > context:
            raise WorkloadError(traffic.lengths_arg, f"a request of {traffic.longest} tokens (prompt + output) is "
                                                     f"over {whose} of {context}")  # fmt: skip
        vocab, vocabulary = MODEL_CONFIGS[args.model].vocab_size, f"{args.model}'s vocabulary"
        if server.vocab_size is not None and server.vocab_size < vocab:  # (else every larger id is refused)
            vocab, vocabulary = server.vocab_size, f"the server's vocabulary of {server.vocab_size} ids"
        tokenizer = prompt_tokenizer(args.prompt_text, traffic, vocab)
    except ValueError as e:
        ap.error(str(e))
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"workload: {traffic.description}", flush=True)
    sent_as = f", sent as text decoded with {args.prompt_text}'s tokenizer" if tokenizer is not None else ""
    print(f"server: {server.url}, model {server.model}; prompt ids from {vocabulary}{sent_as}", flush=True)
    targets = args.goodput or {}
    runs = remote.run_rounds(server, traffic.rounds, traffic.warmup, traffic.sampling,
                             vocab, args.seed, args.prerun, args.max_connections,
                             args.request_timeout, targets, progress=not args.no_progress,
                             client_procs=args.client_procs or 1, tokenizer=tokenizer)  # fmt: skip
    table, summary = remote.summarize(runs, server)
    command = "python -m models.bench.traffic " + " ".join(argv if argv is not None else sys.argv[1:])
    pre = "served once untimed first (other prompt ids), then " if args.prerun else ""
    head = (f"Traffic benchmark against the server at {server.url}, model {server.model} (prompt ids from "
            f"{vocabulary}{sent_as}). Workload: {traffic.description}. {args.rounds} rounds, each its own "
            f"draw of the traffic, {pre}timed; "
            f"{traffic.warmup.n} warm-up requests before the first. Streaming completions, ignore_eos, each sent at "
            f"its arrival over {'at most ' + str(args.max_connections) if args.max_connections else 'uncapped'} "
            f"connections; times from the request's send (models/bench/remote.py). Goodput targets: "
            f"{remote.targets_text(targets)}. Cells are median [min-max] over rounds.\n\n"
            f"Command: `{command}`\n\n")  # fmt: skip
    (args.out / "results.md").write_text(head + table + "\n")
    keep = [{k: v for k, v in r.items() if k == "request_ttft_ms" or not k.endswith("_ms") or not isinstance(v, list)}
            for r in runs]  # fmt: skip
    (args.out / "results.json").write_text(json.dumps(dict(command=command, url=server.url, model=server.model,
                                                           vocabulary=vocabulary, workload=traffic.description,
                                                           prompt_text=None if tokenizer is None else
                                                           str(args.prompt_text),
                                                           goodput=targets, summary=summary, runs=keep),
                                                      indent=1))  # fmt: skip
    plot(runs, [runs[0]["label"]], args.out, timeline=False)
    print(table)
    return runs


if __name__ == "__main__":
    main()
