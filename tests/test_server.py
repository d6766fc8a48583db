"""The OpenAI-compatible server, live: ``python -m models.server`` on a tiny checkpoint directory (made here with
transformers and tokenizers), its engine core in a process of its own, driven by the real ``openai`` client and by
raw HTTP. Text equals ``generate``'s for the same seed (whole and streamed, completions and chat), usage counts, stop
strings split across tokens, ``n``, a disconnect that frees the request's pages within a step, 50 concurrent streams,
every bad input answered 400 (or 404) in OpenAI's error object with the server still serving, ``/metrics`` parsed by
prometheus_client, ``--max-waiting`` answered 503 with Retry-After, SIGTERM draining the running requests, and two
front-end processes over one engine (``--front-ends``) sharing the port and summing their metrics.

Every server binds 127.0.0.1 on a free port and is stopped by the test that started it; every wait is bounded."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from checkpoints import WHISPER_SPECIALS, save_qwen, save_whisper, tone, write_wav

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from models.engine.text import Tokenizer  # noqa: E402
from models.server.metrics import Metrics  # noqa: E402

START_TIMEOUT_S = 120
PROMPT = "the quick brown fox"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A ``python -m models.server`` subprocess on 127.0.0.1."""

    def __init__(self, model_dir, *extra: str) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen([sys.executable, "-m", "models.server", "--model-dir", str(model_dir), "--port",
                                      str(self.port), "--no-progress", *extra], env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited: {self.stop()}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("the server did not become healthy in time")

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc.stdout.closed:
            return ""
        out = self.proc.stdout.read()
        self.proc.stdout.close()
        return out

    def metrics(self) -> dict[str, float]:
        text = httpx.get(self.url + "/metrics", timeout=5).text
        return {s.name + ("" if not s.labels else str(sorted(s.labels.items()))): s.value
                for fam in text_string_to_metric_families(text) for s in fam.samples}  # fmt: skip


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return save_qwen(tmp_path_factory.mktemp("server") / "qwen", eos=0)


@pytest.fixture(scope="module")
def server(ckpt):
    s = Server(ckpt)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def api(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def tok(ckpt):
    return Tokenizer.from_pretrained(ckpt)


def _generate(ckpt, capsys, *args: str) -> str:
    """``python -m models.generate``'s text for one prompt (it streams the text to stdout, then a newline)."""
    from models.generate import main

    assert main(["--model-dir", str(ckpt), "--ignore-eos", *args]) == 0
    return capsys.readouterr().out[:-1]


@pytest.mark.parametrize("sampling", [[], ["--temperature", "0.8", "--seed", "7"]], ids=["greedy", "seeded"])
def test_completions_text_equals_generates(server, api, ckpt, capsys, sampling):
    want = _generate(ckpt, capsys, "--prompt", PROMPT, "--max-tokens", "12", *sampling)
    kw = dict(temperature=0.8, seed=7) if sampling else dict(temperature=0.0)
    whole = api.completions.create(model="qwen", prompt=PROMPT, max_tokens=12, extra_body={"ignore_eos": True}, **kw)
    assert whole.choices[0].text == want and whole.choices[0].finish_reason == "length"
    stream = api.completions.create(model="qwen", prompt=PROMPT, max_tokens=12, stream=True,
                                    extra_body={"ignore_eos": True}, **kw)  # fmt: skip
    assert "".join(c.choices[0].text for c in stream if c.choices) == want


def test_chat_completions_text_equals_generates_and_usage_counts(server, api, ckpt, capsys, tok):
    want = _generate(ckpt, capsys, "--chat", "--prompt", "hello there", "--max-tokens", "10")
    msgs = [{"role": "user", "content": "hello there"}]
    whole = api.chat.completions.create(model="qwen", messages=msgs, max_tokens=10, temperature=0,
                                        extra_body={"ignore_eos": True})  # fmt: skip
    assert whole.choices[0].message.content == want and whole.choices[0].message.role == "assistant"
    assert whole.usage.prompt_tokens == len(tok.chat(msgs)) and whole.usage.completion_tokens == 10
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + 10
    chunks = list(api.chat.completions.create(model="qwen", messages=msgs, max_completion_tokens=10, temperature=0,
                                              stream=True, stream_options={"include_usage": True},
                                              extra_body={"ignore_eos": True}))  # fmt: skip
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    assert all(c.usage is None for c in chunks[:-1])
    counted = list(api.chat.completions.create(  # vLLM's continuous usage: every chunk counts the tokens so far
        model="qwen", messages=msgs, max_completion_tokens=10, temperature=0, stream=True, extra_body={
            "ignore_eos": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}))
    assert "".join(c.choices[0].delta.content or "" for c in counted if c.choices) == want
    so_far = [c.usage.completion_tokens for c in counted]
    assert so_far == sorted(so_far) and so_far[0] == 0 and so_far[-1] == 10, so_far
    assert {c.usage.prompt_tokens for c in counted} == {whole.usage.prompt_tokens}


def test_min_tokens_holds_back_the_stop_token_the_model_would_draw_first(server, api, ckpt, tok):
    """The greedy first token made a stop token: without min_tokens the output is that token; with min_tokens 3 it
    is at least 3 tokens, the engine's own output for the same request (the engine's tests check it against
    transformers' min_new_tokens)."""
    from models.engine import Engine, EngineConfig, Request, SamplingParams

    engine = Engine.from_pretrained(ckpt, EngineConfig(device="cpu", max_seq_len=64))
    prompt = [5, 6, 7, 8]
    first = engine.run([Request(prompt, SamplingParams(max_tokens=1, ignore_eos=True))])[0].tokens[0]
    held = SamplingParams(max_tokens=6, stop_token_ids=(first,), ignore_eos=True, min_tokens=3)
    want = engine.run([Request(prompt, held)])[0].tokens
    kw = dict(model="qwen", prompt=prompt, max_tokens=6, temperature=0)
    plain = api.completions.create(**kw, extra_body={"ignore_eos": True, "stop_token_ids": [first]})
    assert plain.usage.completion_tokens == 1 and plain.choices[0].finish_reason == "stop"
    got = api.completions.create(**kw, extra_body={"ignore_eos": True, "stop_token_ids": [first], "min_tokens": 3})
    assert got.usage.completion_tokens == len(want) >= 3 and want[0] != first
    assert got.choices[0].text == tok.decode(want)


def test_a_stop_string_split_across_tokens_ends_the_text_before_it(server, api, tok):
    ids = tok.encode(PROMPT)
    full = api.completions.create(model="qwen", prompt=ids, max_tokens=24, temperature=0,
                                  extra_body={"ignore_eos": True})  # fmt: skip
    text = full.choices[0].text
    # the tokens' texts, to find a stop string that begins in one token and ends in the next
    gen = api.completions.create(model="qwen", prompt=ids, max_tokens=24, temperature=0,
                                 extra_body={"ignore_eos": True}, stream=True)  # fmt: skip
    pieces = [c.choices[0].text for c in gen if c.choices and c.choices[0].text]
    bounds = [sum(map(len, pieces[:i])) for i in range(1, len(pieces))]
    cut = next(b for b in bounds if 2 <= b <= len(text) - 2 and text.find(text[b - 2 : b + 2]) == b - 2)
    stop = text[cut - 2 : cut + 2]
    for stream in (False, True):
        r = api.completions.create(model="qwen", prompt=ids, max_tokens=24, temperature=0, stop=[stop, "\x00zz"],
                                   stream=stream, extra_body={"ignore_eos": True})  # fmt: skip
        if stream:
            chunks = [c for c in r if c.choices]
            got, reason = "".join(c.choices[0].text for c in chunks), chunks[-1].choices[0].finish_reason
        else:
            got, reason = r.choices[0].text, r.choices[0].finish_reason
        assert (got, reason) == (text[: cut - 2], "stop"), stream


def test_n_choices_are_the_seeds_of_generate(server, api, ckpt, capsys):
    r = api.completions.create(model="qwen", prompt=PROMPT, max_tokens=8, n=2, temperature=0.9, seed=11,
                               extra_body={"ignore_eos": True})  # fmt: skip
    assert [c.index for c in r.choices] == [0, 1]
    for c, seed in zip(r.choices, (11, 12), strict=True):
        assert c.text == _generate(ckpt, capsys, "--prompt", PROMPT, "--max-tokens", "8", "--temperature", "0.9",
                                   "--seed", str(seed))  # fmt: skip
    assert r.usage.completion_tokens == 16


def test_logprobs_are_a_torch_log_softmax_of_the_models_logits(server, api, ckpt, tok):
    """Completions' logprobs=5 and chat's top_logprobs=3, whole and streamed: each token's logprob and its
    alternatives equal log_softmax of transformers' logits for the same checkpoint and tokens (float32, within 1e-4)."""
    import torch
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(ckpt).eval()
    ids = tok.encode(PROMPT)
    r = api.completions.create(model="qwen", prompt=ids, max_tokens=6, temperature=0.7, seed=3, logprobs=5,
                               extra_body={"ignore_eos": True})  # fmt: skip
    lp = r.choices[0].logprobs
    streamed = [c.choices[0].logprobs for c in api.completions.create(
        model="qwen", prompt=ids, max_tokens=6, temperature=0.7, seed=3, logprobs=5, stream=True,
        extra_body={"ignore_eos": True}) if c.choices and c.choices[0].logprobs]  # fmt: skip
    assert sum((s.token_logprobs for s in streamed), []) == lp.token_logprobs
    assert "".join(lp.tokens) == r.choices[0].text and lp.text_offset[0] == 0
    # the generated ids, from the tokens' texts: each top-5 list names its tokens by text; find each drawn id
    with torch.no_grad():
        seq = list(ids)
        for i, (text, got) in enumerate(zip(lp.tokens, lp.token_logprobs, strict=True)):
            want = torch.log_softmax(hf(torch.tensor([seq])).logits[0, -1].float(), -1)
            cands = [t for t in range(want.numel()) if tok.piece(t) == text]
            t = max(cands, key=lambda t: want[t].item() if abs(want[t].item() - got) < 1e-3 else -1e9)
            assert abs(want[t].item() - got) < 1e-4, (i, text)
            top = torch.topk(want, 5)  # (keyed by text, as OpenAI's completions are: two pieces alike share a key)
            expect = {tok.piece(j): v for j, v in zip(top.indices.tolist(), top.values.tolist(), strict=True)}
            assert lp.top_logprobs[i] == pytest.approx(expect, abs=1e-4)
            seq.append(t)
    msgs = [{"role": "user", "content": "hello"}]
    chat = api.chat.completions.create(model="qwen", messages=msgs, max_tokens=4, temperature=0, logprobs=True,
                                       top_logprobs=3, extra_body={"ignore_eos": True})  # fmt: skip
    content = chat.choices[0].logprobs.content
    assert len(content) == 4 and all(len(c.top_logprobs) == 3 for c in content)
    assert "".join(c.token for c in content) == chat.choices[0].message.content
    assert all(c.logprob == pytest.approx(c.top_logprobs[0].logprob) for c in content)  # greedy: the top token
    assert bytes(sum((c.bytes for c in content), [])).decode(errors="replace") == chat.choices[0].message.content


def test_echo_with_logprobs_scores_the_prompt_as_an_eval_harness_asks(server, api, ckpt, tok):
    """lm-eval's loglikelihood request (token-id prompts in a batch, ``echo``, ``logprobs: 1``, ``max_tokens: 1``):
    each prompt token after the first has log_softmax of transformers' logits one position earlier (the first has
    null), then the drawn token's; streamed, the echo chunk carries the same; ``max_tokens: 0`` gives the prompt
    alone (no token, no completion tokens counted), its tokens' logprobs the same."""
    import torch
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(ckpt).eval()
    prompts = [tok.encode(PROMPT), tok.encode("paged attention reads a block table")]
    r = api.completions.create(model="qwen", prompt=prompts, echo=True, logprobs=1, max_tokens=1, temperature=0,
                               seed=1234)  # fmt: skip
    zero = api.completions.create(model="qwen", prompt=prompts, echo=True, logprobs=1, max_tokens=0)
    assert zero.usage.completion_tokens == 0 and zero.usage.prompt_tokens == sum(map(len, prompts))
    for ids, c, z in zip(prompts, r.choices, zero.choices, strict=True):
        with torch.no_grad():
            want = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)  # [P, V]
        lp = c.logprobs
        assert len(lp.token_logprobs) == len(ids) + 1 and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        got = torch.tensor(lp.token_logprobs[1:-1])
        assert torch.allclose(got, want[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0], atol=1e-4)
        assert lp.token_logprobs[-1] == pytest.approx(want[-1].max().item(), abs=1e-4)  # greedy: the argmax
        best = want[:-1].argmax(-1).tolist()
        assert [next(iter(t)) for t in lp.top_logprobs[1:-1]] == [tok.piece(b) for b in best]
        assert c.text == tok.decode(ids) + lp.tokens[-1] and lp.text_offset[-1] == len(tok.decode(ids))
        assert z.text == tok.decode(ids) and z.finish_reason == "length"
        assert z.logprobs.token_logprobs == lp.token_logprobs[:-1] and z.logprobs.tokens == lp.tokens[:-1]
    chunks = [ch.choices[0] for ch in api.completions.create(model="qwen", prompt=prompts[0], echo=True, logprobs=1,
                                                              max_tokens=1, temperature=0, stream=True)
              if ch.choices]  # fmt: skip
    assert chunks[0].text == tok.decode(prompts[0])  # (alone, not in a pass of two: a GEMM of other rows rounds
    streamed = sum((c.logprobs.token_logprobs for c in chunks if c.logprobs), [])  # a row's last bits otherwise)
    assert chunks[0].logprobs.token_logprobs[0] is None and len(streamed) == len(prompts[0]) + 1
    assert streamed[1:] == pytest.approx(r.choices[0].logprobs.token_logprobs[1:], abs=1e-5)
    assert chunks[0].logprobs.tokens == r.choices[0].logprobs.tokens[:-1]


def _random_fields(rng, chat: bool) -> dict:
    """One request's sampling fields drawn at random: lengths, greedy or seeded, stops, n, logprobs, echo."""
    p = dict(max_tokens=int(rng.choice([1, 2, 5, 16, 30])), temperature=float(rng.choice([0, 0.8])),
             seed=int(rng.integers(100)))
    if rng.random() < 0.4:
        p["stop"] = [" the", ["fox", "é"], "o", ["\n", "a"]][rng.integers(4)]
    if rng.random() < 0.3:
        p["n"] = int(rng.choice([2, 3]))
    extra = {k: v for k, v, q in (("ignore_eos", True, 0.3), ("min_tokens", 1, 0.2),
                                   ("stop_token_ids", [int(rng.integers(300))], 0.2)) if rng.random() < q}  # fmt: skip
    if chat and rng.random() < 0.3:
        p |= dict(logprobs=True, top_logprobs=int(rng.choice([0, 2])))
    if not chat and rng.random() < 0.3:
        p["logprobs"] = int(rng.choice([0, 2]))
    if not chat and rng.random() < 0.3:
        p["echo"] = True
    return p | ({"extra_body": extra} if extra else {})


def test_the_tokenizer_endpoints_are_the_checkpoints_tokenizer(server, tok):
    """vLLM's /tokenize (a text, with and without its special tokens; chat messages through the template),
    /detokenize and /tokenizer_info, as lm-eval's remote tokenizer reads them; bad input is a 400 naming the field."""
    post = lambda path, body: httpx.post(server.url + path, json=body, timeout=10)  # noqa: E731
    r = post("/tokenize", {"prompt": PROMPT}).json()
    assert r["tokens"] == tok.encode(PROMPT) and r["count"] == len(r["tokens"]) and r["max_model_len"] == 512
    assert post("/tokenize", {"prompt": PROMPT, "add_special_tokens": False}).json()["tokens"] == (
        tok.encode_many([PROMPT], special=False)[0])  # fmt: skip
    msgs = [{"role": "user", "content": "hello"}]
    assert post("/tokenize", {"messages": msgs}).json()["tokens"] == tok.chat(msgs)
    assert post("/detokenize", {"tokens": r["tokens"]}).json() == {"prompt": tok.decode(r["tokens"])}
    info = httpx.get(server.url + "/tokenizer_info", timeout=10).json()
    assert info["eos_token"] == tok.hf.eos_token and info["chat_template"] == tok.hf.chat_template
    assert info["vocab_size"] == 320  # (the checkpoint's: checkpoints.VOCAB; the ids a prompt may hold)
    for path, body, param in (("/tokenize", {}, "prompt"), ("/tokenize", {"prompt": "x", "messages": msgs}, "prompt"),
                              ("/detokenize", {"tokens": [10**6]}, "tokens"), ("/detokenize", {"tokens": [-1]},
                              "tokens.0"), ("/tokenize", {"prompt": "x", "model": "gpt-9"}, "model")):  # fmt: skip
        bad = post(path, body)
        assert bad.status_code in (400, 404) and bad.json()["error"]["param"] == param, (path, body, bad.text)


def test_random_requests_stream_what_they_answer_whole(server):
    """40 requests of random fields (stops, n, logprobs, echo, min_tokens, seeds), chat and completions, all at once:
    each streamed gives its whole response's text, finish reasons, usage and logprobs (within 1e-4: the two runs
    batch with other requests, and a GEMM over other rows rounds a row's last bits otherwise)."""
    import numpy as np

    rng = np.random.default_rng(0)
    words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "café", "naïve", "日本語", "😀", "paged",
             "attention", "block", "table"]

    async def one(client, chat: bool, fields: dict, text: str):
        create = client.chat.completions.create if chat else client.completions.create
        kw = dict(messages=[{"role": "user", "content": text}]) if chat else dict(prompt=text)
        whole = await create(model="qwen", **kw, **fields)
        texts, reasons, lps, used = {}, {}, {}, None
        async for chunk in await create(model="qwen", **kw, **fields, stream=True,
                                        stream_options={"include_usage": True}):  # fmt: skip
            used = chunk.usage or used
            for c in chunk.choices:
                texts[c.index] = texts.get(c.index, "") + ((c.delta.content if chat else c.text) or "")
                reasons[c.index] = c.finish_reason or reasons.get(c.index)
                if c.logprobs:
                    lps.setdefault(c.index, []).extend([e.logprob for e in c.logprobs.content] if chat
                                                       else c.logprobs.token_logprobs)  # fmt: skip
        assert (used.prompt_tokens, used.completion_tokens) == (whole.usage.prompt_tokens,
                                                                whole.usage.completion_tokens), fields  # fmt: skip
        for c in whole.choices:
            assert texts[c.index] == (c.message.content if chat else c.text), fields
            assert reasons[c.index] == c.finish_reason, fields
            lp = c.logprobs
            want = [] if not lp else [e.logprob for e in lp.content] if chat else lp.token_logprobs
            got = lps.get(c.index, [])
            assert [x is None for x in got] == [x is None for x in want], fields
            assert [x for x in got if x is not None] == pytest.approx([x for x in want if x is not None], abs=1e-4)

    async def all_of_them():
        async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0,
                                      timeout=60) as client:  # fmt: skip
            jobs = []
            for _ in range(40):
                chat = bool(rng.random() < 0.4)
                text = " ".join(rng.choice(words, int(rng.integers(1, 30))))
                jobs.append(one(client, chat, _random_fields(rng, chat), text))
            await asyncio.wait_for(asyncio.gather(*jobs), 120)

    asyncio.run(all_of_them())


def test_a_client_that_disconnects_mid_stream_frees_its_request(server):
    before = server.metrics()
    body = {"prompt": PROMPT, "max_tokens": 480, "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        m = server.metrics()
        if m["resplan_requests_running"] == 0 and m["resplan_kv_pages_used"] == 0:
            break
        time.sleep(0.05)
    assert m["resplan_requests_running"] == 0 and m["resplan_kv_pages_used"] == 0
    assert m["resplan_generation_tokens_total"] - before["resplan_generation_tokens_total"] < 480


def test_50_concurrent_streams_each_get_every_token(server):
    async def one(client, i):
        stream = await client.completions.create(model="qwen", prompt=f"{PROMPT} {i}", max_tokens=6, temperature=0,
                                                 stream=True, stream_options={"include_usage": True},
                                                 extra_body={"ignore_eos": True})  # fmt: skip
        chunks = [c async for c in stream]
        return chunks[-1].usage.completion_tokens, [c.choices[0].finish_reason for c in chunks if c.choices][-1]

    async def all_of_them():
        async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60) as c:
            return await asyncio.wait_for(asyncio.gather(*(one(c, i) for i in range(50))), 120)

    assert asyncio.run(all_of_them()) == [(6, "length")] * 50


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # (a zombie has exited)
    except FileNotFoundError:
        return False


def test_front_ends_share_the_port_and_the_engine_and_metrics_sum_over_them(ckpt, api):
    """``--front-ends 2``: 16 streams at once, each on a connection of its own, all get the text one front end gives;
    the kernel spread the connections over both processes (each counted some), /metrics sums them; SIGTERM drains and
    stops every process of the server."""
    expected = api.completions.create(model="qwen", prompt=PROMPT, max_tokens=6, temperature=0,
                                      extra_body={"ignore_eos": True}).choices[0].text  # fmt: skip
    s = Server(ckpt, "--front-ends", "2")
    try:
        children = subprocess.run(["pgrep", "-P", str(s.proc.pid)], capture_output=True, text=True).stdout.split()
        assert len(children) >= 2  # the engine and the other front end (and multiprocessing's resource tracker)

        async def one():
            async with openai.AsyncOpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0, timeout=60) as c:
                stream = await c.completions.create(model="qwen", prompt=PROMPT, max_tokens=6, temperature=0,
                                                    stream=True, extra_body={"ignore_eos": True})  # fmt: skip
                return "".join([c.choices[0].text async for c in stream if c.choices])

        async def burst():
            return await asyncio.wait_for(asyncio.gather(*(one() for _ in range(16))), 120)

        assert asyncio.run(burst()) == [expected] * 16
        finished = 'resplan_requests_finished_total[(\'finish_reason\', \'length\')]'
        assert s.metrics()[finished] == 16
        seen = {}  # each front end's own count, by its process's start time (a new connection each time)
        for _ in range(40):
            text = httpx.get(s.url + "/metrics?scope=front-end", timeout=5).text
            own = {x.name: x.value for fam in text_string_to_metric_families(text) for x in fam.samples}
            seen[own["process_start_time_seconds"]] = own["resplan_requests_finished_total"]
            if len(seen) == 2:
                break
        assert len(seen) == 2 and sum(seen.values()) == 16 and min(seen.values()) > 0, seen
        assert "2 front ends" in s.stop() and s.proc.returncode == 0
        deadline = time.monotonic() + 10
        while any(_alive(int(p)) for p in children) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(int(p)) for p in children)
    finally:
        s.stop()


BAD = [
    ("completions", {"prompt": "x", "temperature": -1}, 400, "temperature"),
    ("completions", {"prompt": "x", "top_p": 1.5}, 400, "top_p"),
    ("completions", {"prompt": "x", "top_k": 1000}, 400, "top_k"),
    ("completions", {"prompt": "x", "max_tokens": "many"}, 400, "max_tokens"),
    ("completions", {"prompt": "x", "max_tokens": 100000}, 400, "max_tokens"),
    ("completions", {"prompt": [5] * 600}, 400, "prompt"),
    ("completions", {"prompt": [1, 2, 99999]}, 400, "prompt"),
    ("completions", {"prompt": [[3], [4, -1]]}, 400, "prompt"),
    ("completions", {"prompt": "x", "n": 0}, 400, "n"),
    ("completions", {"prompt": "x", "logit_bias": {"1": 5}}, 400, "logit_bias"),
    ("completions", {"prompt": "x", "frobnicate": 1}, 400, "frobnicate"),
    ("completions", {"prompt": "x", "stop": [""]}, 400, "stop"),
    ("completions", {"prompt": "x", "seed": 2**40}, 400, "seed"),
    ("completions", {"prompt": "x", "logprobs": 6}, 400, "logprobs"),
    ("completions", {"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),  # (0 only with echo)
    ("chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, 400, "top_logprobs"),
    ("completions", {"prompt": "x", "max_tokens": 2, "min_tokens": 3}, 400, "min_tokens"),
    ("completions", {"prompt": "x", "min_tokens": 2, "stop_token_ids": list(range(5, 17))}, 400, "min_tokens"),
    ("completions", {"max_tokens": 3}, 400, "prompt"),
    ("completions", {"prompt": [1, "a"]}, 400, "prompt"),
    ("completions", {"prompt": "x", "model": "gpt-9"}, 404, "model"),
    ("chat/completions", {"messages": []}, 400, "messages"),
    ("chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages.0.role"),
    ("chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
     "messages.0.content.0"),
]  # fmt: skip


@pytest.mark.parametrize("path, body, status, param", BAD, ids=[f"{p}-{next(iter(b.items()))}" for p, b, _, _ in BAD])
def test_bad_input_is_answered_in_openais_error_object_and_the_server_serves_on(server, path, body, status, param):
    r = httpx.post(f"{server.url}/v1/{path}", json=body, timeout=10)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["code"] == status and err["message"], err
    ok = httpx.post(f"{server.url}/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=10)
    assert ok.status_code == 200


def test_bad_json_is_a_400(server):
    r = httpx.post(server.url + "/v1/completions", content=b"{not json", headers={"content-type": "application/json"},
                   timeout=10)  # fmt: skip
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    body = json.dumps({"prompt": "x", "max_tokens": 2}).encode()
    for kind in ("text/plain", "application/x-www-form-urlencoded", None):  # (a cross-site "simple" request's)
        r = httpx.post(server.url + "/v1/completions", content=body, headers={"content-type": kind} if kind else {},
                       timeout=10)  # fmt: skip
        assert r.status_code == 400 and "Content-Type: application/json" in r.json()["error"]["message"], kind
    r = httpx.post(server.url + "/v1/completions", content=body,
                   headers={"content-type": "application/json; charset=utf-8"}, timeout=10)  # fmt: skip
    assert r.status_code == 200


def test_return_token_ids_gives_every_tokens_id_whole_and_streamed(server, tok):
    """vLLM's ``return_token_ids`` on completions: the choice's ``token_ids`` are its tokens (they decode to its text),
    and a stream's chunks carry them in order, concatenating to the same ids; without it no chunk carries any."""
    req = dict(model="qwen", prompt=PROMPT, max_tokens=12, temperature=0, ignore_eos=True, return_token_ids=True)
    whole = httpx.post(server.url + "/v1/completions", json=req, timeout=60).json()["choices"][0]
    ids = whole["token_ids"]
    assert len(ids) == 12 and tok.decode(ids) == whole["text"]
    events = []
    with httpx.stream("POST", server.url + "/v1/completions", json=dict(req, stream=True), timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                events.append(json.loads(line[6:]))
    choices = [e["choices"][0] for e in events if e["choices"]]
    assert all("token_ids" in c for c in choices) and choices[-1]["finish_reason"] == "length"
    assert [t for c in choices for t in c["token_ids"]] == ids and "".join(c["text"] for c in choices) == whole["text"]
    with httpx.stream("POST", server.url + "/v1/completions", json=dict(req, stream=True, return_token_ids=False),
                      timeout=60) as r:  # fmt: skip
        assert "token_ids" not in r.read().decode()


def test_the_traffic_benchmarks_chats_run_against_the_server(server, tmp_path):
    """``models.bench.traffic --url --shape chat``: every turn's prompt the previous turn's prompt, the ids the server
    returned and a new message; none fails, and each later turn's prompt is as long as its history."""
    from models.bench import traffic

    runs = traffic.main(["--url", server.url, "--model", "qwen3_5-tiny", "--shape", "chat", "--users", "2",
                         "--turns", "3", "--prompt-len", "fixed:5", "--gen-len", "fixed:4", "--think-s", "0.01",
                         "--rounds", "1", "--warmup", "0", "--no-prerun", "--no-progress", "--out",
                         str(tmp_path / "out")])  # fmt: skip
    (r,) = runs
    assert r["failed"] == 0 and r["output_lens"] == [4] * 6
    assert r["prompt_tokens"] == 2 * (5 + 14 + 23)


def test_a_chats_next_turn_restores_its_history_from_the_prefix_cache(server, tok):
    """The server's engine has the prefix cache on (Qwen3.5's default): a turn whose prompt is the last turn's prompt,
    the ids it got and a new message restores everything the last turn fed (its prompt and all its tokens but the
    last), and /metrics counts it."""
    first = dict(model="qwen", prompt=PROMPT, max_tokens=8, temperature=0, ignore_eos=True, return_token_ids=True)
    ids = httpx.post(server.url + "/v1/completions", json=first, timeout=60).json()["choices"][0]["token_ids"]
    before = server.metrics()
    prompt = tok.encode(PROMPT) + ids + tok.encode(" and then")
    r = httpx.post(server.url + "/v1/completions", json=dict(model="qwen", prompt=prompt, max_tokens=3, temperature=0,
                                                             ignore_eos=True), timeout=60)  # fmt: skip
    assert r.status_code == 200
    after = server.metrics()
    assert after["resplan_prefix_cache_hits"] - before["resplan_prefix_cache_hits"] == 1
    cached = after["resplan_prefix_cache_prompt_tokens"] - before["resplan_prefix_cache_prompt_tokens"]
    assert cached == len(tok.encode(PROMPT)) + len(ids) - 1


def test_metrics_parse_and_count(server, api, tok):
    before = server.metrics()
    api.completions.create(model="qwen", prompt=PROMPT, max_tokens=5, temperature=0, extra_body={"ignore_eos": True})
    m = server.metrics()
    assert m["resplan_generation_tokens_total"] - before["resplan_generation_tokens_total"] == 5
    assert m["resplan_time_to_first_token_seconds_count"] > before.get("resplan_time_to_first_token_seconds_count", 0)
    assert m["resplan_kv_pages_total"] > 0 and "resplan_requests_waiting" in m
    assert m["resplan_requests_finished_total[('finish_reason', 'length')]"] >= 1
    assert m["resplan_engine_decode_steps"] - before["resplan_engine_decode_steps"] >= 3  # (a token from the pass)
    assert m["resplan_engine_decode_steps_beside_pass"] == 0  # on the CPU a pass runs in the step, never beside it
    passes = {k: m[k] - before[k] for k in ("resplan_engine_prefill_passes", "resplan_engine_prefill_tokens",
                                            "resplan_engine_prefill_pass_seconds")}  # fmt: skip
    assert passes["resplan_engine_prefill_passes"] == 1  # (the whole prompt in one pass; some of it may be cached)
    assert 1 <= passes["resplan_engine_prefill_tokens"] <= len(tok.encode(PROMPT))
    assert 0 < passes["resplan_engine_prefill_pass_seconds"] < 60
    d = {k: m[k] - before.get(k, 0) for k in m if k.startswith("resplan_frontend_")}
    lag, wake = "resplan_frontend_step_lag_seconds", "resplan_frontend_steps_per_wakeup"
    assert d[f"{lag}_count"] >= 1 and d[f"{lag}_sum"] >= 0  # every step message's lag from the engine's send
    assert d[f"{wake}_sum"] == d[f"{lag}_count"] >= d[f"{wake}_count"] >= 1  # each delivered in exactly one wake-up
    intake = "resplan_engine_intake_seconds"
    assert m[f"{intake}_count"] - before.get(f"{intake}_count", 0) == 1  # the request's arrival to its submission
    assert 0 <= m[f"{intake}_sum"] - before.get(f"{intake}_sum", 0) < 60
    for gc_seconds in ("resplan_frontend_gc_seconds", "resplan_engine_gc_seconds"):  # each process's collections
        assert 0 <= before[gc_seconds] <= m[gc_seconds] < 60


def test_merged_metrics_sum_the_front_ends_counts_and_keep_the_engines_gauges_once():
    from models.server.client import Load
    from models.server.heap import CollectorClock
    from models.server.metrics import merged

    clocks = [CollectorClock(), CollectorClock()]
    try:
        for c, gc_s in zip(clocks, (0.25, 0.5), strict=True):
            c.seconds = gc_s
        fronts = [Metrics(lambda: Load(running=3, pages_used=7), c) for c in clocks]
        fronts[0].request_done(0.0, [0.003, 0.004, 0.0055], 5, "length")  # gaps 1 and 1.5 ms
        fronts[1].request_done(0.0, [0.3, 0.5], 7, "stop")  # gap 200 ms
        texts = [f.exposition().decode() for f in fronts]
        parsed = [{(x.name, tuple(sorted(x.labels.items()))): x.value for fam in text_string_to_metric_families(t)
                   for x in fam.samples} for t in (*texts, merged(texts).decode())]  # fmt: skip
    finally:
        for c in clocks:
            c.close()
    a, b, m = parsed
    assert m.keys() == a.keys() | b.keys()
    for key, value in m.items():
        name = key[0]
        if name.endswith("_created") or name in ("resplan_requests_running", "resplan_kv_pages_used",
                                                 "process_start_time_seconds", "process_max_fds"):  # fmt: skip
            assert value == (a[key] if key in a else b[key]), key  # the first's (the engine's gauges: the same)
        elif name.startswith("resplan_") or name == "process_cpu_seconds_total":
            assert value == pytest.approx(a.get(key, 0) + b.get(key, 0)), key
    assert m[("resplan_prompt_tokens_total", ())] == 12 and m[("resplan_frontend_gc_seconds", ())] >= 0.75
    assert m[("resplan_requests_running", ())] == 3
    itl = "resplan_inter_token_latency_seconds_bucket"
    assert m[(itl, (("le", "0.0015"),))] == 2 and m[(itl, (("le", "+Inf"),))] == 3
    assert m[("resplan_requests_finished_total", (("finish_reason", "stop"),))] == 1


def test_messages_of_one_loop_turn_reach_the_engine_in_order_in_batches_of_at_most_the_cap():
    import zmq

    from models.server.client import MAX_SEND_BATCH, EngineClient
    from models.server.engine_core import EngineSpec, pack, unpack

    client = EngineClient(EngineSpec(None), in_process=True)  # (sockets only: no engine launched)
    engine = client.ctx.socket(zmq.PULL)
    engine.connect(client.to_engine_addr)
    n = 2 * MAX_SEND_BATCH + 3

    async def one_turn():  # every message queued before the loop runs anything else
        for i in range(n):
            client._send(pack(i))
        await asyncio.sleep(0)  # (the turn's end: the rest goes out)

    try:
        asyncio.run(one_turn())
        batches = []
        while engine.poll(1000) and sum(map(len, batches)) < n:
            batches.append([unpack(f)[0] for f in engine.recv_multipart()])
        assert [len(b) for b in batches] == [MAX_SEND_BATCH, MAX_SEND_BATCH, 3]
        assert sum(batches, []) == list(range(n))
    finally:
        engine.close(linger=0)
        client.shutdown()


def test_a_step_wakes_its_streams_in_the_engines_row_order():
    """The reader wakes the streams a STEP message touched in the order of its rows (then those it only finished),
    whatever the streams' memory addresses: each stream's place in a step's deliveries is the same from step to step."""
    from models.server.client import EngineClient, RequestStream
    from models.server.engine_core import EngineSpec, Kind

    class Wake:
        def __init__(self, rid, woken):
            self.rid, self.woken = rid, woken

        def set(self):
            self.woken.append(self.rid)

    client = EngineClient(EngineSpec(None), in_process=True)  # (sockets only: no engine launched)
    try:
        rids = [f"r{i}" for i in range(40)]
        for rng_seed in range(3):
            woken = []
            client.streams = {rid: RequestStream(rid, wake=Wake(rid, woken)) for rid in rids}
            order = [str(r) for r in np.random.default_rng(rng_seed).permutation(rids[:30])]
            finished = [(rids[35], "stop"), (order[0], "length")]
            load = (0, 30, 0, 0, 0, 0, 0, 0, 0, 0, 0.0)
            assert client._deliver([Kind.STEP, order, list(range(30)), finished, load, None, [], 0.0, []])
            assert woken == [*order, rids[35]]
    finally:
        client.shutdown()


def test_the_collector_clock_counts_collections_until_it_is_closed():
    import gc

    from models.server.heap import CollectorClock

    clock = CollectorClock()
    for _ in range(3):
        gc.collect()
    counted = clock.seconds
    clock.close()
    gc.collect()
    assert counted > 0 and clock.seconds == counted


def test_an_api_key_guards_the_api_and_leaves_health_and_metrics_open(ckpt, monkeypatch):
    """``--api-key`` (here from $RESPLAN_API_KEY): the API answers 401 in OpenAI's error object without the key or
    with another, serves with it (the server's own warm-up requests carried it: no warning); /health and /metrics
    need none."""
    monkeypatch.setenv("RESPLAN_API_KEY", "sekrit")
    s = Server(ckpt, "--in-process")
    try:
        for key in ("wrong", None):
            r = httpx.post(s.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=10,
                           headers={"Authorization": f"Bearer {key}"} if key else {})  # fmt: skip
            assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error", r.text
        assert httpx.get(s.url + "/v1/models", timeout=10).status_code == 401
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=s.url + "/v1", api_key="wrong", max_retries=0).models.list()
        api = openai.OpenAI(base_url=s.url + "/v1", api_key="sekrit", max_retries=0, timeout=60)
        chunks = list(api.completions.create(model="qwen", prompt=PROMPT, max_tokens=3, stream=True))
        assert chunks and api.models.list().data[0].id == "qwen"
        assert httpx.get(s.url + "/health", timeout=10).status_code == 200
        assert httpx.get(s.url + "/metrics", timeout=10).status_code == 200
    finally:
        out = s.stop()
    assert "warning" not in out, out


def test_max_waiting_answers_503_and_sigterm_drains(ckpt):
    """A server with room for 2 running and 2 waiting requests: a burst of 12 gets some 503s with Retry-After, the
    others finish; after the engine has been idle past its liveness check, a request is still served; then SIGTERM
    with a long request running: a new request gets 503, the running one finishes whole, and the server exits 0. (The
    engine core runs in a thread here: ``--in-process``.)"""
    from models.server.engine_core import ALIVE_CHECK_MS

    s = Server(ckpt, "--max-running", "2", "--max-waiting", "2", "--in-process")
    try:

        async def burst():
            async with httpx.AsyncClient(timeout=60) as c:
                body = {"prompt": PROMPT, "max_tokens": 30, "temperature": 0, "ignore_eos": True}
                return await asyncio.gather(*(c.post(s.url + "/v1/completions", json=body) for _ in range(12)))

        codes = [r.status_code for r in asyncio.run(burst())]
        assert set(codes) == {200, 503} and codes.count(200) >= 2, codes
        refused = next(r for r in asyncio.run(burst()) if r.status_code == 503)
        assert refused.headers["retry-after"] and refused.json()["error"]["code"] == 503
        time.sleep(1.5 * ALIVE_CHECK_MS / 1000)  # (an engine thread once took its process's parent for the front end)
        after_idle = httpx.post(s.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=30)
        assert after_idle.status_code == 200
        body = {"prompt": PROMPT, "max_tokens": 200, "temperature": 0, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()
            next(lines)
            s.proc.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            late = httpx.post(s.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=10)
            assert late.status_code == 503
            events = [ln for ln in lines if ln.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        assert json.loads(events[-2][len("data: ") :])["choices"][0]["finish_reason"] == "length"
        assert s.proc.wait(30) == 0
    finally:
        s.stop()


def _engine_pid(server_pid: int) -> int:
    """The engine core's process: the server's child started by multiprocessing's spawn (not its resource tracker)."""
    with open(f"/proc/{server_pid}/task/{server_pid}/children") as f:
        for pid in f.read().split():
            with open(f"/proc/{pid}/cmdline", "rb") as g:
                if b"spawn_main" in g.read():
                    return int(pid)
    raise AssertionError("no engine process")


def test_an_engine_killed_mid_stream_ends_the_stream_in_an_error_and_stops_the_server(ckpt):
    """The engine process killed (as the OOM killer does: no word from it) while a stream runs: the stream's last
    events are OpenAI's error object (500) and [DONE], and the server exits 1 saying the engine failed, instead of
    holding the stream open on an engine that is gone."""
    s = Server(ckpt)
    try:
        body = {"prompt": PROMPT, "max_tokens": 480, "temperature": 0, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=30) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            os.kill(_engine_pid(s.proc.pid), signal.SIGKILL)
            events = [ln for ln in lines if ln.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        err = json.loads(events[-2][len("data: ") :])["error"]
        assert err["code"] == 500 and err["type"] == "server_error", err
        assert s.proc.wait(30) == 1
        assert "error: the engine failed; stopping" in s.stop()
    finally:
        s.stop()


def _speaks_german(path, wav) -> None:
    """Edit a tiny Whisper checkpoint so that on ``wav`` its most likely token after the start token is <|de|>: that
    token's embedding row (the output projection's, tied) moved along the decoder's last hidden state there."""
    import torch
    import transformers

    from models.engine.audio import feature_extractor, log_mel, read_wav

    model = transformers.WhisperForConditionalGeneration.from_pretrained(path).eval()
    de = WHISPER_SPECIALS.index("<|de|>")
    features = log_mel(read_wav(wav), feature_extractor(path, 16), 2 * model.config.max_source_positions)[None]
    with torch.no_grad():
        h = model.model(input_features=features, decoder_input_ids=torch.tensor([[1]])).last_hidden_state[0, -1]
        logits = model.proj_out(h)
        model.model.decoder.embed_tokens.weight[de] += (logits.max() - logits[de] + 5) * h / h.dot(h)
        assert model.proj_out(h).argmax() == de
    model.save_pretrained(path)


def _transformers_text(path, wav, previous: str) -> str:
    """transformers' greedy English transcription of ``wav`` conditioned on ``previous`` (its prompt_ids:
    <|startofprev|> and " " + the text's ids), up to the end token or the decoder's context."""
    import torch
    import transformers

    from models.engine.audio import feature_extractor, log_mel, read_wav

    model = transformers.WhisperForConditionalGeneration.from_pretrained(path).eval()
    tok = Tokenizer.from_pretrained(path)
    features = log_mel(read_wav(wav), feature_extractor(path, 16), 2 * model.config.max_source_positions)[None]
    ids = [WHISPER_SPECIALS.index("<|startofprev|>"), *tok.encode_many([" " + previous], special=False)[0]]
    out = model.generate(input_features=features, language="en", task="transcribe", prompt_ids=torch.tensor(ids),
                         max_new_tokens=model.config.max_target_positions - len(ids) - 4, do_sample=False)
    return tok.decode(out[0].tolist()).strip()


def test_a_whisper_server_transcribes_a_wav_upload_as_generate_does(tmp_path, capsys):
    """A checkpoint that hears German in the test tone: without a language, generate and the server both detect it
    (the transcription is the one asked in German); then the texts, the formats, a long file's windows."""
    import numpy as np

    from models.generate import main

    path, wav = save_whisper(tmp_path / "whisper"), write_wav(tmp_path / "a.wav", tone(0.4))
    _speaks_german(path, wav)
    assert main(["--model-dir", str(path), "--audio", str(wav), "--max-tokens", "60", "--language", "de",
                 "--quiet"]) == 0  # fmt: skip
    german = capsys.readouterr().out.strip()
    assert main(["--model-dir", str(path), "--audio", str(wav), "--max-tokens", "60", "--language", "en",
                 "--quiet"]) == 0  # fmt: skip
    assert capsys.readouterr().out.strip() != german  # (so the text says which language the prompt named)
    room = 64 - 5 - len(Tokenizer.from_pretrained(path).encode_many([" w7 w9 w12"], special=False)[0])
    assert main(["--model-dir", str(path), "--audio", str(wav), "--max-tokens", str(room), "--language", "en",
                 "--previous-text", "w7 w9 w12", "--quiet"]) == 0  # (the decoder's context less the prompt)
    conditioned_by_generate = capsys.readouterr().out.strip()
    assert main(["--model-dir", str(path), "--audio", str(wav), "--max-tokens", "60"]) == 0
    out, err = capsys.readouterr()
    want = out.strip()
    assert want == german and "a.wav: de" in err
    assert main(["--model-dir", str(path), "--audio", str(wav), "--max-tokens", "60", "--task", "translate",
                 "--quiet"]) == 0  # fmt: skip
    translated = capsys.readouterr().out.strip()
    gap = lambda ms: np.zeros(16 * ms, np.float32)  # noqa: E731
    long = write_wav(tmp_path / "long.wav", np.concatenate([tone(0.3), gap(50), tone(0.35, 300), gap(100),
                                                            tone(0.4, 500)]))  # fmt: skip
    assert main(["--model-dir", str(path), "--audio", str(long), "--max-tokens", "60"]) == 0
    out, err = capsys.readouterr()
    detected_long = err.split("long.wav: ")[1][:2]  # (its first window's language)
    blocks = out.split("### [")[1:]  # "0:long.wav A-B s] reason, n tokens\ntext\n" each
    start = lambda b: float(b.split()[1].split("-")[0])  # noqa: E731
    windows_want = [b.split("\n", 1)[1].strip() for b in sorted(blocks, key=start)]
    s = Server(path, "--in-process", "--max-audio-mb", "0.05")  # (50 kB: 1.5 s of this WAV)
    try:
        api = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0, timeout=60)
        with open(write_wav(tmp_path / "big.wav", tone(2.0)), "rb") as f:
            big = httpx.post(s.url + "/v1/audio/transcriptions", files={"file": ("big.wav", f)}, timeout=10)
        assert big.status_code == 413 and "at most 0.05 MB (--max-audio-mb)" in big.json()["error"]["message"]
        with open(wav, "rb") as f:
            got = api.audio.transcriptions.create(model="whisper", file=f)
        assert got.text == want
        with open(wav, "rb") as f:
            text = api.audio.transcriptions.create(model="whisper", file=f, response_format="text")
        assert text.strip() == want
        with open(wav, "rb") as f:  # (German detected, translated into English)
            assert api.audio.translations.create(model="whisper", file=f).text == translated != want
        with open(wav, "rb") as f:
            assert api.audio.transcriptions.create(model="whisper", file=f, response_format="verbose_json",
                                                   language="en").language == "en"  # (given: not detected)
        # a file of three of the encoder's windows (0.48 s each) with pauses: cut there, each window transcribed as
        # generate transcribes it, the texts joined
        with open(long, "rb") as f:
            verbose = api.audio.transcriptions.create(model="whisper", file=f, response_format="verbose_json",
                                                      timestamp_granularities=["segment"])  # (its windows: taken)
        spans = [(round(g.start, 2), round(g.end, 2)) for g in verbose.segments]
        assert spans == [(0.0, 0.3), (0.3, 0.71), (0.71, 1.07), (1.07, 1.2)], spans
        assert [g.text for g in verbose.segments] == windows_want and verbose.duration == pytest.approx(1.2)
        assert verbose.language == detected_long
        assert verbose.text == " ".join(t for t in windows_want if t)
        for fmt in ("srt", "vtt"):  # a cue a window with text: its span and text, as verbose_json's segments
            with open(long, "rb") as f:
                cues = _cues(api.audio.transcriptions.create(model="whisper", file=f, response_format=fmt), fmt)
            assert cues == [(round(g.start, 3), round(g.end, 3), g.text) for g in verbose.segments if g.text], fmt
        with open(wav, "rb") as f:  # conditioned on a previous text, as transformers' generate with prompt_ids
            conditioned = api.audio.transcriptions.create(model="whisper", file=f, language="en", prompt="w7 w9 w12")
        with open(wav, "rb") as f:
            plain = api.audio.transcriptions.create(model="whisper", file=f, language="en")
        assert conditioned.text == _transformers_text(path, wav, "w7 w9 w12") == conditioned_by_generate != plain.text
        for field, value in (("stream", "true"), ("timestamp_granularities[]", "word"),
                             ("frobnicate", "1")):  # (refused by name, not ignored)
            with open(wav, "rb") as f:
                r = httpx.post(s.url + "/v1/audio/transcriptions", files={"file": ("a.wav", f)}, data={field: value},
                               timeout=10)  # fmt: skip
            assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
        with open(wav, "rb") as f:  # (values that ask for nothing are taken)
            r = httpx.post(s.url + "/v1/audio/transcriptions", files={"file": ("a.wav", f)},
                           data={"prompt": "", "stream": "false"}, timeout=10)  # fmt: skip
        assert r.status_code == 200 and r.json()["text"] == want
        bad = httpx.post(s.url + "/v1/audio/transcriptions", files={"file": ("x.wav", b"not a wav")}, timeout=10)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "file"
        text_only = httpx.post(s.url + "/v1/completions", json={"prompt": "x"}, timeout=10)
        assert text_only.status_code == 404 and "transcriptions" in text_only.json()["error"]["message"]
    finally:
        s.stop()


def _cues(body: str, fmt: str) -> list[tuple[float, float, str]]:
    """(start s, end s, text) of each cue of a SubRip or WebVTT body, read by the formats' grammar."""
    import re

    if fmt == "vtt":
        assert body.startswith("WEBVTT\n\n"), body[:20]
        body = body[len("WEBVTT\n\n"):]
    sep = "," if fmt == "srt" else "."
    t = rf"(\d\d):(\d\d):(\d\d){re.escape(sep)}(\d\d\d)"
    out = []
    for i, block in enumerate(b for b in body.split("\n\n") if b.strip()):
        lines = block.strip("\n").split("\n")
        if fmt == "srt":
            assert lines.pop(0) == str(i + 1), block
        m = re.fullmatch(rf"{t} --> {t}", lines[0])
        assert m, lines[0]
        v = [int(x) for x in m.groups()]
        out.append(((v[0] * 3600 + v[1] * 60 + v[2]) + v[3] / 1000, (v[4] * 3600 + v[5] * 60 + v[6]) + v[7] / 1000,
                    "\n".join(lines[1:])))  # fmt: skip
    return out


def test_subtitle_cues_carry_each_windows_span_and_text_and_skip_silent_windows():
    from models.server.app import subtitles

    spans, texts = [(0.0, 0.3), (0.3, 0.71), (0.71, 3725.0715)], ["hello there", "", "last one"]
    for fmt in ("srt", "vtt"):
        assert _cues(subtitles(spans, texts, fmt), fmt) == [(0.0, 0.3, "hello there"), (0.71, 3725.072, "last one")]


@pytest.mark.parametrize("kind", ["no-config", "unknown-architecture", "port", "port-in-use", "front-ends",
                                  "burst-wait"])
def test_a_bad_start_is_one_line(tmp_path, capsys, kind):
    """What the command line and the directory tell is refused in one line (the engine process, started at once so
    that it loads while the front end checks, is stopped again); a port another socket holds, before anything
    starts."""
    from models.server.cli import main

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = {"port": "70000", "port-in-use": str(taken.getsockname()[1])}.get(kind, "0")
    args = ["--model-dir", str(tmp_path), "--port", port]
    args += ["--front-ends", "2", "--in-process"] if kind == "front-ends" else []
    args += ["--burst-wait-ms", "-1"] if kind == "burst-wait" else []
    if kind != "no-config":
        (tmp_path / "config.json").write_text('{"architectures": ["Foo"]}')
    try:
        with pytest.raises(SystemExit) as info:
            main(args)
    finally:
        taken.close()
    err = capsys.readouterr().err
    words = {"no-config": "holds no config.json", "unknown-architecture": "architectures ['Foo']",
             "port": "must be in [0, 65535]", "port-in-use": "cannot listen on 127.0.0.1",
             "front-ends": "serves one front end",
             "burst-wait": "--burst-wait-ms: must be in [0, 1000]"}[kind]  # fmt: skip
    assert info.value.code == 2 and err.count("\n") == 1 and words in err, err


NEUTRAL_BODIES = [  # what load generators and vLLM-minded clients send with nothing to change
    {"best_of": 1, "temperature": 0.0, "ignore_eos": True, "stream_options": {"include_usage": True}, "stream": True},
    {"best_of": 2, "n": 2},
    {"top_k": -1, "repetition_penalty": 1.0, "min_p": 0.0, "presence_penalty": 0, "frequency_penalty": 0},
    {"logit_bias": {}, "user": "u1"},
]
CHAT_NEUTRAL_BODIES = [{"response_format": {"type": "text"}, "tools": [], "tool_choice": "none",
                        "modalities": ["text"]}]
CHAT_REFUSED_BODIES = [({"response_format": {"type": "json_object"}}, "response_format"),
                       ({"modalities": ["text", "audio"]}, "modalities")]
REFUSED_BODIES = [({"best_of": 3}, "best_of"), ({"best_of": 2, "n": 1}, "best_of"), ({"repetition_penalty": 1.1},
                  "repetition_penalty"), ({"min_p": 0.05}, "min_p"), ({"presence_penalty": 0.5}, "presence_penalty")]


def _request(chat: bool, fields: dict):
    from models.server.protocol import ChatCompletionRequest, CompletionRequest

    if chat:
        return ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], **fields)
    return CompletionRequest(prompt="x", **fields)


@pytest.mark.parametrize("chat, fields", [(False, f) for f in NEUTRAL_BODIES] +
                         [(True, f) for f in CHAT_NEUTRAL_BODIES])  # fmt: skip
def test_fields_at_their_neutral_values_are_taken(chat, fields):
    from models.server.protocol import unsupported

    assert unsupported(_request(chat, fields)) is None


@pytest.mark.parametrize("chat, fields, param", [(False, *r) for r in REFUSED_BODIES] +
                         [(True, *r) for r in CHAT_REFUSED_BODIES])  # fmt: skip
def test_fields_that_would_change_the_draw_are_refused_by_name(chat, fields, param):
    from models.server.protocol import unsupported

    assert unsupported(_request(chat, fields))[0] == param


def test_a_known_field_sent_as_null_keeps_its_default_and_a_required_one_is_missing():
    """OpenAI's schema makes its optional fields nullable, and clients built from it send nulls."""
    import pydantic

    from models.server.protocol import ChatCompletionRequest, CompletionRequest, unsupported

    nulls = dict(n=None, stream=None, echo=None, logprobs=None, presence_penalty=None, frequency_penalty=None,
                 logit_bias=None, stop=None, stream_options=None, max_tokens=None, temperature=None, top_p=None,
                 seed=None, best_of=None, suffix=None, user=None, top_k=None, min_tokens=None, ignore_eos=None)
    req = CompletionRequest(prompt="x", **nulls)
    assert req.model_dump() == CompletionRequest(prompt="x").model_dump() and unsupported(req) is None
    sent = CompletionRequest.model_validate_json(json.dumps(dict(prompt="x", **nulls)))  # (as the server parses)
    assert sent.model_dump() == req.model_dump()
    chat = dict(messages=[{"role": "user", "content": "x"}])
    assert (ChatCompletionRequest(**chat, logprobs=None, top_logprobs=None, max_completion_tokens=None, tools=None,
                                  response_format=None).model_dump() == ChatCompletionRequest(**chat).model_dump())
    with pytest.raises(pydantic.ValidationError, match="prompt"):
        CompletionRequest(prompt=None)
    assert unsupported(CompletionRequest(prompt="x", frobnicate=None))[0] == "frobnicate"  # (unknown: still named)


def test_the_model_is_listed_and_retrieved_by_its_id_and_another_id_is_a_404(server, api):
    listed = api.models.list().data
    assert [m.id for m in listed] == ["qwen"] and api.models.retrieve("qwen").id == "qwen"
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        api.models.retrieve("gpt-9")
