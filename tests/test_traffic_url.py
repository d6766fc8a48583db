"""The traffic benchmark against a server (``--url``, models/bench/remote.py): a fake OpenAI-compatible streaming
server in a background thread, whose delays are known, answers the workload; every request is timed within those
delays, generates its max_tokens, counts toward goodput exactly when it meets the targets, and a request the server
fails is reported failed with its error. The requests are the in-process arms' (the same seeds), and bad arguments
end in one line."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time

import numpy as np
import pytest

pytest.importorskip("httpx")
fastapi = pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")

from fastapi.responses import JSONResponse, StreamingResponse  # noqa: E402

from models.bench import traffic  # noqa: E402
from models.engine.adapters import MODEL_CONFIGS  # noqa: E402

MODEL = "qwen3_5-tiny"
FIRST_S, SLOW_FIRST_S = 0.005, 0.600  # before the first token; a prompt of SLOW_PROMPT tokens or more waits longer
TOKEN_S, SLOW_TOKEN_S = 0.002, 0.100  # between tokens; a request of SLOW_OUT tokens streams slower
TARGETS = "ttft:300,tpot:50"  # wide of both (a loaded CI machine adds tens of ms), so the slow ones miss by design
SLOW_PROMPT, SLOW_OUT = 40, 7
HTTP_500, CUT, BROKEN = 13, 17, 19  # prompt lengths the server fails: a 500, a stream without [DONE], a dropped one
NO_IDS = 23  # a prompt length the server answers without token ids even when asked (return_token_ids)
ENDED: list = []  # (perf_counter time, prompt) of every stream the server ended, its last event sent
AUTHORIZATION: list = []  # every completion request's Authorization header (None: none)


def token_id(prompt: list[int], i: int) -> int:
    """The fake server's i-th output token for a prompt (it returns them where asked: return_token_ids)."""
    return (len(prompt) * 7 + i * 3) % 100


def fake_app(seen: list, key: str | None = None, vocab: int | None = None):
    """An OpenAI-compatible server streaming one chunk per token after known delays (module constants); with
    ``key``, its model list answers 401 to a request without it; with ``vocab``, /tokenizer_info says its
    vocabulary."""
    app = fastapi.FastAPI()

    if vocab is not None:

        @app.get("/tokenizer_info")
        async def tokenizer_info():
            return {"tokenizer_class": "x", "vocab_size": vocab}

    @app.get("/health")
    async def health():
        return {}

    @app.get("/v1/models")
    async def models(request: fastapi.Request):
        if key is not None and request.headers.get("authorization") != f"Bearer {key}":
            return JSONResponse({"error": {"message": "a key", "type": "authentication_error"}}, status_code=401)
        return {"object": "list", "data": [{"id": MODEL, "object": "model", "max_model_len": 4096}]}

    @app.post("/v1/completions")
    async def completions(request: fastapi.Request):
        body = await request.json()
        seen.append((time.perf_counter(), body))
        AUTHORIZATION.append(request.headers.get("authorization"))
        n, prompt = body["max_tokens"], body["prompt"]
        if isinstance(prompt, str):  # (--prompt-text with a word-level tokenizer: a word a token)
            prompt = prompt.split()
        if len(prompt) == HTTP_500:
            return JSONResponse({"error": {"message": "the engine fell over", "type": "internal_error",
                                           "param": None, "code": 500}}, status_code=500)  # fmt: skip
        first = SLOW_FIRST_S if len(prompt) >= SLOW_PROMPT else FIRST_S
        gap = SLOW_TOKEN_S if n == SLOW_OUT else TOKEN_S

        async def stream():
            if body.get("echo"):  # the prompt at once, its first token's logprob null (OpenAI's echo)
                rest = len(prompt) - 1
                echo = {"index": 0, "text": " ".join(map(str, prompt)), "finish_reason": None,
                        "logprobs": {"tokens": [str(t) for t in prompt], "token_logprobs": [None] + [-1.0] * rest,
                                     "top_logprobs": [None] + [{"x": -1.0}] * rest,
                                     "text_offset": list(range(len(prompt)))}}  # fmt: skip
                yield f"data: {json.dumps({'id': 'cmpl-1', 'object': 'text_completion', 'choices': [echo]})}\n\n"
            await asyncio.sleep(first)
            for i in range(n):
                if i:
                    await asyncio.sleep(gap)
                if i == 2 and len(prompt) == CUT:
                    return  # the stream ends early, no [DONE]
                if i == 2 and len(prompt) == BROKEN:
                    raise RuntimeError("the connection drops")
                chunk = {"id": "cmpl-1", "object": "text_completion", "model": MODEL,
                         "choices": [{"index": 0, "text": f" t{i}", "finish_reason": "length" if i == n - 1 else None}]}
                if body.get("return_token_ids") and len(prompt) != NO_IDS:
                    chunk["choices"][0]["token_ids"] = [token_id(prompt, i)]
                yield f"data: {json.dumps(chunk)}\n\n"  # fmt: skip
            usage = {"prompt_tokens": len(prompt), "completion_tokens": n, "total_tokens": len(prompt) + n}
            yield f"data: {json.dumps({'id': 'cmpl-1', 'choices': [], 'usage': usage})}\n\n"
            ENDED.append((time.perf_counter(), list(prompt)))
            yield "data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    return app


@contextlib.contextmanager
def serving(app):
    """``app`` on a free port of 127.0.0.1 in a background thread: its URL, until the block ends."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    srv = uvicorn.Server(uvicorn.Config(app, log_level="critical", timeout_graceful_shutdown=1))
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not srv.started and time.monotonic() < deadline:
        time.sleep(0.01)
    assert srv.started, "the fake server did not start"
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        srv.should_exit = True
        thread.join(5)
        sock.close()


@pytest.fixture(scope="module")
def server():
    """(url, the request bodies it received with their times): the fake server on a free port of 127.0.0.1."""
    seen: list = []
    with serving(fake_app(seen)) as url:
        yield url, seen


def write_trace(path, rows):
    path.write_text("".join(json.dumps(dict(arrival_s=a, prompt_len=p, output_len=o)) + "\n" for a, p, o in rows))


# (arrival s, prompt tokens, output tokens): fast ones, a slow first token, slow tokens, the three failures
TRACE = [(0.0, 4, 5), (0.0, 6, 3), (0.01, 5, 1), (0.02, SLOW_PROMPT, 4), (0.02, 8, SLOW_OUT), (0.03, 9, 6),
         (0.03, HTTP_500, 4), (0.04, CUT, 5), (0.04, BROKEN, 5), (0.05, 3, 2), (0.06, SLOW_PROMPT + 5, 3),
         (0.06, 7, 4)]  # fmt: skip
FAILS = {HTTP_500: "HTTP 500: the engine fell over", CUT: "the stream ended before data: [DONE]",
         BROKEN: "HTTPError: the server closed the connection in the middle of the response"}  # fmt: skip


def test_every_request_is_timed_within_the_servers_delays_and_goodput_counts_the_ones_on_target(server, tmp_path):
    url, seen = server
    seen.clear()
    write_trace(tmp_path / "t.jsonl", TRACE)
    out = tmp_path / "out"
    runs = traffic.main(["--url", url, "--trace", str(tmp_path / "t.jsonl"), "--rounds", "1", "--warmup", "0",
                         "--no-prerun", "--no-progress", "--goodput", TARGETS, "--out", str(out)])
    assert len(runs) == 1 and len(seen) == len(TRACE)
    r = runs[0]
    assert r["requests"] == 12 and r["failed"] == 3 and r["completed"] == 9
    failed = dict(r["errors"])
    for i, (_, p, o) in enumerate(TRACE):
        if p in FAILS:
            assert FAILS[p] in failed[i], failed[i]
            continue
        assert i not in failed and r["output_lens"][i] == o == r["max_tokens"][i]  # ignore_eos: exactly max_tokens
    ok = [(p, o) for _, p, o in TRACE if p not in FAILS]
    ttft, e2el = np.array(r["ttft_ms"]), np.array(r["e2el_ms"])
    first = np.array([SLOW_FIRST_S if p >= SLOW_PROMPT else FIRST_S for p, _ in ok]) * 1e3
    gap = np.array([SLOW_TOKEN_S if o == SLOW_OUT else TOKEN_S for _, o in ok]) * 1e3
    outs = np.array([o for _, o in ok])
    # at least the server's waits (measured from the send, before the server got it), and not far over them; each
    # wait less 1 ms: the fake server runs on uvloop, whose timers fire on a millisecond clock (a 5 ms sleep measured
    # 4.19 ms at the least on the development CPU), which a client that stamps each chunk as it arrives can see
    assert (ttft >= first - 1).all() and (ttft < first + 500).all(), ttft
    assert 0 < r["headers_mean_ms"] < FIRST_S * 1e3  # (the fake sends its headers at once, its first token later)
    assert (e2el >= first + (outs - 1) * gap - outs).all() and (e2el < first + (outs - 1) * gap + 1000).all(), e2el
    assert len(r["itl_ms"]) == int((outs - 1).sum())  # a gap for every token after a request's first
    tpot = (e2el - ttft)[outs > 1] / (outs[outs > 1] - 1)
    assert r["tpot_ms"] == pytest.approx(tpot.tolist())
    slow = gap[outs > 1] == SLOW_TOKEN_S * 1e3  # (chunks 2 ms apart may reach a busy client in one read)
    assert (np.array(r["tpot_ms"])[slow] >= 0.5 * SLOW_TOKEN_S * 1e3).all()
    # goodput: the completed requests with a fast first token and fast tokens, by design
    good = sum(p < SLOW_PROMPT and o != SLOW_OUT for p, o in ok)
    assert good == 6 and r["good"] == good
    assert r["goodput_frac"] == pytest.approx(good / 12) and r["goodput_reqps"] == pytest.approx(good / r["wall_s"])
    assert r["output_tokens"] == outs.sum() and r["tokps"] == pytest.approx(outs.sum() / r["wall_s"])
    assert r["lag_max_ms"] < 50  # each request sent at its arrival
    report = (out / "results.md").read_text()
    assert f"against the server at {url}, model {MODEL}" in report and "TTFT <= 300 ms, TPOT <= 50 ms" in report
    assert f"| {url} | {MODEL} | 12 | 3 |" in report and "| TPOT |" in report and "| E2EL |" in report
    assert "Failed requests (3 over 1 round)" in report and "1 x HTTP 500: the engine fell over" in report
    data = json.loads((out / "results.json").read_text())
    assert data["url"] == url and data["model"] == MODEL and data["goodput"] == {"ttft": 300.0, "tpot": 50.0}
    assert data["summary"]["goodput_frac"]["median"] == pytest.approx(0.5)
    assert (out / "ttft_cdf.png").stat().st_size > 1000 and not (out / "timeline.png").exists()


def test_a_target_of_each_kind_counts_exactly_the_requests_that_meet_it(server, tmp_path):
    """itl (every gap of the request) and e2el targets, and a request of one token (TPOT 0, as vLLM counts it)."""
    from models.bench.remote import Outcome, meets

    fast = Outcome(4, 3, ttft_s=0.01, e2el_s=0.025, itl_s=[0.005, 0.005, 0.005], output_tokens=4)
    spiky = Outcome(4, 3, ttft_s=0.01, e2el_s=0.025, itl_s=[0.001, 0.013, 0.001], output_tokens=4)
    one = Outcome(1, 3, ttft_s=0.01, e2el_s=0.01, output_tokens=1)
    bad = Outcome(4, 3, error="HTTP 500")
    assert fast.tpot_s == pytest.approx(0.005) and one.tpot_s == 0.0
    assert [meets(o, {"itl": 10}) for o in (fast, spiky, one, bad)] == [True, False, True, False]
    assert [meets(o, {"tpot": 5.5, "e2el": 20}) for o in (fast, spiky, one, bad)] == [False, False, True, False]
    assert [meets(o, {"tpot": 5.5}) for o in (fast, spiky, one)] == [True, True, True]


def test_the_requests_are_the_in_process_arms_requests(server, tmp_path):
    """Two rounds of drawn traffic with sampled requests, stop tokens and scored prompts: the timed requests carry the
    prompt ids, lengths and sampling the in-process arms serve (the same seeds, the served model's vocabulary; a
    scored prompt as echo with logprobs 1), in arrival order; the warm-up and the untimed prerun carry other prompt
    ids."""
    url, seen = server
    seen.clear()
    argv = ["--num-requests", "6", "--rate", "200", "--prompt-len", "uniform:20,30", "--gen-len", "uniform:2,6",
            "--sampled-frac", "0.5", "--stop-frac", "0.5", "--scored-frac", "0.5", "--rounds", "2", "--warmup", "2",
            "--no-progress"]  # fmt: skip
    runs = traffic.main(["--url", url, *argv, "--out", str(tmp_path / "out")])
    assert [r["failed"] for r in runs] == [0, 0]
    args = traffic.parser().parse_args([*argv, "--model", MODEL, "--out", "x"])
    drawn = traffic.draw_traffic(args, args.max_running)
    vocab = MODEL_CONFIGS[MODEL].vocab_size
    n_warm = drawn.warmup.n
    assert n_warm == 2 + 32 and len(seen) == n_warm + 2 * (6 + 6)  # warm-up, then each round untimed and timed
    bodies = [b for _, b in seen]
    untimed = {tuple(b["prompt"]) for b in bodies[:n_warm] + bodies[n_warm:n_warm + 6] + bodies[n_warm + 12:-6]}
    for rnd, work in enumerate(drawn.rounds):
        timed = {tuple(b["prompt"]): b for b in bodies[n_warm + 12 * rnd + 6:n_warm + 12 * rnd + 12]}
        for req in work.requests(vocab, drawn.sampling, args.seed + rnd, f"{rnd}-"):
            sp, b = req.sampling, timed[tuple(req.prompt)]
            assert b["prompt"] == list(req.prompt) and max(b["prompt"]) < vocab and tuple(req.prompt) not in untimed
            assert (b["max_tokens"], b["temperature"], b["ignore_eos"], b["stream"]) == (sp.max_tokens,
                                                                                          sp.temperature, True, True)
            assert b["stream_options"] == {"include_usage": True} and b["model"] == MODEL
            assert b.get("seed") == (sp.seed if sp.temperature > 0 else None)
            assert b.get("stop_token_ids", []) == list(sp.stop_token_ids)
            scored = sp.prompt_logprobs is not None
            assert (b.get("echo", False), b.get("logprobs")) == (scored, 1 if scored else None)
        assert runs[rnd]["output_lens"] == work.output_len.tolist()
    assert any(b.get("stop_token_ids") for b in bodies) and any(b["temperature"] > 0 for b in bodies)
    assert any(b.get("echo") for b in bodies) and not all(b.get("echo") for b in bodies)


def test_prompt_ids_come_from_the_servers_vocabulary_where_it_is_smaller(tmp_path, capsys):
    """A server whose /tokenizer_info says 50 ids: every prompt and stop id sent is below 50 (drawn from --model's
    vocabulary they would be refused), and the report says whose vocabulary it was."""
    seen: list = []
    with serving(fake_app(seen, vocab=50)) as url:
        argv = ["--url", url, "--num-requests", "8", "--rate", "inf", "--prompt-len", "uniform:5,12", "--gen-len",
                "fixed:2", "--stop-frac", "1", "--rounds", "1", "--warmup", "1", "--no-progress"]  # fmt: skip
        runs = traffic.main([*argv, "--out", str(tmp_path / "out")])
    assert runs[0]["failed"] == 0 and MODEL_CONFIGS[MODEL].vocab_size > 50
    ids = [t for _, b in seen for t in b["prompt"] + b.get("stop_token_ids", [])]
    assert max(ids) < 50 and any(b.get("stop_token_ids") for _, b in seen)
    assert "prompt ids from the server's vocabulary of 50 ids" in capsys.readouterr().out


def test_an_api_key_in_the_environment_goes_with_every_request(server, tmp_path, monkeypatch):
    """$OPENAI_API_KEY (as vllm bench serve reads it): every request the load generator sends carries it as a bearer
    key; without it, none carries any."""
    url, _ = server
    argv = ["--url", url, "--num-requests", "3", "--rate", "inf", "--prompt-len", "fixed:4", "--gen-len", "fixed:2",
            "--rounds", "1", "--warmup", "1", "--no-progress", "--out", str(tmp_path / "o")]
    monkeypatch.setenv("OPENAI_API_KEY", "sekrit")
    AUTHORIZATION.clear()
    traffic.main(argv)
    assert AUTHORIZATION and set(AUTHORIZATION) == {"Bearer sekrit"}
    monkeypatch.delenv("OPENAI_API_KEY")
    AUTHORIZATION.clear()
    traffic.main(argv)
    assert AUTHORIZATION and set(AUTHORIZATION) == {None}


def test_a_server_that_wants_a_key_is_told_in_one_line(tmp_path, capsys):
    """A server whose API answers 401 without a key: the load generator says to set $OPENAI_API_KEY."""
    with serving(fake_app([], key="sekrit")) as url, pytest.raises(SystemExit):
        traffic.main(["--url", url, "--num-requests", "1", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "answers 401: it wants an API key (set OPENAI_API_KEY)" in err, err


def test_an_echoed_prompt_is_not_timed_as_a_token(server, tmp_path):
    """``--scored-frac 1``: every request asks for its prompt back with logprobs; the server sends the echo at once and
    the first token after its delay: each TTFT is the first token's, and the gaps are the tokens'."""
    url, _ = server
    argv = ["--num-requests", "4", "--rate", "inf", "--prompt-len", "uniform:5,9", "--gen-len", "fixed:3",
            "--scored-frac", "1", "--rounds", "1", "--warmup", "0", "--no-prerun", "--no-progress"]
    (r,) = traffic.main(["--url", url, *argv, "--out", str(tmp_path / "o")])
    assert r["failed"] == 0 and len(r["itl_ms"]) == 4 * 2, r
    assert min(r["ttft_ms"]) >= FIRST_S * 1e3 - 1, r["ttft_ms"]  # (the fake's timers: a millisecond's grain)


def test_prompts_sent_as_text_are_their_ids_decoded_and_count_what_they_encode_to(server, tmp_path):
    """``--prompt-text``: every timed prompt goes as text, the in-process arms' prompt ids decoded with the tokenizer
    given (a word-level one: a word a token, its special tokens dropped), and the report counts the tokens that text
    encodes to."""
    from models.bench.make_checkpoint import word_tokenizer
    from models.engine.text import Tokenizer

    url, seen = server
    seen.clear()
    vocab = MODEL_CONFIGS[MODEL].vocab_size
    word_tokenizer(vocab).save_pretrained(tmp_path / "tok")
    tok = Tokenizer.from_pretrained(tmp_path / "tok")
    argv = ["--num-requests", "5", "--rate", "inf", "--prompt-len", "uniform:20,30", "--gen-len", "fixed:3",
            "--rounds", "1", "--warmup", "0", "--no-prerun", "--no-progress"]
    (r,) = traffic.main(["--url", url, *argv, "--prompt-text", str(tmp_path / "tok"), "--out", str(tmp_path / "o")])
    args = traffic.parser().parse_args([*argv, "--model", MODEL, "--out", "x"])
    drawn = traffic.draw_traffic(args, args.max_running)
    texts = [tok.decode(q.prompt) for q in drawn.rounds[0].requests(vocab, drawn.sampling, args.seed, "0-")]
    assert r["failed"] == 0 and sorted(b["prompt"] for _, b in seen) == sorted(texts)
    assert r["prompt_tokens"] == sum(len(tok.encode(t)) for t in texts) == sum(len(t.split()) for t in texts)
    assert "sent as text decoded with" in (tmp_path / "o" / "results.md").read_text()


def test_timed_rounds_run_with_the_clients_collector_off(server, tmp_path, monkeypatch):
    """The load generator's timed rounds run with its cyclic garbage collector off (a collection of the oldest
    generation mid-round stamps every chunk that arrives meanwhile late), its warm-up and untimed rounds with it on;
    the collector's state before is restored after."""
    import gc

    from models.bench import remote

    url, _ = server
    seen = []
    send = remote.send_round

    async def watched(*args, **kwargs):
        seen.append(gc.isenabled())
        return await send(*args, **kwargs)

    monkeypatch.setattr(remote, "send_round", watched)
    traffic.main(["--url", url, "--num-requests", "3", "--rate", "inf", "--prompt-len", "fixed:4", "--gen-len",
                  "fixed:2", "--rounds", "2", "--warmup", "2", "--no-progress", "--out", str(tmp_path / "o")])
    assert seen == [True, True, False, True, False] and gc.isenabled()  # warm-up, then each round untimed and timed
    gc.disable()
    try:
        with remote.collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # (off before: left off)
    finally:
        gc.enable()


@pytest.mark.parametrize("procs", [1, 2])
def test_chats_are_closed_loops_whose_prompts_repeat_the_ids_the_server_returned(server, tmp_path, procs):
    """3 users x 3 turns (over one client process and over two): each later turn's prompt is the previous turn's
    prompt, the token ids the server returned for it and the in-process arms' new message, sent only after the
    previous turn's stream ended plus the think time; only a turn that a later one continues asks for token ids."""
    url, seen = server
    seen.clear()
    ENDED.clear()
    argv = ["--shape", "chat", "--users", "3", "--turns", "3", "--prompt-len", "fixed:4", "--gen-len", "fixed:3",
            "--think-s", "0.02", "--rate", "100", "--rounds", "1", "--warmup", "0", "--no-prerun", "--no-progress"]
    runs = traffic.main(["--url", url, *argv, "--client-procs", str(procs), "--out", str(tmp_path / "out")])
    (r,) = runs
    assert r["failed"] == 0 and r["requests"] == 9 and r["prompt_tokens"] == 3 * (4 + 11 + 18)
    args = traffic.parser().parse_args([*argv, "--model", MODEL, "--out", "x"])
    work = traffic.draw_traffic(args, args.max_running).rounds[0]
    reqs = work.requests(MODEL_CONFIGS[MODEL].vocab_size, traffic.Sampling(), args.seed, "0-")
    got = {tuple(b["prompt"]): (t, b) for t, b in seen}
    ended = {tuple(p): t for t, p in ENDED}
    assert len(got) == 9
    for u in range(3):
        prompt: list[int] = []
        prev: list[int] = []
        for k in range(3):
            j = 3 * u + k
            prompt = prompt + list(reqs[j].prompt)
            t, b = got[tuple(prompt)]  # the history, then its own message
            assert b.get("return_token_ids", False) == (k < 2)
            if k:
                assert t >= ended[tuple(prev)] + 0.02  # sent after the previous turn ended and the think time
            prev = prompt
            prompt = prompt + [token_id(prompt, i) for i in range(3)]
    assert "3 users x 3 turns, messages fixed:4, replies fixed:3, think 0.02 s" in (tmp_path / "out" /
                                                                                   "results.md").read_text()


def test_a_traces_prefixes_go_to_the_server_and_a_turn_without_the_ids_before_it_fails(server, tmp_path):
    url, seen = server
    seen.clear()
    rows = [dict(arrival_s=0.0, prompt_len=5, output_len=2, session="a", turn=0),
            dict(arrival_s=0.0, prompt_len=3, output_len=2, session="a", turn=1),
            dict(arrival_s=0.0, prompt_len=NO_IDS, output_len=2, session="b", turn=0),
            dict(arrival_s=0.0, prompt_len=3, output_len=2, session="b", turn=1),
            dict(arrival_s=0.01, prompt_len=3, output_len=2, prefix_id="s", prefix_len=6),
            dict(arrival_s=0.02, prompt_len=2, output_len=2, prefix_id="s", prefix_len=6)]  # fmt: skip
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
    runs = traffic.main(["--url", url, "--trace", str(tmp_path / "t.jsonl"), "--rounds", "1", "--warmup", "0",
                         "--no-prerun", "--no-progress", "--out", str(tmp_path / "out")])  # fmt: skip
    (r,) = runs
    assert r["failed"] == 1 and len(seen) == 5
    ((i, err),) = r["errors"]
    assert i == 3 and "the server returned no token ids for the turn before (return_token_ids)" in err
    lens = sorted(len(b["prompt"]) for _, b in seen)
    assert lens == [5, 8, 9, 5 + 2 + 3, NO_IDS]
    a, b = (x["prompt"] for _, x in seen if len(x["prompt"]) in (8, 9))
    assert a[:6] == b[:6]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("args, words", [
    (["--goodput", "ttft"], "argument --goodput: 'ttft': targets are NAME:MS"),
    (["--goodput", "ttft=500"], "argument --goodput: 'ttft=500': targets are NAME:MS"),
    (["--goodput", "speed:5"], "argument --goodput: 'speed:5': targets are NAME:MS, comma-separated, NAME one of "
                               "ttft, tpot, itl, e2el"),
    (["--goodput", "ttft:fast"], "argument --goodput: 'ttft:fast': 'fast' is not a number of ms"),
    (["--goodput", "tpot:-5"], "argument --goodput: 'tpot:-5': a target must be a number of ms > 0"),
    (["--goodput", "ttft:5,ttft:6"], "argument --goodput: ttft is named twice"),
    (["--goodput", ""], "argument --goodput: '': targets are NAME:MS"),
    (["--arms", "resident-torch", "--max-running", "32"], "argument --url: the server is measured, no engine is "
                                                          "built here: drop --arms, --max-running"),
    (["--device", "cpu"], "argument --url: the server is measured, no engine is built here: drop --device"),
    (["--host-load", "0.3"], "argument --url: the server is measured, no engine is built here: drop --host-load"),
    (["--ready-timeout", "0"], "argument --ready-timeout: must be > 0 seconds"),
    (["--gen-len", "gauss:3"], "argument --gen-len:"),
    (["--served-model", "nope"], "argument --served-model: 'nope' is not served at"),
    (["--prompt-len", "fixed:4000", "--gen-len", "fixed:200"], "argument --prompt-len/--gen-len: a request of 4200 "
                                                               "tokens (prompt + output) is over the server's "
                                                               "max_model_len of 4096"),
    (["--prompt-text", "/nowhere"], "argument --prompt-text: /nowhere: no tokenizer.json or tokenizer_config.json"),
    (["--prompt-text", "/nowhere", "--shape", "chat", "--users", "2"], "argument --prompt-text: a chat's later turns "
                                                                       "repeat the token ids the server returned"),
])  # fmt: skip
def test_bad_arguments_with_a_url_end_in_one_line(server, args, words, tmp_path, capsys):
    url, _ = server
    with pytest.raises(SystemExit) as info:
        traffic.main(["--url", url, *args, "--no-progress", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert err.count("\n") == 1 and err.startswith("python -m models.bench.traffic: error: ")
    assert words in err, err


@pytest.mark.parametrize("args, words", [
    (["--url", "127.0.0.1:8000"], "argument --url: '127.0.0.1:8000' is not an http:// or https:// URL"),
    (["--url", "http://127.0.0.1:{port}", "--ready-timeout", "0.3"], "argument --url: no server answered at "
                                                                     "http://127.0.0.1:{port} within 0.3 s"),
    (["--goodput", "ttft:500"], "argument --goodput: applies to a server's traffic, with --url"),
    (["--prompt-text", "/tmp"], "argument --prompt-text: applies to a server's traffic, with --url"),
])  # fmt: skip
def test_no_server_or_no_url_ends_in_one_line(args, words, tmp_path, capsys):
    port = _free_port()  # nothing listens there
    with pytest.raises(SystemExit) as info:
        traffic.main([a.format(port=port) for a in args] + ["--no-progress", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and words.format(port=port) in err, err


def test_server_costs_are_each_counters_difference_over_the_round():
    """``remote.server_costs`` from two reads of a server's counters: CPU a token, a decode step's and a pass's wall
    time, tokens a pass, and the means of the intake and server-side TTFT histograms over the round (sum / count
    differences); NaN where the server does not say."""
    from models.bench.remote import SERVER_COUNTERS, server_costs

    before = {k: 1.0 for k in SERVER_COUNTERS}
    step = {"process_cpu_seconds_total": 0.02, "resplan_generation_tokens_total": 1000,
            "resplan_engine_decode_steps": 40, "resplan_engine_decode_step_seconds": 0.08,
            "resplan_engine_decode_steps_beside_pass": 10, "resplan_engine_intake_seconds_sum": 0.03,
            "resplan_engine_intake_seconds_count": 10, "resplan_engine_prefill_passes": 4,
            "resplan_engine_prefill_tokens": 2400, "resplan_engine_prefill_pass_seconds": 0.044,
            "resplan_time_to_first_token_seconds_sum": 1.5, "resplan_time_to_first_token_seconds_count": 10}
    after = {k: before[k] + step.get(k, 0.0) for k in SERVER_COUNTERS}
    c = server_costs(before, after)
    assert c["front_cpu_us_token"] == pytest.approx(20.0) and c["engine_decode_step_ms"] == pytest.approx(2.0)
    assert c["engine_beside_share"] == pytest.approx(0.25) and c["engine_intake_ms"] == pytest.approx(3.0)
    assert c["engine_tokens_per_pass"] == pytest.approx(600.0) and c["engine_pass_ms"] == pytest.approx(11.0)
    assert c["server_ttft_mean_ms"] == pytest.approx(150.0)
    old = {k: v for k, v in before.items() if "prefill" not in k and "first_token" not in k}  # an older server
    c = server_costs(old, {k: after[k] for k in old})
    assert np.isnan(c["engine_pass_ms"]) and np.isnan(c["server_ttft_mean_ms"])
    assert c["engine_intake_ms"] == pytest.approx(3.0)
